"""The SAM-2 streaming session on a tiny export, without the reference: what crosses host<->device, objects coming
and going, reset, skipped frames, bad prompts, leaks, and steady-state memory over 1,000+ frames."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)

from fakes import sam2_reference as ref  # noqa: E402

from vostream.pipeline.errors import PromptError  # noqa: E402
from vostream.pipeline.types import Frame, Prompt  # noqa: E402
from vostream.stages.trackers.sam2 import OnnxTracker  # noqa: E402
from vostream.stages.trackers.sam2.session import resize_aa  # noqa: E402


@pytest.fixture(scope="module")
def clip() -> tuple[list[np.ndarray], list[np.ndarray], int]:
    size = 128
    frames = ref.make_frames(24, size, occluded=(10,))
    mean, std = ref.mean_std("sam2")
    return frames, [ref.to_tensor(f, mean, std) for f in frames], size


def _frame(i: int, img: np.ndarray, x: np.ndarray) -> Frame:
    f = Frame(i, img)
    f.tensor = x
    return f


def test_only_image_and_metadata_cross_per_frame(sam2_tiny: Any, clip: Any) -> None:
    """After warm-up, per frame: H2D = the image + a few hundred bytes of metadata; D2H = 4 low-res planes + IoU
    + score per object.  The bank (C+N slots of T x M floats per object) and the pointers never cross."""
    _, export = sam2_tiny("sam2")
    frames, tensors, size = clip
    tracker = OnnxTracker(export, threads=1)
    m = tracker.manifest
    s = tracker.new_session()
    s.add_prompt(Prompt(1, 0, [[40, 45]], [1]))
    s.add_prompt(Prompt(2, 0, box=(70, 70, 110, 100)))
    warm = 16  # after 15 tracking frames every recent slot and recent pointer holds a memory
    for i in range(warm):
        s.step(_frame(i, frames[i], tensors[i]))
    before = tracker.runtime.stats.snapshot()
    attended_before = s.stats.attended_slots
    n = len(frames) - warm
    for i in range(warm, warm + n):
        s.step(_frame(i, frames[i], tensors[i]))
    d = tracker.runtime.stats.minus(before)
    objects, P = 2, m.mask_size
    # ONNX Runtime takes views: with one conditioning frame per object the C - 1 empty conditioning slots and
    # pointers are not bound at all, so memory attention sees 1 + N slots and 1 + (Q - C) pointers, as HF does
    L, Q = 1 + m.recent_slots, 1 + m.pointer_slots - m.cond_slots
    assert s.stats.attended_slots - attended_before == n * objects * L
    image = 4 * 3 * size * size
    # per object: slot_tpos (int64) + slot_valid + ptr_tdiff + ptr_valid, one padding point + label, and the
    # has_mask / plane / token / use_mask_prompt / binarize scalars
    meta = L * 8 + L * 4 + Q * 4 + Q * 4 + 8 + 4 + 4 + 8 + 8 + 4 + 4
    assert d.h2d_bytes == n * (image + objects * meta)
    assert d.d2h_bytes == n * objects * (4 * P * P * 4 + 4 * 4 + 4)
    bank = L * m.tokens_per_slot * m.mem_dim * 4
    assert bank > objects * meta  # the bound above excludes the bank by construction, not by accident
    assert d.d2d_bytes == 0
    assert d.runs == {
        "image_encoder": n,
        "memory_attention": n * objects,
        "decoder": n * objects,
        "memory_encoder": n * objects,
    }
    metrics = s.metrics()
    assert metrics["frames"] == warm + n and metrics["h2d_bytes_per_frame"] > image
    # while the bank fills, fewer slots are bound still
    assert 1 <= metrics["memory_slots_per_attention"] < L
    s.close()
    tracker.close()
    assert tracker.runtime.live_buffers() == 0


def _run(
    export: Any,
    frames: list[np.ndarray],
    tensors: list[np.ndarray],
    prompts: dict[int, list[Prompt]],
    removals: dict[int, int] | None = None,
    indices: list[int] | None = None,
) -> list[dict[int, np.ndarray]]:
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    out = []
    for k, (img, x) in enumerate(zip(frames, tensors)):
        idx = indices[k] if indices else k
        for p in prompts.get(k, []):
            s.add_prompt(Prompt(p.obj_id, idx, p.points, p.labels, p.box, p.mask))
        if removals and k in removals:
            s.remove_object(removals[k])
        r = s.step(_frame(idx, img, x))
        assert r.frame_index == idx
        out.append({int(o): r.logits[j].copy() for j, o in enumerate(r.obj_ids)})
    s.close()
    tracker.close()
    return out


def test_removing_an_object_leaves_the_others_unchanged(sam2_tiny: Any, clip: Any) -> None:
    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    one = Prompt(1, 0, [[40, 45]], [1])
    two = Prompt(2, 0, [[90, 85]], [1])
    both = _run(export, frames, tensors, {0: [one, two]}, removals={9: 2})
    alone = _run(export, frames, tensors, {0: [one, two]}, removals={1: 2})
    for k in range(len(frames)):
        assert (2 in both[k]) == (k < 9)
        np.testing.assert_array_equal(both[k][1], alone[k][1])


def test_skipped_source_frames_are_invisible_to_the_model(sam2_tiny: Any, clip: Any) -> None:
    """Live feeds drop frames: the model's clock is the count of processed frames, as in the reference."""
    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    prompts = {0: [Prompt(1, 0, [[40, 45]], [1])], 7: [Prompt(1, 0, [[44, 40]], [1])]}
    dense = _run(export, frames, tensors, prompts)
    gaps = [0, 1, 5, 6, 9, 20, 21, 22, 40, 41, 42, 43, 50, 51, 60, 61, 62, 70, 71, 80, 81, 82, 90, 91]
    sparse = _run(export, frames, tensors, prompts, indices=gaps[: len(frames)])
    for a, b in zip(dense, sparse):
        np.testing.assert_array_equal(a[1], b[1])


