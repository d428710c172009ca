"""Live prompts: the prompts file's wall-clock triggers (``after_s``, ``at``) and frame triggers on a live feed.

Unit level: :func:`load_live_prompts` parsing and its one-line errors, :class:`PromptTimer` driven by hand with a
manual clock and a fake source.  End to end: ``vostream track rtsp://...`` (Python API and CLI) against GStreamer's
RTSP server on loopback (``tests/fakes/rtsp_server.py``): an object added ``after_s`` seconds after the first frame shows
up in the outputs from about the right frame on and matches the scene's ground truth; a bad file fails in one line.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fakes.live_clips import write_clip
from fakes.media import media_dir
from fakes.rtsp_server import RtspServer, server_available, serving
from fakes.waiting import wait_until
from PIL import Image

from vostream.apps.config import TrackSettings
from vostream.apps.live_prompts import PromptTimer, TimedPrompt, load_live_prompts
from vostream.pipeline.errors import PromptError
from vostream.pipeline.testing import ManualClock
from vostream.pipeline.types import Prompt, RemoveObject
from vostream.samples.scenes import iou, render_scene

W, H, FPS, N = 320, 240, 30, 300

needs_server = pytest.mark.skipif(server_available() is not None, reason=str(server_available()))


@functools.cache
def scene() -> Any:
    return render_scene("crossing", W, H, frames=N)


@functools.cache
def scene_clip() -> Path:
    return write_clip(media_dir() / "live_crossing.mp4", scene().frames)


@pytest.fixture
def rtsp_server() -> Iterator[RtspServer]:
    yield from serving(scene_clip())


def write_prompts(path: Path, entries: Any) -> Path:
    path.write_text(json.dumps(entries))
    return path


# -- load_live_prompts ---------------------------------------------------------------------------------------------


def test_load_splits_frame_and_wall_clock_triggers(tmp_path: Path) -> None:
    f = write_prompts(
        tmp_path / "p.json",
        {
            "prompts": [
                {"obj": 1, "frame": 0, "points": [[10, 20]]},
                {"obj": 2, "after_s": 1.5, "box": [1, 2, 30, 40]},
                {"obj": 1, "at": 1_700_000_000, "points": [[5, 6], [7, 8]], "labels": [1, 0]},
                {"obj": 2, "after_s": 3, "remove": True},
                {"obj": 3, "frame": 45, "points": [[50, 60]]},
            ]
        },
    )
    frame_prompts, timed = load_live_prompts(f)
    assert [(p.obj_id, p.frame_index) for p in frame_prompts] == [(1, 0), (3, 45)]
    assert [(t.after_s, t.at) for t in timed] == [(1.5, None), (None, 1_700_000_000.0), (3.0, None)]
    assert isinstance(timed[0].message, Prompt) and timed[0].message.box == (1.0, 2.0, 30.0, 40.0)
    assert timed[1].message.labels.tolist() == [1, 0]
    assert timed[2].message == RemoveObject(2, 0)


@pytest.mark.parametrize(
    "entries, match",
    [
        ([{"obj": 1, "after_s": 1, "at": 5, "points": [[1, 1]]}], "give one trigger"),
        ([{"obj": 1, "after_s": 1, "frame": 3, "points": [[1, 1]]}], "give one trigger"),
        ([{"obj": 1, "after_s": -2, "points": [[1, 1]]}], "seconds >= 0"),
        ([{"obj": 1, "after_s": "soon", "points": [[1, 1]]}], "seconds >= 0"),
        ([{"obj": 1, "after_s": True, "points": [[1, 1]]}], "seconds >= 0"),
        ([{"obj": 1, "after_s": 1, "points": [[1, 1]], "colour": 3}], "unknown key"),
        ([{"obj": 1, "after_s": 1, "points": "x"}], "points"),
        ({"prompts": 3}, "expected"),
    ],
)
def test_bad_live_prompts_file_is_one_prompt_error(tmp_path: Path, entries: Any, match: str) -> None:
    f = write_prompts(tmp_path / "bad.json", entries)
    with pytest.raises(PromptError, match=match) as info:
        load_live_prompts(f)
    assert "\n" not in str(info.value) and "bad.json" in str(info.value)


def test_non_finite_trigger_and_unreadable_files(tmp_path: Path) -> None:
    nan = tmp_path / "nan.json"
    nan.write_text('[{"obj": 1, "after_s": NaN, "points": [[1, 1]]}]')  # Python's json accepts NaN/Infinity
    with pytest.raises(PromptError, match="seconds >= 0"):
        load_live_prompts(nan)
    inf = tmp_path / "inf.json"
    inf.write_text('[{"obj": 1, "at": Infinity, "points": [[1, 1]]}]')
    with pytest.raises(PromptError, match="seconds >= 0"):
        load_live_prompts(inf)
    broken = tmp_path / "broken.json"
    broken.write_text('{"prompts": [')
    with pytest.raises(PromptError, match="invalid JSON at line 1"):
        load_live_prompts(broken)
    with pytest.raises(PromptError, match="no such file"):
        load_live_prompts(tmp_path / "missing.json")


# -- PromptTimer with a manual clock ---------------------------------------------------------------------------------


def _timed(obj: int, *, after_s: float | None = None, at: float | None = None) -> TimedPrompt:
    return TimedPrompt(Prompt(obj, 0, [[1.0, 2.0]], [1]), after_s, at)


def test_timer_waits_for_the_first_frame_then_fires_in_order() -> None:
    source = SimpleNamespace(last_index=-1, first_frame_time=None)
    sent: list[Any] = []
    clock = [1000.0]
    timer = PromptTimer(
        sent.append,
        source,
        [_timed(2, after_s=2.0), _timed(1, after_s=0.5), _timed(3, at=1004.0), _timed(4, at=900.0)],
        clock=lambda: clock[0],
    )
    # No frame yet: nothing is sent, not even the 'at' prompt already in the past.
    clock[0] = 1010.0
    assert timer.poll() == 1010.0 and sent == [] and timer.started is None
    # The first frame was captured at 1001.0 (connecting took a while): after_s counts from there.
    source.last_index, source.first_frame_time = 3, 1001.0
    clock[0] = 1001.2
    assert timer.poll() == 1001.5  # the past 'at' prompt fired; next: 1001.0 + 0.5
    assert [(m.obj_id, m.frame_index) for m in sent] == [(4, 4)]  # indexed to the next frame
    source.last_index = 10
    assert timer.poll(1001.49) == 1001.5 and len(sent) == 1
    assert timer.poll(1001.5) == 1003.0
    assert [(m.obj_id, m.frame_index) for m in sent] == [(4, 4), (1, 11)]
    # Late poll: both remaining are due; sent by due time (after_s 2.0 -> 1003.0 before at 1004.0).
    source.last_index = 99
    assert timer.poll(1005.0) is None
    assert [(m.obj_id, m.frame_index) for m in sent] == [(4, 4), (1, 11), (2, 100), (3, 100)]
    assert timer.sent == 4 and timer.pending == []
    assert all(isinstance(m, Prompt) for m in sent)


def test_timer_reindexes_removals_and_survives_a_failing_send() -> None:
    source = SimpleNamespace(last_index=7, first_frame_time=50.0)
    calls: list[Any] = []

    def send(msg: Any) -> None:
        calls.append(msg)
        if len(calls) == 1:
            raise RuntimeError("pipeline gone")

    timer = PromptTimer(
        send, source, [_timed(1, after_s=0.0), TimedPrompt(RemoveObject(1), after_s=1.0)], clock=lambda: 60.0
    )
    assert timer.poll() is None
    assert timer.failed == 1 and timer.sent == 1
    assert calls[1] == RemoveObject(1, 8)


def test_timer_thread_sends_when_due_on_its_clock_and_close_joins() -> None:
    """The timer's own thread, on a manual clock: nothing before the first frame, nothing before ``after_s`` has
    passed on the clock (however long the thread runs), the prompt at the instant it is due; close() joins."""
    clock = ManualClock(start=0.0, epoch=1_700_000_000.0)
    reads = [0]

    def now() -> float:
        reads[0] += 1
        return clock.time()

    def polled_twice() -> None:  # the thread read the clock twice more: it polled at least once since
        seen = reads[0]
        assert wait_until(lambda: reads[0] >= seen + 2, timeout=10), "the timer thread stopped polling"

    source = SimpleNamespace(last_index=-1, first_frame_time=None)
    sent: list[tuple[float, Any]] = []
    timer = PromptTimer(
        lambda m: sent.append((clock.time(), m)),
        source,
        [_timed(1, after_s=0.3), _timed(2, after_s=60.0)],
        clock=now,
        poll_s=0.01,
    ).start()
    try:
        clock.advance(5.0)
        polled_twice()
        assert sent == [] and timer.started is None  # no first frame yet
        first = clock.time()
        source.first_frame_time, source.last_index = first, 0
        clock.advance(0.29)
        polled_twice()
        polled_twice()  # a wait of min(0.5, due - now) real seconds may come between two polls
        assert sent == [], "sent before it was due"
        assert timer.started == first
        clock.advance(0.01)
        assert wait_until(lambda: bool(sent), timeout=10), "the timer never fired"
        assert sent[0][0] - first == pytest.approx(0.3)
        assert sent[0][1].obj_id == 1 and sent[0][1].frame_index == 1
    finally:
        timer.close()
    assert not timer._thread.is_alive()
    assert len(sent) == 1 and [t.message.obj_id for t in timer.pending] == [2]
    assert "vostream-prompt-timer" not in {t.name for t in threading.enumerate()}


@pytest.mark.realtime
def test_timer_thread_sends_on_time_by_the_wall_clock() -> None:
    """The same on the real clock: fired no earlier than due, and soon after (1 s of margin for a loaded machine;
    the timer itself sleeps until the due time), and close() returns promptly."""
    source = SimpleNamespace(last_index=-1, first_frame_time=None)
    sent: list[tuple[float, Any]] = []
    timer = PromptTimer(
        lambda m: sent.append((time.time(), m)), source, [_timed(1, after_s=0.3), _timed(2, after_s=60.0)]
    ).start()
    try:
        time.sleep(0.2)  # no first frame for a while: the timer must not start counting
        first = time.time()
        source.first_frame_time, source.last_index = first, 0
        assert wait_until(lambda: bool(sent), timeout=10), "the timer never fired"
        assert 0.3 <= sent[0][0] - first < 0.3 + 1.0
        assert sent[0][1].obj_id == 1
    finally:
        t0 = time.monotonic()
        timer.close()
    assert time.monotonic() - t0 < 2.0 and not timer._thread.is_alive()
    assert len(sent) == 1 and [t.message.obj_id for t in timer.pending] == [2]


# -- end to end over RTSP ------------------------------------------------------------------------------------------


@needs_server
@pytest.mark.slow
def test_after_s_object_appears_from_the_right_frame(
    rtsp_server: RtspServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Object 1 from a frame trigger, object 2 added 1 s after the first frame: its masks start at the frame the
    timer indexed it to, ~30 frames in, and match the ground truth in every frame from then on.

    Deterministic on a loaded machine: the timer's clock is paced by the feed (the first frame's time plus the
    media time of the last frame the source delivered, as a camera's clock would be), so 1 s is 30 frames
    whatever the machine's load; lossless edges (``policy="block"``, no catch-up) track every one of the 90
    frames.  The wall-clock timer itself is tested above (manual clock, and ``realtime``)."""
    from vostream.apps import track as track_app

    fired: list[int] = []  # the frame index the timed prompt was given when the timer fired

    def paced_timer(send: Any, source: Any, prompts: list[TimedPrompt]) -> PromptTimer:
        def media_clock() -> float:
            if source.first_frame_time is None:
                return 0.0
            return float(source.first_frame_time) + max(0, source.last_index) / FPS

        def recording_send(msg: Any) -> Any:
            fired.append(msg.frame_index)
            return send(msg)

        return PromptTimer(recording_send, source, prompts, clock=media_clock)

    monkeypatch.setattr(track_app, "PromptTimer", paced_timer)

    sc = scene()
    after = 1.0
    start = round(after * FPS)
    # The timer fires once the source has delivered frame 'start', indexing the prompt to the next frame it
    # delivers (a few later if the source ran ahead between two polls): click object 2 at a pixel it covers
    # throughout frames start..start+WINDOW.
    window = 45
    inside = np.all(sc.labels[start : start + window] == 2, axis=0)
    ys, xs = np.nonzero(inside)
    assert len(xs), "no pixel inside object 2 for the whole window"
    k = int(np.argmin((xs - xs.mean()) ** 2 + (ys - ys.mean()) ** 2))
    click2 = [int(xs[k]), int(ys[k])]
    prompts = write_prompts(
        tmp_path / "live.json",
        {
            "prompts": [
                {"obj": 1, "frame": 0, "points": [list(map(round, sc.click(1)))]},
                {"obj": 2, "after_s": after, "points": [click2]},
            ]
        },
    )
    out = tmp_path / "out"
    settings = TrackSettings(
        source=rtsp_server.url,
        out=str(out),
        save=("png",),
        prompts_file=str(prompts),
        max_frames=90,
        read_timeout=3,
        policy="block",  # every frame reaches the tracker
        max_stream_lag=0,  # and the source never skips to a keyframe
        quiet=True,
    )
    report = track_app.run_track(settings)
    assert not report.interrupted
    summary = json.loads((out / "summary.json").read_text())
    nodes = {n["name"]: n for n in summary["metrics"]["nodes"]}
    assert summary["metrics"]["nodes"][0]["frames_out"] == 90  # the source's node
    assert nodes["track"]["extra"]["applied_prompts"] == 2, nodes["track"]["extra"]
    pngs = sorted((out / "masks").glob("*.png"))
    assert len(pngs) == report.frames == 90  # lossless: every frame tracked
    indices = [int(p.stem) for p in pngs]
    with_obj2 = [i for i, p in zip(indices, pngs) if (np.asarray(Image.open(p)) == 2).any()]
    assert with_obj2, "object 2 was never tracked"
    first2 = with_obj2[0]
    # Fired once frame 'start' was delivered, at the latest half a second of the timer's polling later.
    assert len(fired) == 1 and start < fired[0] <= start + 15, fired
    assert first2 == min(i for i in indices if i >= fired[0]), (
        first2,
        fired,
    )  # applied to the frame it named
    assert with_obj2 == [i for i in indices if i >= first2]  # from then on, in every tracked frame
    scores1, scores2 = [], []
    for i, p in zip(indices, pngs):
        labels = np.asarray(Image.open(p))
        if i:
            scores1.append(iou(labels == 1, sc.labels[i] == 1))
        if i > first2:
            scores2.append(iou(labels == 2, sc.labels[i] == 2))
    assert np.mean(scores1) >= 0.8, np.mean(scores1)
    assert np.mean(scores2) >= 0.8, np.mean(scores2)


