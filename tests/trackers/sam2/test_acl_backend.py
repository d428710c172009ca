"""The ``acl`` backend (``AclRuntime`` + ``AclTracker``) on the fake pyACL (``tests/fakes/fake_acl.py``): parity with the ``onnx``
backend, transfer accounting from the fake's own counters, context/thread rules and teardown, ACL error mapping
(also through a real track pipeline), the device-memory plan, and load-time checks.

The ``.om`` files are stand-ins: each ``X.onnx`` of a tiny SAM 2.1 export copied to ``X.om`` (the fake runs them
with ONNX Runtime).  The decoder's dynamic point count is registered with the fake as ATC gears K = 1..8
(``--dynamic_dims "1,1;...;8,8"``), as a real conversion would compile it.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import types
from collections.abc import Iterator
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)
pytest.importorskip("onnxruntime", reason="onnxruntime is part of the [test] extra: pip install -e '.[test]'")

from fakes import fake_acl as fake
from fakes import sam2_reference as ref

from vostream.pipeline.errors import BackendError, ConfigError, StageError
from vostream.pipeline.types import Frame, Prompt, TrackResult
from vostream.stages.trackers.sam2 import AclTracker, OnnxTracker
from vostream.stages.trackers.sam2.backends.acl import RESERVE_BYTES, AclRuntime, atc_dynamic_options
from vostream.stages.trackers.sam2.manifest import Manifest, load_manifest
from vostream.stages.trackers.sam2.session import MAX_POINTS

FAMILY = "sam2"
GEARS = ";".join(f"{k},{k}" for k in range(1, 9))  # one value per -1 marker: points [1,K,2], labels [1,K]


# ------------------------------------------------------------------------------------------------------------------
# fixtures and helpers
# ------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def om_dir(sam2_tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny export with an ``X.om`` stand-in next to every ``X.onnx``."""
    _, export_dir = sam2_tiny(FAMILY)
    out = tmp_path_factory.mktemp("acl") / "export"
    shutil.copytree(export_dir, out)
    for onnx_file in out.glob("*.onnx"):
        shutil.copyfile(onnx_file, onnx_file.with_suffix(".om"))
    return out


def _register_gears(model_dir: Path, decoder: bool = True) -> None:
    """What ATC's options give the .om files: the decoder's K gears; memory attention's static slot and pointer
    counts (its ONNX file takes shorter views, which a static .om does not)."""
    if decoder:
        fake.model_options(model_dir / "decoder.om", dynamic_dims=GEARS)
    m = load_manifest(model_dir)
    fake.model_options(model_dir / "memory_attention.om", **atc_dynamic_options(m.graphs["memory_attention"]))


@pytest.fixture
def acl(om_dir: Path) -> Iterator[types.ModuleType]:
    """A fresh fake installed as ``acl`` (one ONNX Runtime thread per model), with the decoder's gears."""
    fake.reset(ort_threads=1)
    module = fake.install()
    _register_gears(om_dir)
    yield module
    fake.uninstall()
    fake.reset()


def _video(n: int) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    size = 128
    mean, std = ref.mean_std(FAMILY)
    frames = ref.make_frames(n, size)
    return frames, [ref.to_tensor(f, mean, std) for f in frames], size


def _prompt(p: ref.PromptSpec, i: int) -> Prompt:
    return Prompt(p.obj_id, i, np.asarray(p.points, np.float32).reshape(-1, 2), p.labels, p.box, p.mask)


def _step(session: Any, i: int, img: np.ndarray, x: np.ndarray) -> TrackResult:
    frame = Frame(i, img)
    frame.tensor = x
    return session.step(frame)


def _track(
    tracker: Any,
    frames: list[np.ndarray],
    tensors: list[np.ndarray],
    schedule: dict[int, list[ref.PromptSpec]],
) -> list[TrackResult]:
    session = tracker.new_session()
    out = []
    try:
        for i, (img, x) in enumerate(zip(frames, tensors)):
            for p in schedule.get(i, []):
                session.add_prompt(_prompt(p, i))
            out.append(_step(session, i, img, x))
    finally:
        session.close()
    return out


