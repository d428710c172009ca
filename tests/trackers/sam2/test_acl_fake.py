"""The fake pyACL (``tests/fakes/fake_acl.py``): the §9 checklist of shared/reference/ascend-acl.md,
end-to-end runs of tiny ONNX "om" models through datasets and streams, thread/context rules, leaks, injected faults
and transfer accounting."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip("onnxruntime", reason="onnxruntime is part of the [test] extra: pip install -e '.[test]'")
from fakes import fake_acl as fake
from onnx import TensorProto, helper, numpy_helper

H2D, D2H, D2D, H2H, DEFAULT = 1, 2, 3, 0, 4
HBM = 1


# ------------------------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def acl() -> Iterator[types.ModuleType]:
    """A fresh fake installed as ``acl``."""
    fake.reset()
    module = fake.install()
    yield module
    fake.uninstall()
    fake.reset()


@pytest.fixture
def dev(acl: types.ModuleType) -> tuple[types.ModuleType, int, int]:
    """init → set_device → create_context → create_stream, as the samples do; returns (acl, ctx, stream)."""
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    stream, ret = acl.rt.create_stream()
    assert ret == 0
    return acl, ctx, stream


def _save(model: Any, path: Path, meta: dict[str, str] | None = None) -> str:
    model.ir_version = 8
    if meta:
        helper.set_model_props(model, meta)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


W = np.arange(12, dtype=np.float32).reshape(4, 3) / 7.0
B = np.array([0.5, -1.0, 2.0], np.float32)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Tiny ONNX graphs standing in for .om files."""
    d = tmp_path_factory.mktemp("om")
    opset = [helper.make_opsetid("", 17)]
    out: dict[str, str] = {}

    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "b")],
    )
    out["linear"] = _save(helper.make_model(g, opset_imports=opset), d / "linear.om")

    two = np.array([2.0], np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "two"], ["doubled"]),
            helper.make_node("ArgMax", ["x"], ["best"], axis=1, keepdims=1),
        ],
        "two_outputs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [
            helper.make_tensor_value_info("doubled", TensorProto.FLOAT, [1, 8]),
            helper.make_tensor_value_info("best", TensorProto.INT64, [1, 1]),
        ],
        [numpy_helper.from_array(two, "two")],
    )
    out["two"] = _save(helper.make_model(g, opset_imports=opset), d / "two.om")

    one = np.array([1.0], np.float32)
    g = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "dyn_batch",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(one, "one")],
    )
    dyn = helper.make_model(g, opset_imports=opset)
    out["dyn_batch"] = _save(dyn, d / "dyn_batch.om", {"fake_acl.dynamic_batch_size": "1,2,4"})
    out["dyn_none"] = _save(helper.make_model(g, opset_imports=opset), d / "dyn_none.om")
    out["dyn_dims"] = _save(helper.make_model(g, opset_imports=opset), d / "dyn_dims.om")

    (d / "garbage.om").write_bytes(b"this is not a model")
    out["garbage"] = str(d / "garbage.om")
    return out


def h2d(acl: types.ModuleType, ptr: int, array: np.ndarray) -> None:
    """Host -> device from a NumPy array's address, as ``AclRuntime.upload`` does."""
    data = np.ascontiguousarray(array)
    assert acl.rt.memcpy(ptr, data.nbytes, data.ctypes.data, data.nbytes, H2D) == 0


def d2h(acl: types.ModuleType, ptr: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Device -> host into a fresh NumPy array's address, as ``AclRuntime.download`` does."""
    out = np.empty(shape, dtype)
    assert acl.rt.memcpy(out.ctypes.data, out.nbytes, ptr, out.nbytes, D2H) == 0
    return out


def addr(data: bytes | bytearray) -> int:
    """The address of a bytes object's buffer (writable in place, as host memory is to pyACL)."""
    if isinstance(data, bytearray):
        return ctypes.addressof(ctypes.c_char.from_buffer(data))
    return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0


def run(acl: types.ModuleType, stream: int, model_id: int, ins: int, outs: int) -> int:
    """``execute_async`` + ``synchronize_stream`` (what AclRuntime.run does): the first non-zero code."""
    return acl.mdl.execute_async(model_id, ins, outs, stream) or acl.rt.synchronize_stream(stream)


def dataset(acl: types.ModuleType, *buffers: tuple[int, int]) -> tuple[int, list[int]]:
    ds = acl.mdl.create_dataset()
    bufs = []
    for ptr, size in buffers:
        buf = acl.create_data_buffer(ptr, size)
        got, ret = acl.mdl.add_dataset_buffer(ds, buf)
        assert (got, ret) == (ds, 0)
        bufs.append(buf)
    return ds, bufs


def load(acl: types.ModuleType, path: str) -> tuple[int, int]:
    model_id, ret = acl.mdl.load_from_file(path)
    assert ret == 0, acl.get_recent_err_msg()
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, model_id) == 0
    return model_id, desc


