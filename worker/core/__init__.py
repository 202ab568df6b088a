"""Scheduling: sequences, the block manager, the scheduler and its fair queue, deadlines, the KV audit. Plain Python,
no torch."""
