"""Post-processing: logits upsampling, threshold, hole filling, speck removal, boxes, absent objects, RLE."""

from __future__ import annotations

import numpy as np
import pytest
from pycocotools import mask as mask_utils

from vostream.pipeline.errors import ConfigError
from vostream.pipeline.types import Frame, TrackResult
from vostream.stages.postprocess import PostprocessStage, clean_mask, postprocess_result, upsample_logits

# pycocotools' decode trips a NumPy 2 deprecation inside the library itself
pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")


def _result(
    logits: np.ndarray | None = None,
    masks: np.ndarray | None = None,
    present: list[bool] | None = None,
    ids: list[int] | None = None,
) -> TrackResult:
    n = len(logits if logits is not None else masks)
    return TrackResult(
        7,
        np.asarray(ids or list(range(1, n + 1))),
        np.linspace(0.9, 0.5, n),
        np.asarray(present if present is not None else [True] * n),
        np.zeros((n, 4)),
        masks=masks,
        logits=logits,
    )


def test_upsample_is_bilinear_with_half_pixel_centres() -> None:
    # A horizontal ramp of logits x - 1.5 on a 4-wide grid; upsampled 4x with half-pixel centres, output
    # column u samples input coordinate (u + 0.5) / 4 - 0.5, so the ramp continues linearly inside.
    low = np.tile(np.arange(4, dtype=np.float32) - 1.5, (4, 1))[None]
    up = upsample_logits(low, 16, 16)
    u = np.arange(16)
    expected = np.clip((u + 0.5) / 4 - 0.5, 0, 3) - 1.5
    assert np.allclose(up[0, 5], expected, atol=1e-5)
    assert up.dtype == np.float32 and up.shape == (1, 16, 16)


def test_threshold_on_float_logits_not_on_binary_masks() -> None:
    # A ramp crossing zero between input columns 1 and 2 (at x = 1 + 1/1.5): resizing float logits puts the
    # edge at that crossing (output u = 4 (x + 0.5) - 0.5 = 8.17, so u = 9 is the first foreground pixel);
    # resizing a binary mask would snap it to the block boundary u = 8.
    low = np.tile(np.array([-3, -1, 0.5, 3], np.float32), (4, 1))[None]
    res = postprocess_result(_result(logits=low), 16, 16)
    row = res.masks[0, 8]
    first = int(np.argmax(row))
    crossing = 4 * (1 + 1 / 1.5 + 0.5) - 0.5
    assert first == int(np.ceil(crossing)) == 9
    assert row[first:].all() and not row[:first].any()
    # threshold moves the edge right
    res_hi = postprocess_result(_result(logits=low), 16, 16, threshold=2.0)
    assert int(np.argmax(res_hi.masks[0, 8])) > first


def test_masks_boxes_and_source_size() -> None:
    logits = np.full((2, 32, 32), -5, np.float32)
    logits[0, 8:16, 4:12] = 5
    logits[1, 20:30, 20:24] = 5
    res = postprocess_result(_result(logits=logits), 64, 96)
    assert res.masks.shape == (2, 64, 96) and res.masks.dtype == bool
    # 32x32 -> 96x64: x scale 3, y scale 2
    assert np.allclose(res.boxes[0], [12, 16, 36, 32], atol=2)
    assert np.allclose(res.boxes[1], [60, 40, 72, 60], atol=2)
    assert res.present.tolist() == [True, True]
    assert res.frame_index == 7 and res.obj_ids.tolist() == [1, 2]


def test_absent_objects_get_empty_masks_and_zero_boxes() -> None:
    logits = np.full((3, 16, 16), 5, np.float32)
    logits[2] = -5  # present according to the tracker, but nothing above threshold
    res = postprocess_result(_result(logits=logits, present=[True, False, True]), 32, 32)
    assert res.masks[0].all()
    assert not res.masks[1].any() and not res.masks[2].any()
    assert res.boxes[1].tolist() == [0, 0, 0, 0] and res.boxes[2].tolist() == [0, 0, 0, 0]
    assert res.present.tolist() == [True, False, False]


def test_full_size_and_low_res_masks_input() -> None:
    full = np.zeros((1, 20, 30), bool)
    full[0, 5:10, 5:15] = True
    res = postprocess_result(_result(masks=full), 20, 30)
    assert np.array_equal(res.masks, full) and res.masks is not full
    low = np.zeros((1, 10, 15), bool)
    low[0, 2:5, 2:7] = True
    res = postprocess_result(_result(masks=low), 20, 30)
    assert res.boxes[0].tolist() == [4, 4, 14, 10]
    with pytest.raises(ValueError, match="neither logits nor masks"):
        postprocess_result(TrackResult(0, [1], [1], [True], [[0, 0, 0, 0]]), 4, 4)


def _ring(size: int = 40) -> np.ndarray:
    m = np.zeros((size, size), bool)
    m[5:35, 5:35] = True
    m[12:28, 12:28] = False  # a 16x16 = 256 px hole
    m[8:10, 8:10] = False  # a 4 px hole
    return m


def test_fill_holes() -> None:
    m = _ring()
    filled = clean_mask(m.copy(), fill_holes=True)
    assert filled[5:35, 5:35].all() and filled.sum() == 900
    # with min_area, only holes smaller than it are filled
    some = clean_mask(m.copy(), fill_holes=True, min_area=10)
    assert some[8:10, 8:10].all() and not some[12:28, 12:28].any()
    # a notch open to the outside is not a hole
    notch = np.zeros((20, 20), bool)
    notch[2:18, 2:18] = True
    notch[2:10, 8:12] = False  # touches the top edge of the object's box
    assert not clean_mask(notch.copy(), fill_holes=True)[2:10, 8:12].any()