def linear_io(
    acl: types.ModuleType, models: dict[str, str], fill: float = 0.0
) -> tuple[int, int, int, int, int, int]:
    """The ``linear`` model loaded, its input ``x`` (2x4 float32, set to ``fill``) and output ``y`` on the device,
    each in a dataset: ``(model_id, desc, x, y, ins, outs)``."""
    model_id, desc = load(acl, models["linear"])
    x, _ = acl.rt.malloc(32, 0)
    y, _ = acl.rt.malloc(24, 0)
    h2d(acl, x, np.full((2, 4), fill, np.float32))
    ins, _ = dataset(acl, (x, 32))
    outs, _ = dataset(acl, (y, 24))
    return model_id, desc, x, y, ins, outs


# ------------------------------------------------------------------------------------------------------------------
# module object
# ------------------------------------------------------------------------------------------------------------------


def test_module_surface_install_and_guesses(acl: types.ModuleType) -> None:
    import acl as imported  # type: ignore[import-not-found]

    assert imported is acl and sys.modules["acl.rt"] is acl.rt and sys.modules["acl.mdl"] is acl.mdl
    for name in ("rt", "mdl", "util", "op", "media", "blas", "prof", "himpi", "fv"):
        assert isinstance(getattr(acl, name), types.ModuleType)
    assert len(fake.api_names()) == 45  # the calls AclRuntime and vostream doctor make, nothing else
    for name in (
        "rt.malloc",
        "rt.memcpy",
        "mdl.execute_async",
        "mdl.set_input_dynamic_dims",
        "update_data_buffer",
    ):
        assert name in fake.api_names()
    assert not hasattr(acl.mdl, "execute") and not hasattr(
        acl.rt, "memcpy_async"
    )  # never used by the product
    assert not [n for n in dir(acl) if n.startswith("ACL_")], "the real module defines no constants"
    assert fake.__test__ is False
    assert len(fake.GUESSES) >= 10 and all(g in (fake.__doc__ or "") for g in fake.GUESSES)
    with pytest.raises(TypeError):
        acl.rt.malloc(size=1, policy=0)  # METH_VARARGS: no keywords


def test_install_restores_a_previous_module() -> None:
    fake.uninstall()
    dummy = types.ModuleType("acl")
    sys.modules["acl"] = dummy
    try:
        assert fake.install() is sys.modules["acl"]
        fake.uninstall()
        assert sys.modules["acl"] is dummy and "acl.rt" not in sys.modules
    finally:
        sys.modules.pop("acl", None)


# ------------------------------------------------------------------------------------------------------------------
# §9: handles, address space, host pointers
# ------------------------------------------------------------------------------------------------------------------


def test_device_pointers_are_private_ints_with_interior_offsets(dev: Any) -> None:
    acl, ctx, stream = dev
    ptr, ret = acl.rt.malloc(256, 2)
    host = np.zeros(4, np.float32)
    host_ptr = host.ctypes.data
    assert ret == 0 and all(type(h) is int for h in (ptr, ctx, stream, host_ptr))
    assert ptr % 64 == 0 and ptr != host_ptr and fake._DEV_BASE <= ptr < fake._DEV_LIMIT
    assert not fake._DEV_BASE <= host_ptr < fake._DEV_LIMIT
    h2d(acl, ptr + 64, np.array([1, 2, 3, 4], np.float32))  # interior offset
    np.testing.assert_array_equal(d2h(acl, ptr + 68, (3,), np.float32), [2, 3, 4])


