"""Hot model reload (``docs/deploy.md`` §2): a new model loaded beside the running one, checked, and switched to at
a frame boundary of every stream, on real encoded clips, a real RTSP feed and the tiny exported SAM 2 model.

A test that must reload *mid-run* holds the deployment's scheduler with one job of its own (a "gate") while it
reloads: the streams wait at their next frame, the reload itself does not need the scheduler (it loads beside the
running model), and once the gate opens every stream switches at that frame.  Without the gate a file stream can
end before a reload of a few hundred milliseconds lands."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakes.media import make_video, square_box, square_frames, square_mask
from fakes.rtsp_server import RtspServer, server_available
from fakes.waiting import wait_until
from PIL import Image

from vostream.apps import deploy
from vostream.apps.model_watch import ModelWatcher, directory_signature
from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Frame, Prompt, TrackResult
from vostream.stages.trackers.base import InputSpec, Tracker, TrackerSession
from vostream.stages.trackers.reload import ModelHandle, ReloadableTracker, ReloadBusy, ReloadError

W, H, N = 160, 96, 48
needs_server = pytest.mark.skipif(server_available() is not None, reason=str(server_available()))


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("reload")
    return make_video(d / "square.mp4", square_frames(N, W, H, step=2), fps=25)


@pytest.fixture()
def model_dir(sam2_tiny: Any, tmp_path: Path) -> Path:
    """A private copy of the tiny SAM 2 export (tests damage or replace it)."""
    _, export = sam2_tiny("sam2")
    return Path(shutil.copytree(export, tmp_path / "model"))


def write_deploy(
    tmp_path: Path,
    clip: Path,
    tracker: list[str],
    names: tuple[str, ...] = ("a",),
    save: str = '["mot", "png"]',
) -> Path:
    box = list(square_box(0, W, H, step=2))
    lines = ["[tracker]", *tracker, ""]
    for name in names:
        lines += [
            "[[streams]]",
            f'name = "{name}"',
            f'source = "{clip}"',
            f'out = "{tmp_path / name}"',
            f"save = {save}",
            "[[streams.prompts]]",
            "obj = 1",
            f"box = {box}",
            "",
        ]
    path = tmp_path / "deploy.toml"
    path.write_text("\n".join(lines))
    return path


def frames_of(dep: deploy.Deployment, name: str) -> int:
    """Frames the stream has tracked so far (0 until its pipeline is built)."""
    pipe = dep.streams[name].pipeline
    return pipe.metrics().frames if pipe is not None else 0


@contextlib.contextmanager
def gate(dep: deploy.Deployment) -> Iterator[None]:
    """Hold the scheduler's worker: every stream waits at its next frame until the block exits."""
    held, release = threading.Event(), threading.Event()
    t = threading.Thread(target=dep.scheduler.run, args=("gate", lambda: (held.set(), release.wait(30))))
    t.start()
    assert held.wait(10)
    try:
        yield
    finally:
        release.set()
        t.join(10)


def mot_rows(out: Path) -> list[tuple[int, int]]:
    rows = []
    for line in (out / "mot.txt").read_text().splitlines():
        f, oid = line.split(",")[:2]
        rows.append((int(f) - 1, int(oid)))
    return rows


def masks(out: Path) -> list[np.ndarray]:
    return [np.array(Image.open(out / "masks" / f"{k:05d}.png")) == 1 for k in range(N)]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max(1, (a | b).sum()))


def one_result_per_frame(out: Path) -> None:
    """Every frame 0..N-1 reached the sinks once: one mask PNG each, one MOT row per frame for object 1, no other
    object, and nothing twice."""
    assert sorted(p.name for p in (out / "masks").glob("*.png")) == [f"{k:05d}.png" for k in range(N)]
    rows = mot_rows(out)
    assert sorted(rows) == [(k, 1) for k in range(N)], "one MOT row per frame for object 1, none twice"


def reload_mid_run(dep: deploy.Deployment, after: int = 12) -> tuple[Any, dict[str, int]]:
    """Reload once every stream has tracked ``after`` frames, with the streams held at their next frame."""
    assert wait_until(lambda: all(frames_of(dep, n) >= after for n in dep.streams))
    with gate(dep):
        at = {n: frames_of(dep, n) for n in dep.streams}
        outcome = dep.reload()
    return outcome, at


# -- a file stream, the tiny SAM 2 export ----------------------------------------------------------------------------


