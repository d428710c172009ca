"""File sinks: MP4 overlay, DAVIS PNGs, YouTube-VIS JSON, MOT text; atomicity and unwritable outputs."""

from __future__ import annotations

import json
import os
import pickle
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from fakes.media import square_frame, square_mask
from PIL import Image
from pycocotools import mask as mask_utils

from vostream.pipeline.errors import ConfigError, OutputError
from vostream.pipeline.types import Frame, TrackResult, boxes_from_masks
from vostream.sinks import (
    DAVIS_PALETTE,
    FILE_FORMATS,
    MotSinkSpec,
    OverlayStyle,
    PngSinkSpec,
    VideoSinkSpec,
    VisJsonSinkSpec,
    build_file_sinks,
    color_for,
    draw_overlay,
)
from vostream.sinks.atomic import AtomicFile, atomic_write_text, ensure_dir

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")

W, H = 64, 48


def _frames(n: int, width: int = W, height: int = H, absent_at: int | None = None) -> list[Frame]:
    """Frames of the moving-square scene with full-size results for objects 1 (the square) and 2 (a fixed
    block, prompted from frame 2 on).  Object 1 is absent at ``absent_at``."""
    frames = []
    for i in range(n):
        image = square_frame(i, width, height)
        m1 = square_mask(i, width, height)
        m2 = np.zeros((height, width), bool)
        m2[2:10, width - 14 : width - 2] = True
        ids, masks, present = [1], [m1], [i != absent_at]
        if i >= 2:
            ids.append(2)
            masks.append(m2)
            present.append(True)
        masks_arr = np.stack(masks)
        masks_arr[~np.asarray(present)] = False
        result = TrackResult(i, ids, [0.9] * len(ids), present, boxes_from_masks(masks_arr), masks=masks_arr)
        frames.append(
            Frame(i, image, pts=i * 512, time_base=Fraction(1, 12800), source_id="clip.mp4", result=result)
        )
    return frames


def _write_all(spec, frames):  # type: ignore[no-untyped-def]
    with spec.build() as sink:
        for f in frames:
            sink.write(f)
    return sink


