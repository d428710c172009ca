"""A faithful in-process fake of Huawei's pyACL (``import acl``) for machines without an Ascend NPU.

Why: ``AclRuntime`` is written against the real pyACL API; this module lets its tests (and
``VOSTREAM_FAKE_ACL=1`` runs) exercise exactly the calls, return shapes and error codes the real binding has, on CPU.
The authority is ``shared/reference/ascend-acl.md`` plus the pyACL wrapper source it cites (``hicann/runtime``
``python/pyACL``): argument formats, ``(value, ret)`` tuples, ``TypeError("acl.<ns>.<fn> args parse failed")`` on bad
argument types, and bare values where the wrapper returns them.

What it models:

* a module object (:func:`module`, :func:`install`) with the real sub-modules ``acl.rt``, ``acl.mdl``, ``acl.util``
  (and empty ``acl.op``/``media``/``blas``/``prof``/``himpi``/``fv``); like the real extension it defines **no**
  constants — callers define ``ACL_MEMCPY_HOST_TO_DEVICE = 1`` etc. themselves.  The constants below live in this
  module only (for tests and for the fake itself);
* a private device address space: device pointers are integers in ``[0x124000000000, ...)`` that no host code may
  dereference; every ``acl.rt.malloc`` owns a private NumPy byte arena (size rounded up to 32 plus 32 bytes, start
  64-byte aligned, contents *not* zeroed but filled with ``0xFF`` so un-initialised reads show up as NaN / -1);
  interior pointers (``ptr + k``) resolve to their allocation; freed, unknown or out-of-range pointers fail with
  ``107000`` (ACL_ERROR_RT_PARAM_INVALID) and a message in ``acl.get_recent_err_msg()``;
* per-thread current contexts (``107002`` in a thread that never set one), stream and model ownership
  (``107003`` / ``107004``), ``acl.init`` repeated -> ``100002``;
* ``.om`` stand-ins that are ONNX files run with ONNX Runtime (CPU): model descs derived from the graph's static
  shapes, datasets and data buffers, ``execute`` and ``execute_async`` (queued on the stream, run at
  ``synchronize_stream``) reading inputs from and writing outputs into the arena at the data buffers' addresses,
  dynamic gears (``ascend_mbatch_shape_data``) configured through ATC-like ONNX metadata keys
  (``fake_acl.input_shape``, ``fake_acl.dynamic_batch_size``, ``fake_acl.dynamic_image_size``,
  ``fake_acl.dynamic_dims``) or :func:`model_options`;
* accounting (:func:`stats`), leak reporting (:func:`live_handles`, :func:`assert_no_leaks`), fault injection
  (:func:`inject`), and test isolation (:func:`reset`).

Control API (not pyACL): :func:`install` / :func:`uninstall` / :func:`module`, :func:`reset`, :func:`configure`
(:class:`FakeConfig`), :func:`model_options`, :func:`stats` / :func:`reset_stats` (:class:`AclStats`),
:func:`live_handles` / :func:`assert_no_leaks`, :func:`inject` / :func:`clear_injections`, :func:`error_log`,
:func:`peek` / :func:`poke` (read/write device memory without counting a transfer), :func:`api_names`.

Behaviour the reference does not pin down is listed in ``GUESSES`` (appended below); each item should be checked on
real hardware.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import operator
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

__test__ = False

# ----------------------------------------------------------------------------------------------------------------
# Constants (acl_base_rt.h / acl_rt.h / rt_error_codes.h / ge_error_codes.h).  NOT exported on the fake `acl`
# module: the real extension defines none, so code must not rely on `acl.<CONSTANT>`.
# ----------------------------------------------------------------------------------------------------------------

ACL_SUCCESS = 0

ACL_MEMCPY_HOST_TO_HOST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_MEMCPY_DEFAULT = 4
ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE = 5
ACL_MEMCPY_INNER_DEVICE_TO_DEVICE = 6
ACL_MEMCPY_INTER_DEVICE_TO_DEVICE = 7

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_HUGE_ONLY = 1
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEM_MALLOC_HUGE_FIRST_P2P = 3
ACL_MEM_MALLOC_HUGE_ONLY_P2P = 4
ACL_MEM_MALLOC_NORMAL_ONLY_P2P = 5
ACL_MEM_MALLOC_HUGE1G_ONLY = 6
ACL_MEM_MALLOC_HUGE1G_ONLY_P2P = 7
ACL_MEM_TYPE_LOW_BAND_WIDTH = 0x100
ACL_MEM_TYPE_HIGH_BAND_WIDTH = 0x1000
ACL_MEM_ACCESS_USER_SPACE_READONLY = 0x100000

ACL_DDR_MEM = 0
ACL_HBM_MEM = 1
ACL_DDR_MEM_HUGE = 2
ACL_DDR_MEM_NORMAL = 3
ACL_HBM_MEM_HUGE = 4
ACL_HBM_MEM_NORMAL = 5

ACL_DEVICE = 0  # aclrtRunMode
ACL_HOST = 1

ACL_CALLBACK_NO_BLOCK = 0
ACL_CALLBACK_BLOCK = 1

ACL_STREAM_STATUS_COMPLETE = 0
ACL_STREAM_STATUS_NOT_READY = 1
ACL_EVENT_RECORDED_STATUS_NOT_READY = 0
ACL_EVENT_RECORDED_STATUS_COMPLETE = 1

ACL_DT_UNDEFINED = -1
ACL_FLOAT = 0
ACL_FLOAT16 = 1
ACL_INT8 = 2
ACL_INT32 = 3
ACL_UINT8 = 4
ACL_INT16 = 6
ACL_UINT16 = 7
ACL_UINT32 = 8
ACL_INT64 = 9
ACL_UINT64 = 10
ACL_DOUBLE = 11
ACL_BOOL = 12
ACL_STRING = 13
ACL_COMPLEX64 = 16
ACL_COMPLEX128 = 17
ACL_BF16 = 27
ACL_INT4 = 29
ACL_UINT1 = 30
ACL_COMPLEX32 = 33
ACL_HIFLOAT8 = 34
ACL_FLOAT8_E5M2 = 35
ACL_FLOAT8_E4M3FN = 36
ACL_FLOAT8_E8M0 = 37

ACL_FORMAT_UNDEFINED = -1
ACL_FORMAT_NCHW = 0
ACL_FORMAT_NHWC = 1
ACL_FORMAT_ND = 2
ACL_FORMAT_NC1HWC0 = 3
ACL_FORMAT_FRACTAL_Z = 4
ACL_FORMAT_NC1HWC0_C04 = 12
ACL_FORMAT_HWCN = 16
ACL_FORMAT_NDHWC = 27
ACL_FORMAT_FRACTAL_NZ = 29
ACL_FORMAT_NCDHW = 30

ACL_DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"

ACL_ERROR_INVALID_PARAM = 100000
ACL_ERROR_UNINITIALIZE = 100001
ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_ERROR_INVALID_FILE = 100003
ACL_ERROR_INVALID_MODEL_ID = 100011
ACL_ERROR_PARSE_MODEL = 100013
ACL_ERROR_MODEL_INPUT_NOT_MATCH = 100017
ACL_ERROR_MODEL_OUTPUT_NOT_MATCH = 100018
ACL_ERROR_MODEL_NOT_DYNAMIC = 100019
ACL_ERROR_REPEAT_SUBSCRIBE = 100033
ACL_ERROR_STREAM_NOT_SUBSCRIBE = 100034
ACL_ERROR_THREAD_NOT_SUBSCRIBE = 100035
ACL_ERROR_WAIT_CALLBACK_TIMEOUT = 100036
ACL_ERROR_REPEAT_FINALIZE = 100037
ACL_ERROR_RT_PARAM_INVALID = 107000
ACL_ERROR_RT_INVALID_DEVICEID = 107001
ACL_ERROR_RT_CONTEXT_NULL = 107002
ACL_ERROR_RT_STREAM_CONTEXT = 107003
ACL_ERROR_RT_MODEL_CONTEXT = 107004
ACL_ERROR_RT_EVENT_TIMESTAMP_INVALID = 107006
ACL_ERROR_RT_ADDR_UNALIGNED = 107008
ACL_ERROR_RT_MODEL_RUNNING = 107037
ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID = 145007
ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
ACL_ERROR_GE_SHAPE_INVALID = 145021
ACL_ERROR_BAD_ALLOC = 200000
ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000
ACL_ERROR_RT_MEMORY_ALLOCATION = 207001
ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
ACL_ERROR_RT_DEVICE_OOM = 207018
ACL_ERROR_FAILURE = 500001
ACL_ERROR_RT_MODEL_EXECUTE = 507011
ACL_ERROR_RT_REPORT_TIMEOUT = 507012
ACL_ERROR_RT_AICORE_EXCEPTION = 507015
ACL_ERROR_RT_STREAM_SYNC_TIMEOUT = 507046

#: code -> symbolic name, for messages and for callers that want to print a code.
ERROR_NAMES: dict[int, str] = {
    value: name
    for name, value in dict(globals()).items()
    if name.startswith("ACL_ERROR_") and isinstance(value, int)
}

#: Every place where the fake had to guess pyACL behaviour that the reference does not pin down.
GUESSES: tuple[str, ...] = (
    (
        "Error code for a freed, unknown or out-of-range device pointer (memcpy, memset, free, data the model"
        " reads): 107000 ACL_ERROR_RT_PARAM_INVALID."
    ),
    (
        "memcpy with count > dst_max, a NULL pointer, or an unknown memcpy kind: 100000 "
        "ACL_ERROR_INVALID_PARAM; count == 0 is a successful no-op."
    ),
    (
        "Bounds are checked against the REQUESTED size of an allocation; real hardware would accept accesses "
        "into the 32..63 bytes of padding (and silently into neighbouring allocations).  "
        "configure(strict_bounds=False) uses the padded size."
    ),
    (
        "memcpy validates `kind` against pointer provenance (107000 on mismatch); current CANN docs say the "
        "kind of the synchronous aclrtMemcpy is reserved and inferred from the pointers, older docs treat it "
        "as authoritative."
    ),
    (
        "Model I/O addresses (data buffers given to execute/execute_async) must be 64-byte aligned, like the "
        "docs' rule for user-managed sub-allocations; misaligned -> 107008.  configure(io_align=1) disables "
        "the check."
    ),
    (
        "Model I/O that is not inside a live rt.malloc / malloc_host allocation -> 145007 "
        "ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID at call time; memory freed between execute_async and "
        "synchronize_stream -> 507011 at synchronize time."
    ),
    (
        "Dataset buffer count or a buffer smaller than the model input/output size -> 100017 / 100018; LARGER"
        " buffers are accepted (ACLLite only warns)."
    ),
    (
        "A failing queued task makes synchronize_stream return its code and discards the stream's later "
        "tasks; the stream is usable afterwards."
    ),
    (
        "Calls before acl.init (set_device, create_context, load) -> 100001; finalize without init or twice "
        "-> 100037; finalize leaves leaked handles listed (for leak tests) and clears every thread's current "
        "context."
    ),
    (
        "These need a current context (else 107002): streams, events, malloc/free/malloc_host/free_host, "
        "memcpy, memset, get_mem_info, get_device, load/unload/execute; datasets, data buffers and model "
        "descs do not."
    ),
    (
        "set_device makes the device's default context current for the calling thread; reset_device on a "
        "device that was not set returns 0; destroy_context on a default (implicit) context -> 107000."
    ),
    (
        "Unknown/destroyed rt handles (context, stream, event) -> 107000; unknown/destroyed acl handles "
        "(dataset, data buffer, model desc, tensor desc) -> 100000; a NULL handle where one is required -> "
        "100000."
    ),
    ("destroy_stream drains the stream's queued tasks first and returns the first task error, if any."),
    (
        "unload of a model with queued, unsynchronised execute_async work -> 107037 "
        "ACL_ERROR_RT_MODEL_RUNNING."
    ),
    ("execute_async of one model on a second stream while work is still queued on the first -> 100000."),
    (
        "Model id numbering starts at 1; model inputs/outputs keep the ONNX graph order; ONNX int64 stays "
        "INT64 (ATC may convert it); 4-D tensors report format NCHW, others ND; names longer than 127 "
        "characters are replaced by 'acl_modelId_<id>_input_<i>' / '..._output_<i>'."
    ),
    (
        "ONNX inputs with symbolic dims and no gear option fail to load with 100013 ACL_ERROR_PARSE_MODEL "
        "(ATC would refuse to convert them); a missing/unreadable file is 100003."
    ),
    (
        "Dynamic gears: the extra input 'ascend_mbatch_shape_data' is INT64 with one value per gear component"
        " (batch: 1, image size: 2, dims: one per -1 marker); the set_* call writes the gear there; output "
        "dims report -1 on axes that vary between gears; get_cur_output_dims before any execute returns the "
        "largest gear's dims."
    ),
    (
        "Invalid batch gear -> 145013; invalid image size or dims gear -> 145021; set_* on a static model or "
        "the wrong kind of dynamic model -> 100019; idx not the ascend_mbatch_shape_data index -> 100000."
    ),
    ("get_recent_err_msg is per thread, returns None when there is no message and clears it when read."),
    (
        "malloc beyond the configured HBM capacity -> (0, 207001 ACL_ERROR_RT_MEMORY_ALLOCATION); out-of-"
        "range policies are accepted."
    ),
    (
        "get_mem_info: HBM attributes report the configured capacity and padded bytes in use; DDR attributes "
        "report (0, 0, 0) as on an EP-mode 910B; unknown attributes -> 100000."
    ),
    (
        "get_version returns (1, 0, 0, 0); get_soc_name returns 'Ascend910B3'; get_run_mode returns ACL_HOST "
        "(1)."
    ),
    (
        "Pointer/size arguments (PyArg formats k/K/I/H) reject numpy integers as CPython <= 3.13 does (3.14 "
        "may accept __index__ objects); int arguments (format i) accept anything with __index__."
    ),
    (
        "Sub-modules are also registered as sys.modules['acl.rt'] etc., as PyImport_AddModule does in "
        "PyInit_acl."
    ),
)

# ----------------------------------------------------------------------------------------------------------------
# Address spaces
# ----------------------------------------------------------------------------------------------------------------

_DEV_BASE = 0x1240_0000_0000  # device VA range (looks like Ascend HBM VAs, never a host address here)
_DEV_LIMIT = 0x1A40_0000_0000
_HANDLE_BASE = 0x0A5C_0000_0000  # descriptors: contexts, streams, datasets, ...
_HANDLE_LIMIT = 0x0A5D_0000_0000
_HANDLE_STEP = 0x40
_GUARD = 0x10000  # unmapped gap between device allocations
_MIN_HOST_PTR = 0x10000
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_GIB = 1 << 30

_ACL_TYPES: dict[str, tuple[Any, int]] = {
    "tensor(float)": (np.float32, ACL_FLOAT),
    "tensor(float16)": (np.float16, ACL_FLOAT16),
    "tensor(int8)": (np.int8, ACL_INT8),
    "tensor(int32)": (np.int32, ACL_INT32),
    "tensor(uint8)": (np.uint8, ACL_UINT8),
    "tensor(int16)": (np.int16, ACL_INT16),
    "tensor(uint16)": (np.uint16, ACL_UINT16),
    "tensor(uint32)": (np.uint32, ACL_UINT32),
    "tensor(int64)": (np.int64, ACL_INT64),
    "tensor(uint64)": (np.uint64, ACL_UINT64),
    "tensor(double)": (np.float64, ACL_DOUBLE),
    "tensor(bool)": (np.bool_, ACL_BOOL),
}

_DTYPE_SIZES = {
    ACL_FLOAT: 4,
    ACL_FLOAT16: 2,
    ACL_INT8: 1,
    ACL_INT32: 4,
    ACL_UINT8: 1,
    ACL_INT16: 2,
    ACL_UINT16: 2,
    ACL_UINT32: 4,
    ACL_INT64: 8,
    ACL_UINT64: 8,
    ACL_DOUBLE: 8,
    ACL_BOOL: 1,
    ACL_COMPLEX64: 8,
    ACL_COMPLEX128: 16,
    ACL_BF16: 2,
    ACL_COMPLEX32: 4,
    ACL_HIFLOAT8: 1,
    ACL_FLOAT8_E5M2: 1,
    ACL_FLOAT8_E4M3FN: 1,
    ACL_FLOAT8_E8M0: 1,
}

_NPY_TYPES: dict[int, np.dtype[Any]] = {np.dtype(c).num: np.dtype(c) for c in "?bBhHiIlLqQefdgFDG"}

_MDL_OPTION_KEYS = ("input_shape", "dynamic_batch_size", "dynamic_image_size", "dynamic_dims")


class _Fail(Exception):
    """Internal: a call failed with an ACL error code; converted to the call's return shape by the dispatcher."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _align(value: int, to: int) -> int:
    return (value + to - 1) // to * to


