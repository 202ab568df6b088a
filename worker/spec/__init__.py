"""Speculative decoding: proposers, verification, acceptance tracking."""