def _nbytes(m: Manifest, graph: str, name: str, k: int = 8) -> int:
    g = m.graphs[graph]
    t = next(t for t in (*g.inputs, *g.outputs) if t.name == name)
    itemsize = np.dtype(t.dtype).itemsize
    return prod(k if isinstance(d, str) else int(d) for d in t.shape) * itemsize


def _host_fed_inputs(m: Manifest) -> list[tuple[str, str]]:
    """(graph, input) pairs the host uploads every frame besides the image: graph inputs no graph produces, minus
    the image, the per-object bank and pointer ring (device-resident) and the mask prompt (mask frames only)."""
    produced = {t.name for g in m.graphs.values() for t in g.outputs}
    skip = {"image", "bank", "ptrs", "mask_prompt"}
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for gname, g in m.graphs.items():
        for t in g.inputs:
            if t.name not in produced and t.name not in skip and t.name not in seen:
                seen.add(t.name)
                out.append((gname, t.name))
    return out


# ------------------------------------------------------------------------------------------------------------------
# 1. parity with the onnx backend
# ------------------------------------------------------------------------------------------------------------------


def test_acl_masks_equal_onnx_masks(acl: types.ModuleType, om_dir: Path) -> None:
    """32 frames, two objects (a click + a negative click, later a box), a correction on frame 12, occluded frames:
    the acl backend's logits, scores and presence equal the onnx backend's on the same export."""
    frames, tensors, size = _video(32)
    schedule = ref.default_schedule(size)
    onnx_tracker = OnnxTracker(om_dir, threads=1)
    try:
        theirs = _track(onnx_tracker, frames, tensors, schedule)
    finally:
        onnx_tracker.close()
    tracker = AclTracker(om_dir)
    try:
        ours = _track(tracker, frames, tensors, schedule)
        runtime = tracker.runtime
        assert isinstance(runtime, AclRuntime) and runtime.is_fake
        # the decoder ran on several gears (K = 1 tracking, 2 click+negative / box)
        assert runtime.gear_sets["decoder"] == runtime.stats.runs["decoder"] == 32 + 12
    finally:
        tracker.close()
    worst, absent, compared = 0.0, 0, 0
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a.obj_ids.tolist() == b.obj_ids.tolist(), f"frame {i}"
        assert a.present.tolist() == b.present.tolist(), f"frame {i}"
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5, err_msg=f"frame {i}")
        diff = float(np.abs(a.logits - b.logits).max())
        assert diff <= 1e-5, f"frame {i}: max |logit difference| {diff:.3g}"
        worst = max(worst, diff)
        absent += int((~a.present).sum())
        compared += len(a.obj_ids)
    assert compared == 32 + (32 - 20)  # object 2 from frame 20
    assert absent >= 2, "no occluded frames: the no-object path was not exercised"
    assert max(int((r.logits[0] > 0).sum()) for r in ours if r.present[0]) > 0, "object 1 never has a mask"


# ------------------------------------------------------------------------------------------------------------------
# 2. transfer accounting from the fake's own counters
# ------------------------------------------------------------------------------------------------------------------