def test_malloc_rounding_poison_and_bounds(dev: Any) -> None:
    acl, _, _ = dev
    free0, total, ret = acl.rt.get_mem_info(HBM)
    assert ret == 0 and free0 == total
    ptr, _ = acl.rt.malloc(100, 0)
    assert acl.rt.get_mem_info(HBM)[0] == free0 - 160  # ALIGN_UP(100, 32) + 32
    p32, _ = acl.rt.malloc(100, 2)
    assert acl.rt.get_mem_info(HBM)[0] == free0 - 160 - 160
    assert fake.peek(ptr, 100) == b"\xff" * 100  # not zeroed
    assert acl.rt.malloc(0, 0) == (0, fake.ACL_ERROR_INVALID_PARAM)
    one = bytes(1)
    assert acl.rt.memcpy(ptr + 99, 1, addr(one), 1, H2D) == 0
    assert acl.rt.memcpy(ptr + 100, 1, addr(one), 1, H2D) == fake.ACL_ERROR_RT_PARAM_INVALID
    assert "overruns" in acl.get_recent_err_msg()
    fake.configure(strict_bounds=False)  # padded size, as the hardware would allow
    assert acl.rt.memcpy(ptr + 159, 1, addr(one), 1, H2D) == 0
    assert acl.rt.memcpy(ptr + 160, 1, addr(one), 1, H2D) == fake.ACL_ERROR_RT_PARAM_INVALID
    assert acl.rt.free(p32) == 0 and acl.rt.free(ptr) == 0


def test_free_errors_and_use_after_free(dev: Any) -> None:
    acl, _, _ = dev
    ptr, _ = acl.rt.malloc(64, 0)
    buf = bytes(64)
    assert acl.rt.free(ptr + 32) == fake.ACL_ERROR_RT_PARAM_INVALID
    assert "interior" in acl.get_recent_err_msg()
    assert acl.rt.free(ptr) == 0
    assert acl.rt.free(ptr) == fake.ACL_ERROR_RT_PARAM_INVALID
    assert "double free" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(addr(buf), 64, ptr, 64, D2H) == fake.ACL_ERROR_RT_PARAM_INVALID
    assert "already freed" in acl.get_recent_err_msg()
    assert acl.rt.free(0) == fake.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memset(ptr, 64, 0, 64) == fake.ACL_ERROR_RT_PARAM_INVALID


def test_memcpy_kinds_and_limits(dev: Any) -> None:
    acl, _, _ = dev
    a, _ = acl.rt.malloc(64, 0)
    b, _ = acl.rt.malloc(64, 0)
    src = np.arange(16, dtype=np.float32).tobytes()
    host = addr(src)
    assert acl.rt.memcpy(host, 64, a, 64, H2D) == fake.ACL_ERROR_RT_PARAM_INVALID  # dst is host memory
    assert "HOST_TO_DEVICE" in acl.get_recent_err_msg()
    assert acl.rt.memcpy(a, 32, host, 64, H2D) == fake.ACL_ERROR_INVALID_PARAM  # count > dst_max
    assert acl.rt.memcpy(a, 64, host, 64, 9) == fake.ACL_ERROR_INVALID_PARAM  # not a memcpy kind
    assert acl.rt.memcpy(a, 64, 0, 64, H2D) == fake.ACL_ERROR_INVALID_PARAM
    assert acl.rt.memcpy(a, 64, host, 64, DEFAULT) == 0  # direction inferred
    assert acl.rt.memcpy(b, 64, a, 64, D2D) == 0
    np.testing.assert_array_equal(d2h(acl, b, (16,), np.float32), np.arange(16))
    ds = acl.mdl.create_dataset()
    assert acl.rt.memcpy(ds, 64, host, 64, H2D) == fake.ACL_ERROR_RT_PARAM_INVALID  # a handle is not memory
    assert "Dataset handle" in acl.get_recent_err_msg()


# ------------------------------------------------------------------------------------------------------------------
# §9: return shapes and type errors; lifecycle
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.rt.malloc("1", 0),
        lambda a: a.rt.malloc(np.int64(8), 0),  # 'k' accepts Python ints only
        lambda a: a.rt.malloc(8),
        lambda a: a.rt.free(None),
        lambda a: a.rt.set_device(0.0),
        lambda a: a.rt.memcpy(1, 2, 3, 4),
        lambda a: a.mdl.load_from_file(123),
        lambda a: a.mdl.execute_async(1, 2, 3),
        lambda a: a.create_data_buffer(1.0, 2),
        lambda a: a.update_data_buffer(1, None, 2),
        lambda a: a.mdl.set_input_dynamic_dims(1, 2, 3),
    ],
)
def test_bad_argument_types_raise_type_error(acl: types.ModuleType, call: Any) -> None:
    with pytest.raises(TypeError):
        call(acl)


