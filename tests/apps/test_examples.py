"""The runnable examples in samples/examples/ run and say what they promise (docs that run cannot drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fakes.media import moving_square_clip, square_mask

EXAMPLES = Path(__file__).resolve().parents[2] / "samples" / "examples"


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True, timeout=240
    )


@pytest.mark.slow
def test_track_scene_example(tmp_path):
    r = run("track_scene.py", "--scene", "translate", "--size", "320x192", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("translate: 90 frames") and "mean IoU" in first
    assert float(first.rsplit(" ", 1)[1]) >= 0.7, r.stdout
    assert (tmp_path / "result" / "annotations.json").exists()


@pytest.mark.slow
def test_custom_pipeline_example():
    w, h, n = 160, 96, 24
    clip = moving_square_clip(".mp4", "libx264", n, w, h)
    ys, xs = np.nonzero(square_mask(0, w, h))
    r = run("custom_pipeline.py", str(clip), str(xs.mean()), str(ys.mean()))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("frame")]
    assert len(lines) == n
    assert "obj 1: area" in lines[0] and "obj 2" not in lines[0]
    assert "obj 2: area" in lines[-1]  # the object injected halfway through
