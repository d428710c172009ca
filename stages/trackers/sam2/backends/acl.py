"""``AclRuntime``: the pyACL (AscendCL) implementation of :class:`~.runtime.Runtime`.

Design (``docs/sam2-backend.md`` §0, §6; API facts from ``shared/reference/ascend-acl.md``):

* One device, one explicit context and one stream per runtime.  pyACL keeps the *current* context per thread, and
  pipeline stages call from their own threads, so every public method first makes the runtime's context current in
  the calling thread (``acl.rt.set_context``, once per thread and runtime).
* Graphs are ``.om`` files compiled by ATC from the export's ONNX graphs: ``<model_dir>/<stem>.om`` (or
  ``<om_dir>/<stem>.om``), ``stem`` = the manifest's ``file`` without ``.onnx``.  Their I/O (names, order, static
  dims, dtypes) is checked against the manifest at load.  The decoder's point count ``K`` is dynamic: ATC compiles it
  as gears (``--input_shape "points:1,-1,2;labels:1,-1" --dynamic_dims "1,1;2,2;...;8,8"``, see
  :func:`atc_dynamic_options`), and :meth:`AclRuntime.run` selects the gear of the bound ``points`` view with
  ``acl.mdl.set_input_dynamic_dims`` before every execution.
* Memory is ``acl.rt.malloc`` (zeroed with ``acl.rt.memset``: fresh device memory is not initialised).  A
  :class:`DeviceBuffer` is a window ``ptr + offset``, so a bank slot is an interior pointer.  Model I/O addresses must
  be 64-byte aligned; every bound address is checked before execution.
* Each graph has one input and one output dataset (one data buffer per tensor), built on its first run and then
  only *re-pointed* (``acl.update_data_buffer``) where the bound address or size changed -- e.g. the memory
  encoder's ``maskmem`` output moving to the next bank slot.  Re-points are counted in :attr:`AclRuntime.repoints`.
* Execution is ``acl.mdl.execute_async`` + ``acl.rt.synchronize_stream`` (the synchronous ``acl.mdl.execute`` holds
  the GIL for the whole inference; ``synchronize_stream`` releases it).
* Every non-zero return code becomes a :class:`BackendError` naming the call, the code, its meaning
  (:data:`ACL_ERRORS`) and ``acl.get_recent_err_msg()``.

The real ``acl`` module defines no constants, so the ones used here are defined below.  The ``acl`` module is
injected: ``AclRuntime(acl=module)`` drives that module (the tests pass the fake, ``tests/fakes/fake_acl.py``);
``acl=None`` imports the real pyACL lazily.  The ``acl`` tracker factory is ``sam2.tracker.AclTracker``.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vostream.pipeline.errors import BackendError, ConfigError
from vostream.stages.trackers.sam2.backends.binding import Allocation, BindingRuntime, fmt_shape
from vostream.stages.trackers.sam2.runtime import DTYPES, DeviceBuffer
from vostream.stages.trackers.sam2.session import MAX_POINTS

if TYPE_CHECKING:
    from vostream.stages.trackers.sam2.manifest import GraphSpec, Manifest, TensorSpec

logger = logging.getLogger(__name__)

# -- pyACL constants (acl_base_rt.h / acl_rt.h; the extension module exports none) -----------------------------------
ACL_SUCCESS = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEM_MALLOC_HUGE_FIRST = 0  # huge pages when the size allows, else normal pages
ACL_HBM_MEM = 1  # aclrtMemAttr for acl.rt.get_mem_info
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

#: aclDataType -> our dtype names (others keep a readable name for error messages)
ACL_DTYPES: dict[int, str] = {
    0: "float32",
    1: "float16",
    2: "int8",
    3: "int32",
    4: "uint8",
    6: "int16",
    7: "uint16",
    8: "uint32",
    9: "int64",
    10: "uint64",
    11: "float64",
    12: "bool",
    27: "bfloat16",
}

#: ACL error code -> (symbolic name, meaning); shared/reference/ascend-acl.md §7 plus codes the fake documents
ACL_ERRORS: dict[int, tuple[str, str]] = {
    100000: ("ACL_ERROR_INVALID_PARAM", "invalid parameter (NULL pointer, size 0, wrong index)"),
    100001: ("ACL_ERROR_UNINITIALIZE", "acl.init was not called"),
    100002: ("ACL_ERROR_REPEAT_INITIALIZE", "acl.init was already called in this process"),
    100003: ("ACL_ERROR_INVALID_FILE", "the file is missing or unreadable"),
    100011: ("ACL_ERROR_INVALID_MODEL_ID", "unknown or unloaded model id"),
    100013: (
        "ACL_ERROR_PARSE_MODEL",
        (
            "the model file cannot be parsed (built for another CANN version or SoC, "
            "or it has dynamic dims without compiled gears)"
        ),
    ),
    100017: ("ACL_ERROR_MODEL_INPUT_NOT_MATCH", "input dataset buffers do not match the model inputs"),
    100018: ("ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", "output dataset buffers do not match the model outputs"),
    100019: ("ACL_ERROR_MODEL_NOT_DYNAMIC", "a dynamic-shape call on a model compiled without gears"),
    100037: ("ACL_ERROR_REPEAT_FINALIZE", "acl.finalize without a matching acl.init"),
    107000: (
        "ACL_ERROR_RT_PARAM_INVALID",
        "invalid runtime parameter (bad or freed device pointer or handle)",
    ),
    107001: ("ACL_ERROR_RT_INVALID_DEVICEID", "invalid device id"),
    107002: (
        "ACL_ERROR_RT_CONTEXT_NULL",
        "the calling thread has no current context (acl.rt.set_context missing)",
    ),
    107003: ("ACL_ERROR_RT_STREAM_CONTEXT", "the stream belongs to another context"),
    107004: ("ACL_ERROR_RT_MODEL_CONTEXT", "the model belongs to another context"),
    107008: ("ACL_ERROR_RT_ADDR_UNALIGNED", "an address is not aligned (model I/O needs 64-byte alignment)"),
    107037: ("ACL_ERROR_RT_MODEL_RUNNING", "the model still has queued work; synchronize the stream first"),
    145007: (
        "ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID",
        "a model input/output address is not valid device memory",
    ),
    145013: ("ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID", "the batch size is not a compiled gear"),
    145021: ("ACL_ERROR_GE_SHAPE_INVALID", "the shape is not a compiled gear"),
    200000: ("ACL_ERROR_BAD_ALLOC", "out of memory"),
    207000: ("ACL_ERROR_RT_FEATURE_NOT_SUPPORT", "feature not supported"),
    207001: ("ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory allocation failed (out of HBM)"),
    207008: ("ACL_ERROR_RT_NO_STREAM_RESOURCE", "no stream resources left on the device"),
    207018: ("ACL_ERROR_RT_DEVICE_OOM", "the device is out of memory"),
    500001: ("ACL_ERROR_FAILURE", "generic failure; see the device log (plog)"),
    500002: ("ACL_ERROR_GE_FAILURE", "graph engine failure; see the device log (plog)"),
    500003: ("ACL_ERROR_RT_FAILURE", "runtime failure; see the device log (plog)"),
    507011: ("ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed on the device; see the device log (plog)"),
    507012: ("ACL_ERROR_RT_REPORT_TIMEOUT", "callback report timed out"),
    507014: ("ACL_ERROR_RT_AICORE_TIMEOUT", "AI Core kernel timed out; see the device log (plog)"),
    507015: ("ACL_ERROR_RT_AICORE_EXCEPTION", "AI Core kernel fault; see the device log (plog)"),
    507035: ("ACL_ERROR_RT_VECTOR_CORE_EXCEPTION", "vector core kernel fault; see the device log (plog)"),
    507046: ("ACL_ERROR_RT_STREAM_SYNC_TIMEOUT", "stream synchronisation timed out"),
    507053: ("ACL_ERROR_RT_DEVICE_MEM_ERROR", "uncorrectable HBM error"),
    507899: ("ACL_ERROR_RT_DRV_INTERNAL_ERROR", "driver internal error"),
}

#: required alignment of model input/output addresses (and of every allocation's size, so slot views stay aligned)
IO_ALIGN = 64
#: the decoder's point-count gears the .om is expected to be compiled with (ATC --dynamic_dims)
DECODER_GEARS: tuple[int, ...] = tuple(range(1, 9))
#: device memory kept free on top of the plan (runtime workspace, fragmentation)
RESERVE_BYTES = 64 << 20
#: tensors that are per object (bank, pointer ring) or views of them, not session scratch
_PER_OBJECT = {"bank", "ptrs", "maskmem", "obj_ptr"}

_RUNTIME_IDS = itertools.count(1)  # one token per runtime for the per-thread context cache
_TLS = threading.local()  # .token: the runtime whose context this thread made current last
_INIT_LOCK = threading.Lock()
_INIT_STATE = {"users": 0, "initialised_by_us": False}


def describe_error(code: int) -> str:
    """``"507011 (ACL_ERROR_RT_MODEL_EXECUTE: model execution failed ...)"``."""
    name, meaning = ACL_ERRORS.get(
        code, ("unknown ACL error", "not in vostream's table; see the CANN error codes")
    )
    return f"{code} ({name}: {meaning})"


def atc_dynamic_options(spec: GraphSpec, gears: Sequence[int] = DECODER_GEARS) -> dict[str, str]:
    """ATC ``--input_shape`` / ``--dynamic_dims`` values for a graph whose manifest shapes have symbolic axes.

    Every symbolic axis becomes ``-1``; each gear gives every ``-1`` the same value (one symbol, e.g. ``K``), e.g.
    ``{"input_shape": "...;points:1,-1,2;labels:1,-1;...", "dynamic_dims": "1,1;2,2;...;8,8"}``.  Returns ``{}``
    for a fully static graph.  A graph whose ONNX file has dynamic axes the manifest pins (``spec.shrinkable``:
    memory attention's slot and pointer axes) gets just ``input_shape`` with the manifest's static shapes.  (The fake
    ``acl`` takes the same strings through ``fake_acl.model_options``.)"""
    markers = sum(1 for t in spec.inputs for d in t.shape if isinstance(d, str))
    if not markers:
        if spec.shrinkable:
            return {
                "input_shape": ";".join(
                    f"{t.name}:" + ",".join(str(int(d)) for d in t.shape) for t in spec.inputs
                )
            }
        return {}
    symbols = {d for t in spec.inputs for d in t.shape if isinstance(d, str)}
    if len(symbols) != 1:
        raise BackendError(
            f"atc_dynamic_options: graph {spec.name!r} has several dynamic axes {sorted(symbols)}; "
            "only one symbol (the decoder's K) is supported"
        )
    shape = ";".join(
        f"{t.name}:" + ",".join("-1" if isinstance(d, str) else str(d) for d in t.shape) for t in spec.inputs
    )
    dims = ";".join(",".join([str(int(g))] * markers) for g in gears)
    return {"input_shape": shape, "dynamic_dims": dims}


def _import_acl() -> Any:
    """The real pyACL (``import acl``), or a :class:`BackendError` saying where it comes from."""
    try:
        import acl  # type: ignore[import-not-found]
    except ImportError as exc:
        raise BackendError(
            "acl backend: pyACL (the Python module 'acl') is not importable: it comes with the Ascend CANN toolkit, "
            "which is not installed or not on the path here (install CANN, then source "
            "/usr/local/Ascend/ascend-toolkit/set_env.sh, or the set_env.sh of your CANN install, before running "
            f"vostream; 'vostream doctor' checks it) ({exc})"
        ) from exc
    return acl


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _footprint(nbytes: int) -> int:
    """Device bytes one :meth:`AclRuntime.alloc` of ``nbytes`` takes (our 64-byte rounding, then acl.rt.malloc's
    rounding to 32 plus 32 bytes)."""
    return _align(max(_align(nbytes, IO_ALIGN), IO_ALIGN), 32) + 32


@dataclass
class _Tensor:
    """One model input/output as the .om describes it, matched to its manifest entry."""

    name: str
    index: int
    dims: list[int]
    dtype: str
    size: int
    spec: TensorSpec


@dataclass
class _Graph:
    """A loaded .om: model id, desc, its tensors, datasets (built on the first run) and what is bound now."""

    spec: GraphSpec
    path: Path
    model_id: int
    desc: int
    inputs: list[_Tensor]
    outputs: list[_Tensor]
    dyn_index: int = -1  # index of ascend_mbatch_shape_data, -1 for a static model
    dyn_ptr: int = 0  # device buffer behind it
    dyn_size: int = 0
    gears: dict[tuple[int, ...], dict[str, int]] = field(default_factory=dict)  # flat dims -> {symbol: value}
    in_ds: int = 0
    out_ds: int = 0
    data_buffers: list[int] = field(default_factory=list)
    in_buffers: list[int] = field(default_factory=list)  # per model input index (real inputs only)
    out_buffers: list[int] = field(default_factory=list)
    bound: dict[tuple[str, int], tuple[int, int]] = field(
        default_factory=dict
    )  # (kind, index) -> (addr, size)


class AclRuntime(BindingRuntime[Allocation]):
    """pyACL on one Ascend device: ``.om`` graphs, ``acl.rt.malloc`` buffers, datasets re-pointed per slot.

    ``device_id``: the NPU.  ``om_dir``: where the ``.om`` files are (default: the export directory itself).
    ``acl``: the pyACL module to drive (default ``None``: ``import acl``, the real one; tests inject the fake).
    Thread-safe in the sense the pipeline needs: any thread may call (the context is made current per thread) and
    calls are serialised by a lock (one model must not be executed concurrently).
    """

    name = "AclRuntime"

    def __init__(self, device_id: int = 0, om_dir: str | Path | None = None, acl: Any = None) -> None:
        super().__init__()
        self.device_id = int(device_id)
        self.om_dir = Path(om_dir) if om_dir is not None else None
        self._token = next(_RUNTIME_IDS)
        self._lock = threading.RLock()
        self._graphs: dict[str, _Graph] = {}
        self._closed = False
        self._ctx = 0
        self._stream = 0
        self._device_set = False
        self._registered = False
        #: graph -> how many data buffers were re-pointed (acl.update_data_buffer) since load
        self.repoints: dict[str, int] = {}
        #: graph -> how many times a dynamic gear was set (acl.mdl.set_input_dynamic_dims)
        self.gear_sets: dict[str, int] = {}
        self.acl = acl if acl is not None else _import_acl()
        self.is_fake = bool(getattr(self.acl, "__vostream_fake__", False))
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- error handling ----------------------------------------------------------------------------------------------
    def _recent(self) -> str:
        fn = getattr(self.acl, "get_recent_err_msg", None)
        try:
            msg = fn() if fn is not None else None
        except Exception:  # noqa: BLE001 - diagnostics must never mask the real error
            msg = None
        return f"; device says: {msg.strip()}" if msg and str(msg).strip() else ""

    def _error(self, where: str, call: str, code: int, detail: str = "") -> BackendError:
        extra = f" ({detail})" if detail else ""
        return BackendError(
            f"{self.name}.{where}: {call} returned {describe_error(int(code))}{extra}{self._recent()}"
        )

    def _check(self, ret: int, where: str, call: str, detail: str = "") -> None:
        if ret != ACL_SUCCESS:
            raise self._error(where, call, ret, detail)

    def _pair(self, result: tuple[Any, int], where: str, call: str, detail: str = "") -> Any:
        value, ret = result
        self._check(ret, where, call, detail)
        return value

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    def _start(self) -> None:
        acl = self.acl
        with _INIT_LOCK:
            ret = acl.init()
            if ret not in (ACL_SUCCESS, ACL_ERROR_REPEAT_INITIALIZE):
                raise self._error("__init__", "acl.init", ret)
            if ret == ACL_SUCCESS:
                _INIT_STATE["initialised_by_us"] = True
            _INIT_STATE["users"] += 1
            self._registered = True
        self._check(
            acl.rt.set_device(self.device_id), "__init__", "acl.rt.set_device", f"device {self.device_id}"
        )
        self._device_set = True
        self._ctx = self._pair(acl.rt.create_context(self.device_id), "__init__", "acl.rt.create_context")
        _TLS.token = self._token  # create_context made it current in this thread
        self._stream = self._pair(acl.rt.create_stream(), "__init__", "acl.rt.create_stream")

    def _enter(self, where: str) -> None:
        """Refuse calls on a closed runtime; make our context current in the calling thread (once per thread)."""
        if self._closed:
            raise BackendError(f"{self.name}.{where}: the runtime is closed")
        self._make_current(where)

    def _make_current(self, where: str) -> None:
        if getattr(_TLS, "token", None) != self._token:
            self._check(
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
                        errors.append(self._error("close", call, ret))
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
        stem = spec.file[:-5] if spec.file.endswith(".onnx") else Path(spec.file).stem
        return Path(self.om_dir or model_dir) / f"{stem}.om"

    def load(self, manifest: Manifest, model_dir: Path) -> None:
        """Load every graph's ``.om``, check its I/O against the manifest, read its dynamic gears."""
        with self._lock:
            self._enter("load")
            for gname, spec in manifest.graphs.items():
                path = self.om_path(spec, Path(model_dir))
                if not path.is_file():
                    hint = ""
                    opts = atc_dynamic_options(spec)
                    if "dynamic_dims" in opts:
                        hint = (
                            f' --input_format=ND --input_shape="{opts["input_shape"]}" '
                            f'--dynamic_dims="{opts["dynamic_dims"]}"'
                        )
                    elif opts:
                        hint = f' --input_shape="{opts["input_shape"]}"'
                    raise BackendError(
                        f"{self.name}.load: graph {gname!r}: {path} not found; convert the export with ATC, e.g. "
                        f"atc --framework=5 --model={Path(model_dir) / spec.file} --output={path.with_suffix('')} "
                        f"--soc_version=<Ascend + npu-smi Name>{hint}"
                    )
                g = self._load_graph(gname, spec, path)
                self._graphs[gname] = g
                self.repoints[gname] = 0
                self.gear_sets[gname] = 0

    def _load_graph(self, gname: str, spec: GraphSpec, path: Path) -> _Graph:
        acl = self.acl
        where = f"load(graph {gname!r}, {path.name})"
        model_id = self._pair(acl.mdl.load_from_file(str(path)), where, "acl.mdl.load_from_file", str(path))
        desc = acl.mdl.create_desc()
        if not desc:
            acl.mdl.unload(model_id)
            raise self._error(where, "acl.mdl.create_desc", 100000, "returned a NULL desc")
        g = _Graph(spec, path, model_id, desc, [], [])
        try:
            self._check(acl.mdl.get_desc(desc, model_id), where, "acl.mdl.get_desc")
            self._read_io(g, where)
            self._check_io(g, where)
            if g.dyn_index >= 0:
                self._read_gears(g, where)
        except BaseException:
            acl.mdl.destroy_desc(desc)
            if g.dyn_ptr:
                acl.rt.free(g.dyn_ptr)
            acl.mdl.unload(model_id)
            raise
        return g

    def _read_io(self, g: _Graph, where: str) -> None:
        acl = self.acl
        desc = g.desc
        for kind, count_fn, name_fn, dims_fn, type_fn, size_fn, specs, out in (
            (
                "input",
                acl.mdl.get_num_inputs,
                acl.mdl.get_input_name_by_index,
                acl.mdl.get_input_dims,
                acl.mdl.get_input_data_type,
                acl.mdl.get_input_size_by_index,
                g.spec.inputs,
                g.inputs,
            ),
            (
                "output",
                acl.mdl.get_num_outputs,
                acl.mdl.get_output_name_by_index,
                acl.mdl.get_output_dims,
                acl.mdl.get_output_data_type,
                acl.mdl.get_output_size_by_index,
                g.spec.outputs,
                g.outputs,
            ),
        ):
            by_name = {t.name: t for t in specs}
            for i in range(int(count_fn(desc))):
                name = name_fn(desc, i)
                if name is None:
                    raise BackendError(
                        f"{self.name}.{where}: acl.mdl.get_{kind}_name_by_index({i}) returned None"
                    )
                name = str(name)
                if kind == "input" and name == ACL_DYNAMIC_TENSOR_NAME:
                    g.dyn_index = i
                    continue
                dims_dict = self._pair(
                    dims_fn(desc, i), where, f"acl.mdl.get_{kind}_dims", f"{kind} {i} {name!r}"
                )
                dims = [int(d) for d in dims_dict.get("dims", [])]
                dtype = ACL_DTYPES.get(int(type_fn(desc, i)), f"aclDataType {int(type_fn(desc, i))}")
                spec = by_name.get(_manifest_name(name, by_name))
                tensor = _Tensor(name, i, dims, dtype, int(size_fn(desc, i)), spec)  # type: ignore[arg-type]
                out.append(tensor)

    def _check_io(self, g: _Graph, where: str) -> None:
        """Names and order, dtypes and static dims of the .om against the manifest; ``BackendError`` naming graph,
        tensor and both values on the first difference."""
        pre = f"{self.name}.{where}"
        for kind, want, got in (("input", g.spec.inputs, g.inputs), ("output", g.spec.outputs, g.outputs)):
            model_names = [t.name for t in got]
            for t in got:
                if t.spec is None:
                    raise BackendError(
                        f"{pre}: model {kind} {t.name!r} is not in the manifest (manifest {kind}s: "
                        f"{', '.join(s.name for s in want)})"
                    )
            matched = [t.spec.name for t in got]
            missing = [s.name for s in want if s.name not in matched]
            if missing:
                raise BackendError(
                    f"{pre}: manifest {kind}(s) {', '.join(map(repr, missing))} not in the model "
                    f"(model {kind}s: {', '.join(model_names) or 'none'})"
                )
            if matched != [s.name for s in want]:
                raise BackendError(
                    f"{pre}: {kind} order differs: manifest {[s.name for s in want]}, model "
                    f"{model_names} (datasets are positional; re-export or reconvert)"
                )
            for t in got:
                s = t.spec
                if t.dtype != s.dtype:
                    raise BackendError(
                        f"{pre}: {kind} {s.name!r} dtype: manifest {s.dtype}, model {t.dtype} (ATC "
                        "may have changed it: keep fp32 I/O, e.g. without --output_type/"
                        "--input_fp16_nodes)"
                    )
                bad = len(t.dims) != len(s.shape)
                for want_d, got_d in zip(s.shape, t.dims):
                    if isinstance(want_d, str):
                        bad |= kind == "input" and got_d != -1  # dynamic inputs must be gears
                    elif got_d not in (-1, want_d):
                        bad = True
                if bad:
                    hint = (
                        " (compile the dynamic axis as gears: ATC --dynamic_dims)"
                        if any(isinstance(d, str) for d in s.shape)
                        else ""
                    )
                    raise BackendError(
                        f"{pre}: {kind} {s.name!r} shape: manifest {fmt_shape(s.shape)}, model "
                        f"{fmt_shape(t.dims)}{hint}"
                    )
                if all(isinstance(d, int) for d in s.shape) and -1 not in t.dims:
                    need = prod(int(d) for d in s.shape) * DTYPES[s.dtype].itemsize
                    if t.size != need:
                        raise BackendError(
                            f"{pre}: {kind} {s.name!r} size: manifest {need} bytes, model {t.size}"
                        )
        if any(isinstance(d, str) for t in g.spec.inputs for d in t.shape) and g.dyn_index < 0:
            raise BackendError(
                f"{pre}: the manifest's inputs have dynamic axes but the model has no "
                f"{ACL_DYNAMIC_TENSOR_NAME} input (compile it with ATC --dynamic_dims)"
            )

    def _read_gears(self, g: _Graph, where: str) -> None:
        """The compiled ``--dynamic_dims`` gears, each mapped to the manifest's symbols (e.g. ``{"K": 3}``), and the
        device buffer for ``ascend_mbatch_shape_data``."""
        acl = self.acl
        count = self._pair(
            acl.mdl.get_input_dynamic_gear_count(g.desc, -1), where, "acl.mdl.get_input_dynamic_gear_count"
        )
        if not count:
            raise BackendError(
                f"{self.name}.{where}: the model has an {ACL_DYNAMIC_TENSOR_NAME} input but no "
                "dynamic-dims gears (dynamic batch / image size are not supported; use ATC "
                "--dynamic_dims)"
            )
        gears = self._pair(
            acl.mdl.get_input_dynamic_dims(g.desc, -1, int(count)), where, "acl.mdl.get_input_dynamic_dims"
        )
        for entry in gears:
            flat = tuple(int(d) for d in entry["dims"][: int(entry.get("dimCount", len(entry["dims"])))])
            values: dict[str, int] = {}
            pos = 0
            for t in g.inputs:
                rank = len(t.dims)
                shape = flat[pos : pos + rank]
                pos += rank
                for want, got in zip(t.spec.shape, shape):
                    if isinstance(want, str):
                        values[want] = got
            if pos != len(flat):
                raise BackendError(
                    f"{self.name}.{where}: gear dims {list(flat)} do not cover the model inputs ({pos} dims)"
                )
            g.gears[flat] = values
        size = int(acl.mdl.get_input_size_by_index(g.desc, g.dyn_index)) or 8
        g.dyn_ptr = self._pair(
            acl.rt.malloc(_align(size, IO_ALIGN), ACL_MEM_MALLOC_HUGE_FIRST),
            where,
            "acl.rt.malloc",
            f"{ACL_DYNAMIC_TENSOR_NAME}, {size} bytes",
        )
        g.dyn_size = size
        self._check(
            acl.rt.memset(g.dyn_ptr, _align(size, IO_ALIGN), 0, _align(size, IO_ALIGN)),
            where,
            "acl.rt.memset",
            ACL_DYNAMIC_TENSOR_NAME,
        )

    @property
    def max_points(self) -> int | None:  # type: ignore[override]
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
            size = max(_align(nbytes, IO_ALIGN), IO_ALIGN)
            where = f"alloc({name or '?'})"
            ptr = self._pair(
                self.acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST), where, "acl.rt.malloc", f"{size} bytes"
            )
            try:
                self._check(self.acl.rt.memset(ptr, size, 0, size), where, "acl.rt.memset", f"{size} bytes")
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
                self._check(
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
                self._check(
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
            self._check(self.acl.rt.free(a.ptr), f"free({a.name or buf.handle})", "acl.rt.free")

    # -- memory plan -------------------------------------------------------------------------------------------------
    def plan(
        self, manifest: Manifest, objects: int, sessions: int = 1, reserve_bytes: int = RESERVE_BYTES
    ) -> dict[str, Any]:
        """Device memory ``sessions`` sessions of ``objects`` objects each will allocate, against free HBM now.

        Per object: the bank ``[C+N, T, M]`` and the pointer ring ``[Q, D]``; per session: every scratch tensor the
        session allocates (graph I/O other than the bank, pointers and their slot views, the points buffer at
        ``MAX_POINTS``, one extra mask for the zero mask prompt).  Sizes include allocation rounding.  The .om
        models' own work and weight memory was taken at load, so it is already missing from ``free_bytes``."""
        with self._lock:
            self._enter("plan")
            bank_spec = manifest.graphs["memory_attention"].input("bank")
            ptr_spec = manifest.graphs["memory_attention"].input("ptrs")
            bank = _footprint(
                manifest.key_slots
                * manifest.tokens_per_slot
                * manifest.mem_dim
                * DTYPES[bank_spec.dtype].itemsize
            )
            ptrs = _footprint(manifest.pointer_slots * manifest.hidden_dim * DTYPES[ptr_spec.dtype].itemsize)
            scratch: dict[str, int] = {}
            for g in manifest.graphs.values():
                for t in (*g.inputs, *g.outputs):
                    if t.name in _PER_OBJECT or t.name in scratch:
                        continue
                    n = prod(MAX_POINTS if isinstance(d, str) else int(d) for d in t.shape)
                    scratch[t.name] = _footprint(n * DTYPES[t.dtype].itemsize)
            if "mask_prompt" in scratch:
                scratch["zero_mask"] = scratch["mask_prompt"]
            session_bytes = sum(scratch.values())
            per_object = bank + ptrs
            need = sessions * (session_bytes + objects * per_object) + reserve_bytes
            free, total = self._mem_info("plan")
            room = free - reserve_bytes - sessions * session_bytes
            max_objects = max(0, room // (sessions * per_object)) if sessions and per_object else 0
            return {
                "objects": objects,
                "sessions": sessions,
                "bank_bytes": bank,
                "pointer_bytes": ptrs,
                "per_object_bytes": per_object,
                "session_scratch_bytes": session_bytes,
                "reserve_bytes": reserve_bytes,
                "need_bytes": need,
                "free_bytes": free,
                "total_bytes": total,
                "max_objects": int(max_objects),
                "fits": need <= free,
            }

    def check_memory(
        self, manifest: Manifest, objects: int, sessions: int = 1, reserve_bytes: int = RESERVE_BYTES
    ) -> dict[str, Any]:
        """:meth:`plan`, raising :class:`ConfigError` with the numbers when it does not fit the free HBM."""
        p = self.plan(manifest, objects, sessions, reserve_bytes)
        if not p["fits"]:
            mib = 1 << 20
            raise ConfigError(
                f"acl backend: {sessions} session(s) of {objects} objects need {p['need_bytes']} bytes "
                f"({p['need_bytes'] / mib:.1f} MiB) of device memory but device {self.device_id} has "
                f"{p['free_bytes']} bytes ({p['free_bytes'] / mib:.1f} MiB) free of {p['total_bytes']}: "
                f"{p['per_object_bytes']} bytes per object (bank {p['bank_bytes']} + pointers {p['pointer_bytes']}), "
                f"{p['session_scratch_bytes']} bytes of scratch per session, {p['reserve_bytes']} bytes reserve; "
                f"at most {p['max_objects']} objects fit: lower max_objects or free device memory"
            )
        return p

    def _mem_info(self, where: str) -> tuple[int, int]:
        free, total, ret = self.acl.rt.get_mem_info(ACL_HBM_MEM)
        self._check(ret, where, "acl.rt.get_mem_info", "ACL_HBM_MEM")
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
            self._bind(g, where, addrs)
            if g.dyn_index >= 0:
                self._set_gear(g, where, syms)
            t0 = time.perf_counter()
            self._check(
                self.acl.mdl.execute_async(g.model_id, g.in_ds, g.out_ds, self._stream),
                where,
                "acl.mdl.execute_async",
                f"model {g.model_id}",
            )
            self._check(
                self.acl.rt.synchronize_stream(self._stream),
                where,
                "acl.rt.synchronize_stream",
                f"after executing model {g.model_id}",
            )
            self._count_run(graph, t0)

    def _bind(self, g: _Graph, where: str, addrs: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Build the datasets on the first run; afterwards re-point only the data buffers whose window moved."""
        acl = self.acl
        if not g.in_ds:
            self._build_datasets(g, where, addrs)
            return
        for kind, buffers, tensors in (
            ("input", g.in_buffers, g.inputs),
            ("output", g.out_buffers, g.outputs),
        ):
            for t, dbuf in zip(tensors, buffers):
                key = (kind, t.index)
                addr, size = addrs[key]
                if g.bound.get(key) == (addr, size):
                    continue
                self._check(
                    acl.update_data_buffer(dbuf, addr, size),
                    where,
                    "acl.update_data_buffer",
                    f"{kind} {t.spec.name!r} -> 0x{addr:x}, {size} bytes",
                )
                g.bound[key] = (addr, size)
                self.repoints[g.spec.name] = self.repoints.get(g.spec.name, 0) + 1

    def _build_datasets(self, g: _Graph, where: str, addrs: dict[tuple[str, int], tuple[int, int]]) -> None:
        """One input and one output dataset, a data buffer per tensor in model order (the gear tensor at its own
        index).  All or nothing: a failure destroys what was created."""
        acl = self.acl
        created: list[int] = []
        datasets: list[int] = []
        in_buffers: list[int] = []
        out_buffers: list[int] = []
        bound: dict[tuple[str, int], tuple[int, int]] = {}
        try:
            for _ in range(2):
                ds = acl.mdl.create_dataset()
                if not ds:
                    raise self._error(where, "acl.mdl.create_dataset", 100000, "returned NULL")
                datasets.append(ds)
            in_ds, out_ds = datasets
            n_in = len(g.inputs) + (1 if g.dyn_index >= 0 else 0)
            for i in range(n_in):
                addr, size = (g.dyn_ptr, g.dyn_size) if i == g.dyn_index else addrs[("input", i)]
                dbuf = self._data_buffer(where, addr, size)
                created.append(dbuf)
                if i != g.dyn_index:
                    in_buffers.append(dbuf)
                    bound[("input", i)] = (addr, size)
                self._pair(
                    acl.mdl.add_dataset_buffer(in_ds, dbuf), where, "acl.mdl.add_dataset_buffer", f"input {i}"
                )
            for t in g.outputs:
                addr, size = addrs[("output", t.index)]
                dbuf = self._data_buffer(where, addr, size)
                created.append(dbuf)
                out_buffers.append(dbuf)
                bound[("output", t.index)] = (addr, size)
                self._pair(
                    acl.mdl.add_dataset_buffer(out_ds, dbuf),
                    where,
                    "acl.mdl.add_dataset_buffer",
                    f"output {t.index}",
                )
        except BaseException:
            for dbuf in created:
                acl.destroy_data_buffer(dbuf)
            for ds in datasets:
                acl.mdl.destroy_dataset(ds)
            raise
        g.in_ds, g.out_ds = in_ds, out_ds
        g.data_buffers, g.in_buffers, g.out_buffers, g.bound = created, in_buffers, out_buffers, bound

    def _data_buffer(self, where: str, addr: int, size: int) -> int:
        dbuf = self.acl.create_data_buffer(addr, size)
        if not dbuf:
            raise self._error(
                where, "acl.create_data_buffer", 100000, f"returned NULL for 0x{addr:x}, {size} bytes"
            )
        return int(dbuf)

    def _set_gear(self, g: _Graph, where: str, syms: dict[str, tuple[int, str]]) -> None:
        """``acl.mdl.set_input_dynamic_dims`` with every input's full shape for this run's symbol values."""
        flat = tuple(int(v) if not isinstance(v, str) else syms[v][0] for t in g.inputs for v in t.spec.shape)
        if flat not in g.gears:
            got = ", ".join(f"{k}={v}" for k, (v, _) in sorted(syms.items()))
            compiled: dict[str, list[int]] = {}
            for values in g.gears.values():
                for k, v in values.items():
                    compiled.setdefault(k, []).append(v)
            have = "; ".join(f"{k} in {sorted(set(v))}" for k, v in sorted(compiled.items()))
            most = max((max(v) for v in compiled.values()), default=0)
            raise BackendError(
                f"{self.name}.{where}: {got} is not a compiled gear of {g.path.name} ({have}); the .om "
                f"has fixed gears (ATC --dynamic_dims): use at most {most} points per object and frame "
                "(a box counts as two), or recompile with more gears"
            )
        dims = {"name": "", "dimCount": len(flat), "dims": list(flat)}
        self._check(
            self.acl.mdl.set_input_dynamic_dims(g.model_id, g.in_ds, g.dyn_index, dims),
            where,
            "acl.mdl.set_input_dynamic_dims",
            ", ".join(f"{k}={v}" for k, (v, _) in sorted(syms.items())),
        )
        self.gear_sets[g.spec.name] = self.gear_sets.get(g.spec.name, 0) + 1


def _manifest_name(model_name: str, by_name: Mapping[str, object]) -> str:
    """The manifest tensor a model tensor name refers to: the same name, or (ATC-renamed outputs) a ``node:idx:name``
    / ``name:idx`` form whose last or first ``:`` component is the manifest name."""
    if model_name in by_name:
        return model_name
    parts = model_name.split(":")
    for cand in (parts[-1], parts[0]):
        if cand in by_name:
            return cand
    return model_name


__all__ = ["ACL_ERRORS", "DECODER_GEARS", "AclRuntime", "atc_dynamic_options", "describe_error"]