def test_per_frame_transfers_and_resident_bank(acl: types.ModuleType, om_dir: Path) -> None:
    m = load_manifest(om_dir)
    n_obj = 2
    image = _nbytes(m, "image_encoder", "image")
    meta = sum(_nbytes(m, g, n) for g, n in _host_fed_inputs(m))  # per object, K at the largest gear
    h2d_max = image + n_obj * meta
    d2h_exact = n_obj * sum(_nbytes(m, "decoder", n) for n in ("low_res_masks", "iou", "object_score"))
    bank = m.key_slots * m.tokens_per_slot * m.mem_dim * 4
    slot = m.tokens_per_slot * m.mem_dim * 4
    # the bound would catch a bank (or even one slot) crossing: it is far bigger than the per-frame allowance
    assert bank > 3 * max(h2d_max - image, d2h_exact) and slot > h2d_max - image

    frames, tensors, size = _video(14)
    c0 = ref.shape_center(0, size, "disk")
    schedule = {
        0: [
            ref.PromptSpec(1, points=[c0, (10.0, 118.0)], labels=[1, 0]),
            ref.PromptSpec(2, box=ref.shape_box(0, size, "rect")),
        ]
    }
    tracker = AclTracker(om_dir)
    runtime = tracker.runtime
    assert isinstance(runtime, AclRuntime)
    session = tracker.new_session()
    try:
        for i in range(2):  # warm-up: the prompted frame and the first tracking frame
            for p in schedule.get(i, []):
                session.add_prompt(_prompt(p, i))
            _step(session, i, frames[i], tensors[i])
        handles = fake.live_handles()
        assert len(handles["datasets"]) == 2 * len(m.graphs)
        buffers = len(handles["data_buffers"])
        mallocs = fake.stats().mallocs
        per_frame = []
        for i in range(2, len(frames)):
            before, rt_before, rp_before = fake.stats(), runtime.stats.snapshot(), dict(runtime.repoints)
            r = _step(session, i, frames[i], tensors[i])
            after, rt_delta = fake.stats(), runtime.stats.minus(rt_before)
            h2d, d2h = after.h2d_bytes - before.h2d_bytes, after.d2h_bytes - before.d2h_bytes
            per_frame.append((h2d, d2h))
            assert len(r.obj_ids) == n_obj
            assert image <= h2d <= h2d_max, f"frame {i}: {h2d} bytes host->device, allowed {image}..{h2d_max}"
            assert d2h == d2h_exact, f"frame {i}: {d2h} bytes device->host, expected {d2h_exact}"
            assert after.d2d_bytes == 0 and after.d2d_calls == 0
            # the runtime's own accounting agrees with the device's
            assert (rt_delta.h2d_bytes, rt_delta.d2h_bytes) == (h2d, d2h)
            # one image encoder run + memory attention, decoder, memory encoder per object; async, then synced
            assert after.execute_async_calls - before.execute_async_calls == 1 + 3 * n_obj
            assert after.executes - before.executes == 1 + 3 * n_obj
            # datasets are re-pointed (each object's memory goes to a new bank slot), never rebuilt
            assert runtime.repoints["memory_encoder"] - rp_before["memory_encoder"] >= n_obj
            handles = fake.live_handles()
            assert len(handles["datasets"]) == 2 * len(m.graphs) and len(handles["data_buffers"]) == buffers
        assert len(per_frame) == 12
        assert fake.stats().mallocs == mallocs  # no allocation per frame
        # a static .om always takes the whole bank (empty slots masked); only dynamic-shape runtimes bind views
        assert not runtime.dynamic_shapes and session.metrics()["memory_slots_per_attention"] == m.key_slots
    finally:
        session.close()
        tracker.close()
    fake.assert_no_leaks()


def test_streams_sharing_one_tracker_keep_their_own_banks_on_the_device(
    acl: types.ModuleType, om_dir: Path
) -> None:
    """``vostream run``'s sharing (docs/deploy.md): 3 streams, one loaded model, one scheduler thread.  Each
    stream's object has its own bank resident in device memory, and no bank byte crosses per frame."""
    from vostream.pipeline.scheduler import RoundRobinScheduler
    from vostream.stages.trackers.shared import SharedTracker

    m = load_manifest(om_dir)
    n_streams, n_frames = 3, 8
    image = _nbytes(m, "image_encoder", "image")
    meta = sum(_nbytes(m, g, n) for g, n in _host_fed_inputs(m))
    d2h_exact = sum(_nbytes(m, "decoder", n) for n in ("low_res_masks", "iou", "object_score"))
    bank = m.key_slots * m.tokens_per_slot * m.mem_dim * 4
    frames, tensors, size = _video(n_frames)
    c0 = ref.shape_center(0, size, "disk")
    tracker = AclTracker(om_dir)
    loaded_bytes = fake.stats().device_bytes_in_use  # graphs and the runtime's own buffers
    with RoundRobinScheduler() as sched:
        shared = [SharedTracker(tracker, sched, f"s{k}") for k in range(n_streams)]
        sessions = [s.new_session() for s in shared]
        try:
            for i in range(2):  # warm-up: the prompted frame and the first tracking frame of every stream
                for s in sessions:
                    if i == 0:
                        s.add_prompt(_prompt(ref.PromptSpec(1, points=[c0], labels=[1]), 0))
                    _step(s, i, frames[i], tensors[i])
            resident = fake.stats().device_bytes_in_use - loaded_bytes
            assert resident >= n_streams * bank, "every stream's bank is allocated on the device"
            before = fake.stats()
            errors: list[BaseException] = []

            def stream(s: Any) -> None:
                try:
                    for i in range(2, n_frames):
                        assert len(_step(s, i, frames[i], tensors[i]).obj_ids) == 1
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=stream, args=(s,)) for s in sessions]
            for th in threads:
                th.start()
            for th in threads:
                th.join(60)
            assert not errors, errors
            after = fake.stats()
            steps = n_streams * (n_frames - 2)
            h2d, d2h = after.h2d_bytes - before.h2d_bytes, after.d2h_bytes - before.d2h_bytes
            assert steps * image <= h2d <= steps * (image + meta), (
                "per frame only the image and metadata go up"
            )
            assert d2h == steps * d2h_exact and after.d2d_bytes == before.d2d_bytes == 0
            assert after.mallocs == before.mallocs  # banks stay where they are: nothing allocated per frame
            assert fake.stats().device_bytes_in_use - loaded_bytes == resident
            assert {k: v["runs"] for k, v in sched.stats().items()} == {
                f"s{k}": 1 + 1 + 2 + (n_frames - 2) for k in range(n_streams)
            }  # new_session, add_prompt, 2 warm-up steps, the rest: all on the scheduler's thread
        finally:
            for s in sessions:
                s.close()
    tracker.close()
    fake.assert_no_leaks()


