"""The real track pipeline (decode → preprocess → track → postprocess → file sinks) under failure and control."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
from fakes.media import make_video, square_frames, square_mask
from PIL import Image

from vostream.apps.config import TrackSettings
from vostream.apps.track import build_track_pipeline
from vostream.pipeline.errors import StageError
from vostream.pipeline.types import Prompt, RemoveObject

W, H, N = 160, 96, 40


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    return make_video(tmp_path_factory.mktemp("v") / "sq.mp4", square_frames(N, W, H, step=2), fps=25)


def click(i=0):
    ys, xs = np.nonzero(square_mask(i, W, H, step=2))
    return [[float(xs.mean()), float(ys.mean())]]


def settings(video, out, **kw):
    return TrackSettings(
        source=str(video),
        out=str(out),
        save=("video", "png", "json", "mot"),
        prompts=kw.pop("prompts", [Prompt(1, 0, click(), [1])]),
        queue_size=2,
        **kw,
    )


def _raise_after(obj, method: str, after: int, monkeypatch):
    original = getattr(obj, method)
    calls = {"n": 0}

    def wrapped(*a, **k):
        calls["n"] += 1
        if calls["n"] > after:
            raise ZeroDivisionError(f"boom in {method}")
        return original(*a, **k)

    monkeypatch.setattr(obj, method, wrapped)


@pytest.mark.parametrize(
    "where, stage_name",
    [
        ("source", "source:"),
        ("preprocess", "preprocess"),
        ("track", "track"),
        ("postprocess", "postprocess"),
        ("mot", "mot"),
    ],
)
@pytest.mark.slow
def test_error_mid_stream_names_stage_and_keeps_outputs(video, tmp_path, monkeypatch, where, stage_name):
    pipe, _ = build_track_pipeline(settings(video, tmp_path))
    if where == "source":
        _raise_after(pipe.source, "read", 12, monkeypatch)
    elif where == "mot":
        from vostream.sinks.mot import MotSink

        _raise_after(MotSink, "write", 12, monkeypatch)
    else:
        from vostream.stages.postprocess import PostprocessStage
        from vostream.stages.preprocess import PreprocessStage
        from vostream.stages.track import TrackStage

        cls = {"preprocess": PreprocessStage, "track": TrackStage, "postprocess": PostprocessStage}[where]
        _raise_after(cls, "process", 12, monkeypatch)
    with pytest.raises(StageError) as err:
        pipe.run()
    assert stage_name in str(err.value) and isinstance(err.value.__cause__, ZeroDivisionError)
    # every output that exists is complete and valid for the frames that got through
    data = json.loads((tmp_path / "annotations.json").read_text())
    frames = data["videos"][0]["length"]
    assert 0 < frames <= 12 or (where == "mot" and frames <= N)
    with av.open(str(tmp_path / "overlay.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == frames
    assert len(list((tmp_path / "masks").glob("*.png"))) == frames
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".*.tmp*"))


@pytest.mark.slow
def test_failed_run_still_writes_a_summary_with_the_error(video, tmp_path, monkeypatch):
    from vostream.apps.track import run_track
    from vostream.stages.postprocess import PostprocessStage

    _raise_after(PostprocessStage, "process", 7, monkeypatch)
    with pytest.raises(StageError):
        run_track(settings(video, tmp_path, quiet=True))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "postprocess" in summary["error"] and "boom" in summary["error"]
    assert summary["frames"] == 7


@pytest.mark.slow
def test_prompts_on_later_frames_and_removal(video, tmp_path):
    prompts = [Prompt(1, 0, click(0), [1]), Prompt(2, 10, click(10), [1]), RemoveObject(1, 20)]
    # object 2 is a second click on the same square from frame 10: both exist between 10 and 19
    pipe, _ = build_track_pipeline(settings(video, tmp_path, prompts=prompts))
    report = pipe.run()
    assert report.frames == N
    data = json.loads((tmp_path / "annotations.json").read_text())
    by_id = {a["id"]: a for a in data["annotations"]}
    assert set(by_id) == {1, 2}
    assert all(s is None for s in by_id[2]["segmentations"][:10])
    assert by_id[2]["segmentations"][15] is not None
    assert all(s is None for s in by_id[1]["segmentations"][20:])
    assert by_id[1]["segmentations"][5] is not None
    track = next(n for n in report.metrics.as_dict()["nodes"] if n["name"] == "track")
    assert track["extra"]["applied_prompts"] == 2


@pytest.mark.slow
def test_prompt_injected_while_running(video, tmp_path):
    """A prompt sent with send_control for a frame not yet reached is applied exactly at that frame."""
    pipe, _ = build_track_pipeline(settings(video, tmp_path, prompts=[Prompt(1, 0, click(0), [1])]))
    pipe.start()
    pipe.send_control(Prompt(3, 30, click(30), [1]))
    pipe.wait()
    labels = [np.asarray(Image.open(tmp_path / "masks" / f"{i:05d}.png")) for i in (29, 30, 35)]
    assert not (labels[0] == 3).any() and (labels[1] == 3).any() and (labels[2] == 3).any()


@pytest.mark.slow
def test_codec_threads_limit_the_decoder_and_the_encoder(video, tmp_path):
    """``codec_threads`` reaches the file's decoder and the video encoder (x264 records its thread count in the
    stream's settings string); by default FFmpeg picks (annotate workers use this to share the cores)."""
    pipe, _ = build_track_pipeline(settings(video, tmp_path / "one", codec_threads=1))
    assert pipe.source.threads == 1
    pipe.run()
    assert b" threads=1 " in (tmp_path / "one" / "overlay.mp4").read_bytes()
    pipe, _ = build_track_pipeline(settings(video, tmp_path / "auto"))
    assert pipe.source.threads == "AUTO"


def test_codec_threads_are_checked(video, tmp_path):
    from vostream.apps.config import merge_settings
    from vostream.pipeline.errors import ConfigError

    base = {"source": str(video), "out": str(tmp_path)}
    with pytest.raises(ConfigError, match="codec_threads"):
        merge_settings({**base, "codec_threads": 0}, {})
    assert merge_settings({**base, "codec_threads": 2}, {}).codec_threads == 2