def test_argument_parse_message_and_int_conversions(acl: types.ModuleType) -> None:
    with pytest.raises(TypeError, match=r"^acl\.rt\.malloc args parse failed"):
        acl.rt.malloc(None, 0)
    with pytest.raises(TypeError, match=r"^acl\.mdl\.load_from_file args parse failed!"):
        acl.mdl.load_from_file(None)
    acl.init()
    assert acl.rt.set_device(np.int32(0)) == 0  # 'i' takes anything with __index__
    buf = acl.create_data_buffer(-1, 8)  # 'k': no overflow check, the value wraps to uintptr_t
    assert buf != 0 and fake._STATE.objects[buf].addr == 2**64 - 1


def test_init_finalize_and_uninitialised_calls(acl: types.ModuleType) -> None:
    assert acl.rt.set_device(0) == fake.ACL_ERROR_UNINITIALIZE
    assert acl.rt.create_context(0) == (0, fake.ACL_ERROR_UNINITIALIZE)
    assert acl.init() == 0
    assert acl.init() == fake.ACL_ERROR_REPEAT_INITIALIZE
    assert acl.rt.set_device(1) == fake.ACL_ERROR_RT_INVALID_DEVICEID
    assert acl.rt.get_run_mode() == (fake.ACL_HOST, 0)
    assert acl.rt.get_device_count() == (1, 0)
    assert acl.get_version()[3] == 0 and len(acl.get_version()) == 4
    assert isinstance(acl.get_soc_name(), str)
    assert acl.finalize() == 0
    assert acl.finalize() == fake.ACL_ERROR_REPEAT_FINALIZE


def test_recent_error_message_is_per_thread_and_cleared(dev: Any) -> None:
    acl, _, _ = dev
    assert acl.get_recent_err_msg() is None
    assert acl.rt.free(12345678) != 0
    message = acl.get_recent_err_msg()
    assert "acl.rt.free" in message and acl.get_recent_err_msg() is None
    seen: list[object] = []
    t = threading.Thread(target=lambda: seen.append(acl.get_recent_err_msg()))
    assert acl.rt.free(12345678) != 0
    t.start()
    t.join()
    assert seen == [None] and acl.get_recent_err_msg() is not None


# ------------------------------------------------------------------------------------------------------------------
# §9: contexts per thread, stream / model ownership
# ------------------------------------------------------------------------------------------------------------------


def test_second_thread_needs_set_context(dev: Any) -> None:
    acl, ctx, stream = dev
    ptr, _ = acl.rt.malloc(64, 0)
    results: dict[str, object] = {}

    def worker() -> None:
        results["malloc"] = acl.rt.malloc(64, 0)
        results["create_stream"] = acl.rt.create_stream()
        results["sync"] = acl.rt.synchronize_stream(stream)
        results["memset"] = acl.rt.memset(ptr, 64, 0, 64)
        results["set_context"] = acl.rt.set_context(ctx)
        results["after"] = acl.rt.memset(ptr, 64, 1, 64)
        results["sync_after"] = acl.rt.synchronize_stream(stream)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    null = fake.ACL_ERROR_RT_CONTEXT_NULL
    assert results["malloc"] == (0, null) and results["create_stream"] == (0, null)
    assert results["sync"] == null and results["memset"] == null
    assert results["set_context"] == 0 and results["after"] == 0 and results["sync_after"] == 0
    assert fake.peek(ptr, 4) == b"\x01" * 4


def test_stream_and_model_must_belong_to_the_current_context(dev: Any, models: dict[str, str]) -> None:
    acl, ctx_a, stream_a = dev
    model_id, _ = load(acl, models["linear"])
    x, _ = acl.rt.malloc(32, 0)
    y, _ = acl.rt.malloc(24, 0)
    ins, _ = dataset(acl, (x, 32))
    outs, _ = dataset(acl, (y, 24))
    ctx_b, _ = acl.rt.create_context(0)  # now current
    stream_b, _ = acl.rt.create_stream()
    assert acl.rt.synchronize_stream(stream_a) == fake.ACL_ERROR_RT_STREAM_CONTEXT
    assert acl.rt.destroy_stream(stream_a) == fake.ACL_ERROR_RT_STREAM_CONTEXT
    assert acl.mdl.execute_async(model_id, ins, outs, stream_b) == fake.ACL_ERROR_RT_MODEL_CONTEXT
    assert acl.mdl.unload(model_id) == fake.ACL_ERROR_RT_MODEL_CONTEXT
    assert acl.rt.set_context(ctx_a) == 0
    assert acl.mdl.execute_async(model_id, ins, outs, stream_b) == fake.ACL_ERROR_RT_STREAM_CONTEXT
    h2d(acl, x, np.ones((2, 4), np.float32))
    assert acl.mdl.execute_async(model_id, ins, outs, stream_a) == 0
    assert acl.rt.synchronize_stream(stream_a) == 0
    assert acl.rt.set_context(0) == fake.ACL_ERROR_INVALID_PARAM
    assert acl.rt.destroy_context(ctx_b) == 0
    assert acl.rt.set_context(ctx_b) == fake.ACL_ERROR_RT_PARAM_INVALID


