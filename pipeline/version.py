"""The installed distribution's version, read once from its metadata (``pyproject.toml`` is the one source)."""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version


@functools.cache
def package_version() -> str:
    """``"0.1.0"``-style version of the installed ``vostream`` distribution; ``"unknown"`` when running from a
    source tree that was never installed."""
    try:
        return version("vostream")
    except PackageNotFoundError:
        return "unknown"


__all__ = ["package_version"]