def test_speck_removal() -> None:
    m = np.zeros((50, 50), bool)
    m[10:30, 10:30] = True  # 400 px
    m[40:42, 40:42] = True  # 4 px speck
    m[2, 45] = True  # 1 px speck
    out = clean_mask(m.copy(), min_area=10)
    assert out[10:30, 10:30].all() and out.sum() == 400
    # through the pipeline stage, in source pixels, after upsampling
    stage = PostprocessStage(min_area=10, fill_holes=True, rle=False)
    frame = Frame(3, np.zeros((50, 50, 3), np.uint8))
    frame.result = _result(logits=np.where(m, 4.0, -4.0).astype(np.float32)[None])
    out_frame = stage.process(frame)
    assert out_frame.result.masks[0].sum() == 400
    assert out_frame.result.boxes[0].tolist() == [10, 10, 30, 30]


def test_rle_round_trip_through_pycocotools() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 24, 32)).astype(np.float32)
    stage = PostprocessStage()  # rle=True by default: computed once here and cached
    frame = Frame(
        0, np.zeros((48, 64, 3), np.uint8), result=_result(logits=logits, present=[True, False, True])
    )
    res = stage.process(frame).result
    assert res.rles is not None and len(res.rles) == 3
    for rle, mask in zip(res.rles, res.masks):
        assert isinstance(rle["counts"], str) and rle["size"] == [48, 64]
        decoded = mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()})
        assert np.array_equal(decoded.astype(bool), mask)
    assert res.to_rles() is res.rles


def test_rles_of_strided_masks_decode_to_the_masks() -> None:
    """to_rles() lays masks out column-major itself (OpenCV transposes): masks that are a strided view of a larger
    array, with odd sizes and a mask touching every border, still encode to exactly themselves."""
    rng = np.random.default_rng(3)
    big = rng.random((5, 2 * 37, 2 * 53)) > 0.6
    masks = big[1:4, ::2, ::2]  # (3, 37, 53), not contiguous
    masks[2] = True
    assert not masks.flags.c_contiguous
    result = TrackResult(0, [1, 2, 3], [1.0] * 3, [True] * 3, np.zeros((3, 4), np.float32), masks=masks)
    rles = result.to_rles()
    for rle, mask in zip(rles, masks):
        assert rle["size"] == [37, 53]
        assert np.array_equal(
            mask_utils.decode({"size": rle["size"], "counts": rle["counts"].encode()}), mask
        )
    reference = mask_utils.encode(np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8)))
    assert [r["counts"] for r in rles] == [r["counts"].decode("ascii") for r in reference]


def test_frame_without_result_gets_an_empty_one() -> None:
    frame = PostprocessStage().process(Frame(4, np.zeros((10, 12, 3), np.uint8)))
    assert frame.result is not None and len(frame.result) == 0
    assert frame.result.masks.shape == (0, 10, 12) and frame.result.frame_index == 4


def test_bad_options() -> None:
    with pytest.raises(ConfigError, match="min_area"):
        PostprocessStage(min_area=-1)
    with pytest.raises(ConfigError, match="threshold"):
        PostprocessStage(threshold=float("nan"))


def _rle_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    cases = []
    for t in range(300):
        h, w = (int(v) for v in rng.integers(1, 40, 2))
        m = rng.random((h, w)) < rng.random() if t % 5 else np.zeros((h, w), bool)
        if t % 7 == 0:
            m[:] = True
        if t % 11 == 0:
            m[:, rng.integers(0, w)] = True  # a whole column: a run joined across columns
        if t % 13 == 0:
            m = np.zeros((h, w), bool)
            m[rng.integers(0, h), rng.integers(0, w)] = True
        cases.append(m)
    small = np.zeros((120, 160), bool)
    small[100:120, 150:160] = True  # a small box touching the bottom-right corner
    cases.append(small)
    column = np.zeros((120, 160), bool)
    column[60:, 40] = column[:, 41] = column[:30, 42] = True  # small box, runs joined across columns
    cases.append(column)
    for t in range(100):  # small boxes (the runs-in-the-box path), some full-height and narrow (joined runs)
        h, w = (int(v) for v in rng.integers(20, 120, 2))
        bh = h if t % 3 == 0 else int(rng.integers(1, h // 2 + 1))
        bw = int(rng.integers(1, max(2, w // 8)))
        y, x = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        m = np.zeros((h, w), bool)
        m[y : y + bh, x : x + bw] = rng.random((bh, bw)) < rng.uniform(0.3, 1.0)
        cases.append(m)
    return cases


def test_rle_counts_are_pycocotools_strings() -> None:
    """``rle_counts`` (runs found inside the mask's box) gives pycocotools' own string for every mask: empty,
    full, speckled, single pixels, masks on the frame's border, runs that go on from one column to the next, and
    boxes both below and above the quarter-frame size where it switches to the whole-frame encoder."""
    from vostream.pipeline.types import rle_counts

    for i, m in enumerate(_rle_cases()):
        want = mask_utils.encode(np.asfortranarray(m[:, :, None].astype(np.uint8)))[0]["counts"].decode()
        assert rle_counts(m) == want, f"case {i}: {m.shape}"
