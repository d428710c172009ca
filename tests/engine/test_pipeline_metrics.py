"""Per-node metrics: percentiles on known inputs, ages and rates on a manual clock, bounds, thread-safety, export."""

from __future__ import annotations

import json
import math
import threading

import numpy as np
import pytest

from vostream.pipeline import LATEST, BoundedQueue
from vostream.pipeline.metrics import MetricsSnapshot, NodeMetrics, percentile, snapshot_all
from vostream.pipeline.testing import ManualClock, Token

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("values", [[5.0], [3.0, 1.0], list(range(1, 101)), [0.5, 9.0, 2.0, 2.0, 7.5, 1e-3]])
@pytest.mark.parametrize("q", [0, 5, 50, 95, 100])
def test_percentile_matches_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_known_values_and_edges():
    ms = [float(i) for i in range(1, 101)]
    assert percentile(ms, 50) == pytest.approx(50.5)
    assert percentile(ms, 95) == pytest.approx(95.05)
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_age_and_fps_on_a_manual_clock():
    clock = ManualClock()
    m = NodeMetrics("track", "stage", clock=clock.monotonic, wall=clock.time)
    for i in range(100):
        m.record_in()
        m.record_latency((i + 1) / 1000.0)  # 1..100 ms
        item = Token(i, capture_time=clock.time() - 0.040)  # captured 40 ms ago
        m.record_out(item)
        clock.advance(0.010)  # 100 fps
    m.record_out(Token(100))  # capture_time 0: counted, no age sample
    s = m.snapshot()
    assert s.frames_in == 100 and s.frames_out == 101
    assert s.latency_ms_p50 == pytest.approx(50.5) and s.latency_ms_p95 == pytest.approx(95.05)
    assert s.age_ms_p50 == pytest.approx(40.0) and s.age_ms_p95 == pytest.approx(40.0)
    assert s.fps == pytest.approx(100.0)


def test_rings_are_bounded_to_the_recent_window():
    clock = ManualClock()
    m = NodeMetrics("s", "stage", window=10, clock=clock.monotonic, wall=clock.time)
    for i in range(1000):
        m.record_latency(1.0 if i < 990 else 0.002)  # only the last 10 samples count
        m.record_out()
        clock.advance(0.5 if i < 990 else 0.02)
    s = m.snapshot()
    assert s.latency_ms_p95 == pytest.approx(2.0)
    assert s.fps == pytest.approx(50.0)  # the recent rate, not the lifetime average
    assert len(m._latency) == 10 and len(m._out_times) == 10
    assert s.frames_out == 1000  # counters are totals


def test_counters_are_thread_safe():
    m = NodeMetrics("s", "stage")

    def hammer():
        for _ in range(5000):
            m.record_in()
            m.record_out()
            m.record_filtered()

    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = m.snapshot()
    assert (s.frames_in, s.frames_out, s.filtered) == (20000, 20000, 20000)


def test_queue_fields_come_from_the_input_queue():
    q: BoundedQueue[int] = BoundedQueue(2, LATEST, "viewer")
    for i in range(5):
        q.put(i)
    q.get()
    s = NodeMetrics("viewer", "sink", q).snapshot()
    assert (s.drops, s.queue_depth, s.queue_max, s.queue_capacity, s.policy) == (3, 1, 2, 2, LATEST)


def _snapshot() -> MetricsSnapshot:
    clock = ManualClock()
    src = NodeMetrics("source", "source", clock=clock.monotonic, wall=clock.time)
    st = NodeMetrics("track", "stage", BoundedQueue(4, name="track"), clock=clock.monotonic, wall=clock.time)
    for _ in range(3):
        src.record_out()
        st.record_in()
        st.record_latency(0.012)
        st.record_out()
        clock.advance(0.1)
    st.set_extra({"objects": 2, "backend": "classic", "ok": True})
    return snapshot_all("cam0", 1.5, [src, st], frames=st.frames_out)


def test_snapshot_is_json_able_and_readable():
    snap = _snapshot()
    d = json.loads(json.dumps(snap.as_dict()))
    assert (
        d["pipeline"] == "cam0"
        and d["frames"] == 3
        and [n["name"] for n in d["nodes"]] == ["source", "track"]
    )
    assert d["nodes"][0]["latency_ms_p50"] is None  # NaN (no samples) becomes null
    assert d["nodes"][1]["latency_ms_p50"] == pytest.approx(12.0)
    assert d["nodes"][1]["extra"] == {"objects": 2, "backend": "classic", "ok": True}
    assert snap["track"].fps == pytest.approx(10.0)
    with pytest.raises(KeyError, match="known: source, track"):
        snap["nope"]
    line = snap.summary()
    assert "\n" not in line and "cam0 1.5s 3f" in line and "track 3f 10.0fps p95 12.0ms q0/4" in line


def test_samples_for_a_prometheus_exporter():
    samples = list(_snapshot().samples())
    by_key = {(name, labels["node"], labels.get("key")): v for name, labels, v in samples}
    assert by_key[("vostream_node_frames_out_total", "track", None)] == 3.0
    assert by_key[("vostream_node_latency_ms_p95", "track", None)] == pytest.approx(12.0)
    assert ("vostream_node_latency_ms_p95", "source", None) not in by_key  # NaN skipped
    assert by_key[("vostream_node_extra", "track", "objects")] == 2.0
    assert ("vostream_node_extra", "track", "backend") not in by_key  # strings and bools are not samples
    assert all(labels["pipeline"] == "cam0" for _, labels, _ in samples)
