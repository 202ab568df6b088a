"""The gateway's side of the worker link: worker processes, the ZeroMQ link to them, per-request output queues."""
