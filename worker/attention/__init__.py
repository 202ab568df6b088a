"""Attention backends behind one interface (torch reference, Mojo on the CPU, Mojo on CUDA) and their per-step
metadata."""