# ------------------------------------------------------------------------------------------------------------------
# 3. lifecycle: threads, contexts, teardown
# ------------------------------------------------------------------------------------------------------------------


def test_context_per_thread_and_clean_teardown(acl: types.ModuleType, om_dir: Path) -> None:
    frames, tensors, size = _video(6)
    tracker = AclTracker(om_dir)
    runtime = tracker.runtime
    session = tracker.new_session()  # buffers allocated from the main thread
    session.add_prompt(_prompt(ref.PromptSpec(1, points=[ref.shape_center(0, size, "disk")], labels=[1]), 0))
    results: list[TrackResult] = []
    errors: list[BaseException] = []

    def drive() -> None:  # a pipeline stage's own thread: never called acl.rt.set_context itself
        try:
            for i in range(len(frames)):
                results.append(_step(session, i, frames[i], tensors[i]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=drive, name="track-worker")
    worker.start()
    worker.join(60)
    assert not errors, errors
    assert len(results) == len(frames) and all(r.obj_ids.tolist() == [1] for r in results)

    bare: dict[str, Any] = {}

    def no_context() -> None:  # what the runtime protects against: an acl.rt call without set_context
        bare["malloc"] = acl.rt.malloc(64, 0)
        bare["message"] = acl.get_recent_err_msg()

    t = threading.Thread(target=no_context)
    t.start()
    t.join(10)
    assert bare["malloc"] == (0, fake.ACL_ERROR_RT_CONTEXT_NULL)
    assert "set_context" in bare["message"]

    assert runtime.live_buffers() > 0
    session.close()
    assert runtime.live_buffers() == 0
    tracker.close()
    tracker.close()  # idempotent
    assert all(not v for v in fake.live_handles().values()), fake.live_handles()
    fake.assert_no_leaks()
    with pytest.raises(BackendError, match="closed"):
        runtime.alloc((4,), "float32")
    # the runtime initialised ACL, so it finalised it: a new init is a first init again
    assert acl.init() == 0
    assert acl.finalize() == 0


def test_does_not_finalize_acl_it_did_not_initialise(acl: types.ModuleType, om_dir: Path) -> None:
    assert acl.init() == 0  # someone else in the process (e.g. another library) initialised ACL
    runtime = AclRuntime()
    buf = runtime.alloc((16,), "float32")
    runtime.upload(buf, np.arange(16, dtype=np.float32))
    np.testing.assert_array_equal(runtime.download(buf), np.arange(16, dtype=np.float32))
    runtime.close()
    fake.assert_no_leaks()
    assert acl.init() == fake.ACL_ERROR_REPEAT_INITIALIZE  # still initialised: not ours to finalize
    assert acl.finalize() == 0


def test_alloc_is_zeroed_despite_fresh_device_memory_being_garbage(acl: types.ModuleType) -> None:
    with AclRuntime() as runtime:
        buf = runtime.alloc((3, 5), "float32", "x")
        assert not runtime.download(buf).any()  # the fake fills fresh malloc memory with 0xFF (NaN)
        view = runtime.view(buf, 5, (5,))
        runtime.upload(view, np.ones(5, np.float32))
        np.testing.assert_array_equal(
            runtime.download(buf), np.array([[0] * 5, [1] * 5, [0] * 5], np.float32)
        )
        with pytest.raises(BackendError, match="does not match buffer"):
            runtime.upload(view, np.ones(4, np.float32))
    fake.assert_no_leaks()


# ------------------------------------------------------------------------------------------------------------------
# 4. error mapping, also through a real pipeline
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code, at_sync, call, words",
    [
        (507011, False, "acl.mdl.execute_async", ("ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed")),
        (207001, True, "acl.rt.synchronize_stream", ("ACL_ERROR_RT_MEMORY_ALLOCATION", "out of HBM")),
    ],
)
def test_execute_failures_name_call_code_and_meaning(
    acl: types.ModuleType, om_dir: Path, code: int, at_sync: bool, call: str, words: tuple[str, ...]
) -> None:
    frames, tensors, size = _video(4)
    tracker = AclTracker(om_dir)
    session = tracker.new_session()
    try:
        session.add_prompt(
            _prompt(ref.PromptSpec(1, points=[ref.shape_center(0, size, "disk")], labels=[1]), 0)
        )
        _step(session, 0, frames[0], tensors[0])
        _step(session, 1, frames[1], tensors[1])
        fake.inject("mdl.execute_async", code, after=2, at_sync=at_sync)  # the decoder of frame 2
        with pytest.raises(BackendError) as err:
            _step(session, 2, frames[2], tensors[2])
        message = str(err.value)
        assert call in message and str(code) in message and all(w in message for w in words), message
        assert "run('decoder')" in message
        assert "injected fault" in message  # acl.get_recent_err_msg() is part of the message
    finally:
        session.close()
        tracker.close()
    fake.assert_no_leaks()  # a failed execution does not break the teardown


