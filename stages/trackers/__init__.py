"""Tracker backends.  :func:`load_tracker` resolves a backend name to a loaded :class:`Tracker`."""

from __future__ import annotations

import importlib
from typing import Any

from vostream.pipeline.errors import BackendError, ConfigError

from .base import InputSpec, Tracker, TrackerSession

#: backend name -> "module:factory"; modules are imported lazily so optional runtimes stay optional.
BACKENDS: dict[str, str] = {
    "classic": "vostream.stages.trackers.classic:ClassicTracker",
}


def load_tracker(backend: str = "classic", **options: Any) -> Tracker:
    """Load the tracker ``backend`` with backend-specific ``options`` (e.g. ``model=DIR``)."""
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(f"unknown tracker backend {backend!r}; choose one of: {', '.join(sorted(BACKENDS))}") \
            from None
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"tracker backend {backend!r} cannot be imported: {exc}") from exc
    return getattr(module, attr)(**options)


__all__ = ["BACKENDS", "InputSpec", "Tracker", "TrackerSession", "load_tracker"]
