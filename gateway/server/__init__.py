"""The HTTP plumbing every API's routes stand on: error objects, API keys and their limits, request ids, reading
bodies and noticing disconnects, deadlines."""
