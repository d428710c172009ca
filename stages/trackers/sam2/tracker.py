"""The SAM-2-family :class:`~vostream.stages.trackers.base.Tracker`: :class:`Sam2Tracker` on any
:class:`~.runtime.Runtime`, and the backend factories of the registry (``stages/trackers/__init__.py``):
:func:`OnnxTracker` (``onnx``) and :func:`AclTracker` (``acl``).

The dependency goes one way: this module imports the runtimes (lazily, inside the factories, so ``onnxruntime`` and
``acl`` stay optional); the runtimes in ``backends/`` import only ``runtime``, ``manifest`` and ``session``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vostream.pipeline.errors import ConfigError
from vostream.pipeline.types import Frame, Prompt, TrackResult

from ..base import InputSpec, Tracker, TrackerSession
from .manifest import Manifest, load_manifest
from .runtime import Runtime
from .session import Sam2Session


class _LockedSession(TrackerSession):
    """A :class:`Sam2Session` on a runtime shared by every session of one tracker: calls take the tracker's lock
    (a runtime is driven by one thread at a time)."""

    def __init__(self, inner: Sam2Session, lock: threading.Lock) -> None:
        self.inner = inner
        self.lock = lock

    @property  # type: ignore[override]
    def should_stop(self) -> Callable[[], bool] | None:
        return self.inner.should_stop

    @should_stop.setter
    def should_stop(self, value: Callable[[], bool] | None) -> None:
        self.inner.should_stop = value  # checked by the inner session between objects

    def add_prompt(self, prompt: Prompt) -> None:
        self.inner.add_prompt(prompt)

    def remove_object(self, obj_id: int) -> None:
        with self.lock:
            self.inner.remove_object(obj_id)

    def step(self, frame: Frame) -> TrackResult:
        with self.lock:
            return self.inner.step(frame)

    def reset(self) -> None:
        with self.lock:
            self.inner.reset()

    @property
    def object_ids(self) -> list[int]:
        return self.inner.object_ids

    def close(self) -> None:
        with self.lock:
            self.inner.close()

    @property
    def stats(self) -> Any:
        return self.inner.stats

    def metrics(self) -> dict[str, Any]:
        return self.inner.metrics()


class Sam2Tracker(Tracker):
    """A SAM-2-family export (``vostream export``) on a :class:`Runtime`.  The graphs are loaded once; every
    session allocates its own buffers (memory banks) on the shared runtime."""

    name = "sam2"

    def __init__(self, model: str | Path, runtime: Runtime, max_objects: int | None = None) -> None:
        if model is None:
            raise ConfigError("this backend needs --model DIR (a directory written by 'vostream export')")
        self.model_dir = Path(model)
        self.manifest: Manifest = load_manifest(self.model_dir)
        t0 = time.perf_counter()
        self.runtime = runtime
        try:
            runtime.load(self.manifest, self.model_dir)
        except BaseException:
            runtime.close()
            raise
        self.load_s = time.perf_counter() - t0
        #: objects one session may hold (None: no limit); device memory is planned for this many
        self.max_objects = max_objects
        self._lock = threading.Lock()
        self._closed = False

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        m = self.manifest
        return InputSpec(
            width=m.image_size,
            height=m.image_size,
            resize="stretch",
            mean=m.mean,
            std=m.std,
            layout="NCHW",
            dtype="float32",
        )

    def new_session(self) -> TrackerSession:
        with self._lock:
            if self.max_objects is not None:
                # free memory is measured now: open sessions count
                self.runtime.check_memory(self.manifest, self.max_objects)
            inner = Sam2Session(self.runtime, self.manifest, max_objects=self.max_objects)
        return _LockedSession(inner, self._lock)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self.runtime.close()


def OnnxTracker(
    model: str | Path | None = None,
    provider: str = "cpu",
    threads: int | None = None,
    device_id: int = 0,
    **options: Any,
) -> Sam2Tracker:
    """Backend ``onnx``: ONNX Runtime on CPU (default), CUDA or TensorRT."""
    if options:
        raise ConfigError(
            f"onnx backend: unknown option(s) {', '.join(sorted(options))}; known: model, provider, "
            "threads, device_id"
        )
    if model is None:
        raise ConfigError("--backend onnx needs --model DIR (a directory written by 'vostream export')")
    from .backends.ort import OrtRuntime

    load_manifest(model)  # a clear error for a bad directory before any runtime starts
    return Sam2Tracker(model, OrtRuntime(providers=[provider], device_id=device_id, threads=threads))


def AclTracker(
    model: str | Path | None = None,
    device_id: int = 0,
    max_objects: int = 8,
    om_dir: str | Path | None = None,
    acl: Any = None,
    **options: Any,
) -> Sam2Tracker:
    """Backend ``acl``: a SAM-2-family export whose graphs were converted to ``.om`` (ATC), on an Ascend NPU.

    ``acl``: the pyACL module to drive (``None``: ``import acl``, the real one from the CANN toolkit; tests pass
    the fake, ``tests/fakes/fake_acl.py``).  After loading, the device memory for one session of ``max_objects`` objects
    is planned against free HBM (``AclRuntime.check_memory``); a plan that does not fit is a :class:`ConfigError`
    with the numbers."""
    if options:
        raise ConfigError(
            f"acl backend: unknown option(s) {', '.join(sorted(options))}; known: model, device_id, "
            "max_objects, om_dir"
        )
    if model is None:
        raise ConfigError(
            "--backend acl needs --model DIR (a directory written by 'vostream export', with the "
            ".om files converted by ATC next to the .onnx files or in om_dir)"
        )
    if not isinstance(max_objects, int) or max_objects < 1:
        raise ConfigError(f"acl backend: max_objects must be an integer >= 1 (got {max_objects!r})")
    from .backends.acl import AclRuntime

    load_manifest(model)  # a clear error for a bad directory before the device is touched
    runtime = AclRuntime(device_id=device_id, om_dir=om_dir, acl=acl)
    tracker = Sam2Tracker(model, runtime, max_objects=max_objects)
    try:
        runtime.check_memory(tracker.manifest, max_objects)
    except BaseException:
        tracker.close()
        raise
    return tracker


__all__ = ["AclTracker", "OnnxTracker", "Sam2Tracker"]
