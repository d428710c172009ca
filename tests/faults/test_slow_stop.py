"""A stop by a signal where every frame is slow (255 objects: seconds per frame): the drain is bounded, and the
summary of a node that handled no frame prints (issue 24, item 5: one SIGTERM took 66 s to drain; with two, the
summary was written and then ``internal error: TypeError`` from formatting a node without latencies)."""

from __future__ import annotations

import time

import pytest

from vostream.apps.track import format_summary
from vostream.pipeline import Pipeline
from vostream.pipeline.testing import FnStage, ListSinkSpec, ListSource


@pytest.mark.realtime
def test_a_stop_drains_for_at_most_its_time_limit():
    """Half a second per item and eight queued: an unbounded drain takes 4 s or more; bounded to 0.3 s it ends
    after the item in hand (a cancel then discards the queue and closes every sink)."""

    def slow(item: object) -> object:
        time.sleep(0.5)
        return item

    sink = ListSinkSpec()
    pipe = Pipeline(ListSource(range(40)), [FnStage(slow, name="track")], [sink], queue_size=8)
    pipe.start()
    deadline = time.monotonic() + 30
    while pipe.metrics()["track"].frames_in < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.monotonic()
    pipe.stop(drain=True, within_s=0.3)
    report = pipe.wait(timeout=30)
    took = time.monotonic() - t0
    assert took < 3.0, took  # unbounded: >= 4 s (8 queued x 0.5 s)
    assert report.reason == "cancel" and report.frames <= 3, report
    assert sink.sink.closed


def test_the_summary_prints_a_node_that_handled_no_frame():
    summary = {
        "frames": 0,
        "wall_s": 1.0,
        "fps": 0.0,
        "interrupted": True,
        "out": "out/x",
        "metrics": {
            "nodes": [
                {
                    "name": "postprocess",
                    "frames_out": 0,
                    "latency_ms_p50": None,
                    "latency_ms_p95": None,
                    "drops": 0,
                }
            ]
        },
    }
    text = format_summary(summary)
    assert "postprocess" in text and "p50       - ms" in text
