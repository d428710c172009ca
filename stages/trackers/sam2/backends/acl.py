"""``AclRuntime``: the pyACL (AscendCL) implementation of :class:`~.runtime.Runtime`.

Design (``docs/sam2-backend.md`` §0, §6; API facts from ``shared/reference/ascend-acl.md``):

* One device, one explicit context and one stream per runtime.  pyACL keeps the *current* context per thread, and
  pipeline stages call from their own threads, so every public method first makes the runtime's context current in
  the calling thread (``acl.rt.set_context``, once per thread and runtime).
* Graphs are ``.om`` files compiled by ATC from the export's ONNX graphs, loaded and checked against the manifest by
  :class:`~.acl_models.OmLoader`; the decoder's point count ``K`` is compiled as gears
  (:func:`~.acl_models.atc_dynamic_options`), and :meth:`AclRuntime.run` selects the gear of the bound ``points``
  view with ``acl.mdl.set_input_dynamic_dims`` before every execution.
* Memory is ``acl.rt.malloc`` (zeroed with ``acl.rt.memset``: fresh device memory is not initialised).  A
  :class:`DeviceBuffer` is a window ``ptr + offset``, so a bank slot is an interior pointer.  Model I/O addresses must
  be 64-byte aligned; every bound address is checked before execution.  How much memory sessions will take is
  planned against the free HBM (:mod:`.acl_memory`).
* Each graph has one input and one output dataset (one data buffer per tensor), built on its first run and then
  only *re-pointed* (``acl.update_data_buffer``) where the bound address or size changed -- e.g. the memory
  encoder's ``maskmem`` output moving to the next bank slot (:class:`~.acl_datasets.Datasets`).  Re-points are
  counted in :attr:`AclRuntime.repoints`.
* Execution is ``acl.mdl.execute_async`` + ``acl.rt.synchronize_stream`` (the synchronous ``acl.mdl.execute`` holds
  the GIL for the whole inference; ``synchronize_stream`` releases it).
* Every non-zero return code becomes a :class:`BackendError` naming the call, the code, its meaning
  (:data:`~.acl_api.ACL_ERRORS`) and ``acl.get_recent_err_msg()`` (:class:`~.acl_api.AclCalls`).

The real ``acl`` module defines no constants, so the ones used here are defined in :mod:`.acl_api`.  The ``acl``
module is injected: ``AclRuntime(acl=module)`` drives that module (the tests pass the fake, ``tests/fakes/fake_acl.py``);
``acl=None`` imports the real pyACL lazily.  The ``acl`` tracker factory is ``sam2.tracker.AclTracker``.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.backends.acl_api import (
    ACL_ERROR_REPEAT_INITIALIZE,
    ACL_ERRORS,
    ACL_HBM_MEM,
    ACL_MEM_MALLOC_HUGE_FIRST,
    ACL_MEMCPY_DEVICE_TO_HOST,
    ACL_MEMCPY_HOST_TO_DEVICE,
    ACL_SUCCESS,
    IO_ALIGN,
    AclCalls,
    align,
    describe_error,
    import_acl,
)
from vostream.stages.trackers.sam2.backends.acl_datasets import Datasets
from vostream.stages.trackers.sam2.backends.acl_memory import RESERVE_BYTES, does_not_fit, memory_plan
from vostream.stages.trackers.sam2.backends.acl_models import (
    DECODER_GEARS,
    OmGraph,
    OmLoader,
    atc_dynamic_options,
)
from vostream.stages.trackers.sam2.backends.binding import Allocation, BindingRuntime
from vostream.stages.trackers.sam2.runtime import DeviceBuffer, MemoryPlan

if TYPE_CHECKING:
    from vostream.stages.trackers.sam2.manifest import GraphSpec, Manifest

logger = logging.getLogger(__name__)

_RUNTIME_IDS = itertools.count(1)  # one token per runtime for the per-thread context cache
_TLS = threading.local()  # .token: the runtime whose context this thread made current last
_INIT_LOCK = threading.Lock()
_INIT_STATE = {"users": 0, "initialised_by_us": False}


class AclRuntime(BindingRuntime[Allocation]):
    """pyACL on one Ascend device: ``.om`` graphs, ``acl.rt.malloc`` buffers, datasets re-pointed per slot.

    ``device_id``: the NPU.  ``om_dir``: where the ``.om`` files are (default: the export directory itself).
    ``acl``: the pyACL module to drive (default ``None``: ``import acl``, the real one; tests inject the fake).
    Thread-safe in the sense the pipeline needs: any thread may call (the context is made current per thread) and
    calls are serialised by a lock (one model must not be executed concurrently).
    """

    name = "AclRuntime"

    def __init__(
        self, device_id: int = 0, om_dir: str | Path | None = None, acl: ModuleType | None = None
    ) -> None:
        super().__init__()
        self.device_id = int(device_id)
        self.om_dir = Path(om_dir) if om_dir is not None else None
        self._token = next(_RUNTIME_IDS)
        self._lock = threading.RLock()
        self._graphs: dict[str, OmGraph] = {}
        self._closed = False
        self._ctx = 0
        self._stream = 0
        self._device_set = False
        self._registered = False
        self.acl = acl if acl is not None else import_acl()
        self.is_fake = bool(getattr(self.acl, "__vostream_fake__", False))
        self._calls = AclCalls(self.acl, self.name)
        self._loader = OmLoader(self._calls, self.om_dir)
        self._datasets = Datasets(self._calls)
        #: graph -> how many data buffers were re-pointed (acl.update_data_buffer) since load
        self.repoints: dict[str, int] = self._datasets.repoints
        #: graph -> how many times a dynamic gear was set (acl.mdl.set_input_dynamic_dims)
        self.gear_sets: dict[str, int] = self._datasets.gear_sets
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def _start(self) -> None:
        acl = self.acl
        with _INIT_LOCK:
            ret = acl.init()
            if ret not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
                raise self._calls.error("__init__", "acl.init", ret)
            if ret == ACL_SUCCESS:
                _INIT_STATE["initialised_by_us"] = True
            _INIT_STATE["users"] += 1
            self._registered = True
        self._calls.check(
            acl.rt.set_device(self.device_id), "__init__", "acl.rt.set_device", f"device {self.device_id}"
        )
        self._device_set = True
        self._ctx = self._calls.pair(
            acl.rt.create_context(self.device_id), "__init__", "acl.rt.create_context"
        )
        _TLS.token = self._token  # create_context made it current in this thread
        self._stream = self._calls.pair(acl.rt.create_stream(), "__init__", "acl.rt.create_stream")

    def _enter(self, where: str) -> None:
        """Refuse calls on a closed runtime; make our context current in the calling thread (once per thread)."""
        if self._closed:
            raise BackendError(f"{self.name}.{where}: the runtime is closed")
        self._make_current(where)

    def _make_current(self, where: str) -> None:
        if getattr(_TLS, "token", None) != self._token:
            self._calls.check(
                self.acl.rt.set_context(self._ctx),
                where,
                "acl.rt.set_context",
                f"thread {threading.current_thread().name}",
            )
            _TLS.token = self._token

    def close(self) -> None:
        """Release everything in the documented order: synchronize, unload models, destroy descs, destroy data
        buffers and datasets, free device memory, destroy the stream and the context, reset the device; finalize
        ACL when this process's last runtime closes and vostream initialised it.  Idempotent.  Failures are
        collected; the first is raised at the end (only logged when an exception is already propagating)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            acl = self.acl
            errors: list[BackendError] = []

            def attempt(call: str, fn: Any, *args: Any, pair: bool = False) -> None:
                try:
                    ret = fn(*args)
                    if pair:
                        ret = ret[1]
                    if ret != ACL_SUCCESS:
                        errors.append(self._calls.error("close", call, ret))
                except Exception as exc:  # noqa: BLE001 - keep releasing the rest
                    errors.append(
                        BackendError(f"{self.name}.close: {call} raised {type(exc).__name__}: {exc}")
                    )

            if self._ctx:
                try:
                    self._make_current("close")
                except BackendError as exc:
                    errors.append(exc)
            if self._stream:
                attempt("acl.rt.synchronize_stream", acl.rt.synchronize_stream, self._stream)
            for g in self._graphs.values():
                attempt("acl.mdl.unload", acl.mdl.unload, g.model_id)
            for g in self._graphs.values():
                attempt("acl.mdl.destroy_desc", acl.mdl.destroy_desc, g.desc)
            for g in self._graphs.values():
                for buf in g.data_buffers:
                    attempt("acl.destroy_data_buffer", acl.destroy_data_buffer, buf)
                for ds in (g.in_ds, g.out_ds):
                    if ds:
                        attempt("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset, ds)
                if g.dyn_ptr:
                    attempt("acl.rt.free", acl.rt.free, g.dyn_ptr)
            self._graphs.clear()
            for a in self._allocs.values():
                attempt("acl.rt.free", acl.rt.free, a.ptr)
            self._allocs.clear()
            if self._stream:
                attempt("acl.rt.destroy_stream", acl.rt.destroy_stream, self._stream)
                self._stream = 0
            if self._ctx:
                attempt("acl.rt.destroy_context", acl.rt.destroy_context, self._ctx)
                self._ctx = 0
                if getattr(_TLS, "token", None) == self._token:
                    _TLS.token = None
            if self._device_set:
                attempt("acl.rt.reset_device", acl.rt.reset_device, self.device_id)
                self._device_set = False
            if self._registered:
                with _INIT_LOCK:
                    _INIT_STATE["users"] -= 1
                    if _INIT_STATE["users"] <= 0:
                        _INIT_STATE["users"] = 0
                        if _INIT_STATE["initialised_by_us"]:
                            _INIT_STATE["initialised_by_us"] = False
                            attempt("acl.finalize", acl.finalize)
                self._registered = False
            if errors:
                if sys.exc_info()[0] is not None:
                    for e in errors:
                        logger.warning("%s", e)
                    return
                for e in errors[1:]:
                    logger.warning("%s", e)
                raise errors[0]

    def __enter__(self) -> AclRuntime:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> str:
        """One line for logs: SoC, CANN/pyACL version, device, graphs and live memory."""
        live = sum(a.nbytes for a in self._allocs.values())
        soc = "?"
        version = "?"
        try:
            soc = str(self.acl.get_soc_name())
            major, minor, patch, ret = self.acl.get_version()
            version = f"{major}.{minor}.{patch}" if ret == ACL_SUCCESS else "?"
        except Exception as exc:  # noqa: BLE001 - description only
            logger.debug("AclRuntime.describe: %s", exc)
        state = (
            "closed"
            if self._closed
            else (f"{len(self._graphs)} graphs, {len(self._allocs)} buffers ({live / 2**20:.1f} MiB)")
        )
        return (
            f"AclRuntime({'fake ' if self.is_fake else ''}acl {version}, {soc}, device {self.device_id}, "
            f"{state})"
        )

    # -- loading -----------------------------------------------------------------------------------------------------
    def om_path(self, spec: GraphSpec, model_dir: Path) -> Path:
        """Where the ``.om`` of ``spec`` is expected: ``<om_dir or model_dir>/<file stem>.om``."""
        return self._loader.path(spec, model_dir)

    def load(self, manifest: Manifest, model_dir: Path) -> None:
        """Load every graph's ``.om``, check its I/O against the manifest, read its dynamic gears."""
        with self._lock:
            self._enter("load")
            for gname, spec in manifest.graphs.items():
                self._graphs[gname] = self._loader.load(gname, spec, Path(model_dir))
                self._datasets.loaded(gname)

    @property
    def max_points(self) -> int | None:
        """The largest compiled K of the decoder (the session rejects prompts with more points up front)."""
        ks = [v["K"] for v in self.gears.get("decoder", []) if "K" in v]
        return max(ks) if ks else None

    @property
    def gears(self) -> dict[str, list[dict[str, int]]]:
        """``graph -> compiled gears`` (symbol values, e.g. ``[{"K": 1}, ..., {"K": 8}]``) of dynamic graphs."""
        return {n: list(g.gears.values()) for n, g in self._graphs.items() if g.gears}

    # -- memory ------------------------------------------------------------------------------------------------------
    def alloc(self, shape: tuple[int, ...], dtype: str, name: str = "") -> DeviceBuffer:
        """A zero-filled device buffer (``acl.rt.malloc`` + ``acl.rt.memset``), its size rounded up to 64 bytes."""
        with self._lock:
            self._enter("alloc")
            shape, nbytes = self._alloc_args(shape, dtype, name)
            size = max(align(nbytes, IO_ALIGN), IO_ALIGN)
            where = f"alloc({name or '?'})"
            ptr = self._calls.pair(
                self.acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST), where, "acl.rt.malloc", f"{size} bytes"
            )
            try:
                self._calls.check(
                    self.acl.rt.memset(ptr, size, 0, size), where, "acl.rt.memset", f"{size} bytes"
                )
            except BaseException:
                self.acl.rt.free(ptr)
                raise
            return self._register(Allocation(int(ptr), nbytes, name), shape, dtype, name)

    def upload(self, dst: DeviceBuffer, src: np.ndarray) -> None:
        """Copy ``src`` (same dtype and number of elements as ``dst``) host -> device with ``acl.rt.memcpy``."""
        with self._lock:
            self._enter("upload")
            a = self._alloc_of(dst, "upload")
            src = self._upload_source(dst, src)
            if dst.nbytes:
                host = np.ascontiguousarray(src)
                # the address numpy_to_ptr would return, without its per-call deprecation warning
                self._calls.check(
                    self.acl.rt.memcpy(
                        a.ptr + dst.offset,
                        dst.nbytes,
                        int(host.ctypes.data),
                        dst.nbytes,
                        ACL_MEMCPY_HOST_TO_DEVICE,
                    ),
                    f"upload({dst.name or dst.handle})",
                    "acl.rt.memcpy",
                    f"host->device, {dst.nbytes} bytes",
                )
            self._count_h2d(dst.nbytes)

    def download(self, src: DeviceBuffer, out: np.ndarray | None = None) -> np.ndarray:
        """Copy device -> host into ``out`` (or a new array) shaped ``src.shape`` with ``acl.rt.memcpy``."""
        with self._lock:
            self._enter("download")
            a = self._alloc_of(src, "download")
            out = self._download_target(src, out)
            if src.nbytes:
                self._calls.check(
                    self.acl.rt.memcpy(
                        int(out.ctypes.data),
                        src.nbytes,
                        a.ptr + src.offset,
                        src.nbytes,
                        ACL_MEMCPY_DEVICE_TO_HOST,
                    ),
                    f"download({src.name or src.handle})",
                    "acl.rt.memcpy",
                    f"device->host, {src.nbytes} bytes",
                )
            self._count_d2h(src.nbytes)
            return out

    def free(self, buf: DeviceBuffer) -> None:
        """Release the allocation behind ``buf`` (any view of it) with ``acl.rt.free``."""
        with self._lock:
            self._enter("free")
            a = self._forget(buf)
            self._calls.check(self.acl.rt.free(a.ptr), f"free({a.name or buf.handle})", "acl.rt.free")

    # -- memory plan -------------------------------------------------------------------------------------------------
    def plan(
        self, manifest: Manifest, objects: int, sessions: int = 1, reserve_bytes: int = RESERVE_BYTES
    ) -> MemoryPlan:
        """Device memory ``sessions`` sessions of ``objects`` objects each will allocate, against free HBM now
        (:func:`~.acl_memory.memory_plan`).  The .om models' own work and weight memory was taken at load, so it is
        already missing from ``free_bytes``."""
        with self._lock:
            self._enter("plan")
            return memory_plan(manifest, objects, sessions, reserve_bytes, lambda: self._mem_info("plan"))

    def check_memory(
        self, manifest: Manifest, objects: int, sessions: int = 1, reserve_bytes: int = RESERVE_BYTES
    ) -> MemoryPlan:
        """:meth:`plan`, raising :class:`ConfigError` with the numbers when it does not fit the free HBM."""
        p = self.plan(manifest, objects, sessions, reserve_bytes)
        if not p["fits"]:
            raise does_not_fit(p, self.device_id)
        return p

    def _mem_info(self, where: str) -> tuple[int, int]:
        free, total, ret = self.acl.rt.get_mem_info(ACL_HBM_MEM)
        self._calls.check(ret, where, "acl.rt.get_mem_info", "ACL_HBM_MEM")
        return int(free), int(total)

    # -- running -----------------------------------------------------------------------------------------------------
    def run(
        self, graph: str, inputs: Mapping[str, DeviceBuffer], outputs: Mapping[str, DeviceBuffer]
    ) -> None:
        """Run ``graph`` on device buffers bound by name (every input and output exactly once, dtypes and static
        dims as in the manifest, one value per dynamic symbol, outputs overlapping nothing else, 64-byte aligned
        addresses).  Data buffers are re-pointed where the bound window moved; dynamic graphs get their gear set;
        then ``execute_async`` and ``synchronize_stream``."""
        with self._lock:
            self._enter("run")
            g = self._graphs.get(graph)
            if g is None:
                raise BackendError(
                    f"{self.name}.run: graph {graph!r} is not loaded (loaded: "
                    f"{', '.join(self._graphs) or 'none'})"
                )
            where = f"run({graph!r})"

            def aligned(kind: str, n: str, buf: DeviceBuffer, addr: int) -> None:
                if addr % IO_ALIGN:
                    raise BackendError(
                        f"{self.name}.{where}: {kind} {n!r} is bound to buffer "
                        f"{buf.name or buf.handle} at byte offset {buf.offset}, address "
                        f"0x{addr:x} is not {IO_ALIGN}-byte aligned (model I/O must be; slot sizes "
                        f"must be multiples of {IO_ALIGN} bytes)"
                    )

            bound, syms = self._check_bindings(
                graph,
                f"{self.name}.{where}",
                (
                    ("input", [t.spec for t in g.inputs], inputs),
                    ("output", [t.spec for t in g.outputs], outputs),
                ),
                aligned,
            )
            index = {
                (kind, t.spec.name): t.index
                for kind, ts in (("input", g.inputs), ("output", g.outputs))
                for t in ts
            }
            addrs = {(b.kind, index[(b.kind, b.spec.name)]): (b.addr, b.buf.nbytes) for b in bound}
            self._datasets.bind(g, where, addrs)
            if g.dyn_index >= 0:
                self._datasets.set_gear(g, where, syms)
            t0 = time.perf_counter()
            self._calls.check(
                self.acl.mdl.execute_async(g.model_id, g.in_ds, g.out_ds, self._stream),
                where,
                "acl.mdl.execute_async",
                f"model {g.model_id}",
            )
            self._calls.check(
                self.acl.rt.synchronize_stream(self._stream),
                where,
                "acl.rt.synchronize_stream",
                f"after executing model {g.model_id}",
            )
            self._count_run(graph, t0)


__all__ = [
    "ACL_ERRORS",
    "DECODER_GEARS",
    "RESERVE_BYTES",
    "AclRuntime",
    "atc_dynamic_options",
    "describe_error",
]