# ------------------------------------------------------------------------------------------------------------------
# models: descs, datasets, execute / execute_async
# ------------------------------------------------------------------------------------------------------------------


def test_linear_model_execute_async_into_an_interior_offset(dev: Any, models: dict[str, str]) -> None:
    acl, _, stream = dev
    model_id, desc = load(acl, models["linear"])
    assert (acl.mdl.get_num_inputs(desc), acl.mdl.get_num_outputs(desc)) == (1, 1)
    assert acl.mdl.get_input_size_by_index(desc, 0) == 32 and acl.mdl.get_output_size_by_index(desc, 0) == 24
    assert acl.mdl.get_input_dims(desc, 0) == ({"name": "x", "dimCount": 2, "dims": [2, 4]}, 0)
    assert acl.mdl.get_output_dims(desc, 0) == ({"name": "y", "dimCount": 2, "dims": [2, 3]}, 0)
    assert acl.mdl.get_input_data_type(desc, 0) == fake.ACL_FLOAT
    assert (
        acl.mdl.get_input_name_by_index(desc, 0) == "x" and acl.mdl.get_output_name_by_index(desc, 0) == "y"
    )

    x_host = np.array([[1, 2, 3, 4], [-1, 0.5, 0, 2]], np.float32)
    x_dev, _ = acl.rt.malloc(32, 0)
    h2d(acl, x_dev, x_host)
    bank, _ = acl.rt.malloc(4096, 0)  # outputs go to slots inside one bigger buffer
    ins, _ = dataset(acl, (x_dev, 32))
    outs, (out_buf,) = dataset(acl, (bank + 1024, 24))

    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    assert fake.peek(bank + 1024, 24) == b"\xff" * 24  # queued, not run yet
    assert acl.rt.synchronize_stream(stream) == 0
    expected = x_host @ W + B
    np.testing.assert_allclose(d2h(acl, bank + 1024, (2, 3), np.float32), expected, rtol=1e-6)
    untouched = fake.peek(bank, 4096)
    assert untouched[:1024] == b"\xff" * 1024 and untouched[1048:] == b"\xff" * (4096 - 1048)

    # re-point the resident dataset at the next slot, as the runtime does for the memory bank
    assert acl.update_data_buffer(out_buf, bank + 2048, 24) == 0
    h2d(acl, x_dev, 2 * x_host)
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    np.testing.assert_allclose(d2h(acl, bank + 2048, (2, 3), np.float32), 2 * x_host @ W + B, rtol=1e-6)
    np.testing.assert_allclose(d2h(acl, bank + 1024, (2, 3), np.float32), expected, rtol=1e-6)
    st = fake.stats()
    assert st.executes == 2 and st.execute_async_calls == 2 and st.executes_by_model == {model_id: 2}


def test_two_output_model_with_int64_output(dev: Any, models: dict[str, str]) -> None:
    acl, _, _ = dev
    model_id, desc = load(acl, models["two"])
    assert acl.mdl.get_num_outputs(desc) == 2
    assert acl.mdl.get_output_data_type(desc, 1) == fake.ACL_INT64
    assert acl.mdl.get_output_dims(desc, 1)[0]["dims"] == [1, 1]
    x_host = np.array([[3, -1, 7, 2, 0, 9, 1, 4]], np.float32)
    x_dev, _ = acl.rt.malloc(32, 0)
    out_dev, _ = acl.rt.malloc(32 + 64, 0)
    h2d(acl, x_dev, x_host)
    ins, _ = dataset(acl, (x_dev, 32))
    outs, _ = dataset(acl, (out_dev, 32), (out_dev + 64, 8))
    assert run(acl, dev[2], model_id, ins, outs) == 0  # synchronous
    np.testing.assert_array_equal(d2h(acl, out_dev, (1, 8), np.float32), 2 * x_host)
    assert d2h(acl, out_dev + 64, (1, 1), np.int64)[0, 0] == 5


