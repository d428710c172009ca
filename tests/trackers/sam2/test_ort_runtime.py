"""``OrtRuntime`` on CPU with tiny hand-built ONNX graphs standing in for the four SAM-2 graphs.

What is proven here: outputs land in place inside interior slot views (and nowhere else), graphs chain through device
buffers with no host traffic, ``stats`` counts exactly the uploaded/downloaded bytes, the manifest is enforced at load
and at run time, and every failure is a ``BackendError`` naming the call/file/tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

REASON = "onnx and onnxruntime are part of the [test] extra: pip install -e '.[test]'"
onnx = pytest.importorskip("onnx", reason=REASON)
pytest.importorskip("onnxruntime", reason=REASON)

from onnx import TensorProto, helper

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.backends.ort import CPU_EP, CUDA_EP, TRT_EP, OrtRuntime
from vostream.stages.trackers.sam2.manifest import GraphSpec, Manifest, TensorSpec, load_manifest
from vostream.stages.trackers.sam2.runtime import DeviceBuffer

L, T, M = 3, 4, 3  # bank slots, tokens per slot, memory dim
F = TensorProto.FLOAT
_ONNX_DTYPES = {"float32": F, "int64": TensorProto.INT64, "int32": TensorProto.INT32}


def _model(
    nodes: list, ins: list[TensorSpec], outs: list[TensorSpec], inits: list | None = None
) -> onnx.ModelProto:
    vi = [helper.make_tensor_value_info(t.name, _ONNX_DTYPES[t.dtype], list(t.shape)) for t in ins]
    vo = [helper.make_tensor_value_info(t.name, _ONNX_DTYPES[t.dtype], list(t.shape)) for t in outs]
    m = helper.make_model(
        helper.make_graph(nodes, "g", vi, vo, initializer=inits or []),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _scalar(name: str, v: float) -> TensorProto:
    return helper.make_tensor(name, F, [], [v])


def _graphs() -> dict[str, tuple[onnx.ModelProto, GraphSpec]]:
    """Four toy graphs with the SAM-2 graph names (so ``load_manifest`` accepts the manifest)."""
    g: dict[str, tuple[onnx.ModelProto, GraphSpec]] = {}
    # "encoder": feat = image * 2 + 1
    i, o = [TensorSpec("image", (1, T, M), "float32")], [TensorSpec("feat", (1, T, M), "float32")]
    g["image_encoder"] = (
        _model(
            [
                helper.make_node("Mul", ["image", "two"], ["t"]),
                helper.make_node("Add", ["t", "one"], ["feat"]),
            ],
            i,
            o,
            [_scalar("two", 2.0), _scalar("one", 1.0)],
        ),
        GraphSpec("image_encoder", "image_encoder.onnx", tuple(i), tuple(o)),
    )
    # two outputs: maskmem = feat * 10 (bound to a bank slot), obj_ptr = mean over tokens
    i = [TensorSpec("feat", (1, T, M), "float32")]
    o = [TensorSpec("maskmem", (1, T, M), "float32"), TensorSpec("obj_ptr", (1, M), "float32")]
    g["memory_encoder"] = (
        _model(
            [
                helper.make_node("Mul", ["feat", "ten"], ["maskmem"]),
                helper.make_node("ReduceMean", ["feat"], ["obj_ptr"], axes=[1], keepdims=0),
            ],
            i,
            o,
            [_scalar("ten", 10.0)],
        ),
        GraphSpec("memory_encoder", "memory_encoder.onnx", tuple(i), tuple(o)),
    )
    # int64 index + Gather over the whole bank, read in place
    i = [TensorSpec("bank", (L, T, M), "float32"), TensorSpec("slot", (1,), "int64")]
    o = [TensorSpec("pix_feat", (1, T, M), "float32")]
    g["memory_attention"] = (
        _model(
            [
                helper.make_node("Gather", ["bank", "slot"], ["g"], axis=0),
                helper.make_node("Add", ["g", "one"], ["pix_feat"]),
            ],
            i,
            o,
            [_scalar("one", 1.0)],
        ),
        GraphSpec("memory_attention", "memory_attention.onnx", tuple(i), tuple(o)),
    )
    # dynamic K: point sum [1,2] and label sum [1,1]
    i = [TensorSpec("points", (1, "K", 2), "float32"), TensorSpec("labels", (1, "K"), "int32")]
    o = [TensorSpec("psum", (1, 2), "float32"), TensorSpec("lsum", (1, 1), "float32")]
    g["decoder"] = (
        _model(
            [
                helper.make_node("ReduceSum", ["points", "ax1"], ["psum"], keepdims=0),
                helper.make_node("Cast", ["labels"], ["lf"], to=F),
                helper.make_node("ReduceSum", ["lf", "ax1"], ["lsum"], keepdims=1),
            ],
            i,
            o,
            [helper.make_tensor("ax1", TensorProto.INT64, [1], [1])],
        ),
        GraphSpec("decoder", "decoder.onnx", tuple(i), tuple(o)),
    )
    return g


def _manifest(specs: dict[str, GraphSpec]) -> Manifest:
    return Manifest(
        family="sam2",
        image_size=16,
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        grid=1,
        hidden_dim=M,
        mem_dim=M,
        tokens_per_slot=T,
        mask_size=4,
        cond_slots=1,
        recent_slots=L - 1,
        pointer_slots=16,
        max_object_pointers=16,
        num_maskmem=L,
        algorithm={},
        graphs=specs,
    )


def _write(d: Path, specs: dict[str, GraphSpec] | None = None) -> Manifest:
    graphs = _graphs()
    for model, spec in graphs.values():
        onnx.save(model, str(d / spec.file))
    m = _manifest(specs or {n: s for n, (_, s) in graphs.items()})
    m.write(d)
    return m


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    _write(tmp_path)
    return tmp_path


@pytest.fixture
def rt(model_dir: Path) -> OrtRuntime:
    r = OrtRuntime(threads=1)
    r.load(load_manifest(model_dir), model_dir)
    yield r
    r.close()


def _img(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((1, T, M)).astype(np.float32)


# -- in place, chaining, accounting ------------------------------------------------------------------------------------
def test_output_lands_in_interior_slot_only(rt: OrtRuntime) -> None:
    bank = rt.alloc((L, T, M), "float32", "bank")
    sentinel = np.full((L, T, M), -7.0, np.float32)
    rt.upload(bank, sentinel)
    feat, ptr = rt.alloc((1, T, M), "float32"), rt.alloc((1, M), "float32")
    x = _img(1)
    rt.upload(feat, x)
    host_before = rt._allocs[bank.handle].host.ctypes.data
    for slot in (1, 2, 0, 1):  # move the bound slot around: rebinding must follow
        rt.upload(bank, sentinel)
        rt.run(
            "memory_encoder",
            {"feat": feat},
            {"maskmem": rt.view(bank, slot * T * M, (1, T, M)), "obj_ptr": ptr},
        )
        got = rt.download(bank)
        want = sentinel.copy()
        want[slot] = x[0] * 10
        np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_allclose(rt.download(ptr), x.mean(axis=1), rtol=1e-5)
    # ORT wrote into our memory: same array, no fallback copy, no d2d traffic
    assert rt._allocs[bank.handle].host.ctypes.data == host_before
    assert rt.inplace_fallbacks == {} and rt.stats.d2d_bytes == 0


def test_chain_without_host_traffic_and_exact_stats(rt: OrtRuntime) -> None:
    image, feat = rt.alloc((1, T, M), "float32", "image"), rt.alloc((1, T, M), "float32", "feat")
    bank, ptr = rt.alloc((L, T, M), "float32", "bank"), rt.alloc((1, M), "float32", "ptr")
    slot, pix = rt.alloc((1,), "int64", "slot"), rt.alloc((1, T, M), "float32", "pix")
    assert rt.stats.h2d_bytes == rt.stats.d2h_bytes == rt.stats.h2d_calls == rt.stats.d2h_calls == 0
    x = _img(2)
    before = rt.stats.snapshot()
    rt.upload(image, x)
    rt.upload(slot, np.array([2], np.int64))
    rt.run("image_encoder", {"image": image}, {"feat": feat})
    rt.run("memory_encoder", {"feat": feat}, {"maskmem": rt.view(bank, 2 * T * M, (1, T, M)), "obj_ptr": ptr})
    mid = rt.stats.minus(before)
    assert (mid.h2d_bytes, mid.h2d_calls, mid.d2h_bytes, mid.d2h_calls) == (x.nbytes + 8, 2, 0, 0)
    rt.run("memory_attention", {"bank": bank, "slot": slot}, {"pix_feat": pix})
    out = rt.download(pix)
    np.testing.assert_allclose(out, (x * 2 + 1) * 10 + 1, rtol=1e-5)
    d = rt.stats.minus(before)
    assert (d.h2d_bytes, d.d2h_bytes, d.d2d_bytes, d.h2d_calls, d.d2h_calls) == (
        x.nbytes + 8,
        out.nbytes,
        0,
        2,
        1,
    )
    assert d.runs == {"image_encoder": 1, "memory_encoder": 1, "memory_attention": 1}
    assert all(s > 0 for s in d.run_s.values())
    # download into a caller array counts too, and returns that array
    into = np.empty((1, M), np.float32)
    assert rt.download(ptr, out=into) is into
    assert rt.stats.d2h_bytes == out.nbytes + into.nbytes


def test_dynamic_axis_through_views_of_a_larger_buffer(rt: OrtRuntime) -> None:
    pts, lab = rt.alloc((1, 8, 2), "float32", "points"), rt.alloc((1, 8), "int32", "labels")
    psum, lsum = rt.alloc((1, 2), "float32"), rt.alloc((1, 1), "float32")
    rng = np.random.default_rng(3)
    for k in (3, 1, 5, 3):
        p = rng.standard_normal((1, k, 2)).astype(np.float32)
        lb = rng.integers(0, 4, (1, k)).astype(np.int32)
        pv, lv = rt.view(pts, 0, (1, k, 2)), rt.view(lab, 0, (1, k))
        rt.upload(pv, p)
        rt.upload(lv, lb)
        rt.run("decoder", {"points": pv, "labels": lv}, {"psum": psum, "lsum": lsum})
        np.testing.assert_allclose(rt.download(psum), p.sum(axis=1), rtol=1e-5)
        assert rt.download(lsum)[0, 0] == lb.sum()


def test_fallback_copy_when_ort_does_not_write_in_place(tmp_path: Path) -> None:
    """A graph output that is also a graph input is the one case found where ORT CPU ignores the bound output
    memory (it hands back the input's memory); the runtime detects it, copies, and counts the copy as d2d."""
    i = [TensorSpec("x", (1, 3), "float32")]
    o = [TensorSpec("y", (1, 3), "float32"), TensorSpec("x", (1, 3), "float32")]
    onnx.save(_model([helper.make_node("Relu", ["x"], ["y"])], i, o), str(tmp_path / "pass.onnx"))
    m = _manifest({"pass": GraphSpec("pass", "pass.onnx", tuple(i), tuple(o))})
    with OrtRuntime(threads=1) as r:
        r.load(m, tmp_path)
        x, y, xo = r.alloc((1, 3), "float32"), r.alloc((1, 3), "float32"), r.alloc((1, 3), "float32")
        r.upload(x, np.array([[-1, 5, 7]], np.float32))
        r.run("pass", {"x": x}, {"y": y, "x": xo})
        assert r.inplace_fallbacks == {"pass/x": 1}
        assert r.stats.d2d_bytes == 12
        np.testing.assert_array_equal(r.download(xo), [[-1, 5, 7]])
        np.testing.assert_array_equal(r.download(y), [[0, 5, 7]])


# -- manifest enforcement ---------------------------------------------------------------------------------------------
def _broken(
    specs: dict[str, GraphSpec], graph: str, io: str, idx: int, **change: object
) -> dict[str, GraphSpec]:
    gs = specs[graph]
    ts = list(getattr(gs, io))
    t = ts[idx]
    ts[idx] = TensorSpec(
        str(change.get("name", t.name)),
        tuple(change.get("shape", t.shape)),  # type: ignore[arg-type]
        str(change.get("dtype", t.dtype)),
    )
    return {
        **specs,
        graph: GraphSpec(
            gs.name, gs.file, *((tuple(ts), gs.outputs) if io == "inputs" else (gs.inputs, tuple(ts)))
        ),
    }


@pytest.mark.parametrize(
    "graph,io,idx,change,needles",
    [
        ("image_encoder", "inputs", 0, {"name": "img"}, ["image_encoder", "'img'", "not in the model"]),
        (
            "memory_attention",
            "inputs",
            1,
            {"dtype": "int32"},
            ["memory_attention", "'slot'", "int32", "int64"],
        ),
        (
            "memory_encoder",
            "outputs",
            0,
            {"shape": (1, T, 5)},
            ["memory_encoder", "'maskmem'", "[1,4,5]", "[1,4,3]"],
        ),
        ("memory_attention", "inputs", 0, {"shape": (L, T)}, ["'bank'", "shape"]),
        ("image_encoder", "inputs", 0, {"shape": (1, "N", M)}, ["'image'", "[1,N,3]", "[1,4,3]"]),
    ],
)
def test_manifest_mismatch_names_tensor(
    tmp_path: Path, graph: str, io: str, idx: int, change: dict, needles: list[str]
) -> None:
    specs = {n: s for n, (_, s) in _graphs().items()}
    m = _write(tmp_path, _broken(specs, graph, io, idx, **change))
    with OrtRuntime(threads=1) as r, pytest.raises(BackendError) as ei:
        r.load(m, tmp_path)
    for needle in needles:
        assert needle in str(ei.value)


def test_manifest_may_pin_a_dynamic_model_axis(tmp_path: Path) -> None:
    """A manifest static dim over a dynamic model axis loads, and run() then enforces the manifest's value."""
    specs = {n: s for n, (_, s) in _graphs().items()}
    specs = _broken(
        _broken(specs, "decoder", "inputs", 0, shape=(1, 4, 2)), "decoder", "inputs", 1, shape=(1, 4)
    )
    m = _write(tmp_path, specs)
    with OrtRuntime(threads=1) as r:
        r.load(m, tmp_path)
        pts, lab = r.alloc((1, 4, 2), "float32"), r.alloc((1, 4), "int32")
        outs = {"psum": r.alloc((1, 2), "float32"), "lsum": r.alloc((1, 1), "float32")}
        r.upload(pts, np.ones((1, 4, 2), np.float32))
        r.run("decoder", {"points": pts, "labels": lab}, outs)
        np.testing.assert_array_equal(r.download(outs["psum"]), [[4, 4]])
        with pytest.raises(BackendError, match=r"input 'points' shape: graph \[1,4,2\], buffer \[1,3,2\]"):
            r.run("decoder", {"points": r.view(pts, 0, (1, 3, 2)), "labels": r.view(lab, 0, (1, 3))}, outs)


def test_extra_model_tensor_is_reported(tmp_path: Path) -> None:
    specs = {n: s for n, (_, s) in _graphs().items()}
    gs = specs["memory_encoder"]
    specs["memory_encoder"] = GraphSpec(gs.name, gs.file, gs.inputs, gs.outputs[:1])
    m = _write(tmp_path, specs)
    with (
        OrtRuntime(threads=1) as r,
        pytest.raises(BackendError, match="model output 'obj_ptr' is not in the manifest"),
    ):
        r.load(m, tmp_path)


def test_corrupt_and_missing_graph_files(tmp_path: Path) -> None:
    m = _write(tmp_path)
    (tmp_path / "decoder.onnx").write_bytes(b"this is not a protobuf")
    with OrtRuntime(threads=1) as r:
        with pytest.raises(BackendError, match=r"decoder\.onnx.*CPUExecutionProvider") as ei:
            r.load(m, tmp_path)
        assert ei.value.__cause__ is not None
        assert r.providers_in_use == {}  # all or nothing
        (tmp_path / "decoder.onnx").unlink()
        with pytest.raises(BackendError, match=r"'decoder'.*decoder\.onnx not found"):
            r.load(m, tmp_path)


# -- run-time validation ----------------------------------------------------------------------------------------------
def test_run_validates_bindings(rt: OrtRuntime) -> None:
    image, feat = rt.alloc((1, T, M), "float32"), rt.alloc((1, T, M), "float32")
    with pytest.raises(BackendError, match="input 'image' is not bound"):
        rt.run("image_encoder", {}, {"feat": feat})
    with pytest.raises(BackendError, match="'extra' is not an input"):
        rt.run("image_encoder", {"image": image, "extra": image}, {"feat": feat})
    with pytest.raises(BackendError, match="output 'feat' is not bound"):
        rt.run("image_encoder", {"image": image}, {})
    with pytest.raises(BackendError, match="'nope' is not loaded"):
        rt.run("nope", {}, {})
    f16 = rt.alloc((1, T, M), "float16")
    with pytest.raises(BackendError, match="input 'image' dtype: graph float32, buffer float16"):
        rt.run("image_encoder", {"image": f16}, {"feat": feat})
    flat = rt.alloc((T * M,), "float32")
    with pytest.raises(BackendError, match=r"output 'feat' shape: graph \[1,4,3\], buffer \[12\]"):
        rt.run("image_encoder", {"image": image}, {"feat": flat})
    with pytest.raises(BackendError, match="output 'feat' overlaps input 'image'"):
        rt.run("image_encoder", {"image": image}, {"feat": image})
    pts, lab = rt.alloc((1, 3, 2), "float32"), rt.alloc((1, 2), "int32")
    out2, out1 = rt.alloc((1, 2), "float32"), rt.alloc((1, 1), "float32")
    with pytest.raises(BackendError, match="'labels' has K=2 but 'points' has K=3"):
        rt.run("decoder", {"points": pts, "labels": lab}, {"psum": out2, "lsum": out1})
    rt.free(feat)
    with pytest.raises(BackendError, match="not a live buffer"):
        rt.run("image_encoder", {"image": image}, {"feat": feat})
    with OrtRuntime(threads=1) as other:
        foreign = other.alloc((1, T, M), "float32")
        with pytest.raises(BackendError, match="not a live buffer"):
            rt.upload(foreign, np.zeros((1, T, M), np.float32))
    bogus = DeviceBuffer(image.handle, 8, (1, T, M), "float32", T * M * 4)
    with pytest.raises(BackendError, match="does not fit"):
        rt.download(bogus)
    assert rt.stats.runs == {}  # nothing ran


def test_upload_download_validation(rt: OrtRuntime) -> None:
    b = rt.alloc((2, 3), "float32", "b")
    with pytest.raises(BackendError, match=r"upload\(b\).*float64"):
        rt.upload(b, np.zeros((2, 3)))
    with pytest.raises(BackendError, match=r"upload\(b\)"):
        rt.upload(b, np.zeros((4,), np.float32))
    rt.upload(b, np.arange(6, dtype=np.float32))  # same size, other shape: fine
    with pytest.raises(BackendError, match=r"download\(b\)"):
        rt.download(b, out=np.empty((3, 2), np.float32))
    assert rt.stats.h2d_calls == 1 and rt.stats.d2h_calls == 0
    np.testing.assert_array_equal(rt.download(rt.view(b, 4, (2,))), [4, 5])
    assert rt.stats.d2h_bytes == 8


def test_view_out_of_range(rt: OrtRuntime) -> None:
    bank = rt.alloc((L, T, M), "float32", "bank")
    assert rt.view(bank, (L - 1) * T * M, (1, T, M)).offset == (L - 1) * T * M * 4
    with pytest.raises(BackendError, match="outside buffer bank"):
        rt.view(bank, L * T * M - 1, (1, T, M))
    with pytest.raises(BackendError, match="outside buffer bank"):
        rt.view(bank, -1, (1,))


# -- lifetime ---------------------------------------------------------------------------------------------------------
def test_alloc_zeroed_aligned_and_leak_count(rt: OrtRuntime) -> None:
    bufs = [rt.alloc((5, 7), "float32"), rt.alloc((3,), "int64"), rt.alloc((1, 1), "bool")]
    assert rt.live_buffers() == 3
    assert all(rt._allocs[b.handle].ptr % 64 == 0 for b in bufs)
    assert not rt.download(bufs[0]).any() and not rt.download(bufs[1]).any()
    rt.free(bufs[0])
    assert rt.live_buffers() == 2
    with pytest.raises(BackendError, match="double free"):
        rt.free(bufs[0])
    rt.close()
    assert rt.live_buffers() == 0
    with pytest.raises(BackendError, match="unsupported dtype"):
        OrtRuntime().alloc((1,), "float64")


def test_closed_runtime_raises(model_dir: Path) -> None:
    r = OrtRuntime(threads=1)
    r.load(load_manifest(model_dir), model_dir)
    b = r.alloc((1, T, M), "float32")
    r.close()
    r.close()  # idempotent
    calls = [
        lambda: r.load(load_manifest(model_dir), model_dir),
        lambda: r.alloc((1,), "float32"),
        lambda: r.view(b, 0, (1,)),
        lambda: r.upload(b, np.zeros((1, T, M), np.float32)),
        lambda: r.download(b),
        lambda: r.run("image_encoder", {"image": b}, {"feat": b}),
        lambda: r.free(b),
        lambda: r.providers_in_use,
    ]
    for call in calls:
        with pytest.raises(BackendError, match="runtime is closed"):
            call()
    assert "closed" in r.describe()


# -- providers --------------------------------------------------------------------------------------------------------
def test_providers_in_use_and_describe(rt: OrtRuntime) -> None:
    assert rt.providers_in_use == {
        n: [CPU_EP] for n in ("image_encoder", "memory_encoder", "memory_attention", "decoder")
    }
    s = rt.describe()
    assert "CPUExecutionProvider" in s and "4 graphs" in s and "threads 1" in s


def test_missing_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [CPU_EP])
    for req in (["cuda"], ["tensorrt"], [CUDA_EP]):
        with pytest.raises(BackendError) as ei:
            OrtRuntime(req)
        assert "onnxruntime-gpu" in str(ei.value) and "available: CPUExecutionProvider" in str(ei.value)
    with pytest.raises(BackendError, match="NoSuchExecutionProvider is not available"):
        OrtRuntime(["NoSuchExecutionProvider"])


def test_provider_expansion(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [TRT_EP, CUDA_EP, CPU_EP])
    r = OrtRuntime(["tensorrt"], device_id=1, trt_cache_dir=tmp_path / "engines")
    assert [p if isinstance(p, str) else p[0] for p in r._providers] == [TRT_EP, CUDA_EP, CPU_EP]
    trt_opts = r._providers[0][1]
    assert trt_opts["trt_fp16_enable"] is False and trt_opts["device_id"] == 1
    assert trt_opts["trt_engine_cache_path"] == str(tmp_path / "engines") and (tmp_path / "engines").is_dir()
    assert r._providers[1] == (CUDA_EP, {"device_id": 1}) and r._device_type == "cuda"
    assert OrtRuntime("cpu")._device_type == "cpu"
    assert OrtRuntime([(CUDA_EP, {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"})])._providers[
        0
    ][1] == {"device_id": 0, "arena_extend_strategy": "kSameAsRequested"}


def test_missing_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(BackendError, match=r"pip install 'vostream\[onnx\]'"):
        OrtRuntime()
