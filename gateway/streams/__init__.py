"""One request's outputs as a stream of text events, and resumable streams."""
