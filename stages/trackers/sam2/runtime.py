"""The device interface the SAM-2 streaming session is written against (``docs/sam2-backend.md`` §0).

A :class:`Runtime` owns device memory and compiled graphs.  The session addresses everything through
:class:`DeviceBuffer` handles: it allocates the memory bank once per object, asks for *views* of single slots (no
copy) and binds them as graph outputs, so the memory encoder writes straight into the bank and memory attention reads
it in place.  Every host<->device copy goes through :meth:`Runtime.upload` / :meth:`Runtime.download`, which count
bytes, so a test can prove the bank never crosses.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from vostream.pipeline.errors import BackendError

if TYPE_CHECKING:
    from .manifest import Manifest

#: dtype names used in manifests and buffers -> NumPy dtypes
DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "int64": np.dtype(np.int64),
    "int32": np.dtype(np.int32),
    "uint8": np.dtype(np.uint8),
    "bool": np.dtype(np.bool_),
}


@dataclass(frozen=True, eq=False)
class DeviceBuffer:
    """A typed window ``[offset, offset + nbytes)`` into the allocation ``handle`` (identity-compared)."""

    handle: int
    offset: int
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    name: str = ""

    @property
    def size(self) -> int:
        return prod(self.shape)


@dataclass
class TransferStats:
    """Host<->device traffic and graph runs since the last :meth:`reset`."""

    h2d_bytes: int = 0
    d2h_bytes: int = 0
    d2d_bytes: int = 0
    h2d_calls: int = 0
    d2h_calls: int = 0
    runs: dict[str, int] = field(default_factory=dict)
    run_s: dict[str, float] = field(default_factory=dict)

    def snapshot(self) -> TransferStats:
        return TransferStats(
            self.h2d_bytes,
            self.d2h_bytes,
            self.d2d_bytes,
            self.h2d_calls,
            self.d2h_calls,
            dict(self.runs),
            dict(self.run_s),
        )

    def reset(self) -> None:
        self.h2d_bytes = self.d2h_bytes = self.d2d_bytes = self.h2d_calls = self.d2h_calls = 0
        self.runs.clear()
        self.run_s.clear()

    def minus(self, before: TransferStats) -> TransferStats:
        """The traffic between ``before`` and now."""
        return TransferStats(
            self.h2d_bytes - before.h2d_bytes,
            self.d2h_bytes - before.d2h_bytes,
            self.d2d_bytes - before.d2d_bytes,
            self.h2d_calls - before.h2d_calls,
            self.d2h_calls - before.d2h_calls,
            {k: v - before.runs.get(k, 0) for k, v in self.runs.items()},
            {k: v - before.run_s.get(k, 0.0) for k, v in self.run_s.items()},
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "h2d_bytes": self.h2d_bytes,
            "d2h_bytes": self.d2h_bytes,
            "d2d_bytes": self.d2d_bytes,
            "h2d_calls": self.h2d_calls,
            "d2h_calls": self.d2h_calls,
            "runs": dict(self.runs),
            "run_ms": {k: round(v * 1e3, 3) for k, v in self.run_s.items()},
        }


class MemoryPlan(TypedDict):
    """Device memory a number of sessions will allocate, against the free memory now (:meth:`Runtime.check_memory`)."""

    objects: int
    sessions: int
    bank_bytes: int
    pointer_bytes: int
    per_object_bytes: int
    session_scratch_bytes: int
    reserve_bytes: int
    need_bytes: int
    free_bytes: int
    total_bytes: int
    max_objects: int
    fits: bool


class Runtime(ABC):
    """One device, one driving thread; not thread-safe.  Every method raises ``BackendError`` naming the call.

    Optional capabilities are members with a default here (``max_points``, ``dynamic_shapes``,
    :meth:`check_memory`), so a caller reads them directly and a backend overrides what it has."""

    name: str = "runtime"
    #: graphs may be run with shorter views on their shrinkable axes (``GraphSpec.shrinkable``)
    dynamic_shapes: bool = False

    def __init__(self) -> None:
        self.stats = TransferStats()

    @property
    def max_points(self) -> int | None:
        """Most prompt points (clicks + box corners) one decoder call takes; None = no limit beyond the session's
        own (the Ascend decoder is compiled for a fixed set of point counts)."""
        return None

    def check_memory(self, manifest: Manifest, objects: int) -> MemoryPlan | None:
        """Plan device memory for one session of ``objects`` objects and raise ``ConfigError`` when it does
        not fit; ``None`` when this runtime does not plan (the default: host memory, or a device that pages)."""
        return None

    @abstractmethod
    def load(self, manifest: Manifest, model_dir: Path) -> None:
        """Load every graph of ``manifest`` from ``model_dir`` and check its I/O against the manifest."""

    @abstractmethod
    def alloc(self, shape: tuple[int, ...], dtype: str, name: str = "") -> DeviceBuffer:
        """A zero-filled device buffer."""

    def view(self, buf: DeviceBuffer, offset_elems: int, shape: tuple[int, ...]) -> DeviceBuffer:
        """A window into ``buf`` starting ``offset_elems`` elements in (no copy)."""
        itemsize = DTYPES[buf.dtype].itemsize
        nbytes = prod(shape) * itemsize
        start = buf.offset + offset_elems * itemsize
        if offset_elems < 0 or start + nbytes > buf.offset + buf.nbytes:
            raise BackendError(
                f"{self.name}.view: [{offset_elems}, +{prod(shape)}) elements is outside buffer "
                f"{buf.name or buf.handle} of {buf.size}"
            )
        return DeviceBuffer(buf.handle, start, tuple(shape), buf.dtype, nbytes, buf.name)

    @abstractmethod
    def upload(self, dst: DeviceBuffer, src: np.ndarray) -> None:
        """Copy ``src`` (same size and dtype as ``dst``) host -> device."""

    @abstractmethod
    def download(self, src: DeviceBuffer, out: np.ndarray | None = None) -> np.ndarray:
        """Copy device -> host; returns an array shaped ``src.shape``."""

    @abstractmethod
    def run(
        self, graph: str, inputs: Mapping[str, DeviceBuffer], outputs: Mapping[str, DeviceBuffer]
    ) -> None:
        """Run ``graph`` reading ``inputs`` and writing ``outputs`` in place (all device buffers)."""

    @abstractmethod
    def free(self, buf: DeviceBuffer) -> None:
        """Release the allocation behind ``buf`` (views of it become invalid)."""

    @abstractmethod
    def live_buffers(self) -> int:
        """How many allocations are alive (leak checks)."""

    @abstractmethod
    def close(self) -> None:
        """Free everything, unload the graphs.  Idempotent."""

    # -- helpers shared by implementations -------------------------------------------------------------------------
    def _count_h2d(self, nbytes: int) -> None:
        self.stats.h2d_bytes += nbytes
        self.stats.h2d_calls += 1

    def _count_d2h(self, nbytes: int) -> None:
        self.stats.d2h_bytes += nbytes
        self.stats.d2h_calls += 1

    def _count_run(self, graph: str, t0: float) -> None:
        self.stats.runs[graph] = self.stats.runs.get(graph, 0) + 1
        self.stats.run_s[graph] = self.stats.run_s.get(graph, 0.0) + (time.perf_counter() - t0)


__all__ = ["DTYPES", "DeviceBuffer", "MemoryPlan", "Runtime", "TransferStats"]
