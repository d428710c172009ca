"""The ``vostream`` command line end to end, on real encoded videos: outputs, bad input, Ctrl-C, config files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
from fakes.media import copy_to, make_frame_dir, make_video, moving_square_clip, square_frames, square_mask
from fakes.waiting import wait_until
from PIL import Image
from pycocotools import mask as mask_utils

CLI = [sys.executable, "-m", "vostream.apps.cli"]
W, H, N = 160, 96, 30


def run_cli(*args, timeout=120, **kw):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout, **kw)


def clip() -> Path:
    return moving_square_clip(".mp4", "libx264", N, W, H)


def square_centre(i=0):
    ys, xs = np.nonzero(square_mask(i, W, H))
    return int(xs.mean()), int(ys.mean())


def read_mp4_frames(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def check_outputs(out: Path, frames: int) -> dict:
    """Re-read every output and check they agree with each other; return the parsed JSON."""
    assert read_mp4_frames(out / "overlay.mp4") == frames
    pngs = sorted((out / "masks").glob("*.png"))
    assert [p.name for p in pngs] == [f"{i:05d}.png" for i in range(frames)]
    data = json.loads((out / "annotations.json").read_text())
    assert data["videos"][0]["length"] == frames
    mot = [line.split(",") for line in (out / "mot.txt").read_text().splitlines()]
    (ann,) = data["annotations"]
    assert ann["id"] == 1
    for i, png in enumerate(pngs):
        labels = np.asarray(Image.open(png))
        seg = ann["segmentations"][i]
        from_json = mask_utils.decode(seg).astype(bool) if seg else np.zeros_like(labels, bool)
        assert np.array_equal(from_json, labels == 1), f"frame {i}: JSON and PNG masks differ"
    assert {int(r[0]) for r in mot} <= set(range(1, frames + 1))  # MOT frames are 1-based
    return data


def test_track_writes_every_output_and_tracks(tmp_path):
    x, y = square_centre()
    out = tmp_path / "out"
    r = run_cli("track", clip(), "--point", f"{x},{y}", "--out", out, "--save", "video,png,json,mot")
    assert r.returncode == 0, r.stderr
    assert f"{N} frames in" in r.stderr
    check_outputs(out, N)
    ious = []
    for i in range(1, N):
        pred = np.asarray(Image.open(out / "masks" / f"{i:05d}.png")) == 1
        gt = square_mask(i, W, H)
        ious.append((pred & gt).sum() / (pred | gt).sum())
    assert np.mean(ious) >= 0.8, ious
    summary = json.loads((out / "summary.json").read_text())
    assert summary["frames"] == N and summary["interrupted"] is False
    assert {n["name"] for n in summary["metrics"]["nodes"]} >= {"track", "preprocess", "postprocess"}


@pytest.mark.slow
def test_track_from_frames_dir_and_config(tmp_path):
    frames = make_frame_dir(tmp_path / "frames", square_frames(8, W, H), ext=".png")
    x, y = square_centre()
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'source = "frames"\nout = "o"\nsave = ["png", "mot"]\n[[prompts]]\nobj = 4\npoints = [[{x}, {y}]]\n'
    )
    r = run_cli("track", "--config", cfg, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet: nothing on stderr
    assert frames.is_dir()
    labels = np.asarray(Image.open(tmp_path / "o" / "masks" / "00005.png"))
    assert set(np.unique(labels)) == {0, 4}
    assert not (tmp_path / "o" / "overlay.mp4").exists()  # only what was asked for
    # flags override the config
    r = run_cli("track", "--config", cfg, "--save", "json", "--out", tmp_path / "o2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "o2" / "annotations.json").read_text())["annotations"][0]["id"] == 4


def _bad_inputs(tmp_path: Path):
    text = tmp_path / "notes.txt"
    text.write_text("not a video\n")
    trunc = copy_to(clip(), tmp_path, "trunc.mp4")
    trunc.write_bytes(trunc.read_bytes()[: trunc.stat().st_size // 3])
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    bad_json = tmp_path / "p.json"
    bad_json.write_text('{"prompts": [{"obj": 1, "points": [[1, 2]]}, }')
    remove_unknown = tmp_path / "r.json"
    remove_unknown.write_text(
        '{"prompts": [{"obj": 1, "points": [[10, 10]]}, {"obj": 9, "frame": 3, "remove": true}]}'
    )
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where a directory should be")
    ok = ["--point", "10,10"]
    return {
        "missing file": (["/nonexistent/video.mp4", *ok], "video.mp4"),
        "not a video": ([text, *ok], "notes.txt"),
        "truncated": ([trunc, *ok], "trunc.mp4"),
        "no images": ([empty_dir, *ok], "no images"),
        "point outside": ([clip(), "--point", f"{W + 5},10"], "outside the 160x96 frame"),
        "malformed prompts": ([clip(), "--prompts", bad_json], "invalid JSON"),
        "unknown object": ([clip(), "--prompts", remove_unknown], "unknown object id"),
        "negative only": ([clip(), "--neg", "10,10"], "only negative points"),
        "no prompt": ([clip()], "nothing to track"),
        "unwritable out": ([clip(), *ok, "--out", blocker / "sub"], "blocker"),
        "bad option value": ([clip(), *ok, "--save", "gif"], "unknown format"),
        "unknown backend": ([clip(), *ok, "--backend", "nope"], "unknown tracker backend"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "missing file",
        "not a video",
        "truncated",
        "no images",
        "point outside",
        "malformed prompts",
        "unknown object",
        "negative only",
        "no prompt",
        "unwritable out",
        "bad option value",
        "unknown backend",
    ],
)
@pytest.mark.slow
def test_bad_input_one_line_error(tmp_path, case):
    args, needle = _bad_inputs(tmp_path)[case]
    if "--out" not in args:
        args = [*args, "--out", tmp_path / "out"]
    r = run_cli("track", *args)
    assert r.returncode not in (0, 70), (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("vostream: error:"), r.stderr
    assert needle in lines[0], lines[0]


def test_zero_frame_video(tmp_path):
    from fakes.media import empty_clip

    r = run_cli("track", empty_clip(), "--point", "1,1", "--out", tmp_path / "o")
    assert r.returncode == 3 and "no frames" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
def test_sigint_finalises_outputs(tmp_path):
    """Ctrl-C mid-run: exit 130 and every output is complete and consistent for the frames processed."""
    n, w, h = 400, 320, 192
    video = make_video(tmp_path / "long.mp4", square_frames(n, w, h, step=1), fps=25)
    ys, xs = np.nonzero(square_mask(0, w, h, step=1))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            *CLI,
            "track",
            str(video),
            "--point",
            f"{int(xs.mean())},{int(ys.mean())}",
            "--out",
            str(out),
            "--save",
            "video,png,json,mot",
            "--max-frames",
            str(n),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_until(lambda: len(list((out / "masks").glob("*.png"))) >= 10, 60), "no masks after 60 s"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted" in err
    written = len(list((out / "masks").glob("*.png")))
    assert 10 <= written < n
    check_outputs(out, written)
    assert json.loads((out / "summary.json").read_text())["interrupted"] is True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.slow
def test_sigterm_and_sighup_also_finalise(tmp_path, sig):
    n, w, h = 300, 320, 192
    video = make_video(tmp_path / "long.mp4", square_frames(n, w, h, step=1), fps=25)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*CLI, "track", str(video), "--point", "60,96", "--out", str(out), "--save", "video,json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_until(lambda: list(out.glob("*.tmp*")) or (out / "overlay.mp4").exists(), 60), "no output"
    time.sleep(0.3)  # a few frames into the files
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode in (0, 130), err  # 0 if it happened to finish first
    frames = read_mp4_frames(out / "overlay.mp4")
    assert json.loads((out / "annotations.json").read_text())["videos"][0]["length"] == frames
    assert not list(out.glob("*.tmp")), "temporary files left behind"


@pytest.mark.slow
def test_demo_runs_and_scores(tmp_path):
    r = run_cli("demo", "--out", tmp_path / "out", "--samples-dir", tmp_path / "media", timeout=300)
    assert r.returncode == 0, r.stderr
    score = float(r.stderr.strip().splitlines()[-1].rsplit(" ", 1)[1])
    assert score >= 0.8, r.stderr
    assert (tmp_path / "media" / "crossing.mp4").exists()
    data = json.loads((tmp_path / "out" / "annotations.json").read_text())
    assert sorted(a["id"] for a in data["annotations"]) == [1, 2]


def test_version_and_help():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("vostream ")
    r = run_cli()
    assert r.returncode == 2 and "track" in r.stdout


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
    assert os.getcwd() == str(tmp_path)