def test_desc_queries_out_of_range(dev: Any, models: dict[str, str]) -> None:
    acl, _, _ = dev
    _, desc = load(acl, models["linear"])
    dims, ret = acl.mdl.get_input_dims(desc, 5)
    assert dims == {} and ret != 0
    assert acl.mdl.get_input_name_by_index(desc, 5) is None
    assert acl.mdl.get_input_size_by_index(desc, 5) == 0
    assert acl.mdl.get_input_data_type(desc, 5) == fake.ACL_DT_UNDEFINED
    empty = acl.mdl.create_desc()
    assert acl.mdl.get_num_inputs(empty) == 0 and acl.mdl.get_num_inputs(12345) == 0
    assert acl.mdl.get_desc(empty, 999) == fake.ACL_ERROR_INVALID_MODEL_ID
    assert acl.mdl.get_input_dims(0, 0) == ({}, fake.ACL_ERROR_INVALID_PARAM)


def test_execute_validation(dev: Any, models: dict[str, str]) -> None:
    acl, _, stream = dev
    model_id, _ = load(acl, models["linear"])
    x, _ = acl.rt.malloc(32, 0)
    y, _ = acl.rt.malloc(256, 0)
    h2d(acl, x, np.zeros((2, 4), np.float32))
    ins, (in_buf,) = dataset(acl, (x, 32))
    outs, _ = dataset(acl, (y, 24))
    empty = acl.mdl.create_dataset()
    assert run(acl, dev[2], model_id, empty, outs) == fake.ACL_ERROR_MODEL_INPUT_NOT_MATCH
    small, _ = dataset(acl, (y, 16))
    assert run(acl, dev[2], model_id, ins, small) == fake.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
    host_out = bytes(24)
    host_ds, _ = dataset(acl, (addr(host_out), 24))
    assert run(acl, dev[2], model_id, ins, host_ds) == fake.ACL_ERROR_GE_EXEC_MODEL_ADDR_INVALID
    misaligned, _ = dataset(acl, (y + 4, 24))
    assert run(acl, dev[2], model_id, ins, misaligned) == fake.ACL_ERROR_RT_ADDR_UNALIGNED
    assert run(acl, dev[2], 77, ins, outs) == fake.ACL_ERROR_INVALID_MODEL_ID
    # memory freed between launch and synchronize: the queued run fails at synchronize time
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    assert acl.rt.free(x) == 0
    assert acl.rt.synchronize_stream(stream) == fake.ACL_ERROR_RT_MODEL_EXECUTE
    assert "freed" in acl.get_recent_err_msg()
    assert acl.destroy_data_buffer(in_buf) == 0
    assert run(acl, dev[2], model_id, ins, outs) == fake.ACL_ERROR_INVALID_PARAM


def test_unload_with_queued_work_and_model_on_two_streams(dev: Any, models: dict[str, str]) -> None:
    acl, _, stream = dev
    model_id, _, x, y, ins, outs = linear_io(acl, models)
    other, _ = acl.rt.create_stream()
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    assert acl.mdl.execute_async(model_id, ins, outs, other) == fake.ACL_ERROR_INVALID_PARAM
    assert acl.mdl.unload(model_id) == fake.ACL_ERROR_RT_MODEL_RUNNING
    assert acl.rt.synchronize_stream(stream) == 0
    assert acl.mdl.unload(model_id) == 0
    assert acl.mdl.unload(model_id) == fake.ACL_ERROR_INVALID_MODEL_ID


def test_load_errors(dev: Any, models: dict[str, str], tmp_path: Path) -> None:
    acl, _, _ = dev
    assert acl.mdl.load_from_file(str(tmp_path / "missing.om")) == (0, fake.ACL_ERROR_INVALID_FILE)
    assert acl.mdl.load_from_file(models["garbage"]) == (0, fake.ACL_ERROR_PARSE_MODEL)
    assert acl.mdl.load_from_file(models["dyn_none"]) == (0, fake.ACL_ERROR_PARSE_MODEL)
    assert "dynamic dim" in acl.get_recent_err_msg()
    fake.model_options(models["dyn_none"], input_shape="x:3,4")  # like ATC --input_shape
    model_id, desc = load(acl, models["dyn_none"])
    assert (
        acl.mdl.get_input_dims(desc, 0)[0]["dims"] == [3, 4]
        and acl.mdl.get_output_size_by_index(desc, 0) == 48
    )


# ------------------------------------------------------------------------------------------------------------------
# §9: dynamic gears
# ------------------------------------------------------------------------------------------------------------------


