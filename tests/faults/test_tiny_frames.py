"""Tiny videos (1x1, 2x2, 3x3 frames) with the classic tracker: a working path or one clear error, never raw
OpenCV text (the probe saw exit 6 with an OpenCV assertion)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fakes import harness
from PIL import Image


def frames_dir(root: Path, size: int, n: int = 6) -> Path:
    d = root / f"tiny{size}"
    d.mkdir()
    rng = np.random.default_rng(size)
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(d / f"{i:05d}.png")
    return d


@pytest.mark.parametrize("size", [1, 2, 3])
@pytest.mark.slow
def test_tiny_frames_are_tracked(tmp_path, size):
    out = tmp_path / "out"
    r = harness.run_cli(
        ["track", frames_dir(tmp_path, size), "--point", "0,0", "--out", out, "--save", "json,png,mot", "-q"],
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "cv2" not in r.stderr and "Traceback" not in r.stderr
    assert json.loads((out / "summary.json").read_text())["frames"] == 6
    assert len(list((out / "masks").glob("*.png"))) == 6


@pytest.mark.slow
def test_a_one_pixel_video_output_is_refused_clearly(tmp_path):
    out = tmp_path / "out"
    r = harness.run_cli(
        ["track", frames_dir(tmp_path, 1), "--point", "0,0", "--out", out, "--save", "video,json", "-q"],
        timeout=60,
    )
    assert r.returncode == 4, r.stderr  # OutputError: the encoder cannot take a 1x1 picture
    assert "too small to encode" in r.stderr and r.stderr.count("\n") <= 3
    assert (out / "summary.json").exists()
