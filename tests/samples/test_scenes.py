"""The synthetic scenes: ground truth matches what is drawn, determinism, MP4 round trip, scoring conventions."""

from __future__ import annotations

import numpy as np
import pytest

from vostream.pipeline.errors import ConfigError
from vostream.samples import scenes as S

W, H = 320, 180


def test_every_scene_renders_with_visible_objects_and_clicks_inside() -> None:
    for name, spec in S.SCENES.items():
        sc = S.render_scene(name, W, H, frames=12)
        assert sc.frames.shape == (12, H, W, 3) and sc.frames.dtype == np.uint8
        assert sc.labels.shape == (12, H, W)
        assert sc.obj_ids == list(range(1, spec.n_objects + 1))
        for k, oid in enumerate(sc.obj_ids):
            x, y = sc.clicks[k]
            assert sc.labels[0, int(y), int(x)] == oid, f"{name}: click of object {oid} is not on it"
            m = sc.labels[0] == oid
            # "well inside": the click is at least a few pixels from the outline
            ys, xs = np.nonzero(~m)
            assert np.min(np.hypot(xs - x, ys - y)) >= 4


def test_ground_truth_matches_the_drawn_pixels() -> None:
    # static camera: where the object was at t0 but not at t1 (and vice versa) the pixels change a lot;
    # where neither frame has the object only the sensor noise differs
    sc = S.render_scene("translate", W, H, frames=30)
    a, b = sc.frames[0].astype(np.int16), sc.frames[20].astype(np.int16)
    ga, gb = sc.labels[0] > 0, sc.labels[20] > 0
    diff = np.abs(a - b).sum(axis=2)
    neither = ~(ga | gb)
    inner = ga & ~gb
    import cv2

    inner = cv2.erode(inner.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(
        bool
    )  # away from blurred edges
    assert inner.sum() > 200
    assert np.median(diff[neither]) < 25
    assert np.median(diff[inner]) > 3 * np.median(diff[neither]) + 30


def test_occlusion_scenes_have_the_advertised_events() -> None:
    full = S.render_scene("full_occlusion", W, H)
    areas = (full.labels > 0).reshape(len(full), -1).sum(1)
    hidden = np.flatnonzero(areas == 0)
    assert len(hidden) >= 5, "the object must disappear completely for a while"
    assert areas[hidden.max() + 1 :].max() > 0.8 * areas[0], "and come back fully"
    cross = S.render_scene("crossing", W, H)
    a2 = (cross.labels == 2).reshape(len(cross), -1).sum(1)
    assert a2.min() < 0.5 * a2[0], "object 2 must be (partly) hidden by object 1 while they cross"
    part = S.render_scene("partial_occlusion", W, H)
    import cv2

    n_parts = [cv2.connectedComponents((lab == 1).astype(np.uint8))[0] - 1 for lab in part.labels]
    assert max(n_parts) >= 2, "the pole must cut the object in two"


def test_determinism_by_seed() -> None:
    a = S.render_scene("deform", W, H, frames=8, seed=3)
    S.render_scene.cache_clear()
    b = S.render_scene("deform", W, H, frames=8, seed=3)
    assert a is not b
    assert np.array_equal(a.frames, b.frames) and np.array_equal(a.labels, b.labels)
    c = S.render_scene("deform", W, H, frames=8, seed=4)
    assert not np.array_equal(a.frames, c.frames)


def test_mp4_round_trip(tmp_path) -> None:
    sc = S.render_scene("camera_pan", W, H, frames=15)
    path = S.write_scene(sc, tmp_path / "pan.mp4", gt_dir=tmp_path / "gt")
    frames = S.read_video(path)
    assert frames.shape == sc.frames.shape
    mse = np.mean((frames.astype(np.float64) - sc.frames) ** 2)
    assert 10 * np.log10(255**2 / mse) > 30  # crf 18: small but real compression error
    from PIL import Image

    pngs = sorted((tmp_path / "gt").glob("*.png"))
    assert len(pngs) == 15
    im = Image.open(pngs[7])
    assert im.mode == "P" and np.array_equal(np.asarray(im), sc.labels[7])


def test_cli_writes_scene(tmp_path) -> None:
    assert S.main(["--out", str(tmp_path), "--scene", "translate", "--size", "160x90", "--frames", "4"]) == 0
    assert len(S.read_video(tmp_path / "translate.mp4")) == 4
    assert len(list((tmp_path / "translate").glob("*.png"))) == 4


def test_iou_and_score_conventions() -> None:
    z = np.zeros((4, 4), bool)
    o = z.copy()
    o[:2] = True
    assert S.iou(z, z) == 1.0
    assert S.iou(o, z) == 0.0 and S.iou(z, o) == 0.0
    half = z.copy()
    half[:1] = True
    assert S.iou(half, o) == pytest.approx(0.5)
    sc = S.render_scene("translate", W, H, frames=5)
    perfect = [sc.masks(t) for t in range(5)]
    assert S.score_sequence(perfect, sc).mean == 1.0
    # frame 0 is excluded: a wrong frame 0 does not count
    wrong0 = [np.zeros_like(perfect[0])] + perfect[1:]
    assert S.score_sequence(wrong0, sc).mean == 1.0
    # label maps are accepted too; an empty prediction on a visible object scores 0
    labs = [sc.labels[t] for t in range(4)] + [np.zeros((H, W), np.uint8)]
    r = S.score_sequence(labs, sc)
    assert r.mean == pytest.approx(0.75) and r.per_frame.shape == (4, 1)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown scene"):
        S.render_scene("nope")
    with pytest.raises(ConfigError, match="even sizes"):
        S.render_scene("translate", 321, 180)