@pytest.mark.slow
def test_reload_mid_run_switches_every_stream_at_a_frame_boundary(tmp_path, clip, model_dir):
    path = write_deploy(tmp_path, clip, ['backend = "onnx"', f'model = "{model_dir}"'], names=("a", "b"))
    dep = deploy.Deployment(deploy.load_deploy(path))
    dep.start()
    assert dep.handle is not None
    first = dep.handle.tracker
    try:
        outcome, at = reload_mid_run(dep)
        assert outcome.generation == 2 and outcome.load_s > 0 and outcome.check_s > 0
        # both models are loaded until the streams have moved, then the old one is closed
        assert wait_until(lambda: dep.handle is not None and dep.handle.loaded() == [2])
        assert wait_until(lambda: first.runtime._closed)  # type: ignore[attr-defined]
    finally:
        summary = dep.wait()
    assert summary["model"]["generation"] == 2 and summary["model"]["reloads"] == 1
    assert summary["tracker_loads"] == 2
    for name in ("a", "b"):
        st = summary["streams"][name]
        assert st["frames"] == N and st["error"] is None
        model = st["model"]
        assert model["generation"] == 2 and model["switches"] == 1 and model["dropped_objects"] == 0
        switch = model["last_switch_frame"]
        assert at[name] <= switch < N - 1, f"{name} switched at frame {switch}, not mid-run"
        out = tmp_path / name
        one_result_per_frame(out)
        m = masks(out)
        # the mask continues across the switch: the carried mask on the new model's first frame, then its own
        # tracking, as close to the frame before as consecutive frames are elsewhere
        steady = [iou(m[k], m[k - 1]) for k in range(1, N) if not switch <= k - 1 <= switch + 1]
        for k in (switch + 1, switch + 2):
            assert m[k].any() and iou(m[k], m[k - 1]) >= min(steady) - 0.05, (k, iou(m[k], m[k - 1]), steady)


# -- the classic tracker: real tracking, so the masks can be checked against the truth --------------------------------


@pytest.fixture(scope="module")
def classic_without_reload(tmp_path_factory: pytest.TempPathFactory, clip: Path) -> list[np.ndarray]:
    """The same stream's masks from a run without a reload (the reference for the run with one)."""
    tmp = tmp_path_factory.mktemp("baseline")
    summary = deploy.run_deploy(
        deploy.load_deploy(write_deploy(tmp, clip, ['backend = "classic"'])), quiet=True
    )
    assert summary["streams"]["a"]["frames"] == N
    return masks(tmp / "a")


@pytest.mark.parametrize("seed", ["next", "same"])
@pytest.mark.slow
def test_reload_keeps_each_object_on_its_target(tmp_path, clip, seed, classic_without_reload):
    path = write_deploy(tmp_path, clip, ['backend = "classic"', f'reload_seed = "{seed}"'])
    dep = deploy.Deployment(deploy.load_deploy(path))
    dep.start()
    try:
        reload_mid_run(dep)
    finally:
        summary = dep.wait()
    model = summary["streams"]["a"]["model"]
    assert model["switches"] == 1 and model["generation"] == 2
    switch = model["last_switch_frame"]
    out = tmp_path / "a"
    one_result_per_frame(out)
    m = masks(out)
    truth = [square_mask(k, W, H, step=2) for k in range(N)]
    after = [iou(m[k], truth[k]) for k in range(switch + 1, N)]
    unreloaded = [iou(classic_without_reload[k], truth[k]) for k in range(switch + 1, N)]
    # the reloaded tracker stays on the square: about as well as the same frames tracked without a reload
    assert min(after) > 0.7 and np.mean(after) > np.mean(unreloaded) - 0.05, (after, unreloaded)


# -- bad models ---------------------------------------------------------------------------------------------------------


def break_graph(model: Path) -> None:
    (model / "decoder.onnx").unlink()