def test_dynamic_dims_gears(dev: Any, models: dict[str, str]) -> None:
    acl, _, _ = dev
    fake.model_options(models["dyn_dims"], dynamic_dims="1;3")
    model_id, desc = load(acl, models["dyn_dims"])
    assert acl.mdl.get_input_dynamic_gear_count(desc, -1) == (2, 0)
    gears, ret = acl.mdl.get_input_dynamic_dims(desc, -1, 2)
    assert ret == 0 and [g["dims"] for g in gears] == [[1, 4], [3, 4]]
    x, _ = acl.rt.malloc(48, 0)
    y, _ = acl.rt.malloc(48, 0)
    gear_buf, _ = acl.rt.malloc(8, 0)
    ins, _ = dataset(acl, (x, 48), (gear_buf, 8))
    outs, _ = dataset(acl, (y, 48))
    bad = {"name": "", "dimCount": 2, "dims": [2, 4]}
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, 1, bad) == fake.ACL_ERROR_GE_SHAPE_INVALID
    with pytest.raises(TypeError):
        acl.mdl.set_input_dynamic_dims(model_id, ins, 1, [3, 4])
    with pytest.raises(TypeError):
        acl.mdl.set_input_dynamic_dims(model_id, ins, 1, {"name": "", "dimCount": 2, "dims": [3, 4.0]})
    assert acl.mdl.set_input_dynamic_dims(model_id, ins, 1, {"name": "", "dimCount": 2, "dims": [3, 4]}) == 0
    h2d(acl, x, np.full((3, 4), 2.0, np.float32))
    assert run(acl, dev[2], model_id, ins, outs) == 0
    np.testing.assert_array_equal(d2h(acl, y, (3, 4), np.float32), np.full((3, 4), 3.0))


# ------------------------------------------------------------------------------------------------------------------
# streams, async copies, events, callbacks
# ------------------------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------------------------
# memory accounting, leaks, injected faults, transfer stats
# ------------------------------------------------------------------------------------------------------------------


