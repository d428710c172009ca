"""What vostream knows about pyACL (AscendCL) and the one way it calls it: the constants the extension module does
not export, the error codes with their meanings, and :class:`AclCalls`, which turns every non-zero return code into
a :class:`BackendError` naming the call, the code, its meaning (:data:`ACL_ERRORS`) and ``acl.get_recent_err_msg()``.

API facts from ``shared/reference/ascend-acl.md``; the runtime is :class:`~.acl.AclRuntime`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TypeVar

from vostream.pipeline.errors import BackendError

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


def describe_error(code: int) -> str:
    """``"507011 (ACL_ERROR_RT_MODEL_EXECUTE: model execution failed ...)"``."""
    name, meaning = ACL_ERRORS.get(
        code, ("unknown ACL error", "not in vostream's table; see the CANN error codes")
    )
    return f"{code} ({name}: {meaning})"


def import_acl() -> ModuleType:
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


def align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


#: what a pyACL call returns beside its status code (a handle, a size, ...)
V = TypeVar("V")


class AclCalls:
    """Checked pyACL calls for one owner: ``check(ret, where, call)`` raises a :class:`BackendError`
    ``"<owner>.<where>: <call> returned <code> (<name>: <meaning>) (<detail>); device says: <recent message>"``
    when ``ret`` is not ``ACL_SUCCESS``; ``pair((value, ret), ...)`` checks the code and returns the value."""

    def __init__(self, acl: ModuleType, owner: str) -> None:
        self.acl = acl
        self.owner = owner

    def recent(self) -> str:
        fn = getattr(self.acl, "get_recent_err_msg", None)
        try:
            msg = fn() if fn is not None else None
        except Exception:  # noqa: BLE001 - diagnostics must never mask the real error
            msg = None
        return f"; device says: {msg.strip()}" if msg and str(msg).strip() else ""

    def error(self, where: str, call: str, code: int, detail: str = "") -> BackendError:
        extra = f" ({detail})" if detail else ""
        return BackendError(
            f"{self.owner}.{where}: {call} returned {describe_error(int(code))}{extra}{self.recent()}"
        )

    def check(self, ret: int, where: str, call: str, detail: str = "") -> None:
        if ret != ACL_SUCCESS:
            raise self.error(where, call, ret, detail)

    def pair(self, result: tuple[V, int], where: str, call: str, detail: str = "") -> V:
        value, ret = result
        self.check(ret, where, call, detail)
        return value


__all__ = [
    "ACL_DTYPES",
    "ACL_ERRORS",
    "AclCalls",
    "IO_ALIGN",
    "align",
    "describe_error",
    "import_acl",
]
