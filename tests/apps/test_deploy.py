"""Several streams in one process sharing one tracker (``vostream run``, ``docs/deploy.md``): the round-robin
scheduler, the deployment file, isolation of a failing stream, and two live streams from real RTSP servers of
which one is killed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fakes.media import make_video, square_frames, square_mask
from fakes.rtsp_server import RtspServer, server_available
from fakes.waiting import wait_until

from vostream.apps import deploy
from vostream.apps.cli import main
from vostream.pipeline.errors import ConfigError
from vostream.pipeline.scheduler import RoundRobinScheduler, SchedulerClosed
from vostream.stages.trackers import load_tracker

W, H, N = 160, 96, 30
needs_server = pytest.mark.skipif(server_available() is not None, reason=str(server_available()))


# -- the scheduler ---------------------------------------------------------------------------------------------


def test_streams_take_turns_and_results_reach_their_caller():
    sched = RoundRobinScheduler()
    for name in ("a", "b", "c"):
        sched.register(name)
    order: list[str] = []
    results: dict[str, list[int]] = {"a": [], "b": [], "c": []}
    lock = threading.Lock()

    def submit(name: str, i: int) -> None:
        r = sched.run(name, lambda: (order.append(name), i)[1])
        with lock:
            results[name].append(r)

    # a has 6 frames waiting, b 3, c 1 before the worker starts: the worker takes the streams in turn
    threads = [
        threading.Thread(target=submit, args=(n, i))
        for n, k in (("a", 6), ("b", 3), ("c", 1))
        for i in range(k)
    ]
    for t in threads:
        t.start()
    assert wait_until(lambda: sum(sched.pending().values()) == 10)
    with sched:
        for t in threads:
            t.join(10)
    assert order == ["a", "b", "c", "a", "b", "a", "b", "a", "a", "a"]
    assert {k: sorted(v) for k, v in results.items()} == {"a": list(range(6)), "b": list(range(3)), "c": [0]}
    assert sched.stats()["a"]["runs"] == 6


@pytest.mark.realtime
def test_a_stalled_stream_costs_the_others_nothing_and_errors_stay_in_their_stream():
    with RoundRobinScheduler() as sched:
        sched.register("stalled")  # registered, never submits (a feed that went quiet)

        def boom() -> None:
            raise ValueError("bad frame")

        with pytest.raises(ValueError, match="bad frame"):
            sched.run("b", boom)
        t0 = time.monotonic()
        assert [sched.run("b", lambda i=i: i * 2) for i in range(50)] == [i * 2 for i in range(50)]
        assert time.monotonic() - t0 < 2.0


def test_close_wakes_waiting_callers():
    sched = RoundRobinScheduler().start()
    started = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def busy() -> None:
        sched.run("a", lambda: (started.set(), release.wait(5)))

    def waiting() -> None:
        try:
            sched.run("b", lambda: None)
        except SchedulerClosed as exc:
            errors.append(exc)

    t1 = threading.Thread(target=busy)
    t1.start()
    started.wait(5)
    t2 = threading.Thread(target=waiting)
    t2.start()
    assert wait_until(lambda: sched.pending().get("b", 0) == 1), "b never queued behind a"
    closer = threading.Thread(target=sched.close)
    closer.start()
    time.sleep(0.1)
    release.set()
    for t in (t1, t2, closer):
        t.join(10)
    assert len(errors) == 1 and "closed" in str(errors[0])
    with pytest.raises(SchedulerClosed):
        sched.run("a", lambda: None)


# -- the deployment file ---------------------------------------------------------------------------------------


def write_deploy(tmp_path: Path, streams: list[dict], tracker: str = 'backend = "classic"') -> Path:
    lines = ["[tracker]", tracker, ""]
    for s in streams:
        lines.append("[[streams]]")
        for k, v in s.items():
            if k != "prompts":
                lines.append(f"{k} = {json.dumps(v)}")
        for p in s.get("prompts", []):
            lines.append("[[streams.prompts]]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in p.items()]
        lines.append("")
    path = tmp_path / "deploy.toml"
    path.write_text("\n".join(lines))
    return path


def click(i=0):
    ys, xs = np.nonzero(square_mask(i, W, H, step=2))
    return [[float(xs.mean()), float(ys.mean())]]


@pytest.mark.parametrize(
    "streams, message",
    [
        ([], "no streams"),
        ([{"name": "a", "source": "x.mp4", "out": "o", "backend": "onnx"}], "shared by every stream"),
        (
            [{"name": "a", "source": "x.mp4", "out": "o"}, {"name": "a", "source": "y.mp4", "out": "p"}],
            "unique",
        ),
        ([{"name": "a", "source": "x.mp4"}], "no output directory"),
    ],
)
def test_bad_deployment_files_are_refused_naming_the_stream(tmp_path, streams, message):
    with pytest.raises(ConfigError, match=message):
        deploy.load_deploy(write_deploy(tmp_path, streams))


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("deploy")
    return [make_video(d / f"sq{i}.mp4", square_frames(N, W, H, step=2), fps=25) for i in range(3)]


def test_three_streams_share_one_loaded_tracker(tmp_path, clips, monkeypatch):
    loads: list[str] = []

    def counting_load(backend, **options):
        loads.append(backend)
        return load_tracker(backend, **options)

    monkeypatch.setattr(deploy, "load_tracker", counting_load)
    streams = [
        {
            "name": f"cam{i}",
            "source": str(c),
            "out": str(tmp_path / f"out{i}"),
            "save": ["png", "json"],
            "prompts": [{"obj": 1, "frame": 0, "points": click()}],
        }
        for i, c in enumerate(clips)
    ]
    summary = deploy.run_deploy(deploy.load_deploy(write_deploy(tmp_path, streams)), quiet=True)
    assert loads == ["classic"]  # one model for every stream
    assert summary["failed"] == []
    for i in range(3):
        st = summary["streams"][f"cam{i}"]
        assert st["frames"] == N and st["reason"] == "end" and st["scheduler"]["runs"] >= N
        out = tmp_path / f"out{i}"
        assert json.loads((out / "summary.json").read_text())["frames"] == N
        from PIL import Image

        ious = []
        for k in range(1, N):
            got = np.array(Image.open(out / "masks" / f"{k:05d}.png")) == 1
            want = square_mask(k, W, H, step=2)
            ious.append((got & want).sum() / max(1, (got | want).sum()))
        assert np.mean(ious) > 0.8, f"cam{i} mean IoU {np.mean(ious):.3f}"
    assert json.loads((tmp_path / "deploy-summary.json").read_text())["streams"].keys() == {
        "cam0",
        "cam1",
        "cam2",
    }


def test_a_stream_that_cannot_start_fails_alone(tmp_path, clips, capsys):
    streams = [
        {
            "name": "good",
            "source": str(clips[0]),
            "out": str(tmp_path / "good"),
            "prompts": [{"obj": 1, "frame": 0, "points": click()}],
        },
        {
            "name": "missing",
            "source": str(tmp_path / "nope.mp4"),
            "out": str(tmp_path / "bad"),
            "prompts": [{"obj": 1, "frame": 0, "points": click()}],
        },
    ]
    code = main(["run", "--config", str(write_deploy(tmp_path, streams))])
    assert code == 3  # the missing file's SourceError code
    summary = json.loads((tmp_path / "deploy-summary.json").read_text())
    assert summary["streams"]["good"]["frames"] == N and summary["streams"]["good"]["error"] is None
    assert "no such file" in summary["streams"]["missing"]["error"]
    assert "missing" in capsys.readouterr().err


# -- live streams, one server killed ---------------------------------------------------------------------------


@needs_server
@pytest.mark.realtime
def test_a_dead_feed_does_not_stall_the_other_stream(tmp_path):
    frames = square_frames(300, 320, 240, size=60, step=1)
    clip = make_video(tmp_path / "live.mp4", frames, fps=30, options={"g": "30", "bf": "0"})
    with RtspServer(clip) as a, RtspServer(clip) as b:
        a.start()
        b.start()
        streams = [
            {
                "name": name,
                "source": srv.url,
                "out": str(tmp_path / name),
                "save": ["json"],
                "reconnect_max_delay": 1.0,
                "prompts": [{"obj": 1, "frame": 0, "points": [[60, 120]]}],
            }
            for name, srv in (("a", a), ("b", b))
        ]
        dep = deploy.Deployment(deploy.load_deploy(write_deploy(tmp_path, streams)))
        dep.start()
        try:

            def frames_of(name: str) -> int:
                pipe = dep.streams[name].pipeline
                assert pipe is not None
                return pipe.metrics().frames

            def rate_of_b(seconds: float) -> float:
                before, t0 = frames_of("b"), time.monotonic()
                time.sleep(seconds)
                return (frames_of("b") - before) / (time.monotonic() - t0)

            assert wait_until(lambda: min(frames_of("a"), frames_of("b")) >= 15), (
                "both streams should be running"
            )
            b_up = rate_of_b(2.0)  # b's rate on this machine, now, with both feeds up
            a.kill()  # stream a's feed dies
            time.sleep(0.5)
            b_down = rate_of_b(2.0)
            # a stall of b would show as ~0 fps; a loaded machine slows both measurements alike
            assert b_down >= 0.5 * b_up, f"stream b fell from {b_up:.1f} to {b_down:.1f} fps while a was down"
            text = dep.metrics_text()
            assert 'stream="a"' in text and 'stream="b"' in text
        finally:
            dep.stop()
            summary = dep.wait()
    assert summary["streams"]["b"]["error"] is None
    assert (tmp_path / "a" / "summary.json").exists() and (tmp_path / "b" / "summary.json").exists()


def test_several_workers_run_different_streams_at_once_but_a_stream_never_twice():
    sched = RoundRobinScheduler(workers=3)
    active: dict[str, int] = {"a": 0, "b": 0}
    peak = {"a": 0, "b": 0, "total": 0}
    lock = threading.Lock()

    def work(name: str) -> None:
        with lock:
            active[name] += 1
            peak[name] = max(peak[name], active[name])
            peak["total"] = max(peak["total"], sum(active.values()))
        time.sleep(0.05)
        with lock:
            active[name] -= 1

    threads = [
        threading.Thread(target=sched.run, args=(n, lambda n=n: work(n)))
        for n in ("a", "b")
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    assert wait_until(lambda: sum(sched.pending().values()) == 8)
    with sched:
        for t in threads:
            t.join(10)
    assert peak["a"] == 1 and peak["b"] == 1  # a stream's own work is never run twice at once
    assert peak["total"] == 2  # but the two streams ran side by side