@needs_server
@pytest.mark.slow
def test_cli_bad_live_prompts_file_one_line_error(rtsp_server: RtspServer, tmp_path: Path) -> None:
    bad = write_prompts(tmp_path / "bad.json", [{"obj": 2, "after_s": -1, "points": [[10, 10]]}])
    outside = write_prompts(tmp_path / "outside.json", [{"obj": 2, "after_s": 1, "points": [[5000, 10]]}])
    for path, match in ((bad, "seconds >= 0"), (outside, "outside the 320x240 frame")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "vostream.apps.cli",
                "track",
                rtsp_server.url,
                "--prompts",
                str(path),
                "--out",
                str(tmp_path / "o"),
                "--max-frames",
                "5",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == PromptError.exit_code, r.stderr
        lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and match in lines[0], r.stderr
        assert "Traceback" not in r.stderr


def test_live_prompts_file_is_a_bounded_regular_file(tmp_path):
    """The live path reads prompts files through the same guard as the others: no /dev/zero, no FIFO."""
    import os

    with pytest.raises(PromptError, match="not a regular file"):
        load_live_prompts("/dev/zero")
    fifo = tmp_path / "p.fifo"
    os.mkfifo(fifo)
    with pytest.raises(PromptError, match="not a regular file"):
        load_live_prompts(fifo)