def truncate_graph(model: Path) -> None:
    data = (model / "memory_attention.onnx").read_bytes()
    (model / "memory_attention.onnx").write_bytes(data[: len(data) // 2])


def garble_manifest(model: Path) -> None:
    (model / "manifest.json").write_text('{"format": "vostream-sam2-export", "format_ver')


def test_a_broken_model_is_refused_and_the_old_one_keeps_running(tmp_path, clip, model_dir, caplog):
    path = write_deploy(tmp_path, clip, ['backend = "onnx"', f'model = "{model_dir}"'])
    dep = deploy.Deployment(deploy.load_deploy(path))
    dep.start()
    backup = Path(shutil.copytree(model_dir, tmp_path / "backup"))
    reasons = []
    try:
        assert wait_until(lambda: frames_of(dep, "a") >= 8)
        with gate(dep):
            for damage in (break_graph, truncate_graph, garble_manifest):
                damage(model_dir)
                caplog.clear()
                with caplog.at_level(logging.ERROR, logger="vostream.stages.trackers.reload"):
                    with pytest.raises(ReloadError) as info:
                        dep.reload()
                errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
                assert len(errors) == 1 and "\n" not in errors[0].getMessage()
                reasons.append(str(info.value))
                shutil.rmtree(model_dir)
                shutil.copytree(backup, model_dir)
            assert dep.handle is not None and dep.handle.loaded() == [1]
            text = dep.metrics_text()
            assert "vostream_model_reload_failed_total 3.0" in text
            assert "vostream_model_generation 1.0" in text
    finally:
        summary = dep.wait()
    assert "decoder.onnx" in reasons[0] and "generation 1 keeps running" in reasons[0]
    assert "did not load" in reasons[1]
    assert "manifest" in reasons[2]
    assert summary["model"]["reload_failed"] == 3 and summary["model"]["generation"] == 1
    st = summary["streams"]["a"]
    assert st["frames"] == N and st["error"] is None and st["model"]["switches"] == 0
    one_result_per_frame(tmp_path / "a")


def test_a_model_with_another_input_is_refused(tmp_path, clip):
    """Frames already preprocessed for the running model reach the new one: its input must be the same."""
    path = write_deploy(tmp_path, clip, ['backend = "classic"'])
    dep = deploy.Deployment(deploy.load_deploy(path))
    dep.start()
    try:
        assert wait_until(lambda: frames_of(dep, "a") >= 4)
        with gate(dep):
            good = path.read_text()
            path.write_text(good.replace("[tracker]", "[tracker"))  # a broken deployment file: refused too
            with pytest.raises(ReloadError, match="deploy.toml"):
                dep.reload()
            path.write_text(good.replace('backend = "classic"', 'backend = "classic"\nwork_size = "320x180"'))
            with pytest.raises(ReloadError, match="cannot change the input"):
                dep.reload()
    finally:
        summary = dep.wait()
    assert summary["model"]["reload_failed"] == 2 and summary["streams"]["a"]["frames"] == N


@pytest.mark.parametrize(
    "lines, message",
    [
        (['backend = "classic"', 'watch = "yes"'], "watch must be true or false"),
        (['backend = "classic"', "watch = true"], "needs a model directory"),
        (['backend = "classic"', 'reload_seed = "later"'], "reload_seed must be one of"),
    ],
)
def test_bad_reload_options_are_refused(tmp_path, clip, lines, message):
    from vostream.pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        deploy.load_deploy(write_deploy(tmp_path, clip, lines))


# -- SIGHUP ---------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sighup_rereads_the_tracker_table_and_reloads(tmp_path, clip, monkeypatch):
    path = write_deploy(tmp_path, clip, ['backend = "classic"', 'flow_preset = "medium"'], names=("a", "b"))
    made: list[deploy.Deployment] = []

    class Recorded(deploy.Deployment):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(deploy, "Deployment", Recorded)
    problems: list[str] = []

    def operator() -> None:  # what an operator does: edit the file, send SIGHUP
        try:
            assert wait_until(lambda: bool(made) and made[0].handle is not None)
            dep = made[0]
            assert wait_until(lambda: all(frames_of(dep, n) >= 8 for n in dep.streams))
            with gate(dep):
                path.write_text(path.read_text().replace('"medium"', '"fast"'))
                os.kill(os.getpid(), signal.SIGHUP)
                assert wait_until(lambda: dep.handle is not None and dep.handle.generation == 2)
        except AssertionError as exc:
            problems.append(repr(exc))

    t = threading.Thread(target=operator)
    t.start()
    summary = deploy.run_deploy(deploy.load_deploy(path), quiet=True)
    t.join(30)
    assert not problems
    assert summary["model"]["generation"] == 2 and not summary["signalled"]
    assert made[0].config.tracker_options["flow_preset"] == "fast"  # the table now in force
    on_disk = json.loads((tmp_path / "deploy-summary.json").read_text())
    for name in ("a", "b"):
        assert on_disk["streams"][name]["model"]["switches"] == 1
        one_result_per_frame(tmp_path / name)


# -- watching the model directory -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_new_export_in_the_watched_directory_is_loaded_and_a_half_written_one_never(
    tmp_path, clip, model_dir, sam2_tiny
):
    _, export = sam2_tiny("sam2")
    path = write_deploy(tmp_path, clip, ['backend = "onnx"', f'model = "{model_dir}"', "watch = true"])
    dep = deploy.Deployment(deploy.load_deploy(path))
    dep.start()
    handle = dep.handle
    assert handle is not None and dep._watcher is not None
    try:
        assert wait_until(lambda: frames_of(dep, "a") >= 6)
        with gate(dep):
            # what `vostream export --force` does: a complete staging directory renamed into place
            staged = Path(shutil.copytree(export, tmp_path / ".model.staging"))
            shutil.rmtree(model_dir)
            staged.rename(model_dir)
            assert wait_until(lambda: handle.generation == 2, timeout=10)
            # a copy into the directory file by file that stops half-way: refused, never installed
            graphs = sorted(model_dir.glob("*.onnx"))
            graphs[0].write_bytes(graphs[0].read_bytes()[:1000])
            assert wait_until(lambda: handle.stats.failed == 1, timeout=10)
            assert handle.generation == 2
            # the copy completes: the next change is loaded
            shutil.copyfile(export / graphs[0].name, graphs[0])
            assert wait_until(lambda: handle.generation == 3, timeout=10)
            # generation 1 until the stream moves; 2 was closed unused
            assert handle.stats.failed == 1 and handle.loaded() == [1, 3]
    finally:
        summary = dep.wait()
    st = summary["streams"]["a"]
    assert st["model"]["generation"] == 3 and st["model"]["switches"] == 1 and st["frames"] == N
    one_result_per_frame(tmp_path / "a")


def test_the_watcher_waits_for_the_directory_to_hold_still(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    calls: list[int] = []
    watcher = ModelWatcher(d, lambda: calls.append(1))
    assert not watcher.poll()  # unchanged: nothing to do
    for i in range(3):  # being written: every look sees another state
        (d / f"part{i}").write_text("x" * i)
        assert not watcher.poll()
    assert watcher.poll() and calls == [1]  # held still for one interval: reload once
    assert not watcher.poll() and calls == [1]
    os.utime(d / "part0", ns=(1, 1))  # touched: a change again
    assert not watcher.poll() and watcher.poll() and calls == [1, 1]
    shutil.rmtree(d)  # gone (being replaced): never acted on
    assert not watcher.poll() and not watcher.poll() and directory_signature(d) is None
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    assert not watcher.poll() and watcher.poll() and calls == [1, 1, 1]  # the new directory, once complete


# -- sessions that track nothing, hidden objects --------------------------------------------------------------------


class Scripted(TrackerSession):
    """A session that reports object 1 hidden on the frames in ``hidden``, fails its step on the frames in
    ``fail``, and logs what it was asked."""

    __test__ = False

    def __init__(self, log: list[str], hidden: set[int], fail: set[int]) -> None:
        self.log, self.hidden, self.fail, self.ids = log, hidden, fail, []

    def add_prompt(self, prompt: Prompt) -> None:
        kind = "mask" if prompt.mask is not None else "points"
        self.log.append(f"prompt {prompt.obj_id}@{prompt.frame_index} {kind}")
        if prompt.obj_id not in self.ids:
            self.ids.append(prompt.obj_id)

    def remove_object(self, obj_id: int) -> None:
        if obj_id not in self.ids:
            raise PromptError(f"unknown object {obj_id}")
        self.ids.remove(obj_id)

    def step(self, frame: Frame) -> TrackResult:
        self.log.append(f"step {frame.index}")
        if frame.index in self.fail:
            raise RuntimeError("the new model cannot run this frame")
        n = len(self.ids)
        masks = np.zeros((n, 8, 8), bool)
        masks[:, 2:5, 2:5] = True
        present = np.array([not (oid == 1 and frame.index in self.hidden) for oid in self.ids], bool)
        masks[~present] = False
        return TrackResult(frame.index, self.ids, np.ones(n), present, np.zeros((n, 4)), masks=masks)

    def reset(self) -> None:
        self.ids = []

    @property
    def object_ids(self) -> list[int]:
        return list(self.ids)


class ScriptedTracker(Tracker):
    __test__ = False

    def __init__(self, hidden: Iterable[int] = (), fail: Iterable[int] = ()) -> None:
        self.log: list[str] = []
        self.hidden, self.fail = set(hidden), set(fail)
        self.closed = False

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        return InputSpec(8, 8)

    def new_session(self) -> TrackerSession:
        return Scripted(self.log, self.hidden, self.fail)

    def close(self) -> None:
        self.closed = True


def frame(i: int) -> Frame:
    return Frame(i, np.zeros((8, 8, 3), np.uint8), tensor=np.zeros((8, 8, 3), np.uint8))


def two_objects(handle: ModelHandle, label: str = "busy") -> TrackerSession:
    session = ReloadableTracker(handle, label).new_session()
    session.add_prompt(Prompt(1, 0, box=(1, 1, 6, 6)))
    session.add_prompt(Prompt(2, 0, box=(1, 1, 6, 6)))
    for i in range(3):
        session.step(frame(i))
    return session


@pytest.mark.parametrize("seed", ["next", "same"])
def test_a_session_without_objects_moves_at_once_and_hidden_objects_are_waited_for(seed):
    first = ScriptedTracker(hidden={3, 4, 5})
    handle = ModelHandle(first, absent_grace_frames=2, seed=seed)
    idle = ReloadableTracker(handle, "idle").new_session()
    busy = two_objects(handle)
    second = ScriptedTracker()
    handle.reload(lambda: second)
    assert handle.streams["idle"].generation == 2  # nothing to carry: moved on the reload itself
    assert handle.loaded() == [1, 2]
    ids = []
    for i in range(3, 8):  # object 1 is hidden on 3, 4, 5: wait 2 frames for it, then leave it out
        ids.append(list(busy.step(frame(i)).obj_ids))
    info = handle.streams["busy"]
    assert info.switches == 1 and info.last_switch_frame == 5 and info.dropped_objects == 1
    assert ids == [[1, 2], [1, 2], [1, 2], [2], [2]]
    # a mask prompt on the next frame, or on the switch frame with one more step
    on = 6 if seed == "next" else 5
    assert f"prompt 2@{on} mask" in second.log and f"prompt 1@{on} mask" not in second.log
    assert second.log.count("step 5") == (1 if seed == "same" else 0)
    assert handle.loaded() == [2] and first.closed and not second.closed
    idle.close()
    busy.close()
    handle.close()
    assert second.closed


def test_one_reload_at_a_time():
    handle = ModelHandle(ScriptedTracker())
    loading, release = threading.Event(), threading.Event()

    def slow() -> Tracker:
        loading.set()
        release.wait(10)
        return ScriptedTracker()

    t = threading.Thread(target=handle.reload, args=(slow,))
    t.start()
    assert loading.wait(10)
    with pytest.raises(ReloadBusy, match="already under way"):
        handle.reload(ScriptedTracker)
    release.set()
    t.join(10)
    assert handle.generation == 2 and handle.stats.failed == 0  # a busy refusal is not a failed model
    handle.close()


def test_prompts_for_the_next_frame_go_to_the_new_model_and_replace_its_seed():
    handle = ModelHandle(ScriptedTracker(), seed="next")
    session = two_objects(handle)
    second = ScriptedTracker()
    handle.reload(lambda: second)
    session.step(frame(3))  # the old model's last frame: the new session is armed with both masks
    assert session.object_ids == [1, 2] and handle.loaded() == [1, 2]
    session.add_prompt(Prompt(1, 4, points=[[3, 3]], labels=[1]))  # a correction of object 1 on frame 4
    session.remove_object(2)
    with pytest.raises(PromptError):
        session.remove_object(7)
    result = session.step(frame(4))
    assert list(result.obj_ids) == [1] and handle.loaded() == [2]
    assert second.log[-2:] == ["prompt 1@4 points", "step 4"]  # the correction, not the carried mask
    assert handle.streams["busy"].switches == 1
    session.close()
    handle.close()


def test_a_new_model_that_fails_on_a_real_frame_leaves_the_stream_on_the_old_one(caplog):
    first = ScriptedTracker()
    handle = ModelHandle(first, seed="next")
    session = two_objects(handle)
    handle.reload(lambda: ScriptedTracker(fail={4}))
    session.step(frame(3))
    session.add_prompt(Prompt(2, 4, points=[[2, 2]], labels=[1]))  # while armed: replayed on the old one
    with caplog.at_level(logging.ERROR, logger="vostream.stages.trackers.reload"):
        result = session.step(frame(4))
    assert list(result.obj_ids) == [1, 2] and first.log[-2:] == ["prompt 2@4 points", "step 4"]
    info = handle.streams["busy"]
    assert info.failed_switches == 1 and info.switches == 0 and info.generation == 1
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.ERROR]
    session.step(frame(5))  # not retried on every frame
    assert info.failed_switches == 1 and first.log[-1] == "step 5"
    session.close()
    handle.close()


# -- a live feed ---------------------------------------------------------------------------------------------------


@needs_server
@pytest.mark.slow
def test_reload_on_a_live_feed_loses_and_repeats_no_frame(tmp_path, model_dir):
    frames = square_frames(240, W, H, step=1)
    feed = make_video(tmp_path / "live.mp4", frames, fps=30, options={"g": "30", "bf": "0"})
    with RtspServer(feed) as server:
        server.start()
        box = list(square_box(0, W, H, step=1))
        path = tmp_path / "deploy.toml"
        path.write_text(
            "\n".join(
                [
                    "[tracker]",
                    'backend = "onnx"',
                    f'model = "{model_dir}"',
                    "[[streams]]",
                    'name = "cam"',
                    f'source = "{server.url}"',
                    f'out = "{tmp_path / "cam"}"',
                    'save = ["mot"]',
                    "[[streams.prompts]]",
                    "obj = 1",
                    f"box = {box}",
                ]
            )
        )
        dep = deploy.Deployment(deploy.load_deploy(path))
        dep.start()
        try:
            assert wait_until(lambda: frames_of(dep, "cam") >= 30)
            outcome = dep.reload()  # no gate: the feed keeps coming while the new model loads
            assert outcome.generation == 2
            assert wait_until(lambda: dep.handle is not None and dep.handle.loaded() == [2])
            target = frames_of(dep, "cam") + 30
            assert wait_until(lambda: frames_of(dep, "cam") >= target)
        finally:
            dep.stop()
            summary = dep.wait()
    st = summary["streams"]["cam"]
    assert st["error"] is None and st["model"]["switches"] == 1
    switch = st["model"]["last_switch_frame"]
    rows = mot_rows(tmp_path / "cam")
    indices = [f for f, _ in rows]
    assert len(indices) == len(set(indices)), "a frame was written twice"
    assert indices == sorted(indices) and all(oid == 1 for _, oid in rows)
    assert switch in indices and any(f > switch for f in indices)
    nodes = {
        n["name"]: n for n in json.loads((tmp_path / "cam" / "summary.json").read_text())["metrics"]["nodes"]
    }
    source = next(n for n in nodes.values() if n["kind"] == "source")
    assert nodes["track"]["filtered"] == 0 and nodes["track"]["frames_out"] == nodes["mot"]["frames_in"]
    dropped = sum(n["drops"] + n["discarded"] for n in nodes.values() if n is not source)
    # every decoded frame reached the sinks with its one result, or was dropped by a live queue (counted)
    assert nodes["mot"]["frames_in"] + dropped == source["frames_out"], (nodes, source)


# -- vostream serve: the reload message ------------------------------------------------------------------------------


@contextlib.contextmanager
def serve_client(port: int) -> Iterator[tuple[Any, Any, Any, dict]]:
    """A connected viewer-protocol client after ``hello``: ``(send, recv, frame, caps)``."""
    import msgpack
    from websockets.sync.client import connect

    with connect(f"ws://127.0.0.1:{port}/ws", max_size=2**24) as ws:

        def send(msg: dict) -> None:
            ws.send(msgpack.packb(msg, use_bin_type=True))

        def recv(t: str, timeout: float = 20.0) -> dict:
            deadline = time.monotonic() + timeout
            while True:
                m = msgpack.unpackb(ws.recv(timeout=max(0.01, deadline - time.monotonic())), raw=False)
                if m["t"] == t or (m["t"] == "error" and t != "error"):
                    return m

        def frame() -> dict:
            m = recv("frame")
            send({"t": "ack", "seq": m["seq"], "recv_ms": time.time() * 1000, "draw_ms": time.time() * 1000})
            return m

        send({"t": "hello", "v": 1})
        yield send, recv, frame, recv("hello")["caps"]


def test_serve_reload_message_round_trip(clip, model_dir):
    import urllib.request

    from vostream.apps.serve.server import ServerConfig, ServerThread
    from vostream.apps.serve.session import SessionOptions

    options = SessionOptions(backend="onnx", tracker_options={"model": str(model_dir)})
    cfg = ServerConfig(port=0, media_root=str(clip.parent), allow_reload=True, session=options)
    with ServerThread(cfg) as st:
        with serve_client(st.port) as (send, recv, frame, caps):
            assert caps["reload"] is True
            send({"t": "open", "source": clip.name})
            session = recv("opened")["session"]
            assert frame()["index"] == 0
            x0, y0, x1, y1 = square_box(0, W, H, step=2)
            send({"t": "prompt", "obj": 1, "frame": 0, "box": [x0, y0, x1, y1]})
            assert [o["id"] for o in frame()["objs"]] == [1]
            send({"t": "reload"})
            done = recv("reloaded")
            assert done["generation"] == 2 and done["load_ms"] > 0 and done["check_ms"] > 0
            assert done["model"] == str(model_dir)
            handle = st.call(lambda: st.server.trackers.handle)
            assert handle.loaded() == [1, 2]  # the paused session still holds the old model
            for index in (1, 2):  # its next frame is the boundary; the object goes on under the new model
                send({"t": "step"})
                m = frame()
                assert m["index"] == index and [o["id"] for o in m["objs"]] == [1]
            assert handle.streams[session].generation == 2 and handle.streams[session].switches == 1
            assert wait_until(lambda: handle.loaded() == [2])
            (model_dir / "decoder.onnx").unlink()  # a broken export: refused, reported to the client
            send({"t": "reload"})
            err = recv("error")
            assert err["code"] == "reload_failed" and err["ref"] == "reload"
            assert "generation 2 keeps running" in err["message"]
            send({"t": "step"})
            assert [o["id"] for o in frame()["objs"]] == [1]
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{st.port}/metrics").read().decode()
            assert "vostream_model_reload_failed_total 1.0" in metrics
            assert f'vostream_model_stream_generation{{session="{session}"}} 2.0' in metrics
            health = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{st.port}/healthz").read())
            assert health["model_generation"] == 2


def test_serve_refuses_reload_unless_allowed(clip):
    from vostream.apps.serve.server import ServerConfig, ServerThread

    with ServerThread(ServerConfig(port=0, media_root=str(clip.parent))) as st:
        with serve_client(st.port) as (send, recv, _, caps):
            assert caps["reload"] is False
            send({"t": "reload"})
            err = recv("error")
            assert err["code"] == "forbidden" and "--allow-reload" in err["message"]
        assert st.call(lambda: st.server.trackers.handle) is None  # nothing was loaded


def test_the_reload_message_parses_and_takes_no_fields():
    import msgpack

    from vostream.apps.serve.protocol import ProtocolError, Reload, parse_client_message

    assert parse_client_message(msgpack.packb({"t": "reload"})) == Reload()
    with pytest.raises(ProtocolError) as info:
        parse_client_message(msgpack.packb({"t": "reload", "model": "/elsewhere"}))
    assert info.value.code == "bad_message"  # a client cannot choose what the server loads


@pytest.mark.slow
def test_sighup_reloads_a_running_vostream_serve(clip, model_dir):
    """The real command: ``vostream serve`` in its own process, one session open, SIGHUP: a new generation, the
    server still serving; SIGINT then stops it cleanly."""
    import subprocess
    import sys
    import urllib.request

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "vostream.apps.cli", "serve", str(clip)),
            *("--backend", "onnx", "--model", str(model_dir), "--port", "0"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = ""
        deadline = time.monotonic() + 60
        while "open http" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
        port = int(line.rsplit(":", 1)[1].split("/")[0])

        def generation() -> int:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz") as r:
                return int(json.loads(r.read())["model_generation"])

        with serve_client(port) as (send, recv, frame, _):
            send({"t": "open", "source": clip.name})
            recv("opened")
            frame()
            assert generation() == 1
            proc.send_signal(signal.SIGHUP)
            assert wait_until(lambda: generation() == 2, timeout=20)
            send({"t": "step"})
            assert frame()["index"] == 1  # still serving
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert "model reloaded: generation 2" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