def _hex(value: int) -> str:
    return f"0x{value:x}"


def _prod(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


# ----------------------------------------------------------------------------------------------------------------
# Public data types
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class FakeConfig:
    """Knobs of the fake device; change them with :func:`configure` (reset by :func:`reset`)."""

    device_count: int = 1
    hbm_bytes: int = 64 * _GIB
    soc_name: str = "Ascend910B3"
    version: tuple[int, int, int] = (1, 0, 0)
    run_mode: int = ACL_HOST
    poison: int | None = 0xFF  # fill byte for fresh rt.malloc memory (None: zero pages)
    strict_bounds: bool = True  # bounds = requested size (True) or padded size (False)
    io_align: int = 64  # required alignment of model I/O addresses (1 disables)
    max_streams: int = 1984  # per device, Atlas A2
    ort_threads: int = 0  # ONNX Runtime intra-op threads (0: ORT default)


@dataclass(frozen=True)
class AclStats:
    """Snapshot of the fake's counters (see :func:`stats`).  Async copies are counted when they are queued."""

    h2d_calls: int = 0
    h2d_bytes: int = 0
    d2h_calls: int = 0
    d2h_bytes: int = 0
    d2d_calls: int = 0
    d2d_bytes: int = 0
    h2h_calls: int = 0
    h2h_bytes: int = 0
    async_copies: int = 0
    memset_calls: int = 0
    memset_bytes: int = 0
    executes: int = 0
    execute_async_calls: int = 0
    execute_seconds: float = 0.0
    executes_by_model: Mapping[int, int] = field(default_factory=dict)
    syncs: int = 0
    mallocs: int = 0
    frees: int = 0
    device_bytes_in_use: int = 0
    peak_device_bytes: int = 0
    failed_calls: int = 0
    failed_tasks: int = 0
    callback_errors: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain dict (``executes_by_model`` copied)."""
        out = asdict(self)
        out["executes_by_model"] = dict(self.executes_by_model)
        return out


@dataclass
class Injection:
    """One fault-injection rule (see :func:`inject`); ``seen``/``fired`` count matching calls and failures."""

    call: str
    code: int
    after: int = 0
    times: int | None = 1
    at_sync: bool = False
    seen: int = 0
    fired: int = 0

    @property
    def exhausted(self) -> bool:
        return self.times is not None and self.fired >= self.times


# ----------------------------------------------------------------------------------------------------------------
# Internal records
# ----------------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _Alloc:
    base: int
    size: int
    padded: int
    device: int
    pinned_host: bool
    buf: np.ndarray[Any, Any] | None
    addr: int
    api: str
    freed: bool = False


@dataclass(eq=False)
class _Context:
    handle: int
    device: int
    implicit: bool
    default_stream: int = 0
    destroyed: bool = False


@dataclass(eq=False)
class _Task:
    label: str
    run: Callable[[], None]
    fault: int = 0
    cleanup: Callable[[], None] | None = None


@dataclass(eq=False)
class _Stream:
    handle: int
    context: int
    device: int
    is_default: bool = False
    queue: collections.deque[_Task] = field(default_factory=collections.deque)
    destroyed: bool = False


@dataclass(eq=False)
class _DataBuffer:
    handle: int
    addr: int
    size: int
    destroyed: bool = False


@dataclass(eq=False)
class _Dataset:
    handle: int
    buffers: list[int] = field(default_factory=list)
    destroyed: bool = False


@dataclass
class _IO:
    name: str
    real_name: str
    dims: list[int]
    acl_dtype: int
    np_dtype: np.dtype[Any]
    fmt: int
    size: int


@dataclass(eq=False)
class _Model:
    model_id: int
    path: str
    context: int
    device: int
    session: Any
    inputs: list[_IO]
    outputs: list[_IO]
    n_real_inputs: int
    dyn_kind: str | None
    user_gears: list[tuple[int, ...]]
    marker_gears: list[tuple[int, ...]]
    gear_output_shapes: list[list[tuple[int, ...]]]
    cur_output_dims: list[list[int]]
    pending: int = 0
    pending_stream: int = 0
    unloaded: bool = False


@dataclass(eq=False)
class _Desc:
    handle: int
    model: _Model | None = None
    destroyed: bool = False


@dataclass
class _Counters:
    h2d_calls: int = 0
    h2d_bytes: int = 0
    d2h_calls: int = 0
    d2h_bytes: int = 0
    d2d_calls: int = 0
    d2d_bytes: int = 0
    h2h_calls: int = 0
    h2h_bytes: int = 0
    async_copies: int = 0
    memset_calls: int = 0
    memset_bytes: int = 0
    executes: int = 0
    execute_async_calls: int = 0
    execute_seconds: float = 0.0
    executes_by_model: dict[int, int] = field(default_factory=dict)
    syncs: int = 0
    mallocs: int = 0
    frees: int = 0
    device_bytes_in_use: int = 0
    peak_device_bytes: int = 0
    failed_calls: int = 0
    failed_tasks: int = 0
    callback_errors: int = 0


# ----------------------------------------------------------------------------------------------------------------
# ONNX Runtime sessions (cached across reset(): loading a graph is the slow part of a test)
# ----------------------------------------------------------------------------------------------------------------

_SESSION_CACHE: dict[tuple[Any, ...], Any] = {}
_SESSION_LOCK = threading.Lock()


def _ort_session(key: tuple[Any, ...], source: str | bytes, threads: int) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``source`` (path or model bytes), cached by ``key``."""
    full_key = (*key, threads)
    with _SESSION_LOCK:
        cached = _SESSION_CACHE.get(full_key)
    if cached is not None:
        return cached
    try:
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a test dependency
        raise _Fail(ACL_ERROR_PARSE_MODEL, f"the fake acl needs onnxruntime to run models: {exc}") from None
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any ORT failure means "cannot parse this model"
        what = source if isinstance(source, str) else f"{len(source)} bytes of model data"
        raise _Fail(ACL_ERROR_PARSE_MODEL, f"{what} is not a loadable ONNX model: {exc}") from None
    with _SESSION_LOCK:
        _SESSION_CACHE[full_key] = session
    return session


# ----------------------------------------------------------------------------------------------------------------
# The fake device and runtime state
# ----------------------------------------------------------------------------------------------------------------


class _FakeAcl:
    """All state of one fake process-wide ACL runtime.  Every public call runs under ``self.lock``."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.lock = threading.RLock()
        self.config = config or FakeConfig()
        self.tls = threading.local()
        self.initialized = False
        self.objects: dict[int, Any] = {}
        self.dead: dict[int, str] = {}
        self.next_handle = _HANDLE_BASE
        self.next_va = _DEV_BASE
        self.dev_bases: list[int] = []
        self.dev_allocs: list[_Alloc] = []
        self.host_bases: list[int] = []
        self.host_allocs: list[_Alloc] = []
        self.device_refs: dict[int, int] = {}
        self.default_ctx: dict[int, int] = {}
        self.models: dict[int, _Model] = {}
        self.next_model_id = 1
        self.counters = _Counters()
        self.injections: list[Injection] = []
        self.pending_fault = 0
        self.model_opts: dict[str, dict[str, str]] = {}
        self.error_log: collections.deque[tuple[str, int, str]] = collections.deque(maxlen=200)

    # -- bookkeeping ------------------------------------------------------------------------------------------

    def new_handle(self, obj: Any) -> int:
        handle = self.next_handle
        self.next_handle += _HANDLE_STEP
        self.objects[handle] = obj
        return handle

    def kill(self, handle: int, what: str) -> None:
        self.objects.pop(handle, None)
        self.dead[handle] = what

    def lookup(self, handle: int, kind: type, what: str, code: int) -> Any:
        """The live object of type ``kind`` behind ``handle`` or a ``_Fail(code)`` saying what is wrong."""
        if handle == 0:
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{what} is NULL")
        obj = self.objects.get(handle)
        if isinstance(obj, kind) and not getattr(obj, "destroyed", False):
            return obj
        if handle in self.dead:
            raise _Fail(code, f"{what} {_hex(handle)} was already destroyed ({self.dead[handle]})")
        if obj is not None:
            raise _Fail(code, f"{what} {_hex(handle)} is a {type(obj).__name__.lstrip('_')}, not a {what}")
        raise _Fail(code, f"{what} {_hex(handle)} is not a handle the fake acl created")

    def set_err(self, message: str | None) -> None:
        self.tls.last = message

    # -- contexts ---------------------------------------------------------------------------------------------

    def current_context(self) -> _Context | None:
        if not self.initialized:  # finalize invalidates every thread's context
            return None
        handle = getattr(self.tls, "ctx", 0)
        ctx = self.objects.get(handle) if handle else None
        if isinstance(ctx, _Context) and not ctx.destroyed:
            return ctx
        return None

    def need_context(self, call: str) -> _Context:
        ctx = self.current_context()
        if ctx is None:
            raise _Fail(
                ACL_ERROR_RT_CONTEXT_NULL,
                f"{call}: the calling thread ({threading.current_thread().name}) has no current context; call "
                "acl.rt.set_context(ctx) (or set_device/create_context) in this thread first",
            )
        return ctx

    def need_init(self, call: str) -> None:
        if not self.initialized:
            raise _Fail(ACL_ERROR_UNINITIALIZE, f"{call}: acl.init() has not been called")

    def check_device(self, device_id: int) -> None:
        if not 0 <= device_id < self.config.device_count:
            raise _Fail(
                ACL_ERROR_RT_INVALID_DEVICEID,
                f"device id {device_id} is invalid; the fake has {self.config.device_count} device(s)",
            )

    def make_context(self, device: int, implicit: bool) -> _Context:
        ctx = _Context(0, device, implicit)
        ctx.handle = self.new_handle(ctx)
        stream = _Stream(0, ctx.handle, device, is_default=True)
        stream.handle = self.new_handle(stream)
        ctx.default_stream = stream.handle
        return ctx

    def stream_for(self, handle: int, ctx: _Context, call: str) -> _Stream:
        """The stream ``handle`` (0 = the current context's default stream), checked against ``ctx``."""
        if handle == 0:
            stream = self.objects.get(ctx.default_stream)
            assert isinstance(stream, _Stream)
            return stream
        stream = self.lookup(handle, _Stream, "stream", ACL_ERROR_RT_PARAM_INVALID)
        if stream.context != ctx.handle:
            raise _Fail(
                ACL_ERROR_RT_STREAM_CONTEXT,
                f"{call}: stream {_hex(handle)} belongs to context {_hex(stream.context)}, but the current "
                f"context of this thread is {_hex(ctx.handle)}",
            )
        return stream

    # -- memory -----------------------------------------------------------------------------------------------

    @staticmethod
    def _find(bases: list[int], allocs: list[_Alloc], ptr: int) -> _Alloc | None:
        i = bisect.bisect_right(bases, ptr) - 1
        if i >= 0:
            alloc = allocs[i]
            if alloc.base <= ptr < alloc.base + max(alloc.padded, 1):
                return alloc
        return None

    def where(self, ptr: int) -> str:
        """Provenance of ``ptr``: ``null``, ``device``, ``pinned`` (malloc_host), ``handle`` or ``host``."""
        if ptr == 0:
            return "null"
        if _DEV_BASE <= ptr < _DEV_LIMIT:
            return "device"
        if _HANDLE_BASE <= ptr < _HANDLE_LIMIT:
            return "handle"
        if self._find(self.host_bases, self.host_allocs, ptr) is not None:
            return "pinned"
        return "host"

    def device_span(self, ptr: int, count: int, what: str, code: int = ACL_ERROR_RT_PARAM_INVALID) -> int:
        """Real host address backing device bytes ``[ptr, ptr+count)``, or ``_Fail(code)``."""
        alloc = self._find(self.dev_bases, self.dev_allocs, ptr)
        if alloc is None:
            raise _Fail(code, f"{what} {_hex(ptr)} is not inside any device allocation")
        if alloc.freed:
            raise _Fail(
                code,
                f"{what} {_hex(ptr)} points into device allocation {_hex(alloc.base)} ({alloc.size} B) "
                "that was already freed",
            )
        offset = ptr - alloc.base
        limit = alloc.size if self.config.strict_bounds else alloc.padded
        if offset + count > limit:
            raise _Fail(
                code,
                f"{what} [{_hex(ptr)}, +{count} B) overruns device allocation {_hex(alloc.base)} of {alloc.size} B "
                f"(offset {offset}, {limit - offset} B left)",
            )
        return alloc.addr + offset

    def host_span(self, ptr: int, count: int, what: str) -> int:
        """Host address for ``count`` bytes at ``ptr`` (bounds-checked when it is malloc_host memory)."""
        alloc = self._find(self.host_bases, self.host_allocs, ptr)
        if alloc is not None:
            if ptr - alloc.base + count > alloc.size:
                raise _Fail(
                    ACL_ERROR_RT_PARAM_INVALID,
                    f"{what} [{_hex(ptr)}, +{count} B) overruns malloc_host block {_hex(alloc.base)} of {alloc.size} B",
                )
            return ptr
        if ptr < _MIN_HOST_PTR:
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{what} {_hex(ptr)} is not a valid host address")
        return ptr

    def span(self, ptr: int, count: int, what: str, code: int = ACL_ERROR_RT_PARAM_INVALID) -> int:
        """Host address for ``count`` bytes at device or host pointer ``ptr``."""
        kind = self.where(ptr)
        if kind == "null":
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{what} is NULL")
        if kind == "handle":
            obj = self.objects.get(ptr)
            label = type(obj).__name__.lstrip("_") if obj is not None else self.dead.get(ptr, "handle")
            raise _Fail(code, f"{what} {_hex(ptr)} is a fake-acl {label} handle, not a memory address")
        if kind == "device":
            return self.device_span(ptr, count, what, code)
        return self.host_span(ptr, count, what)

    def malloc(self, size: int, api: str, extra: int) -> int:
        ctx = self.need_context(f"acl.rt.{api}")
        if size == 0:
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"acl.rt.{api}: size 0 is invalid")
        padded = _align(size, 32) + extra
        in_use = self.counters.device_bytes_in_use
        if in_use + padded > self.config.hbm_bytes:
            raise _Fail(
                ACL_ERROR_RT_MEMORY_ALLOCATION,
                f"acl.rt.{api}: out of device memory: {size} B requested ({padded} B with padding), {in_use} B of "
                f"{self.config.hbm_bytes} B in use",
            )
        step = 2 << 20 if padded >= 2 << 20 else 64
        base = _align(self.next_va + _GUARD, step)
        if base + padded >= _DEV_LIMIT:  # pragma: no cover - 16 TiB of address space
            raise _Fail(ACL_ERROR_RT_MEMORY_ALLOCATION, f"acl.rt.{api}: fake device address space exhausted")
        self.next_va = base + padded
        if self.config.poison is None:
            buf = np.zeros(padded, np.uint8)
        else:
            buf = np.empty(padded, np.uint8)
            buf.fill(self.config.poison)
        alloc = _Alloc(base, size, padded, ctx.device, False, buf, buf.ctypes.data, api)
        self.dev_bases.append(base)
        self.dev_allocs.append(alloc)
        c = self.counters
        c.mallocs += 1
        c.device_bytes_in_use += padded
        c.peak_device_bytes = max(c.peak_device_bytes, c.device_bytes_in_use)
        return base

    def free(self, ptr: int) -> None:
        self.need_context("acl.rt.free")
        if ptr == 0:
            raise _Fail(ACL_ERROR_INVALID_PARAM, "acl.rt.free: pointer is NULL")
        alloc = self._find(self.dev_bases, self.dev_allocs, ptr) if self.where(ptr) == "device" else None
        if alloc is None:
            raise _Fail(
                ACL_ERROR_RT_PARAM_INVALID, f"acl.rt.free: {_hex(ptr)} was not returned by acl.rt.malloc"
            )
        if alloc.freed:
            raise _Fail(
                ACL_ERROR_RT_PARAM_INVALID, f"acl.rt.free: {_hex(ptr)} was already freed (double free)"
            )
        if ptr != alloc.base:
            raise _Fail(
                ACL_ERROR_RT_PARAM_INVALID,
                f"acl.rt.free: {_hex(ptr)} is an interior pointer (offset {ptr - alloc.base}) of allocation "
                f"{_hex(alloc.base)}; free the base address",
            )
        alloc.freed = True
        alloc.buf = None
        alloc.addr = 0
        self.counters.frees += 1
        self.counters.device_bytes_in_use -= alloc.padded

    def copy_direction(self, dst: int, src: int, kind: int, call: str) -> tuple[str, str]:
        """Provenance of (dst, src), checked against the memcpy ``kind``."""
        if dst == 0 or src == 0:
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: {'dst' if dst == 0 else 'src'} is NULL")
        if not 0 <= kind <= ACL_MEMCPY_INTER_DEVICE_TO_DEVICE:
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: memcpy kind {kind} is not an aclrtMemcpyKind")
        d_where, s_where = self.where(dst), self.where(src)
        for name, value, side in (("dst", dst, d_where), ("src", src, s_where)):
            if side == "handle":
                self.span(value, 1, f"{call}: {name}")  # raises with a description of the handle
        d_side = "device" if d_where == "device" else "host"
        s_side = "device" if s_where == "device" else "host"
        expected = {
            ACL_MEMCPY_HOST_TO_HOST: ("host", "host"),
            ACL_MEMCPY_HOST_TO_DEVICE: ("device", "host"),
            ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: ("device", "host"),
            ACL_MEMCPY_DEVICE_TO_HOST: ("host", "device"),
            ACL_MEMCPY_DEVICE_TO_DEVICE: ("device", "device"),
            ACL_MEMCPY_INNER_DEVICE_TO_DEVICE: ("device", "device"),
            ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: ("device", "device"),
        }.get(kind)
        if expected is not None and expected != (d_side, s_side):
            raise _Fail(
                ACL_ERROR_RT_PARAM_INVALID,
                f"{call}: kind {_KIND_NAMES[kind]} expects a {expected[1]} src and a {expected[0]} dst, but src "
                f"{_hex(src)} is {s_side} memory and dst {_hex(dst)} is {d_side} memory",
            )
        return d_where, s_where

    def count_copy(self, d_where: str, s_where: str, count: int, is_async: bool) -> None:
        direction = ("d" if s_where == "device" else "h") + "2" + ("d" if d_where == "device" else "h")
        c = self.counters
        setattr(c, f"{direction}_calls", getattr(c, f"{direction}_calls") + 1)
        setattr(c, f"{direction}_bytes", getattr(c, f"{direction}_bytes") + count)
        if is_async:
            c.async_copies += 1

    # -- streams ----------------------------------------------------------------------------------------------

    def enqueue(self, stream: _Stream, task: _Task) -> None:
        if self.pending_fault:
            task.fault = self.pending_fault
            self.pending_fault = 0
        stream.queue.append(task)

    def drain(self, stream: _Stream, until: _Task | None = None) -> tuple[int, str]:
        """Run ``stream``'s queued tasks in order (up to and including ``until``); ``(code, message)`` of the first
        failing task, ``(0, "")`` when all succeeded."""
        while stream.queue:
            task = stream.queue.popleft()
            try:
                if task.fault:
                    raise _Fail(
                        task.fault,
                        f"injected fault {task.fault} ({ERROR_NAMES.get(task.fault, '?')}) "
                        f"in queued {task.label}",
                    )
                task.run()
            except _Fail as exc:
                dropped = list(stream.queue)
                stream.queue.clear()
                for other in (task, *dropped):
                    if other.cleanup is not None:
                        other.cleanup()
                self.counters.failed_tasks += 1
                message = (
                    f"{exc.message} [stream {_hex(stream.handle)}; {len(dropped)} later task(s) discarded]"
                )
                self.error_log.append((task.label, exc.code, message))
                return exc.code, message
            if task.cleanup is not None:
                task.cleanup()
            if task is until:
                break
        return 0, ""

    def sync(self, handle: int, call: str) -> int:
        """synchronize_stream: drain the stream, raising the first task failure."""
        ctx = self.need_context(call)
        stream = self.stream_for(handle, ctx, call)
        self.counters.syncs += 1
        code, message = self.drain(stream)
        if code:
            raise _Fail(code, message)
        return ACL_SUCCESS

    # -- models -----------------------------------------------------------------------------------------------

    def load_model(self, source: str | bytes, label: str, key: tuple[Any, ...]) -> _Model:
        ctx = self.need_context("acl.mdl.load")
        session = _ort_session(key, source, self.config.ort_threads)
        meta = dict(session.get_modelmeta().custom_metadata_map)
        options = {k: meta[f"fake_acl.{k}"] for k in _MDL_OPTION_KEYS if f"fake_acl.{k}" in meta}
        if isinstance(source, str):
            options.update(self.model_opts.get(os.path.abspath(source), {}))
        model_id = self.next_model_id
        inputs, markers = self._model_inputs(session, options, label, model_id)
        dyn_kind, user_gears, marker_gears = self._model_gears(options, markers, label)
        shapes_per_gear = self._output_shapes(session, inputs, marker_gears, label)
        for i, io in enumerate(inputs):
            io.size = (
                max(_prod(self.concrete_shapes(inputs, g)[i]) for g in marker_gears) * io.np_dtype.itemsize
            )
        outputs: list[_IO] = []
        for j, arg in enumerate(session.get_outputs()):
            np_dtype, acl_dtype = self._dtype(arg.type, arg.name, label)
            per_gear = [shapes[j] for shapes in shapes_per_gear]
            rank = len(per_gear[0])
            dims = [
                per_gear[0][a] if all(s[a] == per_gear[0][a] for s in per_gear) else -1 for a in range(rank)
            ]
            size = max(_prod(s) for s in per_gear) * np.dtype(np_dtype).itemsize
            name = arg.name if len(arg.name) <= 127 else f"acl_modelId_{model_id}_output_{j}"
            fmt = ACL_FORMAT_NCHW if rank == 4 else ACL_FORMAT_ND
            outputs.append(_IO(name, arg.name, dims, acl_dtype, np.dtype(np_dtype), fmt, size))
        n_real = len(inputs)
        if dyn_kind is not None:
            k = len(user_gears[0])
            inputs.append(
                _IO(
                    ACL_DYNAMIC_TENSOR_NAME,
                    ACL_DYNAMIC_TENSOR_NAME,
                    [k],
                    ACL_INT64,
                    np.dtype(np.int64),
                    ACL_FORMAT_ND,
                    8 * k,
                )
            )
        largest = max(range(len(shapes_per_gear)), key=lambda g: sum(_prod(s) for s in shapes_per_gear[g]))
        model = _Model(
            model_id,
            label,
            ctx.handle,
            ctx.device,
            session,
            inputs,
            outputs,
            n_real,
            dyn_kind,
            user_gears,
            marker_gears,
            shapes_per_gear,
            [list(s) for s in shapes_per_gear[largest]],
        )
        self.next_model_id += 1
        self.models[model_id] = model
        return model

    @staticmethod
    def _dtype(type_str: str, name: str, label: str) -> tuple[Any, int]:
        found = _ACL_TYPES.get(type_str)
        if found is None:
            raise _Fail(
                ACL_ERROR_PARSE_MODEL,
                f"{label}: tensor {name!r} has type {type_str}, which the fake acl cannot run",
            )
        return found

    def _model_inputs(
        self, session: Any, options: dict[str, str], label: str, model_id: int
    ) -> tuple[list[_IO], list[tuple[int, int]]]:
        overrides: dict[str, list[int]] = {}
        if options.get("input_shape"):
            for part in options["input_shape"].split(";"):
                name, _, dims_text = part.strip().rpartition(":")
                try:
                    overrides[name] = [int(d) for d in dims_text.split(",")]
                except ValueError:
                    raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: bad input_shape entry {part!r}") from None
        names = [arg.name for arg in session.get_inputs()]
        unknown = set(overrides) - set(names)
        if unknown:
            raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: input_shape names unknown inputs {sorted(unknown)}")
        gear_options = any(options.get(k) for k in _MDL_OPTION_KEYS[1:])
        inputs: list[_IO] = []
        markers: list[tuple[int, int]] = []
        for i, arg in enumerate(session.get_inputs()):
            np_dtype, acl_dtype = self._dtype(arg.type, arg.name, label)
            if arg.name in overrides:
                dims = overrides[arg.name]
                if len(dims) != len(arg.shape):
                    raise _Fail(
                        ACL_ERROR_PARSE_MODEL,
                        f"{label}: input_shape gives {arg.name!r} {len(dims)} dims, "
                        f"the graph has {len(arg.shape)}",
                    )
            else:
                dims = [d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape]
            for axis, d in enumerate(dims):
                if d < 0:
                    if not gear_options:
                        raise _Fail(
                            ACL_ERROR_PARSE_MODEL,
                            f"{label}: input {arg.name!r} has a dynamic dim (axis {axis} of {arg.shape}); give the "
                            "ONNX graph static shapes, a 'fake_acl.input_shape' entry, or dynamic gears "
                            "(as ATC would require)",
                        )
                    markers.append((i, axis))
            rank = len(dims)
            fmt = ACL_FORMAT_NCHW if rank == 4 else ACL_FORMAT_ND
            name = arg.name if len(arg.name) <= 127 else f"acl_modelId_{model_id}_input_{i}"
            inputs.append(_IO(name, arg.name, dims, acl_dtype, np.dtype(np_dtype), fmt, 0))
        return inputs, markers

    def _model_gears(
        self, options: dict[str, str], markers: list[tuple[int, int]], label: str
    ) -> tuple[str | None, list[tuple[int, ...]], list[tuple[int, ...]]]:
        given = [k for k in _MDL_OPTION_KEYS[1:] if options.get(k)]
        if not given:
            return None, [()], [()]
        if len(given) > 1:
            raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: {given} cannot be combined (ATC rule)")
        key = given[0]
        if not markers:
            raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: {key} given but no input has a -1 dim")
        text = options[key].strip().strip(";")
        gears: list[tuple[int, ...]]
        try:  # ATC syntax: batch "1,2,4"; image size "h,w;h,w"; dims "4;8" or "1,2;3,4"
            if key == "dynamic_batch_size":
                gears = [(int(v),) for v in text.split(",")]
            else:
                gears = [tuple(int(v) for v in g.split(",")) for g in text.split(";")]
        except ValueError:
            raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: cannot parse {key}={options[key]!r}") from None
        if key == "dynamic_batch_size":
            if any(axis != 0 for _, axis in markers) or any(len(g) != 1 for g in gears):
                raise _Fail(
                    ACL_ERROR_PARSE_MODEL,
                    f"{label}: dynamic_batch_size needs -1 only on axis 0 and one value per gear",
                )
            return "batch", gears, [g * len(markers) for g in gears]
        if key == "dynamic_image_size":
            per_input = collections.Counter(i for i, _ in markers)
            if any(n != 2 for n in per_input.values()) or any(len(g) != 2 for g in gears):
                raise _Fail(
                    ACL_ERROR_PARSE_MODEL,
                    f"{label}: dynamic_image_size needs two -1 dims (H, W) per dynamic input and 'h,w' gears",
                )
            return "hw", gears, [g * len(per_input) for g in gears]
        if any(len(g) != len(markers) for g in gears):
            raise _Fail(
                ACL_ERROR_PARSE_MODEL,
                f"{label}: each dynamic_dims gear needs {len(markers)} values (one per -1 dim)",
            )
        return "dims", gears, gears

    @staticmethod
    def concrete_shapes(inputs: list[_IO], values: tuple[int, ...]) -> list[tuple[int, ...]]:
        it = iter(values)
        return [tuple(next(it) if d < 0 else d for d in io.dims) for io in inputs]

    def _output_shapes(
        self, session: Any, inputs: list[_IO], marker_gears: list[tuple[int, ...]], label: str
    ) -> list[list[tuple[int, ...]]]:
        declared = [arg.shape for arg in session.get_outputs()]
        static = all(isinstance(d, int) and d >= 0 for shape in declared for d in shape)
        if static and marker_gears == [()]:
            return [[tuple(int(d) for d in shape) for shape in declared]]
        result = []
        for gear in marker_gears:
            feeds = {
                io.real_name: np.zeros(shape, io.np_dtype)
                for io, shape in zip(inputs, self.concrete_shapes(inputs, gear))
            }
            try:
                outs = session.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                raise _Fail(ACL_ERROR_PARSE_MODEL, f"{label}: probing output shapes failed: {exc}") from None
            result.append([tuple(np.asarray(o).shape) for o in outs])
        return result

    def model(self, model_id: int, call: str) -> _Model:
        model = self.models.get(model_id)
        if model is None or model.unloaded:
            raise _Fail(ACL_ERROR_INVALID_MODEL_ID, f"{call}: model id {model_id} is not loaded")
        return model

    def gear_of(self, model: _Model, ds: _Dataset, call: str) -> int:
        """Index of the gear written into the dataset's ascend_mbatch_shape_data buffer (0 for static models)."""
        if model.dyn_kind is None:
            return 0
        buf = self.lookup(
            ds.buffers[model.n_real_inputs], _DataBuffer, "data buffer", ACL_ERROR_INVALID_PARAM
        )
        k = len(model.user_gears[0])
        addr = self.span(
            buf.addr, 8 * k, f"{call}: {ACL_DYNAMIC_TENSOR_NAME} buffer", ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID
        )
        values = tuple(int(v) for v in np.frombuffer(ctypes.string_at(addr, 8 * k), np.int64))
        for g, gear in enumerate(model.user_gears):
            if gear == values:
                return g
        code = (
            ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
            if model.dyn_kind == "batch"
            else ACL_ERROR_GE_SHAPE_INVALID
        )
        raise _Fail(
            code,
            f"{call}: model {model.model_id} has no gear {values} in {ACL_DYNAMIC_TENSOR_NAME}; call "
            f"acl.mdl.set_dynamic_* on this dataset first (gears: {model.user_gears})",
        )

    def prepare_execute(
        self, model_id: int, in_ds: int, out_ds: int, call: str
    ) -> tuple[_Model, Callable[[], None]]:
        """Validate an execute call now (like the runtime does at launch) and return the deferred work."""
        ctx = self.need_context(call)
        model = self.model(model_id, call)
        if model.context != ctx.handle:
            raise _Fail(
                ACL_ERROR_RT_MODEL_CONTEXT,
                f"{call}: model {model_id} was loaded in context "
                f"{_hex(model.context)}, the current context is {_hex(ctx.handle)}",
            )
        ins = self.lookup(in_ds, _Dataset, "input dataset", ACL_ERROR_INVALID_PARAM)
        outs = self.lookup(out_ds, _Dataset, "output dataset", ACL_ERROR_INVALID_PARAM)
        for ds, ios, code, side in (
            (ins, model.inputs, ACL_ERROR_MODEL_INPUT_NOT_MATCH, "input"),
            (outs, model.outputs, ACL_ERROR_MODEL_OUTPUT_NOT_MATCH, "output"),
        ):
            if len(ds.buffers) != len(ios):
                raise _Fail(
                    code,
                    f"{call}: model {model_id} has {len(ios)} {side}s, the {side} dataset "
                    f"{_hex(ds.handle)} has {len(ds.buffers)} buffers",
                )
        gear = self.gear_of(model, ins, call)
        in_shapes = self.concrete_shapes(model.inputs[: model.n_real_inputs], model.marker_gears[gear])
        out_shapes = model.gear_output_shapes[gear]
        plan: list[tuple[str, _IO, tuple[int, ...], int, int]] = []
        for side, ds, ios, shapes, code in (
            ("input", ins, model.inputs[: model.n_real_inputs], in_shapes, ACL_ERROR_MODEL_INPUT_NOT_MATCH),
            ("output", outs, model.outputs, out_shapes, ACL_ERROR_MODEL_OUTPUT_NOT_MATCH),
        ):
            for i, (io, shape) in enumerate(zip(ios, shapes)):
                buf = self.lookup(
                    ds.buffers[i], _DataBuffer, f"{side} {i} data buffer", ACL_ERROR_INVALID_PARAM
                )
                need = _prod(shape) * io.np_dtype.itemsize
                if buf.size < need:
                    raise _Fail(
                        code,
                        f"{call}: {side} {i} ({io.name!r}, {shape}) needs {need} B, its data buffer "
                        f"{_hex(buf.handle)} holds {buf.size} B",
                    )
                where = self.where(buf.addr)
                if where not in ("device", "pinned"):
                    raise _Fail(
                        ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID,
                        f"{call}: {side} {i} ({io.name!r}) address "
                        f"{_hex(buf.addr)} is not device memory from acl.rt.malloc (or malloc_host)",
                    )
                self.span(
                    buf.addr, need, f"{call}: {side} {i} ({io.name!r})", ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID
                )
                if self.config.io_align > 1 and buf.addr % self.config.io_align:
                    raise _Fail(
                        ACL_ERROR_RT_ADDR_UNALIGNED,
                        f"{call}: {side} {i} ({io.name!r}) address "
                        f"{_hex(buf.addr)} is not {self.config.io_align}-byte aligned",
                    )
                plan.append((side, io, tuple(shape), buf.addr, buf.size))

        def run() -> None:
            self.run_model(model, plan, gear, call)

        return model, run

    def run_model(
        self, model: _Model, plan: list[tuple[str, _IO, tuple[int, ...], int, int]], gear: int, call: str
    ) -> None:
        start = time.perf_counter()
        feeds: dict[str, np.ndarray[Any, Any]] = {}
        out_plan = []
        for side, io, shape, addr, size in plan:
            if side == "output":
                out_plan.append((io, addr, size))
                continue
            arr = np.empty(shape, io.np_dtype)
            src = self.span(
                addr,
                arr.nbytes,
                f"{call} (model {model.model_id}) input {io.name!r}",
                ACL_ERROR_RT_MODEL_EXECUTE,
            )
            ctypes.memmove(arr.ctypes.data, src, arr.nbytes)
            feeds[io.real_name] = arr
        try:
            results = model.session.run(None, feeds)
        except Exception as exc:  # noqa: BLE001 - ORT errors become the device's "model execute failed"
            raise _Fail(
                ACL_ERROR_RT_MODEL_EXECUTE,
                f"{call}: model {model.model_id} ({model.path}) failed in onnxruntime: {exc}",
            ) from None
        for j, ((io, addr, size), value) in enumerate(zip(out_plan, results)):
            out = np.ascontiguousarray(np.asarray(value), dtype=io.np_dtype)
            if out.nbytes > size:
                raise _Fail(
                    ACL_ERROR_RT_MODEL_EXECUTE,
                    f"{call}: output {io.name!r} produced {out.shape} "
                    f"({out.nbytes} B) > its buffer ({size} B)",
                )
            dst = self.span(
                addr,
                out.nbytes,
                f"{call} (model {model.model_id}) output {io.name!r}",
                ACL_ERROR_RT_MODEL_EXECUTE,
            )
            ctypes.memmove(dst, out.ctypes.data, out.nbytes)
            model.cur_output_dims[j] = list(out.shape)
        c = self.counters
        c.executes += 1
        c.execute_seconds += time.perf_counter() - start
        c.executes_by_model[model.model_id] = c.executes_by_model.get(model.model_id, 0) + 1

    def write_gear(
        self, model_id: int, ds_handle: int, index: int, kind: str, values: tuple[int, ...], call: str
    ) -> None:
        model = self.model(model_id, call)
        if model.dyn_kind != kind:
            raise _Fail(
                ACL_ERROR_MODEL_NOT_DYNAMIC,
                f"{call}: model {model_id} has no dynamic {_GEAR_WORDS[kind]} "
                f"gears (it is {model.dyn_kind or 'static'})",
            )
        if index != model.n_real_inputs:
            raise _Fail(
                ACL_ERROR_INVALID_PARAM,
                f"{call}: index {index} is not the {ACL_DYNAMIC_TENSOR_NAME} input "
                f"(index {model.n_real_inputs})",
            )
        ds = self.lookup(ds_handle, _Dataset, "dataset", ACL_ERROR_INVALID_PARAM)
        if index >= len(ds.buffers):
            raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: dataset {_hex(ds_handle)} has no buffer {index}")
        if values not in model.user_gears:
            code = ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID if kind == "batch" else ACL_ERROR_GE_SHAPE_INVALID
            raise _Fail(
                code, f"{call}: {values} is not a compiled gear of model {model_id} ({model.user_gears})"
            )
        buf = self.lookup(ds.buffers[index], _DataBuffer, "data buffer", ACL_ERROR_INVALID_PARAM)
        data = np.asarray(values, np.int64).tobytes()
        if buf.size < len(data):
            raise _Fail(
                ACL_ERROR_INVALID_PARAM,
                f"{call}: {ACL_DYNAMIC_TENSOR_NAME} buffer holds {buf.size} B, needs {len(data)} B",
            )
        dst = self.span(buf.addr, len(data), f"{call}: {ACL_DYNAMIC_TENSOR_NAME} buffer")
        ctypes.memmove(dst, data, len(data))


_GEAR_WORDS = {"batch": "batch", "hw": "image size", "dims": "dims"}

_KIND_NAMES = {
    0: "HOST_TO_HOST",
    1: "HOST_TO_DEVICE",
    2: "DEVICE_TO_HOST",
    3: "DEVICE_TO_DEVICE",
    4: "DEFAULT",
    5: "HOST_TO_BUF_TO_DEVICE",
    6: "INNER_DEVICE_TO_DEVICE",
    7: "INTER_DEVICE_TO_DEVICE",
}

_STATE = _FakeAcl()


# ----------------------------------------------------------------------------------------------------------------
# Argument parsing (a small PyArg_ParseTuple) and the dispatcher
# ----------------------------------------------------------------------------------------------------------------


def _convert(code: str, value: object) -> object:
    if (
        code in "kKIH"
    ):  # unsigned, no overflow check: Python int only (numpy ints are rejected on CPython <= 3.13)
        if not isinstance(value, int):
            raise TypeError(f"integer argument expected, got {type(value).__name__}")
        return value & {"k": _U64, "K": _U64, "I": _U32, "H": 0xFFFF}[code]
    if code == "i":
        if isinstance(value, float):
            raise TypeError("'float' object cannot be interpreted as an integer")
        number = operator.index(value)  # type: ignore[arg-type]
        if not -(1 << 31) <= number < (1 << 31):
            raise OverflowError("signed integer is out of range for a C int")
        return number
    if code == "s":
        if not isinstance(value, str):
            raise TypeError(f"str expected, not {type(value).__name__}")
        if "\0" in value:
            raise ValueError("embedded null character")
        return value
    if code == "f":
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise TypeError(f"must be real number, not {type(value).__name__}")
        return float(value)  # type: ignore[arg-type]
    return value  # "O"


def _parse(full: str, args: tuple[object, ...], fmt: str) -> tuple[Any, ...]:
    """Mimic PyArg_ParseTuple + CHECK_NULL: any mismatch raises ``TypeError('<full> args parse failed')``."""
    message = f"{full} args parse failed" + ("!" if full.startswith("acl.mdl.") else "")
    required, _, optional = fmt.partition("|")
    codes = required + optional
    if not len(required) <= len(args) <= len(codes):
        raise TypeError(
            f"{message}: takes {len(required)}{'-' + str(len(codes)) if optional else ''} positional "
            f"argument(s), got {len(args)}"
        )
    out: list[Any] = []
    for pos, (code, value) in enumerate(zip(codes, args), start=1):
        try:
            out.append(_convert(code, value))
        except (TypeError, OverflowError, ValueError) as exc:
            raise TypeError(f"{message}: argument {pos}: {exc}") from None
    out.extend([None] * (len(codes) - len(args)))
    return tuple(out)


@dataclass(frozen=True)
class _Spec:
    name: str
    fn: Callable[..., Any]
    fail: Callable[[int, tuple[Any, ...]], Any] | None
    is_async: bool


_REGISTRY: dict[str, _Spec] = {}


def _ret(code: int, _args: tuple[Any, ...]) -> int:
    return code


def _pair(code: int, _args: tuple[Any, ...]) -> tuple[int, int]:
    return 0, code


def _dict_pair(code: int, _args: tuple[Any, ...]) -> tuple[dict[str, Any], int]:
    return {}, code


def _api(
    name: str,
    fmt: str | None,
    fail: Callable[[int, tuple[Any, ...]], Any] | None = _ret,
    *,
    is_async: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``impl`` as ``acl.<name>``: parse args per ``fmt`` (None: ignore them, like the no-arg wrappers),
    run under the state lock, apply fault injection, and turn ``_Fail`` into the call's error return shape."""

    full = f"acl.{name}"

    def decorate(impl: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: object) -> Any:
            parsed = _parse(full, args, fmt) if fmt is not None else ()
            state = _STATE
            with state.lock:
                rule = _take_injection(state, name)
                if rule is not None and not rule.at_sync:
                    assert fail is not None
                    message = f"{full}: injected fault {rule.code} ({ERROR_NAMES.get(rule.code, '?')})"
                    state.set_err(message)
                    state.error_log.append((full, rule.code, message))
                    state.counters.failed_calls += 1
                    return fail(rule.code, parsed)
                state.pending_fault = rule.code if rule is not None else 0
                try:
                    return impl(state, *parsed)
                except _Fail as exc:
                    if fail is None:
                        raise ValueError(f"{full}: {exc.message}") from None
                    state.set_err(
                        f"{full}: {exc.message}" if not exc.message.startswith("acl.") else exc.message
                    )
                    state.error_log.append((full, exc.code, exc.message))
                    state.counters.failed_calls += 1
                    return fail(exc.code, parsed)
                finally:
                    state.pending_fault = 0

        short = name.rpartition(".")[2]
        wrapper.__name__ = short
        wrapper.__qualname__ = short
        wrapper.__doc__ = impl.__doc__
        _REGISTRY[name] = _Spec(name, wrapper, fail, is_async)
        return wrapper

    return decorate


def _take_injection(state: _FakeAcl, name: str) -> Injection | None:
    hit: Injection | None = None
    for rule in state.injections:
        if rule.call != name or rule.exhausted:
            continue
        rule.seen += 1
        if hit is None and rule.seen > rule.after:
            rule.fired += 1
            hit = rule
    return hit


# ----------------------------------------------------------------------------------------------------------------
# acl.*  (top level)
# ----------------------------------------------------------------------------------------------------------------


@_api("init", "|s")
def _init(s: _FakeAcl, config_path: str | None) -> int:
    """acl.init([config_json_path]) -> ret; a second call returns 100002 (ACL_ERROR_REPEAT_INITIALIZE)."""
    if config_path and not os.path.isfile(config_path):
        raise _Fail(ACL_ERROR_INVALID_FILE, f"config file {config_path!r} does not exist")
    if s.initialized:
        raise _Fail(ACL_ERROR_REPEAT_INITIALIZE, "acl.init was already called in this process (ignorable)")
    s.initialized = True
    return ACL_SUCCESS


@_api("finalize", None)
def _finalize(s: _FakeAcl) -> int:
    """acl.finalize() -> ret."""
    if not s.initialized:
        raise _Fail(ACL_ERROR_REPEAT_FINALIZE, "acl.finalize without a matching acl.init")
    s.initialized = False
    for obj in s.objects.values():
        if isinstance(obj, _Context) and obj.implicit:
            obj.destroyed = True
    s.device_refs.clear()
    s.default_ctx.clear()
    s.tls.ctx = 0
    return ACL_SUCCESS


@_api("get_version", None, lambda code, _a: (0, 0, 0, code))
def _get_version(s: _FakeAcl) -> tuple[int, int, int, int]:
    """acl.get_version() -> (major, minor, patch, ret)."""
    return (*s.config.version, ACL_SUCCESS)


@_api("get_soc_name", None, None)
def _get_soc_name(s: _FakeAcl) -> str:
    """acl.get_soc_name() -> str."""
    return s.config.soc_name


@_api("get_recent_err_msg", None, None)
def _get_recent_err_msg(s: _FakeAcl) -> str | None:
    """acl.get_recent_err_msg() -> str | None (per thread; cleared when read)."""
    message = getattr(s.tls, "last", None)
    s.tls.last = None
    return message


@_api("create_data_buffer", "kk", lambda code, _a: 0)
def _create_data_buffer(s: _FakeAcl, ptr: int, size: int) -> int:
    """acl.create_data_buffer(ptr, size) -> buffer handle (0 on failure).  Only a descriptor: no memory."""
    buf = _DataBuffer(0, ptr, size)
    buf.handle = s.new_handle(buf)
    return buf.handle


@_api("destroy_data_buffer", "k")
def _destroy_data_buffer(s: _FakeAcl, handle: int) -> int:
    """acl.destroy_data_buffer(buf) -> ret; the memory it points to stays allocated."""
    buf = s.lookup(handle, _DataBuffer, "data buffer", ACL_ERROR_INVALID_PARAM)
    buf.destroyed = True
    s.kill(handle, "data buffer")
    return ACL_SUCCESS


@_api("update_data_buffer", "kkk")
def _update_data_buffer(s: _FakeAcl, handle: int, ptr: int, size: int) -> int:
    """acl.update_data_buffer(buf, ptr, size) -> ret: re-point a buffer (datasets holding it see the change)."""
    buf = s.lookup(handle, _DataBuffer, "data buffer", ACL_ERROR_INVALID_PARAM)
    buf.addr, buf.size = ptr, size
    return ACL_SUCCESS


# ----------------------------------------------------------------------------------------------------------------
# acl.rt.*  devices, contexts, streams
# ----------------------------------------------------------------------------------------------------------------


@_api("rt.set_device", "i")
def _set_device(s: _FakeAcl, device_id: int) -> int:
    """acl.rt.set_device(id) -> ret; creates the device's default context and makes it current in this thread."""
    s.need_init("acl.rt.set_device")
    s.check_device(device_id)
    s.device_refs[device_id] = s.device_refs.get(device_id, 0) + 1
    handle = s.default_ctx.get(device_id)
    if handle is None:
        handle = s.make_context(device_id, implicit=True).handle
        s.default_ctx[device_id] = handle
    s.tls.ctx = handle
    return ACL_SUCCESS


@_api("rt.reset_device", "i")
def _reset_device(s: _FakeAcl, device_id: int) -> int:
    """acl.rt.reset_device(id) -> ret; the last reset destroys the default context."""
    s.check_device(device_id)
    refs = s.device_refs.get(device_id, 0)
    if refs <= 1:
        s.device_refs.pop(device_id, None)
        handle = s.default_ctx.pop(device_id, None)
        if handle is not None:
            ctx = s.objects[handle]
            ctx.destroyed = True
            s.kill(ctx.default_stream, "default stream of a reset device")
            s.kill(handle, "default context of a reset device")
    else:
        s.device_refs[device_id] = refs - 1
    return ACL_SUCCESS


@_api("rt.get_device_count", None, _pair)
def _get_device_count(s: _FakeAcl) -> tuple[int, int]:
    """acl.rt.get_device_count() -> (count, ret)."""
    return s.config.device_count, ACL_SUCCESS


@_api("rt.get_run_mode", None, _pair)
def _get_run_mode(s: _FakeAcl) -> tuple[int, int]:
    """acl.rt.get_run_mode() -> (ACL_HOST=1 on a 910B server, ret)."""
    return s.config.run_mode, ACL_SUCCESS


@_api("rt.create_context", "i", _pair)
def _create_context(s: _FakeAcl, device_id: int) -> tuple[int, int]:
    """acl.rt.create_context(id) -> (context, ret); the new context becomes current in this thread."""
    s.need_init("acl.rt.create_context")
    s.check_device(device_id)
    ctx = s.make_context(device_id, implicit=False)
    s.tls.ctx = ctx.handle
    return ctx.handle, ACL_SUCCESS


@_api("rt.destroy_context", "k")
def _destroy_context(s: _FakeAcl, handle: int) -> int:
    """acl.rt.destroy_context(ctx) -> ret (not for the default context of set_device)."""
    ctx = s.lookup(handle, _Context, "context", ACL_ERROR_RT_PARAM_INVALID)
    if ctx.implicit:
        raise _Fail(
            ACL_ERROR_RT_PARAM_INVALID,
            f"context {_hex(handle)} is the default context of device "
            f"{ctx.device}; release it with acl.rt.reset_device",
        )
    stream = s.objects.get(ctx.default_stream)
    if isinstance(stream, _Stream):
        s.drain(stream)  # a failure here is lost with the context, as on the device
        s.kill(stream.handle, "default stream of a destroyed context")
    ctx.destroyed = True
    s.kill(handle, "context")
    return ACL_SUCCESS


@_api("rt.set_context", "k")
def _set_context(s: _FakeAcl, handle: int) -> int:
    """acl.rt.set_context(ctx) -> ret: make ``ctx`` current for the calling thread."""
    ctx = s.lookup(handle, _Context, "context", ACL_ERROR_RT_PARAM_INVALID)
    s.tls.ctx = ctx.handle
    return ACL_SUCCESS


@_api("rt.create_stream", None, _pair)
def _create_stream(s: _FakeAcl) -> tuple[int, int]:
    """acl.rt.create_stream() -> (stream, ret) in the current context."""
    ctx = s.need_context("acl.rt.create_stream")
    live = sum(1 for o in s.objects.values() if isinstance(o, _Stream) and o.device == ctx.device)
    if live >= s.config.max_streams:
        raise _Fail(ACL_ERROR_RT_NO_STREAM_RESOURCE, f"device {ctx.device} already has {live} streams")
    stream = _Stream(0, ctx.handle, ctx.device)
    stream.handle = s.new_handle(stream)
    return stream.handle, ACL_SUCCESS


@_api("rt.destroy_stream", "k")
def _destroy_stream(s: _FakeAcl, handle: int) -> int:
    """acl.rt.destroy_stream(stream) -> ret; the stream must belong to the current context."""
    ctx = s.need_context("acl.rt.destroy_stream")
    stream = s.lookup(handle, _Stream, "stream", ACL_ERROR_RT_PARAM_INVALID)
    stream = s.stream_for(handle, ctx, "acl.rt.destroy_stream")
    if stream.is_default:
        raise _Fail(ACL_ERROR_RT_PARAM_INVALID, f"stream {_hex(handle)} is a context's default stream")
    code, message = s.drain(stream)
    stream.destroyed = True
    s.kill(handle, "stream")
    if code:
        raise _Fail(code, f"while destroying stream {_hex(handle)}: {message}")
    return ACL_SUCCESS


@_api("rt.synchronize_stream", "k")
def _synchronize_stream(s: _FakeAcl, handle: int) -> int:
    """acl.rt.synchronize_stream(stream) -> ret: runs every queued task; returns the first task error."""
    return s.sync(handle, "acl.rt.synchronize_stream")


# ----------------------------------------------------------------------------------------------------------------
# acl.rt.*  memory
# ----------------------------------------------------------------------------------------------------------------


@_api("rt.malloc", "ki", _pair)
def _malloc(s: _FakeAcl, size: int, policy: int) -> tuple[int, int]:
    """acl.rt.malloc(size, policy) -> (dev_ptr, ret): size rounded up to 32 plus 32 bytes, 64-byte aligned start,
    contents not initialised."""
    return s.malloc(size, "malloc", 32), ACL_SUCCESS


@_api("rt.free", "k")
def _free(s: _FakeAcl, ptr: int) -> int:
    """acl.rt.free(dev_ptr) -> ret: only base addresses returned by malloc, once."""
    s.free(ptr)
    return ACL_SUCCESS


def _copy_checks(
    s: _FakeAcl, call: str, dst: int, dst_max: int, src: int, count: int, kind: int
) -> tuple[str, str] | None:
    s.need_context(call)
    if count > dst_max:
        raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: count {count} > dst_max {dst_max}")
    d_where, s_where = s.copy_direction(dst, src, kind, call)
    if count == 0:
        return None
    s.span(dst, count, f"{call}: dst")
    s.span(src, count, f"{call}: src")
    return d_where, s_where


@_api("rt.memcpy", "kkkki")
def _memcpy(s: _FakeAcl, dst: int, dst_max: int, src: int, count: int, kind: int) -> int:
    """acl.rt.memcpy(dst, dst_max, src, count, kind) -> ret (synchronous)."""
    sides = _copy_checks(s, "acl.rt.memcpy", dst, dst_max, src, count, kind)
    if sides is None:
        return ACL_SUCCESS
    ctypes.memmove(s.span(dst, count, "dst"), s.span(src, count, "src"), count)
    s.count_copy(*sides, count, is_async=False)
    return ACL_SUCCESS


def _memset_checks(s: _FakeAcl, call: str, ptr: int, max_count: int, count: int) -> None:
    s.need_context(call)
    if count > max_count:
        raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: count {count} > max_count {max_count}")
    if s.where(ptr) not in ("device", "pinned"):
        s.span(ptr, max(count, 1), f"{call}: ptr")
        raise _Fail(ACL_ERROR_RT_PARAM_INVALID, f"{call}: {_hex(ptr)} is not device (or malloc_host) memory")
    if count:
        s.span(ptr, count, f"{call}: ptr")


@_api("rt.memset", "kkik")
def _memset(s: _FakeAcl, ptr: int, max_count: int, value: int, count: int) -> int:
    """acl.rt.memset(ptr, max_count, value, count) -> ret: fills ``count`` bytes with ``value & 0xFF``."""
    _memset_checks(s, "acl.rt.memset", ptr, max_count, count)
    if count:
        ctypes.memset(s.span(ptr, count, "ptr"), value & 0xFF, count)
    s.counters.memset_calls += 1
    s.counters.memset_bytes += count
    return ACL_SUCCESS


@_api("rt.get_mem_info", "i", lambda code, _a: (0, 0, code))
def _get_mem_info(s: _FakeAcl, attr: int) -> tuple[int, int, int]:
    """acl.rt.get_mem_info(attr) -> (free, total, ret); ACL_HBM_MEM (1) is what samples use."""
    s.need_context("acl.rt.get_mem_info")
    if attr in (0, 2, 3, 6, 7):
        return 0, 0, ACL_SUCCESS
    if attr in (1, 4, 5, 8, 9, 10, 11):
        total = s.config.hbm_bytes
        return max(0, total - s.counters.device_bytes_in_use), total, ACL_SUCCESS
    raise _Fail(ACL_ERROR_INVALID_PARAM, f"acl.rt.get_mem_info: {attr} is not an aclrtMemAttr")


# ----------------------------------------------------------------------------------------------------------------
# acl.mdl.*
# ----------------------------------------------------------------------------------------------------------------


@_api("mdl.load_from_file", "s", _pair)
def _load_from_file(s: _FakeAcl, path: str) -> tuple[int, int]:
    """acl.mdl.load_from_file(path) -> (model_id, ret).  The file is an ONNX graph standing in for an .om."""
    s.need_init("acl.mdl.load_from_file")
    s.need_context("acl.mdl.load_from_file")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _Fail(ACL_ERROR_INVALID_FILE, f"cannot read model file {path!r}: {exc.strerror}") from None
    if not os.path.isfile(path):
        raise _Fail(ACL_ERROR_INVALID_FILE, f"model path {path!r} is not a file")
    key = ("file", os.path.abspath(path), st.st_mtime_ns, st.st_size)
    return s.load_model(path, path, key).model_id, ACL_SUCCESS


@_api("mdl.unload", "I")
def _unload(s: _FakeAcl, model_id: int) -> int:
    """acl.mdl.unload(model_id) -> ret; must run in the context that loaded the model."""
    ctx = s.need_context("acl.mdl.unload")
    model = s.model(model_id, "acl.mdl.unload")
    if model.context != ctx.handle:
        raise _Fail(ACL_ERROR_RT_MODEL_CONTEXT, f"model {model_id} belongs to context {_hex(model.context)}")
    if model.pending:
        raise _Fail(
            ACL_ERROR_RT_MODEL_RUNNING,
            f"model {model_id} still has {model.pending} queued execute_async "
            f"task(s) on stream {_hex(model.pending_stream)}; synchronize first",
        )
    model.unloaded = True
    del s.models[model_id]
    return ACL_SUCCESS


@_api("mdl.create_desc", None, lambda code, _a: 0)
def _create_desc(s: _FakeAcl) -> int:
    """acl.mdl.create_desc() -> desc handle (empty until get_desc)."""
    desc = _Desc(0)
    desc.handle = s.new_handle(desc)
    return desc.handle


@_api("mdl.get_desc", "kI")
def _get_desc(s: _FakeAcl, handle: int, model_id: int) -> int:
    """acl.mdl.get_desc(desc, model_id) -> ret: fill ``desc`` with the model's I/O description."""
    desc = s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    desc.model = s.model(model_id, "acl.mdl.get_desc")
    return ACL_SUCCESS


@_api("mdl.destroy_desc", "k")
def _destroy_desc(s: _FakeAcl, handle: int) -> int:
    """acl.mdl.destroy_desc(desc) -> ret."""
    desc = s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    desc.destroyed = True
    s.kill(handle, "model desc")
    return ACL_SUCCESS


def _desc_io(s: _FakeAcl, handle: int, index: int, outputs: bool) -> _IO | None:
    desc = s.objects.get(handle)
    if not isinstance(desc, _Desc) or desc.model is None:
        return None
    ios = desc.model.outputs if outputs else desc.model.inputs
    return ios[index] if index < len(ios) else None


def _desc_model(s: _FakeAcl, handle: int) -> _Model | None:
    desc = s.objects.get(handle)
    return desc.model if isinstance(desc, _Desc) else None


@_api("mdl.get_num_inputs", "k", None)
def _get_num_inputs(s: _FakeAcl, handle: int) -> int:
    """acl.mdl.get_num_inputs(desc) -> int (includes ascend_mbatch_shape_data for dynamic models)."""
    model = _desc_model(s, handle)
    return len(model.inputs) if model else 0


@_api("mdl.get_num_outputs", "k", None)
def _get_num_outputs(s: _FakeAcl, handle: int) -> int:
    """acl.mdl.get_num_outputs(desc) -> int."""
    model = _desc_model(s, handle)
    return len(model.outputs) if model else 0


@_api("mdl.get_input_size_by_index", "kk", None)
def _get_input_size_by_index(s: _FakeAcl, handle: int, index: int) -> int:
    """acl.mdl.get_input_size_by_index(desc, i) -> bytes (largest gear; 0 if invalid)."""
    io = _desc_io(s, handle, index, outputs=False)
    return io.size if io else 0


@_api("mdl.get_output_size_by_index", "kk", None)
def _get_output_size_by_index(s: _FakeAcl, handle: int, index: int) -> int:
    """acl.mdl.get_output_size_by_index(desc, i) -> bytes (largest gear; 0 if invalid)."""
    io = _desc_io(s, handle, index, outputs=True)
    return io.size if io else 0


def _dims_dict(name: str, dims: list[int]) -> dict[str, Any]:
    return {"name": name, "dimCount": len(dims), "dims": list(dims)}


def _dims(s: _FakeAcl, handle: int, index: int, outputs: bool, call: str) -> tuple[dict[str, Any], int]:
    s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    io = _desc_io(s, handle, index, outputs)
    if io is None:
        raise _Fail(
            ACL_ERROR_INVALID_PARAM, f"{call}: index {index} out of range (or desc not filled by get_desc)"
        )
    return _dims_dict(io.name, io.dims), ACL_SUCCESS


@_api("mdl.get_input_dims", "kk", _dict_pair)
def _get_input_dims(s: _FakeAcl, handle: int, index: int) -> tuple[dict[str, Any], int]:
    """acl.mdl.get_input_dims(desc, i) -> ({"name", "dimCount", "dims"}, ret); ``{}`` on error; -1 = dynamic."""
    return _dims(s, handle, index, False, "acl.mdl.get_input_dims")


@_api("mdl.get_output_dims", "kk", _dict_pair)
def _get_output_dims(s: _FakeAcl, handle: int, index: int) -> tuple[dict[str, Any], int]:
    """acl.mdl.get_output_dims(desc, i) -> (dims dict, ret)."""
    return _dims(s, handle, index, True, "acl.mdl.get_output_dims")


@_api("mdl.get_input_name_by_index", "kk", None)
def _get_input_name_by_index(s: _FakeAcl, handle: int, index: int) -> str | None:
    """acl.mdl.get_input_name_by_index(desc, i) -> str (None if invalid)."""
    io = _desc_io(s, handle, index, outputs=False)
    return io.name if io else None


@_api("mdl.get_output_name_by_index", "kk", None)
def _get_output_name_by_index(s: _FakeAcl, handle: int, index: int) -> str | None:
    """acl.mdl.get_output_name_by_index(desc, i) -> str (None if invalid)."""
    io = _desc_io(s, handle, index, outputs=True)
    return io.name if io else None


@_api("mdl.get_input_data_type", "kk", None)
def _get_input_data_type(s: _FakeAcl, handle: int, index: int) -> int:
    """acl.mdl.get_input_data_type(desc, i) -> aclDataType (-1 if invalid)."""
    io = _desc_io(s, handle, index, outputs=False)
    return io.acl_dtype if io else ACL_DT_UNDEFINED


@_api("mdl.get_output_data_type", "kk", None)
def _get_output_data_type(s: _FakeAcl, handle: int, index: int) -> int:
    """acl.mdl.get_output_data_type(desc, i) -> aclDataType (-1 if invalid)."""
    io = _desc_io(s, handle, index, outputs=True)
    return io.acl_dtype if io else ACL_DT_UNDEFINED


def _index_by_name(s: _FakeAcl, handle: int, name: str, outputs: bool, call: str) -> tuple[int, int]:
    s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    model = _desc_model(s, handle)
    for i, io in enumerate((model.outputs if outputs else model.inputs) if model else []):
        if io.name == name:
            return i, ACL_SUCCESS
    raise _Fail(ACL_ERROR_INVALID_PARAM, f"{call}: no {'output' if outputs else 'input'} named {name!r}")


@_api("mdl.create_dataset", None, lambda code, _a: 0)
def _create_dataset(s: _FakeAcl) -> int:
    """acl.mdl.create_dataset() -> dataset handle."""
    ds = _Dataset(0)
    ds.handle = s.new_handle(ds)
    return ds.handle


@_api("mdl.destroy_dataset", "k")
def _destroy_dataset(s: _FakeAcl, handle: int) -> int:
    """acl.mdl.destroy_dataset(ds) -> ret; its data buffers are NOT destroyed."""
    ds = s.lookup(handle, _Dataset, "dataset", ACL_ERROR_INVALID_PARAM)
    ds.destroyed = True
    s.kill(handle, "dataset")
    return ACL_SUCCESS


@_api("mdl.add_dataset_buffer", "kk", lambda code, args: (args[0] if args else 0, code))
def _add_dataset_buffer(s: _FakeAcl, handle: int, buffer: int) -> tuple[int, int]:
    """acl.mdl.add_dataset_buffer(ds, buf) -> (ds, ret)."""
    ds = s.lookup(handle, _Dataset, "dataset", ACL_ERROR_INVALID_PARAM)
    s.lookup(buffer, _DataBuffer, "data buffer", ACL_ERROR_INVALID_PARAM)
    ds.buffers.append(buffer)
    return handle, ACL_SUCCESS


@_api("mdl.execute_async", "Ikkk", is_async=True)
def _execute_async(s: _FakeAcl, model_id: int, in_ds: int, out_ds: int, handle: int) -> int:
    """acl.mdl.execute_async(model_id, in_ds, out_ds, stream) -> ret: queued; runs at synchronize_stream.  Buffer
    addresses are captured now, so re-pointing a data buffer afterwards affects only later calls."""
    call = "acl.mdl.execute_async"
    ctx = s.need_context(call)
    stream = s.stream_for(handle, ctx, call)
    model, run = s.prepare_execute(model_id, in_ds, out_ds, call)
    if model.pending and model.pending_stream != stream.handle:
        raise _Fail(
            ACL_ERROR_INVALID_PARAM,
            f"{call}: model {model_id} still has queued work on stream "
            f"{_hex(model.pending_stream)}; one model must not run concurrently "
            "on several streams",
        )

    def cleanup() -> None:
        model.pending -= 1

    model.pending += 1
    model.pending_stream = stream.handle
    s.enqueue(stream, _Task(f"{call}(model {model_id})", run, cleanup=cleanup))
    s.counters.execute_async_calls += 1
    return ACL_SUCCESS


@_api("mdl.set_input_dynamic_dims", "IkkO")
def _set_input_dynamic_dims(s: _FakeAcl, model_id: int, ds: int, index: int, dims: object) -> int:
    """acl.mdl.set_input_dynamic_dims(model_id, in_ds, idx, {"name", "dimCount", "dims"}) -> ret; "dims" is the
    concatenation of every input's full shape for the chosen gear."""
    if not isinstance(dims, dict):
        raise TypeError("argument 4 is not dict")
    count = dims.get("dimCount")
    if not isinstance(count, int):
        raise TypeError("dimCount of argument 4 is not an int")
    values = dims.get("dims")
    if not isinstance(values, list):
        raise TypeError("The dims of parameter 4 is not a list.")
    if len(values) < count or not all(isinstance(v, int) for v in values[:count]):
        raise TypeError("the dims of fourth parameter is not list of int")
    call = "acl.mdl.set_input_dynamic_dims"
    model = s.model(model_id, call)
    full = tuple(values[:count])
    for gear in model.user_gears if model.dyn_kind == "dims" else []:
        shapes = s.concrete_shapes(model.inputs[: model.n_real_inputs], gear)
        if tuple(d for shape in shapes for d in shape) == full:
            s.write_gear(model_id, ds, index, "dims", gear, call)
            return ACL_SUCCESS
    if model.dyn_kind != "dims":
        raise _Fail(
            ACL_ERROR_MODEL_NOT_DYNAMIC,
            f"{call}: model {model_id} has no dynamic dims gears (it is {model.dyn_kind or 'static'})",
        )
    raise _Fail(
        ACL_ERROR_GE_SHAPE_INVALID, f"{call}: dims {list(full)} match no compiled gear of model {model_id}"
    )


@_api("mdl.get_input_dynamic_gear_count", "kk", _pair)
def _get_input_dynamic_gear_count(s: _FakeAcl, handle: int, index: int) -> tuple[int, int]:
    """acl.mdl.get_input_dynamic_gear_count(desc, idx) -> (count, ret)."""
    s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    model = _desc_model(s, handle)
    return (len(model.user_gears) if model and model.dyn_kind == "dims" else 0), ACL_SUCCESS


@_api("mdl.get_input_dynamic_dims", "kkk", lambda code, _a: ([], code))
def _get_input_dynamic_dims(
    s: _FakeAcl, handle: int, index: int, count: int
) -> tuple[list[dict[str, Any]], int]:
    """acl.mdl.get_input_dynamic_dims(desc, idx, gear_count) -> ([dims dict per gear], ret)."""
    s.lookup(handle, _Desc, "model desc", ACL_ERROR_INVALID_PARAM)
    model = _desc_model(s, handle)
    gears = model.user_gears if model and model.dyn_kind == "dims" else []
    if count != len(gears):
        raise _Fail(ACL_ERROR_INVALID_PARAM, f"gear_count {count} != the model's {len(gears)} gears")
    assert model is not None or not gears
    out = []
    for gear in gears:
        assert model is not None
        shapes = s.concrete_shapes(model.inputs[: model.n_real_inputs], gear)
        out.append(_dims_dict("", [d for shape in shapes for d in shape]))
    return out, ACL_SUCCESS


# ----------------------------------------------------------------------------------------------------------------
# acl.util.*
# ----------------------------------------------------------------------------------------------------------------


def _host_view(s: _FakeAcl, ptr: int, size: int, call: str) -> int:
    where = s.where(ptr)
    if where == "device":
        raise ValueError(
            f"{call}: {_hex(ptr)} is a device pointer; it is not host-accessible (real pyACL would "
            "crash reading it) - copy it to the host with acl.rt.memcpy first"
        )
    if where == "handle":
        raise ValueError(f"{call}: {_hex(ptr)} is a fake-acl handle, not memory")
    if ptr == 0 or ptr < _MIN_HOST_PTR:
        raise ValueError(f"{call}: {_hex(ptr)} is not a valid host address")
    return ptr


# ----------------------------------------------------------------------------------------------------------------
# The module object
# ----------------------------------------------------------------------------------------------------------------

_SUBMODULES = ("rt", "mdl", "media", "op", "blas", "util", "prof", "himpi", "fv")


def _build_module() -> types.ModuleType:
    root = types.ModuleType("acl", "Fake pyACL from tests/fakes/fake_acl.py (no Ascend device).")
    root.__file__ = __file__
    root.__vostream_fake__ = True  # type: ignore[attr-defined]
    subs = {name: types.ModuleType(f"acl.{name}") for name in _SUBMODULES}
    for name, sub in subs.items():
        setattr(root, name, sub)
    for name, spec in _REGISTRY.items():
        ns, _, short = name.rpartition(".")
        setattr(subs[ns] if ns else root, short, spec.fn)
    return root


_MODULE = _build_module()
_SAVED: dict[str, types.ModuleType | None] = {}


# ----------------------------------------------------------------------------------------------------------------
# Control API (for tests): not part of pyACL
# ----------------------------------------------------------------------------------------------------------------


def module() -> types.ModuleType:
    """The fake ``acl`` module object (not installed)."""
    return _MODULE


def install() -> types.ModuleType:
    """Put the fake into ``sys.modules['acl']`` (and ``acl.rt`` ...), remembering what was there; returns it."""
    names = {"acl": _MODULE, **{f"acl.{n}": getattr(_MODULE, n) for n in _SUBMODULES}}
    for name, mod in names.items():
        if name not in _SAVED:
            current = sys.modules.get(name)
            _SAVED[name] = current if current is not mod else None
        sys.modules[name] = mod
    return _MODULE


def uninstall() -> None:
    """Remove the fake from ``sys.modules`` (restoring a module that was there before :func:`install`)."""
    ours = {"acl": _MODULE, **{f"acl.{n}": getattr(_MODULE, n) for n in _SUBMODULES}}
    for name, mod in ours.items():
        if sys.modules.get(name) is mod:
            del sys.modules[name]
        previous = _SAVED.get(name)
        if previous is not None:
            sys.modules[name] = previous
    _SAVED.clear()


def reset(**config: Any) -> None:
    """Forget all state (handles, memory, models, counters, injections, model options); apply ``config``."""
    global _STATE
    old = _STATE
    with old.lock:
        _STATE = _FakeAcl()
    if config:
        configure(**config)


def configure(**changes: Any) -> FakeConfig:
    """Change :class:`FakeConfig` fields (e.g. ``hbm_bytes``, ``device_count``, ``io_align``); returns the config."""
    names = {f.name for f in fields(FakeConfig)}
    unknown = set(changes) - names
    if unknown:
        raise TypeError(f"configure: unknown option(s) {sorted(unknown)}; known: {sorted(names)}")
    with _STATE.lock:
        _STATE.config = replace(_STATE.config, **changes)
        return _STATE.config


def model_options(path: str | os.PathLike[str], **options: str | None) -> None:
    """ATC-like options for a model file, instead of ``fake_acl.*`` ONNX metadata: ``input_shape="x:1,3,8,8"``,
    ``dynamic_batch_size="1,2,4"``, ``dynamic_image_size="224,224;448,448"``, ``dynamic_dims="1;2;4"``."""
    unknown = set(options) - set(_MDL_OPTION_KEYS)
    if unknown:
        raise TypeError(
            f"model_options: unknown option(s) {sorted(unknown)}; known: {list(_MDL_OPTION_KEYS)}"
        )
    with _STATE.lock:
        entry = _STATE.model_opts.setdefault(os.path.abspath(os.fspath(path)), {})
        entry.update({k: v for k, v in options.items() if v})


def stats() -> AclStats:
    """A snapshot of the transfer / execution counters since the last :func:`reset` or :func:`reset_stats`."""
    with _STATE.lock:
        values = asdict(_STATE.counters)
        return AclStats(**values)


def reset_stats() -> None:
    """Zero the counters (bytes in use and its peak are kept current)."""
    with _STATE.lock:
        in_use = _STATE.counters.device_bytes_in_use
        _STATE.counters = _Counters(device_bytes_in_use=in_use, peak_device_bytes=in_use)


def live_handles() -> dict[str, list[int]]:
    """Everything created and not yet released, by category (all keys always present)."""
    s = _STATE
    with s.lock:
        out: dict[str, list[int]] = {
            "device_memory": [a.base for a in s.dev_allocs if not a.freed],
            "host_memory": list(s.host_bases),
            "devices": sorted(s.device_refs),
            "contexts": [],
            "streams": [],
            "models": sorted(s.models),
            "model_descs": [],
            "datasets": [],
            "data_buffers": [],
        }
        kinds = {
            _Context: "contexts",
            _Stream: "streams",
            _Desc: "model_descs",
            _Dataset: "datasets",
            _DataBuffer: "data_buffers",
        }
        for handle, obj in s.objects.items():
            if getattr(obj, "destroyed", False):
                continue
            if isinstance(obj, _Context) and obj.implicit:
                continue  # released by reset_device (reported under "devices")
            if isinstance(obj, _Stream) and obj.is_default:
                continue  # owned by its context
            out[kinds[type(obj)]].append(handle)
        return out


def assert_no_leaks(*, allow: Iterable[str] = ()) -> None:
    """Raise ``AssertionError`` naming every live handle outside the categories in ``allow``."""
    allowed = set(allow)
    leaks = {k: v for k, v in live_handles().items() if v and k not in allowed}
    if leaks:
        with _STATE.lock:
            sizes = {a.base: a.size for a in _STATE.dev_allocs if not a.freed}
        detail = "; ".join(
            f"{k}: "
            + ", ".join(
                f"{_hex(h)} ({sizes[h]} B)"
                if k == "device_memory"
                else (str(h) if k in ("models", "devices", "threads") else _hex(h))
                for h in v
            )
            for k, v in leaks.items()
        )
        raise AssertionError(f"fake acl: leaked {detail}")


def inject(
    call: str, code: int, *, after: int = 0, times: int | None = 1, at_sync: bool = False
) -> Injection:
    """Make ``acl.<call>`` fail with ``code``: after ``after`` matching calls, ``times`` times (None = forever).

    ``call`` is e.g. ``"mdl.execute_async"`` or ``"rt.malloc"`` (an ``acl.`` prefix is accepted).  The call
    returns ``code`` in its usual error shape without side effects.  With ``at_sync=True`` (async calls only) the
    call succeeds and the queued task fails, so ``synchronize_stream`` returns ``code``.
    """
    name = call.removeprefix("acl.")
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"inject: the fake has no acl.{name}")
    if spec.fail is None:
        raise ValueError(f"inject: acl.{name} returns no error code, nothing to inject")
    if at_sync and not spec.is_async:
        raise ValueError(f"inject: at_sync needs an asynchronous call, acl.{name} is not")
    if not isinstance(code, int) or code == 0:
        raise ValueError("inject: code must be a non-zero int")
    rule = Injection(name, code, after, times, at_sync)
    with _STATE.lock:
        _STATE.injections.append(rule)
    return rule


def clear_injections() -> None:
    """Drop every fault-injection rule."""
    with _STATE.lock:
        _STATE.injections.clear()


def error_log() -> list[tuple[str, int, str]]:
    """The last 200 failures as ``(call, code, message)``, oldest first (all threads)."""
    with _STATE.lock:
        return list(_STATE.error_log)


def peek(ptr: int, nbytes: int) -> bytes:
    """Read device (or malloc_host) memory without counting a transfer; raises ValueError for bad ranges."""
    with _STATE.lock:
        try:
            return ctypes.string_at(_STATE.span(ptr, nbytes, "peek"), nbytes)
        except _Fail as exc:
            raise ValueError(exc.message) from None


def poke(ptr: int, data: bytes | bytearray | memoryview | np.ndarray[Any, Any]) -> None:
    """Write bytes into device (or malloc_host) memory without counting a transfer."""
    raw = np.ascontiguousarray(data).view(np.uint8).tobytes() if isinstance(data, np.ndarray) else bytes(data)
    with _STATE.lock:
        try:
            ctypes.memmove(_STATE.span(ptr, len(raw), "poke"), raw, len(raw))
        except _Fail as exc:
            raise ValueError(exc.message) from None


def api_names() -> list[str]:
    """Every ``acl.*`` function the fake implements, e.g. ``"rt.malloc"``, ``"init"``."""
    return sorted(_REGISTRY)


# ----------------------------------------------------------------------------------------------------------------
# Running vostream on the fake: ``python tests/fakes/fake_acl.py <vostream arguments>``
# ----------------------------------------------------------------------------------------------------------------

#: environment variable with a JSON object of :class:`FakeConfig` fields, applied wherever the fake is installed by
#: :func:`main` or by an ``acl`` shim (:func:`write_shim`), child processes included
CONFIG_ENV = "FAKE_ACL_CONFIG"

_SHIM = """# written by tests/fakes/fake_acl.py: 'import acl' here gives the fake pyACL (configured from ${env})
import json, os, sys
sys.path.insert(0, {tests!r})
from fakes import fake_acl
fake_acl.configure(**json.loads(os.environ.get({env!r}) or "{{}}"))
sys.modules["acl"] = fake_acl.install()
"""


def write_shim(directory: str | os.PathLike[str]) -> str:
    """Write ``directory/acl.py``: a module that, when imported as ``acl``, installs this fake in its place.  Put
    ``directory`` on ``PYTHONPATH`` so child processes (``vostream doctor``'s probe) get the fake too."""
    path = os.path.join(os.fspath(directory), "acl.py")
    here = os.path.dirname(
        os.path.dirname(os.path.abspath(__file__))
    )  # tests/, which holds the fakes package
    with open(path, "w") as f:
        f.write(_SHIM.replace("${env}", CONFIG_ENV).format(tests=here, env=CONFIG_ENV))
    return path


def main(argv: list[str] | None = None) -> int:
    """``python tests/fakes/fake_acl.py <vostream arguments>``: ``vostream`` with this fake as ``acl`` and the fake ATC
    (``tests/fakes/fake_atc.py``) as ``atc`` on ``PATH``, in this process and in its child processes; no NPU, no CANN.
    ``FAKE_ACL_CONFIG='{"hbm_bytes": 1073741824}'`` configures the fake device (:class:`FakeConfig`)."""
    import json
    import tempfile

    from fakes import fake_atc
    from vostream.apps.cli import main as vostream_main

    argv = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory(prefix="fake-acl-") as tmp:
        fake_atc.install(tmp)
        write_shim(tmp)
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: 'import fakes' there
        saved = {k: os.environ.get(k) for k in ("PATH", "PYTHONPATH")}
        os.environ["PATH"] = os.pathsep.join([tmp, os.environ.get("PATH", "")])
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, here, os.environ.get("PYTHONPATH")) if p)
        configure(**json.loads(os.environ.get(CONFIG_ENV) or "{}"))
        install()
        try:
            return vostream_main(argv)
        finally:
            uninstall()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def _format_guesses() -> str:
    return (
        "\nGuesses (behaviour not pinned by the reference; verify on hardware):\n\n"
        + "\n".join(f"{i}. {g}" for i, g in enumerate(GUESSES, start=1))
        + "\n"
    )


__doc__ = (__doc__ or "") + _format_guesses()

__all__ = [
    "ERROR_NAMES",
    "GUESSES",
    "AclStats",
    "FakeConfig",
    "Injection",
    "api_names",
    "assert_no_leaks",
    "clear_injections",
    "configure",
    "error_log",
    "inject",
    "install",
    "live_handles",
    "main",
    "model_options",
    "module",
    "peek",
    "poke",
    "reset",
    "reset_stats",
    "stats",
    "uninstall",
    "write_shim",
]

if __name__ == "__main__":
    # tests/fakes/ is sys.path[0]: put tests/ first and import this file once more as ``fakes.fake_acl``, the
    # module everything else imports
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from fakes import fake_acl as _self

    raise SystemExit(_self.main(sys.argv[1:]))
