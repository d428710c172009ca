"""The public facade (``import vostream``): ``vostream.track`` runs the track job, ``vostream.open`` hands the
frames back to the caller's loop; both on a real encoded clip."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from fakes.media import make_video, square_frames, square_mask

import vostream

W, H, N = 160, 96, 30


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return make_video(tmp_path_factory.mktemp("api") / "sq.mp4", square_frames(N, W, H, step=2), fps=25)


def centre(i=0):
    ys, xs = np.nonzero(square_mask(i, W, H, step=2))
    return float(xs.mean()), float(ys.mean())


def iou(a, b):
    return (a & b).sum() / max(1, (a | b).sum())


@pytest.mark.slow
def test_track_writes_the_jobs_outputs(video, tmp_path):
    report = vostream.track(video, point=centre(), out=tmp_path / "run", save=("png", "json"))
    assert report.frames == N and report.reason == "end"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["objects"] == [1]
    masks = sorted((tmp_path / "run" / "masks").glob("*.png"))
    assert len(masks) == N


@pytest.mark.slow
def test_open_yields_every_frame_with_masks_that_follow_the_object(video):
    ious = []
    with vostream.open(video, point=centre()) as stream:
        for frame in stream:
            assert frame.result is not None and frame.result.masks is not None
            assert frame.result.masks.shape == (1, H, W)
            ious.append(iou(frame.result.masks[0], square_mask(frame.index, W, H, step=2)))
    assert len(ious) == N
    assert np.mean(ious[1:]) > 0.8


def test_open_takes_prompts_while_running(video):
    present = []
    with vostream.open(video, point=centre(), queue_size=1) as stream:
        for frame in stream:
            if frame.index == 5:
                stream.send(vostream.RemoveObject(1, frame_index=10))
            present.append((frame.index, list(frame.result.obj_ids)))
    assert all(ids == [1] for i, ids in present if i < 10)
    assert all(ids == [] for i, ids in present if i >= 12)  # the removal landed by frame 10 (+ queue slack)


def test_closing_a_stream_early_stops_it_promptly(video):
    stream = vostream.open(video, point=centre(), queue_size=1)
    first = next(iter(stream))
    assert first.index == 0
    t0 = time.monotonic()
    stream.close()
    assert time.monotonic() - t0 < 5
    assert not stream.pipeline.running  # every stage and sink thread has finished
    stream.close()  # idempotent


def test_bad_input_raises_the_projects_errors(video, tmp_path):
    with pytest.raises(vostream.PromptError, match="nothing to track"):
        vostream.track(video, out=tmp_path / "none")
    with pytest.raises(vostream.SourceError):
        vostream.open(tmp_path / "missing.mp4", point=(1, 1))
    with pytest.raises(vostream.ConfigError):
        vostream.open(video, point=(1, 1), backend="nope")


@pytest.mark.slow
def test_the_readmes_python_example_runs(tmp_path, monkeypatch):
    """The README's "From Python" block, run as written on an 854x480 clip named video.mp4 (docs that run)."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = next(b.split("```", 1)[0] for b in readme.split("```python\n")[1:] if "import vostream" in b)
    make_video(tmp_path / "video.mp4", square_frames(60, 854, 480, size=120, step=3), fps=25)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert (tmp_path / "out" / "py" / "summary.json").exists()
    assert namespace["frame"].index == 59 and namespace["mask"].shape == (480, 854)
