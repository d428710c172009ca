"""The pipeline engine with real threads: policies, fan-out, errors, shutdown, controls, signals."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from vostream.pipeline import BLOCK, LATEST, BoundedQueue, Pipeline, handle_signals
from vostream.pipeline.engine import END_OF_STREAM
from vostream.pipeline.errors import ConfigError, OutputError, PromptError, SourceError, StageError
from vostream.pipeline.queues import EMPTY
from vostream.pipeline.testing import (
    FailingStage,
    FnStage,
    ListSinkSpec,
    ListSource,
    SlowStage,
    Token,
    tokens,
)

pytestmark = pytest.mark.timeout(60)


def _vostream_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("vostream-")}


def _wait_until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def _indices(items) -> list[int]:
    return [t.index for t in items if isinstance(t, Token)]


# -- queues --------------------------------------------------------------------------------------------------------
def test_latest_queue_drops_oldest_and_counts():
    q: BoundedQueue[int] = BoundedQueue(3, LATEST, "q")
    for i in range(6):
        assert q.put(i)
    assert q.drops == 3 and len(q) == 3 and q.max_depth == 3
    assert [q.get(0.01) for _ in range(3)] == [3, 4, 5]
    assert q.get(0.01) is EMPTY


def test_block_queue_put_gives_up_on_abort_and_after_close():
    q: BoundedQueue[int] = BoundedQueue(1, BLOCK, "q")
    assert q.put(0)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    t0 = time.monotonic()
    assert q.put(1, abort=stop.is_set) is False  # waited for room, then gave up when told
    assert time.monotonic() - t0 >= 0.05
    assert q.drops == 0 and q.discarded == 1
    q.close()
    assert q.put(2) is False and q.put_final(END_OF_STREAM) is False


def test_queue_end_marker_admitted_when_full_and_wake_returns_empty():
    q: BoundedQueue[int] = BoundedQueue(1, BLOCK, "q")
    q.put(0)
    assert q.put_final(END_OF_STREAM)  # never waits
    assert q.get() == 0 and q.get() is END_OF_STREAM
    threading.Timer(0.05, q.wake).start()
    t0 = time.monotonic()
    assert q.get(timeout=5.0) is EMPTY
    assert time.monotonic() - t0 < 4.0


def test_queue_rejects_bad_settings():
    with pytest.raises(ConfigError, match="capacity"):
        BoundedQueue(0)
    with pytest.raises(ConfigError, match="policy"):
        BoundedQueue(2, "newest")


# -- flow ----------------------------------------------------------------------------------------------------------
def test_block_is_lossless_and_ordered_with_finish_items():
    before = _vostream_threads()
    src = ListSource(tokens(300))
    stages = [
        FnStage(name="a"),
        FnStage(lambda t: t if t.index % 3 else None, name="b", finish_items=["tail1", "tail2"]),
        FnStage(name="c"),
    ]
    sink = ListSinkSpec("out", queue_size=2, delay=0.0005)
    report = Pipeline(src, stages, [sink], queue_size=2, name="t").run()
    expected = [i for i in range(300) if i % 3]
    assert _indices(sink.items) == expected
    assert sink.items[-2:] == ["tail1", "tail2"]  # finish() output before the end marker passed on
    assert report.reason == "end" and not report.interrupted and not report.cancelled
    assert report.frames == len(expected) + 2
    snap = report.metrics
    assert snap["b"].filtered == 100 and snap["b"].frames_in == 300
    assert all(n.drops == 0 for n in snap.nodes)
    assert snap["out"].frames_out == len(expected) + 2 and snap["out"].policy == BLOCK
    assert stages[1].finish_calls == 1
    for obj in [src, *stages, sink.sink]:
        assert obj.open_calls == 1 and obj.close_calls == 1
    assert _vostream_threads() == before


def test_each_node_runs_in_its_own_thread():
    src, st, sink = ListSource(tokens(5)), FnStage(name="st"), ListSinkSpec("out")
    Pipeline(src, [st], [sink], name="thr").run()
    assert src.threads == {"vostream-thr-source"}
    assert st.threads == {"vostream-thr-st"}
    assert sink.sink.threads == {"vostream-thr-out"}


def test_latest_drops_oldest_at_a_slow_sink_and_keeps_the_newest():
    src = ListSource(tokens(60), live=True)
    sink = ListSinkSpec("slow", queue_size=2, delay=0.02)
    report = Pipeline(src, [FnStage()], [sink], queue_size=2, policy={"fn": BLOCK}).run()
    got = _indices(sink.items)
    snap = report.metrics["slow"]
    assert snap.policy == LATEST
    assert snap.drops > 0
    assert report.metrics["fn"].drops == 0
    assert len(got) + snap.drops == 60  # every item written or counted as dropped
    assert got == sorted(got) and got[-1] == 59  # order kept; the newest survives


def test_fanout_slow_latest_sink_does_not_stall_fast_block_sink():
    slow = ListSinkSpec("viewer", policy=LATEST, queue_size=1, delay=0.05)
    seen_by_slow_when_fast_done: list[int] = []

    class Fast(ListSinkSpec):
        def build(self):
            sink = super().build()
            write = sink.write

            def spy(item):
                write(item)
                if item.index == 199:
                    seen_by_slow_when_fast_done.append(len(slow.sink.items))

            sink.write = spy
            return sink

    fast = Fast("file", queue_size=4)
    report = Pipeline(ListSource(tokens(200)), [FnStage()], [fast, slow]).run()
    assert _indices(fast.items) == list(range(200))
    # At 50 ms a write the slow sink alone would need 10 s for 200 items; it had written only a few.
    assert seen_by_slow_when_fast_done[0] < 100
    assert report.metrics["viewer"].drops > 0 and report.metrics["file"].drops == 0
    assert len(slow.items) + report.metrics["viewer"].drops == 200
    assert slow.sink.close_calls == 1 and fast.sink.close_calls == 1


def test_edge_policy_resolution():
    live = Pipeline(ListSource([], live=True), [FnStage(name="a")], [ListSinkSpec("s")])
    assert [n.policy for n in live.metrics().nodes[1:]] == [LATEST, LATEST]
    spec = ListSinkSpec("viewer", policy=LATEST)
    p = Pipeline(
        ListSource([]),
        [FnStage(name="a"), FnStage(name="b")],
        [ListSinkSpec("file"), spec],
        policy={"b": LATEST},
    )
    assert {n.name: n.policy for n in p.metrics().nodes[1:]} == {
        "a": BLOCK,
        "b": LATEST,
        "file": BLOCK,
        "viewer": LATEST,
    }
    forced = Pipeline(ListSource([], live=True), [FnStage(name="a")], [ListSinkSpec("s")], policy=BLOCK)
    assert [n.policy for n in forced.metrics().nodes[1:]] == [BLOCK, BLOCK]


def test_duplicate_names_are_made_unique():
    p = Pipeline(ListSource([]), [FnStage(name="x"), FnStage(name="x")], [ListSinkSpec("x")])
    assert p.node_names == ["source", "x", "x#2", "x#3"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"policy": "newest"}, "unknown edge policy"),
        ({"policy": {"nope": LATEST}}, "unknown edge"),
        ({"queue_size": 0}, "queue_size"),
    ],
)
def test_bad_configuration_is_a_config_error(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        Pipeline(ListSource([]), [FnStage()], [ListSinkSpec()], **kwargs)


def test_misuse_is_a_config_error():
    with pytest.raises(ConfigError, match="Source"):
        Pipeline([1, 2, 3], [], [])  # type: ignore[arg-type]
    p = Pipeline(ListSource([]), [], [ListSinkSpec()])
    with pytest.raises(ConfigError, match="not started"):
        p.wait()
    p.run()
    with pytest.raises(ConfigError, match="already started"):
        p.start()


def test_stamps_recorded_after_source_and_each_stage():
    sink = ListSinkSpec("out")
    Pipeline(ListSource(tokens(5)), [FnStage(name="a"), FnStage(name="b")], [sink]).run()
    for t in sink.items:
        assert list(t.stamps) == ["source", "a", "b"]
        assert t.stamps["source"] <= t.stamps["a"] <= t.stamps["b"]


# -- errors --------------------------------------------------------------------------------------------------------
def _chain(fail: str, exc: BaseException):
    src = ListSource(tokens(40), fail_at=5 if fail == "source" else None, exc=exc)
    stages = [
        FailingStage(5, exc, name=n) if n == fail else FnStage(name=n) for n in ("decode", "track", "post")
    ]
    sinks = [ListSinkSpec("file", fail_at=5 if fail == "file" else None, exc=exc), ListSinkSpec("other")]
    return src, stages, sinks


@pytest.mark.parametrize("fail", ["source", "decode", "track", "post", "file"])
def test_exception_anywhere_names_the_node_and_closes_everything(fail):
    before = _vostream_threads()
    exc = ZeroDivisionError("boom")
    src, stages, sinks = _chain(fail, exc)
    pipe = Pipeline(src, stages, sinks, queue_size=2, name="err")
    with pytest.raises(StageError) as info:
        pipe.run()
    err = info.value
    assert err.stage == fail and err.__cause__ is exc and err.frame_index == 5
    assert f"'{fail}'" in str(err) and "ZeroDivisionError: boom" in str(err)
    for obj in [src, *stages, *(s.sink for s in sinks)]:
        assert obj.close_calls == 1, obj
    # Every item that passed the failed node reached the sinks, in order.
    if fail == "file":
        assert _indices(sinks[0].items) == [0, 1, 2, 3, 4]
        other = _indices(sinks[1].items)
        assert other == list(range(len(other)))
    else:
        for s in sinks:
            assert _indices(s.items) == [0, 1, 2, 3, 4]
    assert pipe.report is not None and pipe.report.reason == "error" and fail in pipe.report.error
    assert _vostream_threads() == before


def test_vostream_errors_pass_through_as_is():
    err = SourceError("cannot open 'missing.mp4': no such file; check the path")
    st, sink = FnStage(), ListSinkSpec()
    with pytest.raises(SourceError) as info:
        Pipeline(ListSource([], open_exc=err), [st], [sink]).run()
    assert info.value is err
    assert st.close_calls == 1 and sink.sink.close_calls == 1


def test_sink_open_failure_stops_before_any_read():
    src = ListSource(tokens(10))
    bad = ListSinkSpec("mp4", open_exc=OutputError("cannot write 'out/x.mp4': read-only directory"))
    good = ListSinkSpec("json")
    with pytest.raises(OutputError):
        Pipeline(src, [FnStage()], [good, bad]).run()
    assert src.reads == 0
    assert bad.sink.close_calls == 1 and good.sink.close_calls == 1 and src.close_calls == 1


@pytest.mark.parametrize("where", ["open", "finish", "close"])
def test_stage_failure_outside_process(where):
    stage = FailingStage(exc=KeyError("k"), name="post", where=where)
    sink = ListSinkSpec()
    with pytest.raises(StageError, match="'post'") as info:
        Pipeline(ListSource(tokens(4)), [stage], [sink]).run()
    assert isinstance(info.value.__cause__, KeyError)
    assert stage.close_calls == 1 and sink.sink.close_calls == 1
    if where != "open":
        assert _indices(sink.items) == [0, 1, 2, 3]


# -- shutdown ------------------------------------------------------------------------------------------------------
def test_stop_drains_in_flight_items_and_runs_finish():
    src = ListSource(tokens(100_000))
    stage = SlowStage(0.005, name="slow")
    stage.finish_items = ["tail"]
    sink = ListSinkSpec("out")
    pipe = Pipeline(src, [stage], [sink], queue_size=4)
    pipe.start()
    _wait_until(lambda: sink.sinks and len(sink.items) >= 5)
    pipe.stop(drain=True)
    pipe.stop()  # idempotent
    report = pipe.wait(timeout=20)
    assert report.interrupted and report.reason == "stop" and not report.cancelled
    assert _indices(sink.items) == list(range(src.reads))  # everything read was delivered
    assert sink.items[-1] == "tail" and stage.finish_calls == 1
    assert src.interrupts <= 1 and src.close_calls == 1 and sink.sink.close_calls == 1


def test_cancel_discards_queued_items_and_skips_finish():
    src = ListSource(tokens(100_000))
    stage = SlowStage(0.02, name="slow")
    stage.finish_items = ["tail"]
    sink = ListSinkSpec("out")
    pipe = Pipeline(src, [stage], [sink], queue_size=8)
    pipe.start()
    _wait_until(lambda: sink.sinks and len(sink.items) >= 3)
    pipe.cancel()
    pipe.cancel()
    report = pipe.wait(timeout=20)
    assert report.cancelled and report.interrupted and report.reason == "cancel"
    assert "tail" not in sink.items and stage.finish_calls == 0
    got = _indices(sink.items)
    assert got == list(range(len(got))) and len(got) < src.reads
    assert report.metrics["slow"].discarded > 0
    assert stage.close_calls == 1 and sink.sink.close_calls == 1 and src.close_calls == 1


def test_wait_timeout_then_cancel_leaves_no_threads():
    before = _vostream_threads()
    pipe = Pipeline(ListSource(tokens(10), block_after=3), [FnStage()], [ListSinkSpec()])
    pipe.start()
    with pytest.raises(TimeoutError, match="still running"):
        pipe.wait(timeout=0.2)
    assert pipe.running
    pipe.cancel()
    assert pipe.wait(timeout=10).cancelled
    assert _vostream_threads() == before


def test_context_manager_stops_and_closes():
    src, sink = ListSource(tokens(100_000), delay=0.001), ListSinkSpec()
    with Pipeline(src, [FnStage()], [sink]) as pipe:
        pipe.start()
        _wait_until(lambda: sink.sinks and len(sink.items) >= 3)
    assert pipe.report is not None and pipe.report.reason == "stop"
    assert sink.sink.close_calls == 1 and src.close_calls == 1


# -- controls ------------------------------------------------------------------------------------------------------
def test_controls_delivered_in_order_in_stage_thread_while_source_blocked():
    src = ListSource(tokens(5), block_after=2)
    a, b = FnStage(name="a"), FnStage(name="b", consume_controls=False)
    sink = ListSinkSpec()
    pipe = Pipeline(src, [a, b], [sink], name="ctl")
    pipe.start()
    _wait_until(src.blocked.is_set)
    _wait_until(lambda: len(b.seen) == 2)
    receipts = [pipe.send_control(f"m{i}") for i in range(3)]
    for r in receipts:
        assert r.wait(5)
        assert r.consumed_by == ["a"] and not r.errors and not r.undelivered
    assert [m for m, _, _ in a.controls] == ["m0", "m1", "m2"] == [m for m, _, _ in b.controls]
    assert {t for _, t, _ in a.controls} == {"vostream-ctl-a"}
    assert {t for _, t, _ in b.controls} == {"vostream-ctl-b"}
    assert {n for _, _, n in a.controls} == {2}  # landed while the source was stalled, after items 0, 1
    src.release()
    report = pipe.wait(10)
    assert report.reason == "end" and _indices(sink.items) == [0, 1, 2, 3, 4]
    late = pipe.send_control("late")
    assert late.done and late.undelivered == ["a", "b"]


def test_control_config_error_is_reported_not_fatal_other_errors_are():
    src = ListSource(tokens(3), block_after=1)
    stage = FnStage(name="track")
    pipe = Pipeline(src, [stage], [ListSinkSpec()])
    pipe.start()
    _wait_until(src.blocked.is_set)
    bad = PromptError("object 1: point (900, 10) is outside the 640x480 frame")
    r = pipe.send_control(bad)
    assert r.wait(5) and r.errors == [("track", bad)] and pipe.running
    r2 = pipe.send_control(RuntimeError("device lost"))
    assert r2.wait(5)
    with pytest.raises(StageError, match="'track'.*device lost"):
        pipe.wait(10)
    assert stage.close_calls == 1 and src.close_calls == 1


# -- signals -------------------------------------------------------------------------------------------------------
def test_sigint_during_run_stops_and_reports_interrupted():
    previous = signal.getsignal(signal.SIGINT)
    src = ListSource(tokens(100_000), delay=0.002)
    sink = ListSinkSpec("mp4")
    pipe = Pipeline(src, [FnStage()], [sink])
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    with handle_signals(pipe):
        timer.start()
        report = pipe.run()
    timer.join()
    assert report.interrupted and report.reason == "signal" and not report.cancelled
    assert sink.sink.close_calls == 1 and len(sink.items) == src.reads > 0
    assert signal.getsignal(signal.SIGINT) is previous


def test_second_sigint_cancels():
    src = ListSource(tokens(100_000))
    sink = ListSinkSpec("slow", delay=0.05, queue_size=8)
    pipe = Pipeline(src, [FnStage()], [sink], queue_size=8)
    timers = [threading.Timer(t, os.kill, (os.getpid(), signal.SIGINT)) for t in (0.3, 0.45)]
    with handle_signals(pipe):
        for t in timers:
            t.start()
        report = pipe.run()
    for t in timers:
        t.join()
    assert report.cancelled and report.reason == "signal"
    assert len(sink.items) < src.reads  # the queued items were discarded, not drained
    assert sink.sink.close_calls == 1


def test_handle_signals_refuses_other_threads():
    errors: list[BaseException] = []

    def body():
        try:
            with handle_signals(Pipeline(ListSource([]))):
                pass
        except ConfigError as e:
            errors.append(e)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])


# -- metrics through the engine ------------------------------------------------------------------------------------
def test_live_metrics_and_stats_merge():
    src = ListSource(tokens(10), block_after=6)
    sink = ListSinkSpec("out")
    pipe = Pipeline(src, [FnStage(name="st")], [sink])
    pipe.start()
    _wait_until(lambda: sink.sinks and len(sink.items) == 6)
    snap = pipe.metrics()
    assert snap.frames == 6  # progress: items out of the last stage
    assert snap["source"].frames_out == 6 and snap["st"].frames_in == 6 and snap["out"].frames_out == 6
    assert snap["source"].kind == "source" and snap["out"].kind == "sink"
    src.release()
    report = pipe.wait(10)
    final = report.metrics
    assert final["st"].extra == {"seen": 10} and final["out"].extra == {"written": 10}
    assert final["source"].extra == {"reads": 10}
    assert final["out"].age_ms_p95 >= final["out"].age_ms_p50 >= 0  # Tokens carry capture_time
    assert final["st"].latency_ms_p50 >= 0


# -- a cancel lands between objects (the track stage hands the pipeline's cancel to its tracker session) ---------


def test_cancel_stops_a_tracker_between_objects() -> None:
    import numpy as np

    from vostream.pipeline.types import Frame, Prompt, TrackResult
    from vostream.stages.track import TrackStage
    from vostream.stages.trackers.base import InputSpec, StepAborted, Tracker, TrackerSession

    entered = threading.Event()

    class SlowObjects(TrackerSession):
        """0.05 s per object, 200 objects: 10 s per frame unless it honours ``should_stop``."""

        def __init__(self) -> None:
            self.ids: list[int] = []
            self.stepped = 0

        def add_prompt(self, prompt: Prompt) -> None:
            self.ids.append(prompt.obj_id)

        def remove_object(self, obj_id: int) -> None:
            self.ids.remove(obj_id)

        def reset(self) -> None:
            self.ids.clear()

        @property
        def object_ids(self) -> list[int]:
            return list(self.ids)

        def step(self, frame: Frame) -> TrackResult:
            entered.set()
            for _ in self.ids:
                if self.stop_requested():
                    raise StepAborted("stopped")
                time.sleep(0.05)
                self.stepped += 1
            return TrackResult.empty(frame.index, frame.height, frame.width)

    class Fake(Tracker):
        def __init__(self) -> None:
            self.session = SlowObjects()

        def input_spec(self, src_w: int, src_h: int) -> InputSpec:
            return InputSpec(src_w, src_h)

        def new_session(self) -> TrackerSession:
            return self.session

    tracker = Fake()
    prompts = [Prompt(i, 0, [[1, 1]], [1]) for i in range(1, 201)]
    frames = [Frame(i, np.zeros((4, 4, 3), np.uint8)) for i in range(3)]
    stage = TrackStage(tracker, prompts)
    sink = ListSinkSpec()
    pipe = Pipeline(ListSource(frames), [stage], [sink])
    pipe.start()
    assert entered.wait(10)
    t0 = time.monotonic()
    pipe.cancel()
    report = pipe.wait(timeout=30)
    assert time.monotonic() - t0 < 2.0  # one object's time plus polling, not the frame's 10 s
    assert report.reason == "cancel" and tracker.session.stepped < 100
    assert stage.aborted_steps == 1 and sink.sink.items == []


# -- queues bounded by bytes -------------------------------------------------------------------------------------


class _Sized:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_queue_bounded_by_bytes_admits_one_item_always() -> None:
    q: BoundedQueue[_Sized] = BoundedQueue(8, BLOCK, "q", max_bytes=100)
    assert q.put(_Sized(60)) and q.bytes == 60
    assert not q.put(_Sized(60), abort=lambda: True)  # would exceed 100 bytes: waits (here: gives up)
    assert q.put(_Sized(40)) and len(q) == 2
    q.get(), q.get()
    assert q.bytes == 0 and q.put(_Sized(10**9)) and len(q) == 1  # an empty queue admits any one item
    latest: BoundedQueue[_Sized] = BoundedQueue(8, LATEST, "l", max_bytes=100)
    first, second = _Sized(50), _Sized(50)
    latest.put(first), latest.put(second)
    latest.put(_Sized(70))  # drops the oldest items until it fits
    assert latest.drops == 2 and len(latest) == 1 and latest.bytes == 70
    plain: BoundedQueue[_Sized] = BoundedQueue(2, BLOCK, "p", max_bytes=100)
    assert plain.put(Token(0)) and plain.put(Token(1))  # items without nbytes: the count bounds them
    with pytest.raises(ConfigError, match="max_bytes"):
        BoundedQueue(2, BLOCK, "bad", max_bytes=0)


def test_pipeline_byte_budget_gives_4k_frames_fewer_slots_and_480p_the_same() -> None:
    import numpy as np

    from vostream.pipeline.engine import DEFAULT_MAX_QUEUE_BYTES
    from vostream.pipeline.types import Frame

    def frames(h: int, w: int, n: int = 30) -> list[Frame]:
        image = np.zeros((h, w, 3), np.uint8)  # shared: the queue counts each item's nbytes
        return [Frame(i, image) for i in range(n)]

    share = DEFAULT_MAX_QUEUE_BYTES // 3

    def held_depth(h: int, w: int) -> int:
        """How many frames queue up in front of a stage that holds its first frame."""
        gate = threading.Event()
        sink = ListSinkSpec()
        stage = FnStage(lambda f: gate.wait(30) and f, name="held")
        pipe = Pipeline(ListSource(frames(h, w)), [stage, FnStage(lambda f: f, name="b")], [sink])
        q = pipe._stages[0].inq
        assert q is not None and q.max_bytes == share
        pipe.start()
        _wait_until(lambda: len(q) >= 8 or (len(q) >= 1 and q.bytes + h * w * 3 > share))
        time.sleep(0.1)  # a producer ignoring the budget would have put more by now
        depth = len(q)
        gate.set()
        pipe.wait(timeout=30)
        assert len(sink.sink.items) == 30
        return depth

    peaks = {"480p": held_depth(480, 854), "4k": held_depth(2160, 3840)}
    assert peaks["480p"] == 8  # queue capacity is still the item count at 480p
    assert peaks["4k"] == DEFAULT_MAX_QUEUE_BYTES // 3 // (2160 * 3840 * 3)  # 3 of 24.9 MB frames in 85 MiB
