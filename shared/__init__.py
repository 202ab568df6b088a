"""What the gateway and the worker both import: sampling parameters, wire messages, configuration."""