def test_mem_info_and_out_of_memory(dev: Any) -> None:
    acl, _, _ = dev
    fake.configure(hbm_bytes=1 << 20)
    assert acl.rt.get_mem_info(HBM) == (1 << 20, 1 << 20, 0)
    assert acl.rt.get_mem_info(fake.ACL_DDR_MEM) == (0, 0, 0)
    assert acl.rt.get_mem_info(99)[2] == fake.ACL_ERROR_INVALID_PARAM
    a, ret = acl.rt.malloc(600_000, 0)
    assert ret == 0 and acl.rt.get_mem_info(HBM)[0] == (1 << 20) - (600_000 + 32)
    assert acl.rt.malloc(600_000, 0) == (0, fake.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert acl.rt.free(a) == 0 and acl.rt.malloc(600_000, 0)[1] == 0
    assert fake.stats().peak_device_bytes == 600_032


def test_leak_reporting_follows_the_release_order(dev: Any, models: dict[str, str]) -> None:
    acl, ctx, stream = dev
    model_id, desc = load(acl, models["linear"])
    x, _ = acl.rt.malloc(32, 0)
    ins, (buf,) = dataset(acl, (x, 32))
    live = fake.live_handles()
    assert live["models"] == [model_id] and live["model_descs"] == [desc] and live["datasets"] == [ins]
    assert live["data_buffers"] == [buf] and live["device_memory"] == [x]
    assert live["streams"] == [stream] and live["contexts"] == [ctx] and live["devices"] == [0]

    assert acl.mdl.destroy_dataset(ins) == 0  # does not destroy its buffers
    assert fake.live_handles()["data_buffers"] == [buf]
    assert acl.destroy_data_buffer(buf) == 0  # does not free the memory
    with pytest.raises(AssertionError, match=r"device_memory: 0x[0-9a-f]+ \(32 B\)"):
        fake.assert_no_leaks(allow=("models", "model_descs", "streams", "contexts", "devices"))
    assert acl.mdl.unload(model_id) == 0 and acl.mdl.destroy_desc(desc) == 0
    assert acl.rt.free(x) == 0
    assert acl.rt.destroy_stream(stream) == 0
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0
    fake.assert_no_leaks()
    assert acl.mdl.destroy_desc(desc) == fake.ACL_ERROR_INVALID_PARAM


def test_fault_injection(dev: Any, models: dict[str, str]) -> None:
    acl, _, stream = dev
    model_id, desc, x, y, ins, outs = linear_io(acl, models)

    rule = fake.inject("mdl.execute_async", fake.ACL_ERROR_RT_MODEL_EXECUTE)
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == fake.ACL_ERROR_RT_MODEL_EXECUTE
    assert "injected" in acl.get_recent_err_msg() and rule.fired == 1 and rule.exhausted
    assert fake.stats().execute_async_calls == 0  # nothing was queued
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0 and acl.rt.synchronize_stream(stream) == 0

    fake.inject("acl.rt.malloc", fake.ACL_ERROR_RT_MEMORY_ALLOCATION, after=1)
    assert acl.rt.malloc(8, 0)[1] == 0
    assert acl.rt.malloc(8, 0) == (0, fake.ACL_ERROR_RT_MEMORY_ALLOCATION)
    assert acl.rt.malloc(8, 0)[1] == 0

    fake.inject("mdl.execute_async", fake.ACL_ERROR_RT_AICORE_EXCEPTION, at_sync=True)
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
    executes = fake.stats().executes
    assert acl.rt.synchronize_stream(stream) == fake.ACL_ERROR_RT_AICORE_EXCEPTION
    assert "1 later task(s) discarded" in acl.get_recent_err_msg()
    assert fake.stats().executes == executes  # the run queued after the failed one never ran
    assert acl.rt.synchronize_stream(stream) == 0  # the stream is usable again

    fake.inject("mdl.get_input_dims", fake.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.get_input_dims(desc, 0) == ({}, fake.ACL_ERROR_INVALID_PARAM)
    fake.inject("mdl.add_dataset_buffer", fake.ACL_ERROR_INVALID_PARAM)
    assert acl.mdl.add_dataset_buffer(ins, acl.create_data_buffer(x, 32)) == (
        ins,
        fake.ACL_ERROR_INVALID_PARAM,
    )
    fake.inject("rt.synchronize_stream", fake.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, times=None)
    assert [acl.rt.synchronize_stream(stream) for _ in range(3)] == [
        fake.ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
    ] * 3
    fake.clear_injections()
    assert acl.rt.synchronize_stream(stream) == 0
    with pytest.raises(ValueError):
        fake.inject("rt.no_such_call", 1)
    with pytest.raises(ValueError):
        fake.inject("mdl.get_num_inputs", 1)  # returns no error code
    with pytest.raises(ValueError):
        fake.inject("rt.malloc", 1, at_sync=True)


def test_transfer_stats(dev: Any) -> None:
    acl, _, stream = dev
    fake.reset_stats()
    a, _ = acl.rt.malloc(256, 0)
    b, _ = acl.rt.malloc(256, 0)
    h2d(acl, a, np.zeros(64, np.float32))  # 256 B
    d2h(acl, a, (16,), np.float32)  # 64 B
    assert acl.rt.memcpy(b, 256, a, 128, D2D) == 0
    src = bytes(32)
    dst = bytes(32)
    assert acl.rt.memcpy(addr(dst), 32, addr(src), 32, H2H) == 0
    h2d(acl, b, np.zeros(64, np.float32))  # 256 B
    d2h(acl, b, (16,), np.float32)  # 64 B
    assert acl.rt.memset(a, 256, 0, 100) == 0
    assert acl.rt.synchronize_stream(stream) == 0
    st = fake.stats()
    assert (st.h2d_calls, st.h2d_bytes) == (2, 512)
    assert (st.d2h_calls, st.d2h_bytes) == (2, 128)
    assert (st.d2d_calls, st.d2d_bytes) == (1, 128)
    assert (st.h2h_calls, st.h2h_bytes) == (1, 32)
    assert (st.memset_calls, st.memset_bytes) == (1, 100) and st.syncs == 1
    assert st.as_dict()["h2d_bytes"] == 512
    fake.reset_stats()
    zero = fake.stats()
    assert zero.h2d_calls == 0 and zero.device_bytes_in_use == 2 * (256 + 32)


def test_reset_forgets_everything(dev: Any) -> None:
    acl, _, _ = dev
    acl.rt.malloc(64, 0)
    fake.inject("rt.malloc", 1)
    fake.reset()
    assert not any(fake.live_handles().values()) and fake.stats().mallocs == 0
    assert acl.init() == 0 and acl.rt.set_device(0) == 0 and acl.rt.malloc(64, 0)[1] == 0


def test_fast_enough(dev: Any, models: dict[str, str]) -> None:
    """A resident-dataset execute loop stays cheap (the fake must not dominate SAM runtime tests)."""
    acl, _, stream = dev
    model_id, _, x, y, ins, outs = linear_io(acl, models, 1.0)
    start = time.perf_counter()
    for _ in range(200):
        assert acl.mdl.execute_async(model_id, ins, outs, stream) == 0
        assert acl.rt.synchronize_stream(stream) == 0
    assert time.perf_counter() - start < 2.0