def test_reset_corrections_beyond_the_slots_and_no_leaks(sam2_tiny: Any, clip: Any) -> None:
    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    scratch = tracker.runtime.live_buffers()
    s.add_prompt(Prompt(1, 0, [[40, 45]], [1]))
    s.add_prompt(Prompt(3, 0, mask=np.pad(np.ones((20, 30), bool), ((50, 58), (60, 38)))))
    for i in range(8):
        if i in (2, 4, 6):  # three corrections > C = 2 conditioning slots: the oldest is evicted each time
            s.add_prompt(Prompt(1, i, [[42, 44]], [1]))
        r = s.step(_frame(i, frames[i], tensors[i]))
        assert list(r.obj_ids) == [1, 3]
        assert np.isfinite(r.logits).all()
    assert s.stats.evicted_cond == 2
    assert tracker.runtime.live_buffers() == scratch + 2 * 2  # a bank and a pointer ring per object
    s.reset()
    assert s.object_ids == [] and tracker.runtime.live_buffers() == scratch
    s.add_prompt(Prompt(5, 8, [[40, 45]], [1]))
    r = s.step(_frame(8, frames[8], tensors[8]))
    assert list(r.obj_ids) == [5]
    s.close()
    s.close()  # idempotent
    tracker.close()
    assert tracker.runtime.live_buffers() == 0


def test_bad_prompts_are_rejected_without_changing_state(sam2_tiny: Any, clip: Any) -> None:
    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    with pytest.raises(PromptError, match="only negative"):
        s.add_prompt(Prompt(1, 0, [[40, 45]], [0]))
    with pytest.raises(PromptError, match="not both"):
        s.add_prompt(Prompt(1, 0, [[40, 45]], [1], mask=np.ones((128, 128), bool)))
    with pytest.raises(PromptError, match="not tracked"):
        s.remove_object(4)
    s.add_prompt(Prompt(1, 0, [[400, 45]], [1]))  # outside the 128x128 stream: caught at the frame
    with pytest.raises(PromptError):
        s.step(_frame(0, frames[0], tensors[0]))
    with pytest.raises(Exception, match="float32"):
        s.step(_frame(0, frames[0], tensors[0][:, :, :64]))
    s.close()
    tracker.close()


def test_antialiased_resize_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    for (h, w), (oh, ow) in [
        ((128, 128), (32, 32)),
        ((112, 112), (32, 32)),
        ((28, 28), (32, 32)),
        ((480, 854), (128, 128)),
    ]:
        x = rng.standard_normal((h, w)).astype(np.float32)
        want = torch.nn.functional.interpolate(
            torch.from_numpy(x)[None, None],
            size=(oh, ow),
            mode="bilinear",
            align_corners=False,
            antialias=True,
        )[0, 0].numpy()
        np.testing.assert_allclose(resize_aa(x, oh, ow), want, atol=2e-5)


