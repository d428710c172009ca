"""Tracker backends.  :func:`load_tracker` resolves a backend name to a loaded :class:`Tracker`."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from vostream.pipeline.errors import BackendError, ConfigError

from .base import InputSpec, Tracker, TrackerSession

#: backend name -> "module:factory"; modules are imported lazily so optional runtimes stay optional.
BACKENDS: dict[str, str] = {
    "classic": "vostream.stages.trackers.classic:ClassicTracker",
    # SAM 2.1 / EdgeTAM / SAM 3 tracker exports (``vostream export``) on ONNX Runtime: CPU, CUDA, TensorRT
    "onnx": "vostream.stages.trackers.sam2.tracker:OnnxTracker",
    "acl": "vostream.stages.trackers.sam2.tracker:AclTracker",  # Ascend NPUs via pyACL (docs/ascend.md)
}


def load_tracker(backend: str = "classic", **options: Any) -> Tracker:
    """Load the tracker ``backend`` with backend-specific ``options`` (e.g. ``model=DIR``)."""
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(
            f"unknown tracker backend {backend!r}; choose one of: {', '.join(sorted(BACKENDS))}"
        ) from None
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"tracker backend {backend!r} cannot be imported: {exc}") from exc
    factory = getattr(module, attr)
    _check_options(backend, factory, options)
    return factory(**options)


def _check_options(backend: str, factory: Any, options: dict[str, Any]) -> None:
    """A :class:`ConfigError` naming the options ``factory`` does not take (``--model`` or ``--provider`` given to
    the classic backend), instead of the ``TypeError`` the call would raise.  Factories with ``**kwargs`` check
    their own options."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # not introspectable: let the call decide
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(
            f"tracker backend {backend!r} does not take option(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(known) or 'none'}"
        )


__all__ = ["BACKENDS", "InputSpec", "Tracker", "TrackerSession", "load_tracker"]
