"""Parity of the exported `onnx` tracker with the transformers reference, frame by frame, for all three families.

The reference is HF's own streaming tracker (``tests/fakes/sam2_reference.py``: one ``add_new_frame`` per frame) on a tiny
random model; ours is ``vostream export`` + ``Sam2Session`` on ``OrtRuntime`` (CPU).  32 frames are longer than the
6 recent memory slots and the 15 recent pointers, so both rings wrap; the schedule has a negative click, a
correction on a later frame, a second object added mid-stream, and grey "occluded" frames where the calibrated
object score is negative (the no-object path).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)

from fakes import sam2_reference as ref  # noqa: E402

from vostream.pipeline.types import Frame, Prompt  # noqa: E402
from vostream.stages.trackers.sam2 import OnnxTracker  # noqa: E402

N_FRAMES = 32


def _ours(
    export_dir: Any,
    frames: list[np.ndarray],
    tensors: list[np.ndarray],
    schedule: dict[int, list[ref.PromptSpec]],
) -> list[dict[int, tuple[np.ndarray, bool]]]:
    tracker = OnnxTracker(export_dir, threads=1)
    session = tracker.new_session()
    out = []
    try:
        for i, (img, x) in enumerate(zip(frames, tensors)):
            for p in schedule.get(i, []):
                pts = np.asarray(p.points, np.float32).reshape(-1, 2)
                session.add_prompt(Prompt(p.obj_id, i, pts, p.labels, p.box, p.mask))
            frame = Frame(i, img)
            frame.tensor = x
            if not session.object_ids:
                out.append({})
                continue
            r = session.step(frame)
            out.append({int(o): (r.logits[k], bool(r.present[k])) for k, o in enumerate(r.obj_ids)})
    finally:
        session.close()
        tracker.close()
    return out


def _compare(
    ours: list[dict[int, tuple[np.ndarray, bool]]], theirs: list[dict[int, ref.RefOut]]
) -> dict[str, float]:
    assert len(ours) == len(theirs)
    worst_iou, worst_diff, absent, compared = 1.0, 0.0, 0, 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert sorted(a) == sorted(b), f"frame {i}: objects {sorted(a)} vs reference {sorted(b)}"
        for oid, (logits, present) in a.items():
            r = b[oid]
            assert logits.shape == r.logits.shape
            assert present == (r.score > 0), (
                f"frame {i} object {oid}: present {present}, reference score {r.score}"
            )
            ma, mb = logits > 0, r.logits > 0
            union = int((ma | mb).sum())
            iou = 1.0 if union == 0 else float((ma & mb).sum()) / union
            diff = float(np.abs(logits - r.logits).max())
            assert iou >= 0.99, f"frame {i} object {oid}: mask IoU {iou:.4f} with the reference"
            assert diff <= 1e-3, f"frame {i} object {oid}: max |logit difference| {diff:.3g}"
            worst_iou, worst_diff = min(worst_iou, iou), max(worst_diff, diff)
            absent += not present
            compared += 1
    return {"iou": worst_iou, "diff": worst_diff, "absent": absent, "compared": compared}


@pytest.mark.parametrize("family", ref.FAMILIES)
@pytest.mark.slow
def test_streaming_parity_with_reference(family: str, sam2_tiny: Any) -> None:
    ckpt, export_dir = sam2_tiny(family)
    model = ref.load_tiny(family, ckpt)
    size = ref.image_size(model)
    mean, std = ref.mean_std(family)
    frames = ref.make_frames(N_FRAMES, size)
    tensors = [ref.to_tensor(f, mean, std) for f in frames]
    schedule = ref.default_schedule(size)
    theirs = ref.run_reference(model, tensors, schedule)
    ours = _ours(export_dir, frames, tensors, schedule)
    stats = _compare(ours, theirs)
    # the test must exercise what it claims: two objects, wrapped rings, the occlusion path, real masks
    assert stats["compared"] == N_FRAMES + (N_FRAMES - 20)
    assert stats["absent"] >= 4, "no occluded frames: the no-object path was not exercised"
    areas = [int((o[1][0] > 0).sum()) for o in ours if 1 in o and o[1][1]]
    assert max(areas) > 0, "object 1 never has a mask: the comparison would be vacuous"


@pytest.mark.parametrize("family", ["sam2", "sam3_tracker"])
def test_mask_prompt_and_click_parity(family: str, sam2_tiny: Any) -> None:
    """Object 1 from a mask prompt (HF's mask-as-output path), object 2 from a single click on frame 3."""
    ckpt, export_dir = sam2_tiny(family)
    model = ref.load_tiny(family, ckpt)
    size = ref.image_size(model)
    mean, std = ref.mean_std(family)
    n = 14
    frames = ref.make_frames(n, size, occluded=(9,))
    tensors = [ref.to_tensor(f, mean, std) for f in frames]
    schedule = {
        0: [ref.PromptSpec(1, mask=ref.shape_masks(0, size)["disk"])],
        3: [ref.PromptSpec(2, points=[ref.shape_center(3, size, "rect")], labels=[1])],
    }
    theirs = ref.run_reference(model, tensors, schedule)
    ours = _ours(export_dir, frames, tensors, schedule)
    stats = _compare(ours, theirs)
    assert stats["compared"] == n + (n - 3)
    # on the prompted frame the output is the mask itself (logits +-10 resampled to the low-res grid)
    first = ours[0][1][0]
    assert first.max() > 9.0 and first.min() < -9.0


#: another input size per family (multiples of the tiny networks' size step: 32 for Hiera, 14 for the SAM 3 ViT)
RESIZED = {"sam2": 96, "edgetam": 160, "sam3_tracker": 84}


@pytest.mark.parametrize("family", ref.FAMILIES)
@pytest.mark.slow
def test_export_at_another_image_size_matches_the_reference_at_that_size(
    family: str, sam2_tiny: Any, tmp_path: Any
) -> None:
    """``export --image-size``: the same weights run at another input size.  The reference model at that size is
    built from the test harness's own config (field by field), not from the exporter's resizing."""
    from vostream.apps.export import export_model

    ckpt, _ = sam2_tiny(family)
    size = RESIZED[family]
    model = ref.load_tiny_at(family, ckpt, size)
    assert ref.image_size(model) == size
    manifest = export_model(str(ckpt), tmp_path / "export", image_size=size)
    assert manifest.image_size == size and manifest.source["trained_image_size"] != size
    n = 24
    mean, std = ref.mean_std(family)
    frames = ref.make_frames(n, size)
    tensors = [ref.to_tensor(f, mean, std) for f in frames]
    schedule = ref.default_schedule(size)
    theirs = ref.run_reference(model, tensors, schedule)
    ours = _ours(tmp_path / "export", frames, tensors, schedule)
    stats = _compare(ours, theirs)
    assert stats["compared"] == n + (n - 20)
    assert ours[0][1][0].shape == (4 * manifest.grid, 4 * manifest.grid) == theirs[0][1].logits.shape
    assert any((o[1][0] > 0).any() for o in ours if 1 in o and o[1][1]), "object 1 never has a mask"


def test_image_sizes_the_networks_cannot_take_are_refused(sam2_tiny: Any, tmp_path: Any) -> None:
    from vostream.apps.export import export_model
    from vostream.pipeline.errors import ConfigError

    ckpt, _ = sam2_tiny("sam2")
    for bad in (100, 32, 0):
        with pytest.raises(ConfigError, match=r"multiples of 32 px") as info:
            export_model(str(ckpt), tmp_path / f"x{bad}", image_size=bad)
        assert "trained at 128" in str(info.value)
        assert not (tmp_path / f"x{bad}").exists()
