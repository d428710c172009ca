"""One loaded tracker shared by several streams through a :class:`~vostream.pipeline.scheduler.RoundRobinScheduler`.

``SharedTracker(tracker, scheduler, stream)`` looks like an ordinary :class:`Tracker` to the stream's pipeline;
every call of its sessions that touches the model (prompts, steps, removals, resets, close) runs on the
scheduler's one worker thread in the stream's turn.  Each stream keeps its own :class:`TrackerSession` (for the
SAM-2 backends: its own memory banks on the device); the graphs are loaded once.  Closing a ``SharedTracker``
does not close the tracker it wraps: its owner (the deployment) does, after every stream ended.
"""

from __future__ import annotations

from vostream.pipeline.scheduler import RoundRobinScheduler
from vostream.pipeline.types import Frame, Prompt, TrackResult
from vostream.stages.trackers.base import InputSpec, Tracker, TrackerSession


class _ScheduledSession(TrackerSession):
    def __init__(self, inner: TrackerSession, scheduler: RoundRobinScheduler, stream: str) -> None:
        self.inner = inner
        self.scheduler = scheduler
        self.stream = stream

    def add_prompt(self, prompt: Prompt) -> None:
        self.scheduler.run(self.stream, lambda: self.inner.add_prompt(prompt))

    def remove_object(self, obj_id: int) -> None:
        self.scheduler.run(self.stream, lambda: self.inner.remove_object(obj_id))

    def step(self, frame: Frame) -> TrackResult:
        return self.scheduler.run(self.stream, lambda: self.inner.step(frame))

    def reset(self) -> None:
        self.scheduler.run(self.stream, self.inner.reset)

    @property
    def object_ids(self) -> list[int]:
        return self.inner.object_ids

    def close(self) -> None:
        self.scheduler.run(self.stream, self.inner.close)

    def metrics(self) -> dict[str, object]:
        return self.inner.metrics()


class SharedTracker(Tracker):
    """``tracker`` seen by one stream: sessions run on ``scheduler`` in ``stream``'s turn."""

    def __init__(self, tracker: Tracker, scheduler: RoundRobinScheduler, stream: str) -> None:
        self.tracker = tracker
        self.scheduler = scheduler
        self.stream = stream
        self.name = tracker.name
        scheduler.register(stream)

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        return self.tracker.input_spec(src_w, src_h)

    def new_session(self) -> TrackerSession:
        inner = self.scheduler.run(self.stream, self.tracker.new_session)
        return _ScheduledSession(inner, self.scheduler, self.stream)

    def close(self) -> None:
        """Nothing to release here: the wrapped tracker belongs to the deployment."""


__all__ = ["SharedTracker"]