def test_pipeline_stops_on_device_error_and_closes_outputs(
    acl: types.ModuleType, om_dir: Path, tmp_path: Path
) -> None:
    import av
    from fakes.media import make_video, square_frames, square_mask

    from vostream.apps.config import TrackSettings
    from vostream.apps.track import build_track_pipeline

    w, h, n = 96, 64, 12
    video = make_video(tmp_path / "clip.mp4", square_frames(n, w, h, step=2), fps=25)
    ys, xs = np.nonzero(square_mask(0, w, h, step=2))
    out = tmp_path / "out"
    settings = TrackSettings(
        source=str(video),
        out=str(out),
        save=("video", "png", "json"),
        backend="acl",
        model=str(om_dir),
        prompts=[Prompt(1, 0, [[float(xs.mean()), float(ys.mean())]], [1])],
        queue_size=2,
    )
    tracker = AclTracker(om_dir)
    try:
        # frame 0 (prompted): image encoder, decoder, memory encoder; frames 1-4: four graphs each -> frame 5's
        # image encoder is execute_async call number 20
        fake.inject("mdl.execute_async", 507011, after=3 + 4 * 4)
        pipe, _ = build_track_pipeline(settings, tracker=tracker)
        # the engine re-raises a VostreamError as itself (with a note naming the stage); others become StageError
        with pytest.raises((BackendError, StageError)) as err:
            pipe.run()
        exc = err.value
        assert isinstance(exc, BackendError), f"expected the runtime's BackendError, got {exc!r}"
        assert any("stage 'track'" in note for note in getattr(exc, "__notes__", ())), exc
        assert (
            "507011" in str(exc)
            and "acl.mdl.execute_async" in str(exc)
            and "run('image_encoder')" in str(exc)
        )
    finally:
        tracker.close()
    fake.assert_no_leaks()
    data = json.loads((out / "annotations.json").read_text())
    written = data["videos"][0]["length"]
    assert written == 5, f"{written} frames written; frames 0-4 were tracked before the failure"
    with av.open(str(out / "overlay.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == written
    assert len(list((out / "masks").glob("*.png"))) == written
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp*"))


def test_cli_names_the_stage_of_a_device_error(
    acl: types.ModuleType, om_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    """What a user sees when the device fails mid-run: one line with the ACL call, the code and the stage."""
    from fakes.media import make_video, square_frames, square_mask

    from vostream.apps.cli import main

    w, h, n = 96, 64, 12
    video = make_video(tmp_path / "clip.mp4", square_frames(n, w, h, step=2), fps=25)
    ys, xs = np.nonzero(square_mask(0, w, h, step=2))
    fake.inject("mdl.execute_async", 507011, after=3 + 4 * 4)
    rc = main(
        [
            "track",
            str(video),
            "--backend",
            "acl",
            "--model",
            str(om_dir),
            "--point",
            f"{xs.mean():.0f},{ys.mean():.0f}",
            "--out",
            str(tmp_path / "out"),
            "--quiet",
        ]
    )
    out, err = capfd.readouterr()
    assert rc == BackendError.exit_code, err
    errors = [line for line in err.splitlines() if line.startswith("vostream: error:")]
    assert len(errors) == 1, err
    assert "507011" in errors[0] and "acl.mdl.execute_async" in errors[0] and "stage 'track'" in errors[0]
    assert "Traceback" not in out + err
    fake.assert_no_leaks()


# ------------------------------------------------------------------------------------------------------------------
# 5. memory plan
# ------------------------------------------------------------------------------------------------------------------


def test_memory_plan_refuses_what_does_not_fit(acl: types.ModuleType, om_dir: Path) -> None:
    m = load_manifest(om_dir)
    per_object = m.key_slots * m.tokens_per_slot * m.mem_dim * 4 + m.pointer_slots * m.hidden_dim * 4
    fake.configure(hbm_bytes=RESERVE_BYTES + (1 << 20))  # room for a session and a few objects, not for 8
    with pytest.raises(ConfigError) as err:
        AclTracker(om_dir, max_objects=8)
    message = str(err.value)
    fake.assert_no_leaks()  # the tracker that was loaded is closed again
    assert "8 objects" in message and f"free of {RESERVE_BYTES + (1 << 20)}" in message
    planned = int(message.split(" bytes per object")[0].rsplit(" ", 1)[1])
    assert per_object <= planned <= per_object + 2 * 96  # bank + pointer ring, plus allocation rounding
    fits = int(message.split("at most ")[1].split(" ")[0])
    assert 1 <= fits < 8
    tracker = AclTracker(om_dir, max_objects=fits)
    try:
        runtime = tracker.runtime
        assert isinstance(runtime, AclRuntime)
        p = runtime.plan(m, fits)
        assert p["fits"] and p["max_objects"] == fits and p["per_object_bytes"] == planned
        # the scratch estimate covers what a session really allocates
        before = fake.stats().device_bytes_in_use
        session = tracker.new_session()
        assert fake.stats().device_bytes_in_use - before <= p["session_scratch_bytes"]
        session.close()
    finally:
        tracker.close()
    fake.assert_no_leaks()


# ------------------------------------------------------------------------------------------------------------------
# load-time checks, gears, imports
# ------------------------------------------------------------------------------------------------------------------


def test_atc_options_for_the_decoder(om_dir: Path) -> None:
    m = load_manifest(om_dir)
    opts = atc_dynamic_options(m.graphs["decoder"])
    assert opts["dynamic_dims"] == GEARS
    assert "points:1,-1,2" in opts["input_shape"] and "labels:1,-1" in opts["input_shape"]
    assert atc_dynamic_options(m.graphs["image_encoder"]) == {}


def test_more_points_than_gears_is_a_clear_error(
    acl: types.ModuleType, om_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's own guard, behind the session's up-front check (switched off here to reach it)."""
    frames, tensors, _ = _video(1)
    monkeypatch.setattr(AclRuntime, "max_points", property(lambda self: None))
    tracker = AclTracker(om_dir)
    session = tracker.new_session()
    try:
        assert MAX_POINTS > 9
        pts = np.array([[20.0 + 5 * i, 30.0] for i in range(9)], np.float32)
        session.add_prompt(Prompt(1, 0, pts, np.ones(9, np.int32)))
        with pytest.raises(
            BackendError, match=r"K=9 is not a compiled gear .*K in \[1, 2, 3, 4, 5, 6, 7, 8\]"
        ):
            _step(session, 0, frames[0], tensors[0])
    finally:
        session.close()
        tracker.close()
    fake.assert_no_leaks()


def test_misaligned_model_io_is_refused_by_name(acl: types.ModuleType, om_dir: Path) -> None:
    m = load_manifest(om_dir)
    ie = m.graphs["image_encoder"]
    with AclRuntime() as runtime:
        runtime.load(m, om_dir)
        n = prod(int(d) for d in ie.inputs[0].shape)
        big = runtime.alloc((n + 16,), "float32", "staging")
        outputs = {t.name: runtime.alloc(tuple(int(d) for d in t.shape), t.dtype, t.name) for t in ie.outputs}
        image = runtime.view(big, 16, (1, 3, m.image_size, m.image_size))  # 64 bytes in: aligned
        runtime.run("image_encoder", {"image": image}, outputs)
        assert runtime.stats.runs["image_encoder"] == 1
        shifted = runtime.view(big, 1, (1, 3, m.image_size, m.image_size))  # 4 bytes in
        with pytest.raises(
            BackendError, match=r"input 'image' .*staging at byte offset 4.*not 64-byte aligned"
        ):
            runtime.run("image_encoder", {"image": shifted}, outputs)
        assert runtime.repoints["image_encoder"] == 0  # nothing was re-pointed for the refused run
    fake.assert_no_leaks()


def test_load_checks_against_the_manifest(acl: types.ModuleType, om_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(om_dir, bad)
    _register_gears(bad)
    original = (bad / "manifest.json").read_text()
    manifest = json.loads(original)
    has_mask = next(t for t in manifest["graphs"]["decoder"]["inputs"] if t["name"] == "has_mask")
    has_mask["dtype"] = "int32"
    (bad / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        BackendError, match=r"graph 'decoder'.*input 'has_mask' dtype: manifest int32, model float32"
    ):
        AclTracker(bad)
    fake.assert_no_leaks()  # the graphs loaded before the bad one were unloaded again

    (bad / "manifest.json").write_text(original)
    (bad / "memory_encoder.om").unlink()
    with pytest.raises(BackendError, match=r"graph 'memory_encoder'.*memory_encoder\.om not found.*atc"):
        AclTracker(bad)
    fake.assert_no_leaks()


def test_decoder_without_gears_fails_to_load_with_the_acl_code(
    acl: types.ModuleType, om_dir: Path, tmp_path: Path
) -> None:
    plain = tmp_path / "plain"
    shutil.copytree(om_dir, plain)
    _register_gears(plain, decoder=False)  # a decoder .om with an unresolved K
    with pytest.raises(BackendError) as err:
        AclTracker(plain)
    message = str(err.value)
    assert "acl.mdl.load_from_file" in message and "100013" in message and "ACL_ERROR_PARSE_MODEL" in message
    assert "decoder" in message
    fake.assert_no_leaks()


def test_missing_pyacl_says_where_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "acl", None)  # import acl -> ImportError
    with pytest.raises(
        BackendError, match=r"pyACL.*not importable.*CANN toolkit.*not installed.*set_env\.sh"
    ):
        AclRuntime()
    with pytest.raises(BackendError, match=r"CANN toolkit"):
        AclRuntime(acl=None)  # None means: import the real pyACL


def test_injected_module_is_used_without_importing_acl(monkeypatch: pytest.MonkeyPatch, om_dir: Path) -> None:
    """``acl=`` is what the runtime drives: no ``import acl`` happens (here it would fail), and the tracker factory
    passes it through."""
    monkeypatch.setitem(sys.modules, "acl", None)
    fake.reset(ort_threads=1)
    try:
        runtime = AclRuntime(acl=fake.module())
        assert runtime.acl is fake.module() and runtime.is_fake and "fake acl" in runtime.describe()
        runtime.close()
        fake.assert_no_leaks()
        _register_gears(om_dir)
        tracker = AclTracker(om_dir, acl=fake.module())
        assert tracker.runtime.acl is fake.module() and fake.stats().mallocs > 0
        tracker.close()
        fake.assert_no_leaks()
    finally:
        fake.reset()


def test_unknown_options_are_config_errors(om_dir: Path) -> None:
    with pytest.raises(ConfigError, match="unknown option.*provider"):
        AclTracker(om_dir, provider="cuda")
    with pytest.raises(ConfigError, match="needs --model"):
        AclTracker()
    with pytest.raises(ConfigError, match="max_objects"):
        AclTracker(om_dir, max_objects=0)


def test_prompt_limits_of_the_device_build_are_checked_up_front(acl: types.ModuleType, om_dir: Path) -> None:
    """The decoder is compiled for K = 1..8 points and memory is planned for max_objects: both are refused when the
    prompt is added (a PromptError naming the limit), not when the device call fails mid-stream."""
    from vostream.pipeline.errors import PromptError
    from vostream.stages.trackers import load_tracker

    tracker = load_tracker("acl", model=str(om_dir), max_objects=2)
    assert tracker.runtime.max_points == 8
    session = tracker.new_session()
    with pytest.raises(PromptError, match="at most 8 points"):
        session.add_prompt(Prompt(1, 0, [[4, 4]] * 9, [1] * 9))
    session.add_prompt(
        Prompt(1, 0, [[4, 4]] * 6, [1] * 6, box=(2, 2, 30, 30))
    )  # 6 clicks + 2 corners = 8: fine
    session.add_prompt(Prompt(2, 0, [[40, 40]], [1]))
    with pytest.raises(PromptError, match="max_objects=2"):
        session.add_prompt(Prompt(3, 0, [[60, 60]], [1]))
    frames, tensors, _ = _video(1)
    result = _step(session, 0, frames[0], tensors[0])
    assert list(result.obj_ids) == [1, 2]
    session.close()
    tracker.close()
    fake.assert_no_leaks()


def test_hot_reload_frees_the_old_model_and_refuses_one_that_does_not_fit(
    acl: types.ModuleType, om_dir: Path
) -> None:
    """docs/deploy.md §2 on the device: a new model is loaded beside the running one in the same process (two
    runtimes, two contexts on one device); once both streams moved to it, the old model's graphs, buffers and banks
    are freed and the device is still usable.  A model that does not fit next to the running one is refused and
    the running one is untouched."""
    from vostream.stages.trackers.reload import ModelHandle, ReloadableTracker, ReloadError

    frames, tensors, size = _video(6)
    c0 = ref.shape_center(0, size, "disk")
    handle = ModelHandle(AclTracker(om_dir, max_objects=2))
    sessions = [ReloadableTracker(handle, f"s{k}").new_session() for k in range(2)]
    for s in sessions:
        s.add_prompt(_prompt(ref.PromptSpec(1, points=[c0], labels=[1]), 0))
    for i in range(2):
        for s in sessions:
            _step(s, i, frames[i], tensors[i])
    one_model = fake.stats().device_bytes_in_use
    fake.configure(hbm_bytes=one_model + RESERVE_BYTES // 2)
    with pytest.raises(ReloadError, match="did not load: acl backend: .* of device memory"):
        handle.reload(lambda: AclTracker(om_dir, max_objects=2))
    assert fake.stats().device_bytes_in_use == one_model and handle.loaded() == [1]
    fake.configure(hbm_bytes=64 << 30)
    handle.reload(lambda: AclTracker(om_dir, max_objects=2))
    assert fake.stats().device_bytes_in_use > one_model  # both models loaded until the streams move
    for i in range(2, 6):
        for s in sessions:
            assert list(_step(s, i, frames[i], tensors[i]).obj_ids) == [1]
    assert handle.loaded() == [2] and all(handle.streams[f"s{k}"].switches == 1 for k in range(2))
    assert fake.stats().device_bytes_in_use == one_model  # the old model's memory is back
    for s in sessions:
        s.close()
    handle.close()
    fake.assert_no_leaks()