@pytest.mark.slow
def test_steady_state_host_memory_is_flat(sam2_tiny: Any) -> None:
    psutil = pytest.importorskip("psutil")
    _, export = sam2_tiny("sam2")
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    rng = np.random.default_rng(0)
    pool = [rng.standard_normal((1, 3, 128, 128)).astype(np.float32) for _ in range(8)]
    img = np.zeros((128, 128, 3), np.uint8)
    s.add_prompt(Prompt(1, 0, [[40, 45]], [1]))
    s.add_prompt(Prompt(2, 0, [[90, 85]], [1]))
    proc = psutil.Process()
    rss = []
    for i in range(1200):
        s.step(_frame(i, img, pool[i % len(pool)]))
        if i in (199, 1199):
            gc.collect()
            rss.append(proc.memory_info().rss)
    growth = (rss[1] - rss[0]) / 2**20
    assert growth < 4.0, f"RSS grew {growth:.1f} MiB over 1,000 frames after warm-up"
    assert s.stats.frames == 1200
    s.close()
    tracker.close()


@pytest.mark.slow
def test_fp16_export_is_half_the_size_and_tracks_like_fp32(sam2_tiny: Any, clip: Any, tmp_path: Any) -> None:
    from vostream.apps.export import export_model

    ckpt, export = sam2_tiny("sam2")
    manifest = export_model(str(ckpt), tmp_path / "fp16", fp16=True)
    assert manifest.dtype == "float16-mixed"
    for (
        name,
        g,
    ) in manifest.graphs.items():  # inputs and outputs stay fp32: every runtime drives both the same way
        assert all(t.dtype in ("float32", "int64", "int32") for t in (*g.inputs, *g.outputs)), name
    size32 = sum((export / g.file).stat().st_size for g in manifest.graphs.values())
    size16 = sum((tmp_path / "fp16" / g.file).stat().st_size for g in manifest.graphs.values())
    assert size16 < 0.65 * size32
    frames, tensors, _ = clip
    prompts = {0: [Prompt(1, 0, [[40, 45]], [1]), Prompt(2, 0, box=(70, 70, 110, 100))]}
    a = _run(export, frames, tensors, prompts)
    b = _run(tmp_path / "fp16", frames, tensors, prompts)
    ious = []
    for fa, fb in zip(a, b):
        for oid in fa:
            ma, mb = fa[oid] > 0, fb[oid] > 0
            union = (ma | mb).sum()
            ious.append(1.0 if union == 0 else (ma & mb).sum() / union)
    assert min(ious) >= 0.9, f"fp16 masks differ from fp32: IoU down to {min(ious):.3f}"


def test_frames_before_the_first_prompt_cost_nothing(sam2_tiny: Any, clip: Any) -> None:
    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    for i in range(3):
        r = s.step(_frame(i, frames[i], tensors[i]))
        assert len(r) == 0 and r.logits is not None and r.logits.shape[0] == 0
    assert tracker.runtime.stats.runs == {} and tracker.runtime.stats.h2d_bytes == 0
    s.add_prompt(Prompt(1, 3, [[40, 45]], [1]))
    assert list(s.step(_frame(3, frames[3], tensors[3])).obj_ids) == [1]
    s.close()
    tracker.close()


def test_exported_graphs_hold_each_constant_once(sam2_tiny: Any) -> None:
    """The exporter's constant folding copies a constant per use (SAM 2.1's RoPE tables: 96 of 138 MiB of memory
    attention); the export shares them, so device memory holds each once."""
    import hashlib

    import onnx

    _, export = sam2_tiny("sam2")
    for name in ("image_encoder", "memory_attention", "decoder", "memory_encoder"):
        graph = onnx.load(str(export / f"{name}.onnx")).graph
        seen: dict[tuple[Any, ...], str] = {}
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].t.raw_data:
                t = node.attribute[0].t
                key = (t.data_type, tuple(t.dims), hashlib.sha256(t.raw_data).hexdigest())
                assert key not in seen or t.ByteSize() < 64, (
                    f"{name}: {node.output[0]} duplicates {seen[key]}"
                )
                seen[key] = node.output[0]


