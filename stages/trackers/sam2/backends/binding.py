"""What ``OrtRuntime`` and ``AclRuntime`` share: the table of live allocations behind :class:`DeviceBuffer`
handles, window checks, views, upload/download argument checks, and the checks of a graph's bindings (names, dtypes,
static dims, one value per dynamic symbol, no output overlapping another bound tensor).

A runtime keeps one :class:`Allocation` (or a subclass with its own fields) per live allocation in ``self._allocs``;
a :class:`DeviceBuffer` names it by ``handle`` and is a window ``[offset, offset + nbytes)`` into it.  Error messages
start with the runtime's ``name`` and the call (``"OrtRuntime.run('decoder'): ..."``).  Transfer accounting is
:class:`~..runtime.Runtime`'s (``_count_h2d`` / ``_count_d2h`` / ``_count_run``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.runtime import DTYPES, DeviceBuffer, Runtime

if TYPE_CHECKING:
    from vostream.stages.trackers.sam2.manifest import TensorSpec

#: buffer handles are unique across every runtime of the process, so a buffer from another runtime is never mistaken
_HANDLES = itertools.count(1)


@dataclass
class Allocation:
    """One device allocation: ``nbytes`` usable bytes at address ``ptr``."""

    ptr: int
    nbytes: int
    name: str


A = TypeVar("A", bound=Allocation)


# -- binding checks (``where`` prefixes every message, e.g. "OrtRuntime.run('decoder')") ----------------------------
def fmt_shape(shape: Sequence[object]) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def check_bound_names(where: str, kind: str, names: Sequence[str], given: Mapping[str, DeviceBuffer]) -> None:
    """Every name in ``given`` is an ``kind`` of the graph (the missing ones are caught per tensor)."""
    for n in given:
        if n not in names:
            raise BackendError(f"{where}: {n!r} is not an {kind} of the graph ({kind}s: {', '.join(names)})")


def check_tensor(
    where: str, kind: str, spec: TensorSpec, buf: DeviceBuffer | None, syms: dict[str, tuple[int, str]]
) -> DeviceBuffer:
    """``buf`` is bound and matches ``spec``'s dtype and static dims; a dynamic axis symbol (``syms``: symbol ->
    (value, first tensor)) takes one value across the run.  Returns ``buf``."""
    if buf is None:
        raise BackendError(f"{where}: {kind} {spec.name!r} is not bound")
    if buf.dtype != spec.dtype:
        raise BackendError(f"{where}: {kind} {spec.name!r} dtype: graph {spec.dtype}, buffer {buf.dtype}")
    ok = len(buf.shape) == len(spec.shape)
    if ok:
        for want, got in zip(spec.shape, buf.shape):
            if isinstance(want, str):
                prev = syms.setdefault(want, (got, spec.name))
                if prev[0] != got:
                    raise BackendError(
                        f"{where}: {kind} {spec.name!r} has {want}={got} but {prev[1]!r} has {want}={prev[0]}"
                    )
            elif want != got:
                ok = False
    if not ok:
        raise BackendError(
            f"{where}: {kind} {spec.name!r} shape: graph {fmt_shape(spec.shape)}, buffer "
            f"{fmt_shape(buf.shape)}"
        )
    return buf


def check_no_overlap(where: str, spans: Iterable[tuple[str, str, int, int, int]]) -> None:
    """No output shares memory with another bound tensor; ``spans``: (kind, name, handle, start, end)."""
    spans = list(spans)
    for kind, n, h, s, e in spans:
        if kind != "output":
            continue
        for kind2, n2, h2, s2, e2 in spans:
            if h2 == h and (kind2, n2) != (kind, n) and s < e2 and s2 < e:
                raise BackendError(f"{where}: output {n!r} overlaps {kind2} {n2!r} (same memory bound twice)")


@dataclass(frozen=True)
class Bound:
    """One checked binding of a run: the graph tensor, the buffer bound to it and its device address."""

    kind: str
    spec: TensorSpec
    buf: DeviceBuffer
    addr: int


class BindingRuntime(Runtime, Generic[A]):
    """A :class:`Runtime` whose buffers are windows into allocations it tracks in ``self._allocs``."""

    def __init__(self) -> None:
        super().__init__()
        self._allocs: dict[int, A] = {}

    # -- allocations -------------------------------------------------------------------------------------------------
    def _alloc_args(self, shape: tuple[int, ...], dtype: str, name: str) -> tuple[tuple[int, ...], int]:
        """Check :meth:`alloc`'s arguments; returns (shape as ints, bytes)."""
        if dtype not in DTYPES:
            raise BackendError(
                f"{self.name}.alloc({name or '?'}): unsupported dtype {dtype!r} "
                f"(supported: {', '.join(DTYPES)})"
            )
        shape = tuple(shape)
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise BackendError(f"{self.name}.alloc({name or '?'}): bad shape {shape}")
        shape = tuple(int(d) for d in shape)
        return shape, prod(shape) * DTYPES[dtype].itemsize

    def _register(self, alloc: A, shape: tuple[int, ...], dtype: str, name: str) -> DeviceBuffer:
        """Track ``alloc`` under a new handle; returns the buffer covering all of it."""
        handle = next(_HANDLES)
        self._allocs[handle] = alloc
        return DeviceBuffer(handle, 0, shape, dtype, alloc.nbytes, name)

    def _alloc_of(self, buf: DeviceBuffer, call: str) -> A:
        """The live allocation behind ``buf``, after checking the window is consistent and inside it."""
        a = self._allocs.get(buf.handle) if isinstance(buf, DeviceBuffer) else None
        if a is None:
            what = f"buffer {buf.name or buf.handle}" if isinstance(buf, DeviceBuffer) else type(buf).__name__
            raise BackendError(
                f"{self.name}.{call}: {what} is not a live buffer of this runtime (freed, or from "
                "another runtime)"
            )
        if (
            buf.dtype not in DTYPES
            or buf.nbytes != prod(buf.shape) * DTYPES[buf.dtype].itemsize
            or buf.offset < 0
            or buf.offset + buf.nbytes > a.nbytes
        ):
            raise BackendError(
                f"{self.name}.{call}: buffer {buf.name or buf.handle} window [{buf.offset}, "
                f"+{buf.nbytes}) {buf.dtype}{fmt_shape(buf.shape)} does not fit its {a.nbytes}-byte "
                "allocation"
            )
        return a

    def _forget(self, buf: DeviceBuffer) -> A:
        """Stop tracking the allocation behind ``buf`` (for :meth:`free`); returns it."""
        a = self._allocs.pop(buf.handle, None)
        if a is None:
            raise BackendError(
                f"{self.name}.free: buffer {buf.name or buf.handle} is not live (double free, or "
                "from another runtime)"
            )
        return a

    def view(self, buf: DeviceBuffer, offset_elems: int, shape: tuple[int, ...]) -> DeviceBuffer:
        """A window into ``buf`` (no copy); see :meth:`Runtime.view`."""
        self._alloc_of(buf, "view")
        return super().view(buf, offset_elems, shape)

    def live_buffers(self) -> int:
        """How many allocations are alive (0 after :meth:`close`, for leak checks)."""
        return len(self._allocs)

    # -- copies ------------------------------------------------------------------------------------------------------
    def _upload_source(self, dst: DeviceBuffer, src: np.ndarray) -> np.ndarray:
        """``src`` as an array with ``dst``'s dtype and number of elements, or a :class:`BackendError`."""
        src = np.asarray(src)
        if src.dtype != DTYPES[dst.dtype] or src.size != dst.size:
            raise BackendError(
                f"{self.name}.upload({dst.name or dst.handle}): source {src.dtype}"
                f"{list(src.shape)} does not match buffer {dst.dtype}{list(dst.shape)}"
            )
        return src

    def _download_target(self, src: DeviceBuffer, out: np.ndarray | None) -> np.ndarray:
        """``out``, or a new array, shaped and typed like ``src`` (a writeable C-contiguous one)."""
        dt = DTYPES[src.dtype]
        if out is None:
            return np.empty(src.shape, dt)
        if out.dtype != dt or out.shape != src.shape or not out.flags.c_contiguous or not out.flags.writeable:
            raise BackendError(
                f"{self.name}.download({src.name or src.handle}): out {out.dtype}{list(out.shape)} "
                f"must be a writeable C-contiguous {src.dtype}{list(src.shape)} array"
            )
        return out

    # -- runs --------------------------------------------------------------------------------------------------------
    def _check_bindings(
        self,
        graph: str,
        where: str,
        tensors: Iterable[tuple[str, Sequence[TensorSpec], Mapping[str, DeviceBuffer]]],
        check_addr: Callable[[str, str, DeviceBuffer, int], None] | None = None,
    ) -> tuple[list[Bound], dict[str, tuple[int, str]]]:
        """Check one run's bindings: for each ``(kind, specs, given)`` every name in ``given`` is a graph tensor,
        every tensor is bound once to a live buffer with its dtype and static dims, one value per dynamic symbol,
        ``check_addr(kind, name, buf, addr)`` (e.g. alignment), and no output overlaps another bound tensor.
        Returns the bindings in graph order and the symbol values (``{"K": (3, "points")}``)."""
        bound: list[Bound] = []
        spans: list[tuple[str, str, int, int, int]] = []  # kind, name, handle, start, end
        syms: dict[str, tuple[int, str]] = {}
        for kind, specs, given in tensors:
            check_bound_names(where, kind, [s.name for s in specs], given)
            for spec in specs:
                n = spec.name
                buf = check_tensor(where, kind, spec, given.get(n), syms)
                addr = self._alloc_of(buf, f"run({graph!r}) {kind} {n!r}").ptr + buf.offset
                if check_addr is not None:
                    check_addr(kind, n, buf, addr)
                bound.append(Bound(kind, spec, buf, addr))
                spans.append((kind, n, buf.handle, buf.offset, buf.offset + buf.nbytes))
        check_no_overlap(where, spans)
        return bound, syms


__all__ = [
    "Allocation",
    "BindingRuntime",
    "Bound",
    "check_bound_names",
    "check_no_overlap",
    "check_tensor",
    "fmt_shape",
]