def _no_tmp(directory: Path) -> None:
    leftovers = [p for p in directory.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, leftovers


# -- overlay ---------------------------------------------------------------------------------------------------


def test_palette_and_colours() -> None:
    assert DAVIS_PALETTE[0].tolist() == [0, 0, 0]
    assert DAVIS_PALETTE[1].tolist() == [128, 0, 0]
    assert DAVIS_PALETTE[2].tolist() == [0, 128, 0]
    assert DAVIS_PALETTE[3].tolist() == [128, 128, 0]
    assert color_for(5) == tuple(DAVIS_PALETTE[5].tolist())
    assert color_for(300) != (0, 0, 0) and color_for(0) != (0, 0, 0)


def test_draw_overlay_tints_masks_and_keeps_input() -> None:
    frame = _frames(3)[2]
    before = frame.image.copy()
    plain = draw_overlay(frame.image, frame.result, OverlayStyle(alpha=0.5, contours=False, labels=False))
    assert np.array_equal(frame.image, before)  # sinks share frames: never draw in place
    for row in range(2):
        m = frame.result.masks[row]
        expected = before[m].astype(float) * 0.5 + np.asarray(color_for(row + 1)) * 0.5
        assert np.abs(plain[m].astype(float) - expected).max() <= 1.0
    assert np.array_equal(plain[~frame.result.masks.any(axis=0)], before[~frame.result.masks.any(axis=0)])
    full = draw_overlay(frame.image, frame.result)  # contours and labels add ink near the objects only
    changed = np.any(full != plain, axis=2)
    assert changed.sum() > 20
    far = np.zeros_like(changed)
    far[H - 4 :, :4] = True
    assert not changed[far].any()


@pytest.mark.parametrize("alpha", [0.5, 0.3, 0.37, 0.9, 1.0])
def test_draw_overlay_tint_is_exactly_the_float32_blend(alpha: float) -> None:
    """The tint (a per-colour lookup table applied by OpenCV) equals, pixel for pixel, the float32 blend
    ``uint8(pixel * (1 - alpha) + colour * alpha)`` on masked pixels, leaves every other pixel alone, and does so
    for overlapping objects and masks that touch the frame's edges (boxes that are views into the frame)."""
    rng = np.random.default_rng(7)
    h, w = 90, 160
    image = rng.integers(0, 256, (h, w, 3), np.uint8)
    yy, xx = np.mgrid[:h, :w]
    masks = np.stack(
        [
            np.hypot(yy - 40, xx - 60) < 30,  # a disc
            (np.abs(yy - xx // 2) < 3) & (xx > 80),  # a thin diagonal band reaching the right edge
            (yy > 30) & (xx < 20),  # touches the left and bottom edges, overlaps nothing
            np.hypot(yy - 50, xx - 75) < 12,  # overlaps the disc: drawn after it, over its tint
        ]
    )
    ids = [1, 7, 200, 3]
    result = TrackResult(0, ids, [1.0] * 4, [True] * 4, boxes_from_masks(masks), masks=masks)
    got = draw_overlay(image, result, OverlayStyle(alpha=alpha, contours=False, labels=False))
    expected = image.copy()
    for oid, m in zip(ids, masks):
        blend = expected[m].astype(np.float32) * np.float32(1 - alpha)
        expected[m] = (blend + np.asarray(color_for(oid), np.float32) * np.float32(alpha)).astype(np.uint8)
    assert np.array_equal(got, expected)
    assert not np.array_equal(got, image)


# -- video -----------------------------------------------------------------------------------------------------


def test_video_sink_writes_playable_annotated_mp4(tmp_path: Path) -> None:
    frames = _frames(12)
    spec = VideoSinkSpec(tmp_path / "out" / "overlay.mp4", crf=18)
    assert pickle.loads(pickle.dumps(spec)) == spec
    sink = _write_all(spec, frames)
    sink.close()  # idempotent
    path = tmp_path / "out" / "overlay.mp4"
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        assert (stream.width, stream.height) == (W, H)
        decoded = [(f.pts, f.time_base, f.to_ndarray(format="rgb24")) for f in c.decode(stream)]
    assert len(decoded) == 12
    # timing kept: 512 ticks of 1/12800 s = 25 fps
    times = [float(p * tb) for p, tb, _ in decoded]
    assert np.allclose(np.diff(times), 0.04, atol=1e-3)
    # overlay colour visible where object 2's mask is (the DAVIS green, blended 50 %)
    img = decoded[5][2].astype(int)
    src = frames[5].image.astype(int)
    inner = (slice(4, 8), slice(W - 12, W - 4))
    tint = img[inner].reshape(-1, 3).mean(axis=0) - src[inner].reshape(-1, 3).mean(axis=0)
    assert tint[1] > 15 and tint[0] < -15  # greener, less red than the grey background
    # the square (object 1, DAVIS red over a red square) gets darker red; the background far away is unchanged
    assert np.abs(img[H - 4 :, :4] - src[H - 4 :, :4]).mean() < 6
    _no_tmp(tmp_path)


def test_video_sink_odd_size_is_cropped_to_even(tmp_path: Path) -> None:
    frames = _frames(3, width=65, height=47)
    _write_all(VideoSinkSpec(tmp_path / "odd.mp4", fps=10), frames)
    with av.open(str(tmp_path / "odd.mp4")) as c:
        s = c.streams.video[0]
        assert (s.width, s.height) == (64, 46)
        assert float(s.average_rate) == pytest.approx(10)
        assert len(list(c.decode(s))) == 3


def test_video_sink_error_mid_stream_leaves_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "overlay.mp4"
    frames = _frames(10)
    with pytest.raises(KeyboardInterrupt):
        with VideoSinkSpec(path).build() as sink:
            for i, f in enumerate(frames):
                if i == 6:
                    assert not path.exists()  # nothing under the final name while running
                    raise KeyboardInterrupt
                sink.write(f)
    with av.open(str(path)) as c:
        assert len(list(c.decode(video=0))) == 6
    _no_tmp(tmp_path)


def test_video_sink_no_frames_creates_nothing(tmp_path: Path) -> None:
    with VideoSinkSpec(tmp_path / "overlay.mp4").build():
        pass
    assert list(tmp_path.iterdir()) == []


# -- PNG -------------------------------------------------------------------------------------------------------


def test_png_sink_writes_palette_pngs_with_ids(tmp_path: Path) -> None:
    frames = _frames(5, absent_at=3)
    _write_all(PngSinkSpec(tmp_path / "masks"), frames)
    names = sorted(p.name for p in (tmp_path / "masks").iterdir())
    assert names == [f"{i:05d}.png" for i in range(5)]
    for f in frames:
        im = Image.open(tmp_path / "masks" / f"{f.index:05d}.png")
        assert im.mode == "P" and im.size == (W, H)
        assert np.asarray(im.getpalette()[:9]).tolist() == DAVIS_PALETTE[:3].reshape(-1).tolist()
        labels = np.asarray(im)
        expected = np.zeros((H, W), np.uint8)
        for oid, m, p in zip(f.result.obj_ids, f.result.masks, f.result.present):
            if p:
                expected[m] = oid
        assert np.array_equal(labels, expected)
    assert (np.asarray(Image.open(tmp_path / "masks" / "00003.png")) == 1).sum() == 0  # absent object
    assert (np.asarray(Image.open(tmp_path / "masks" / "00004.png")) == 1).sum() == square_mask(4, W, H).sum()
    _no_tmp(tmp_path)


def test_png_sink_rejects_ids_over_255(tmp_path: Path) -> None:
    m = np.ones((1, 4, 4), bool)
    frame = Frame(
        0, np.zeros((4, 4, 3), np.uint8), result=TrackResult(0, [300], [1.0], [True], [[0, 0, 4, 4]], masks=m)
    )
    with PngSinkSpec(tmp_path).build() as sink:
        with pytest.raises(OutputError, match="object id 300 .* 1..255"):
            sink.write(frame)


# -- JSON ------------------------------------------------------------------------------------------------------


def test_vis_json_decodes_to_the_same_masks(tmp_path: Path) -> None:
    frames = _frames(6, absent_at=4)
    path = tmp_path / "annotations.json"
    _write_all(VisJsonSinkSpec(path), frames)
    doc = json.loads(path.read_text())
    video = doc["videos"][0]
    assert video == {
        "id": 1,
        "file_name": "clip.mp4",
        "file_names": [f"clip/{i:05d}.jpg" for i in range(6)],
        "width": W,
        "height": H,
        "length": 6,
    }
    assert doc["categories"][0]["id"] == 1
    anns = {a["id"]: a for a in doc["annotations"]}
    assert sorted(anns) == [1, 2]
    for ann in anns.values():
        assert ann["video_id"] == 1 and ann["category_id"] == 1
        for key in ("segmentations", "bboxes", "areas", "scores"):
            assert len(ann[key]) == 6
        assert ann["score"] == pytest.approx(0.9)
    assert anns[1]["segmentations"][4] is None and anns[1]["bboxes"][4] is None  # absent
    assert anns[2]["segmentations"][0] is None and anns[2]["segmentations"][1] is None  # not yet prompted
    for f in frames:
        for row, oid in enumerate(f.result.obj_ids.tolist()):
            seg = anns[oid]["segmentations"][f.index]
            if not f.result.present[row]:
                assert seg is None
                continue
            mask = mask_utils.decode({"size": seg["size"], "counts": seg["counts"].encode()})
            assert np.array_equal(mask.astype(bool), f.result.masks[row])
            x0, y0, x1, y1 = f.result.boxes[row].tolist()
            assert anns[oid]["bboxes"][f.index] == [x0, y0, x1 - x0, y1 - y0]
            assert anns[oid]["areas"][f.index] == int(f.result.masks[row].sum())
    _no_tmp(tmp_path)


def test_vis_json_error_mid_stream_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    with pytest.raises(RuntimeError):
        with VisJsonSinkSpec(path, video_name="v.mp4").build() as sink:
            for f in _frames(3):
                sink.write(f)
            raise RuntimeError("a stage failed")
    doc = json.loads(path.read_text())
    assert doc["videos"][0]["length"] == 3 and len(doc["annotations"]) == 2


# -- MOT -------------------------------------------------------------------------------------------------------


def test_mot_lines_are_one_based(tmp_path: Path) -> None:
    frames = _frames(4, absent_at=2)
    path = tmp_path / "mot.txt"
    _write_all(MotSinkSpec(path), frames)
    lines = path.read_text().splitlines()
    # object 1 on frames 0, 1, 3; object 2 on frames 2, 3
    assert len(lines) == 5
    first = lines[0].split(",")
    x0, y0, x1, y1 = frames[0].result.boxes[0].tolist()
    assert first[:2] == ["1", "1"]
    assert [float(v) for v in first[2:6]] == [x0, y0, x1 - x0, y1 - y0]
    assert float(first[6]) == pytest.approx(0.9) and first[7:] == ["-1", "-1", "-1"]
    frame_ids = [(int(line.split(",")[0]), int(line.split(",")[1])) for line in lines]
    assert frame_ids == [(1, 1), (2, 1), (3, 2), (4, 1), (4, 2)]
    _no_tmp(tmp_path)


# -- atomicity, directories, the helper -------------------------------------------------------------------------


def test_files_appear_only_on_close(tmp_path: Path) -> None:
    specs = build_file_sinks(tmp_path, fps=25, source_name="clip.mp4")
    sinks = [s.build() for s in specs]
    for s in sinks:
        s.open()
    frames = _frames(3)
    for f in frames:
        for s in sinks:
            s.write(f)
    assert not (tmp_path / "overlay.mp4").exists()
    assert not (tmp_path / "annotations.json").exists()
    assert not (tmp_path / "mot.txt").exists()
    assert sorted(p.name for p in (tmp_path / "masks").iterdir()) == ["00000.png", "00001.png", "00002.png"]
    for s in sinks:
        s.close()
    for name in ("overlay.mp4", "annotations.json", "mot.txt"):
        assert (tmp_path / name).stat().st_size > 0
    _no_tmp(tmp_path)


def test_build_file_sinks_names_and_errors(tmp_path: Path) -> None:
    specs = build_file_sinks(tmp_path, ("json", "mot", "video", "png"), fps=0.0)
    assert [type(s).__name__ for s in specs] == [
        "VisJsonSinkSpec",
        "MotSinkSpec",
        "VideoSinkSpec",
        "PngSinkSpec",
    ]
    assert Path(specs[2].path) == tmp_path / FILE_FORMATS["video"] and specs[2].fps is None
    assert Path(specs[3].dir) == tmp_path / "masks"
    assert len({s.name for s in specs}) == 4
    with pytest.raises(ConfigError, match="unknown output format 'gif'"):
        build_file_sinks(tmp_path, ("gif",))
    assert list(tmp_path.iterdir()) == []  # nothing created before open


@pytest.mark.parametrize(
    "spec_for",
    [
        lambda d: VideoSinkSpec(d / "o.mp4"),
        lambda d: PngSinkSpec(d / "masks"),
        lambda d: VisJsonSinkSpec(d / "a.json"),
        lambda d: MotSinkSpec(d / "m.txt"),
    ],
)
def test_unwritable_directory_fails_at_open(tmp_path: Path, spec_for) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("a file where a directory should be")
    sink = spec_for(blocker / "sub").build()
    with pytest.raises(OutputError, match="file/sub"):
        sink.open()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write to read-only directories")
def test_read_only_directory_fails_at_open(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="not writable"):
            MotSinkSpec(ro / "m.txt").build().open()
    finally:
        ro.chmod(0o700)


def test_atomic_file(tmp_path: Path) -> None:
    target = tmp_path / "x.txt"
    atomic_write_text(target, "old")
    with pytest.raises(ValueError):
        with AtomicFile(target, "w") as f:
            f.write("partial")
            raise ValueError("boom")
    assert target.read_text() == "old"  # the previous version survives a failed write
    with AtomicFile(target, "w") as f:
        f.write("new")
        assert target.read_text() == "old"
    assert target.read_text() == "new"
    _no_tmp(tmp_path)
    assert ensure_dir(tmp_path / "a" / "b").is_dir()


@pytest.mark.slow
def test_vis_json_rolls_part_files_with_flat_memory(tmp_path: Path) -> None:
    """A live run never ends: with ``roll_frames`` the JSON sink writes a part file per N frame indices and forgets
    them, so what it holds stays flat over 20,000 frames; every part is a valid document of its frames."""
    import tracemalloc

    n, roll = 20_000, 5_000
    mask = np.zeros((1, 16, 16), bool)
    mask[0, 4:9, 5:11] = True
    boxes = boxes_from_masks(mask)
    rles = TrackResult(0, [1], [0.9], [True], boxes, masks=mask).to_rles()
    image = np.zeros((16, 16, 3), np.uint8)
    spec = VisJsonSinkSpec(tmp_path / "annotations.json", roll_frames=roll)
    sink = spec.build()
    sink.open()
    tracemalloc.start()
    try:
        held = []
        for i in range(n):
            if i == 777:
                continue  # a skipped source frame: a null entry in its part
            result = TrackResult(i, [1], [0.9], [True], boxes, masks=mask, rles=rles)
            sink.write(Frame(i, image, source_id="cam", result=result))
            if i % roll == roll - 1:
                held.append(tracemalloc.get_traced_memory()[0])
        sink.close()
    finally:
        tracemalloc.stop()
    assert max(held) - min(held) < 256 * 1024, held  # flat: no growth part after part
    parts = sorted(tmp_path.glob("annotations-*.json"))
    assert [p.name for p in parts] == [f"annotations-{k:05d}.json" for k in range(n // roll)]
    assert not (tmp_path / "annotations.json").exists()
    for k, path in enumerate(parts):
        doc = json.loads(path.read_text())
        video, (ann,) = doc["videos"][0], doc["annotations"]
        assert video["first_frame"] == k * roll and video["length"] == roll == len(ann["segmentations"])
        assert video["file_names"][0] == f"cam/{k * roll:05d}.jpg"
        assert (ann["segmentations"][777] is None) == (k == 0)
        decoded = mask_utils.decode(
            {**ann["segmentations"][-1], "counts": ann["segmentations"][-1]["counts"]}
        )
        assert np.array_equal(decoded.astype(bool), mask[0])
    with pytest.raises(ConfigError, match="roll_frames"):
        VisJsonSinkSpec(tmp_path / "x.json", roll_frames=0)