def test_a_cancel_lands_between_objects(sam2_tiny: Any, clip: Any) -> None:
    """``should_stop`` (set by the track stage from the pipeline's cancel) is checked between objects: a frame
    with many objects stops after the object in progress, not after all of them."""
    from vostream.stages.trackers.base import StepAborted

    _, export = sam2_tiny("sam2")
    frames, tensors, _ = clip
    tracker = OnnxTracker(export, threads=1)
    s = tracker.new_session()
    for oid in range(1, 5):
        s.add_prompt(Prompt(oid, 0, [[20 + 20 * oid, 45]], [1]))
    s.step(_frame(0, frames[0], tensors[0]))
    runs = tracker.runtime.stats.runs
    before = dict(runs)
    calls = []
    s.should_stop = lambda: calls.append(1) is None and len(calls) > 2  # true from the third object on
    with pytest.raises(StepAborted, match="after 2 of 4 objects"):
        s.step(_frame(1, frames[1], tensors[1]))
    assert tracker.runtime.stats.runs["decoder"] - before["decoder"] == 2
    s.close()


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("image_size", -5, r"'image_size' must be an integer in 16\.\.4096, got -5"),
        ("image_size", 128.5, r"'image_size' must be an integer"),
        ("cond_slots", 10**9, r"'cond_slots' must be an integer in 1\.\.64, got 1000000000"),
        ("cond_slots", True, r"'cond_slots' must be an integer"),
        ("tokens_per_slot", 0, r"'tokens_per_slot' must be an integer in 1\.\.65536"),
        ("bank", 8192, r"make a 16\.0 GiB memory bank per object"),
        ("recent_slots", 3, r"'recent_slots' \(3\) must be 'num_maskmem' - 1"),
        ("pointer_slots", 99, r"'pointer_slots' \(99\) must be 'cond_slots' \+ 'max_object_pointers' - 1"),
        (
            "dtype",
            "int4",
            r"'dtype' must be one of float32, float16, float16-mixed, int8-qdq, got 'int4'.*upgrade",
        ),
        (
            "graph",
            "../../etc/passwd",
            r"graphs\.decoder\.file '\.\./\.\./etc/passwd' must be a file name inside",
        ),
        ("graph", "/etc/passwd", r"graphs\.decoder\.file '/etc/passwd' must be a file name inside"),
        ("shape", -3, r"graphs\.decoder tensor .* bad shape"),
    ],
)
def test_manifest_with_absurd_values_is_rejected_at_load(
    sam2_tiny: Any, tmp_path: Any, field: str, value: Any, message: str
) -> None:
    """A damaged or hand-edited manifest fails at load with a ConfigError naming the field, not mid-run with a
    15 GiB allocation or a file read outside the model directory."""
    import json

    from vostream.pipeline.errors import ConfigError
    from vostream.stages.trackers.sam2.manifest import load_manifest

    _, export = sam2_tiny("sam2")
    d = json.loads((export / "manifest.json").read_text())
    load_manifest(export)  # the export itself is valid
    if field == "graph":
        d["graphs"]["decoder"]["file"] = value
    elif field == "bank":  # each field in range, together a 16 GiB bank per object
        d["tokens_per_slot"], d["mem_dim"] = 65536, value
    elif field == "shape":
        d["graphs"]["decoder"]["inputs"][0]["shape"][0] = value
    else:
        d[field] = value
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=message):
        load_manifest(tmp_path)


def test_manifest_graph_symlinked_outside_the_model_dir_is_rejected(sam2_tiny: Any, tmp_path: Any) -> None:
    import json

    from vostream.pipeline.errors import ConfigError
    from vostream.stages.trackers.sam2.manifest import load_manifest

    _, export = sam2_tiny("sam2")
    model = tmp_path / "model"
    model.mkdir()
    (model / "manifest.json").write_text((export / "manifest.json").read_text())
    (model / json.loads((export / "manifest.json").read_text())["graphs"]["decoder"]["file"]).symlink_to(
        tmp_path / "elsewhere.onnx"
    )
    with pytest.raises(ConfigError, match="leads outside the model directory"):
        load_manifest(model)
