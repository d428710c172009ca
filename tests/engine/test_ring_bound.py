"""The preprocess stage's ring of reused tensors can never be shorter than what the pipeline holds in flight
(issue 24, item 10): built by hand with a queue of 32 and the default ring of 16, as
``samples/examples/custom_pipeline.py`` did, 44 of 60 frames reached the tracker carrying another frame's pixels."""

from __future__ import annotations

import threading

import numpy as np

from vostream.pipeline import Pipeline
from vostream.pipeline.testing import FnStage, ListSinkSpec, ListSource
from vostream.pipeline.types import Frame
from vostream.stages.preprocess import RING_SPARE, Preprocessor, PreprocessStage
from vostream.stages.trackers.base import InputSpec

SPEC = InputSpec(16, 16, "stretch", dtype="uint8")


def _frames(n: int) -> list[Frame]:
    return [Frame(i, np.full((24, 24, 3), i, np.uint8)) for i in range(n)]


def test_frames_reach_the_tracker_with_their_own_pixels_whatever_the_queue_size():
    """The consumer of the tensors is held until every frame it can queue is queued (the worst case of a slow
    tracker), then checks each tensor against the frame's own image, as the tracker would read it."""
    queue_size, n = 32, 60
    gate = threading.Event()
    wrong: list[int] = []
    reference = Preprocessor(SPEC, ring=1)

    def track(item: object) -> object:
        frame = item
        assert isinstance(frame, Frame) and frame.tensor is not None
        gate.wait(30)
        if not np.array_equal(frame.tensor, reference(frame.image)):
            wrong.append(frame.index)
        return frame

    pre = PreprocessStage(lambda w, h: SPEC)  # the default ring (16), shorter than the queue after it
    sink = ListSinkSpec()
    pipe = Pipeline(
        ListSource(_frames(n)), [pre, FnStage(track, name="track")], [sink], queue_size=queue_size
    )
    pipe.start()
    # release the tracker once the preprocess stage has filled the edge before it (and waits on it)
    for _ in range(3000):
        if pipe.metrics()["preprocess"].frames_out >= queue_size + 1:
            break
        threading.Event().wait(0.01)
    gate.set()
    report = pipe.wait()
    assert report.frames == n
    assert wrong == []


def test_the_ring_follows_the_output_edge():
    pre = PreprocessStage(lambda w, h: SPEC, ring=6)
    pre.bind_output(32)
    pre.process(_frames(1)[0])
    assert pre._pre is not None and pre._pre.ring == 32 + RING_SPARE
    small = PreprocessStage(lambda w, h: SPEC, ring=6)
    small.bind_output(1)  # never fewer than asked for
    small.process(_frames(1)[0])
    assert small._pre is not None and small._pre.ring == 6
