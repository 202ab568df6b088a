"""MILI's version number, as the installed package records it."""

from __future__ import annotations

import importlib.metadata


def mili_version() -> str:
    try:
        return importlib.metadata.version("mili")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"
