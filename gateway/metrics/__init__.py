"""Prometheus metrics: MILI's own series and the router contract's aliases."""
