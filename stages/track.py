"""The track stage: drives one :class:`~vostream.stages.trackers.base.TrackerSession` from the pipeline.

Prompts reach it two ways: up front (``prompts=``, e.g. from the command line or a prompts file) and while running
(:meth:`Pipeline.send_control` with a :class:`Prompt`, :class:`RemoveObject` or :class:`ResetTracker`, e.g. from the
viewer).  Either way each one is held until the frame it names and applied just before that frame is tracked.  A
prompt whose frame has already gone by (a live feed, a click on a frame that was dropped) is applied to the next
frame and counted as ``late_prompts``.

Failure behaviour: a prompt given up front that cannot be applied (a point outside the frame) stops the pipeline
with a :class:`PromptError`; a prompt injected while running that cannot be applied is logged and counted as
``rejected_prompts`` (one bad click in the viewer must not end a live session).
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vostream.pipeline.errors import PromptError
from vostream.pipeline.stage import Stage
from vostream.pipeline.types import Control, Frame, Prompt, RemoveObject, ResetTracker, TrackResult

from .trackers.base import StepAborted, Tracker, TrackerSession

logger = logging.getLogger(__name__)


@dataclass(order=True)
class _Pending:
    frame_index: int
    seq: int
    message: Control = field(compare=False)
    injected: bool = field(compare=False, default=False)


class TrackStage(Stage[Frame, Frame]):
    """Sets ``frame.result`` with the tracker's output (logits at tracker resolution) for every frame."""

    name = "track"

    def __init__(self, tracker: Tracker, prompts: Iterable[Control] = ()) -> None:
        self.tracker = tracker
        self.session: TrackerSession | None = None
        self._pending: list[_Pending] = []
        self._seq = itertools.count()
        self.late_prompts = 0
        self.rejected_prompts = 0
        self.applied_prompts = 0
        self.unapplied: list[Control] = []
        self._objects = 0
        self.aborted_steps = 0
        self._should_stop: Callable[[], bool] | None = None
        #: the session's last metrics(), kept after close for the final stats
        self._backend: dict[str, object] = {}
        for p in prompts:
            self._schedule(p, injected=False)

    # -- control ---------------------------------------------------------------------------------------------
    def _schedule(self, message: object, injected: bool) -> None:
        if not isinstance(message, (Prompt, RemoveObject, ResetTracker)):
            raise TypeError(f"track stage cannot handle {type(message).__name__}")
        bisect.insort(self._pending, _Pending(message.frame_index, next(self._seq), message, injected))

    def handle_control(self, message: object) -> bool:
        if isinstance(message, (Prompt, RemoveObject, ResetTracker)):
            self._schedule(message, injected=True)
            return True
        return False

    # -- stage -----------------------------------------------------------------------------------------------
    def bind_should_stop(self, should_stop: Callable[[], bool]) -> None:
        """Called by the engine before :meth:`open` with a callable that turns true once the run is cancelled;
        handed to the tracker session (``TrackerSession.should_stop``) so it can stop between objects."""
        self._should_stop = should_stop
        if self.session is not None:
            self.session.should_stop = should_stop

    def open(self) -> None:
        if self.session is None:
            self.session = self.tracker.new_session()
            if self._should_stop is not None:
                self.session.should_stop = self._should_stop

    def _apply(self, item: _Pending, frame: Frame) -> None:
        session = self.session
        assert session is not None
        msg = item.message
        try:
            if isinstance(msg, Prompt):
                msg.check_bounds(frame.width, frame.height, frame.source_id)
                if msg.frame_index != frame.index:
                    msg = Prompt(msg.obj_id, frame.index, msg.points, msg.labels, msg.box, msg.mask)
                session.add_prompt(msg)
                self.applied_prompts += 1
            elif isinstance(msg, RemoveObject):
                session.remove_object(msg.obj_id)
            else:
                session.reset()
        except PromptError as exc:
            if not item.injected:
                raise
            self.rejected_prompts += 1
            logger.warning("ignored a prompt on frame %d: %s", frame.index, exc)

    def process(self, frame: Frame) -> Frame | None:
        if self.session is None:
            self.open()
        assert self.session is not None
        while self._pending and self._pending[0].frame_index <= frame.index:
            item = self._pending.pop(0)
            if item.frame_index < frame.index:
                self.late_prompts += 1
            self._apply(item, frame)
        self._objects = len(self.session.object_ids)
        if self._objects:
            try:
                frame.result = self.session.step(frame)
            except StepAborted as exc:  # the run was cancelled part-way through the frame: drop it
                self.aborted_steps += 1
                logger.info("tracking stopped mid-frame: %s", exc)
                return None
        else:
            frame.result = TrackResult.empty(frame.index, frame.height, frame.width)
        return frame

    def finish(self) -> Iterable[Frame]:
        if self._pending:
            self.unapplied = [p.message for p in self._pending]
            last = max(p.frame_index for p in self._pending)
            logger.warning(
                "%d prompt(s) were never applied: the stream ended before frame %d", len(self._pending), last
            )
            self._pending.clear()
        return ()

    def close(self) -> None:
        if self.session is not None:
            self._backend = self._session_metrics()  # the engine's final stats() call comes after close()
            self.session.close()
            self.session = None

    def _session_metrics(self) -> dict[str, object]:
        if self.session is None:
            return self._backend
        try:
            return dict(self.session.metrics() or {})
        except Exception:  # backend counters are best effort, never a reason to fail a run
            logger.debug("tracker session metrics() failed", exc_info=True)
            return self._backend

    def stats(self) -> dict[str, object]:
        """Prompt counters, plus the tracker session's own ``metrics()`` (host<->device bytes, ms per graph of the
        SAM-2 backends) under ``"backend"`` when it reports any."""
        out: dict[str, object] = {
            "objects": self._objects,
            "applied_prompts": self.applied_prompts,
            "late_prompts": self.late_prompts,
            "rejected_prompts": self.rejected_prompts,
            "unapplied_prompts": len(self.unapplied),
        }
        self._backend = self._session_metrics()
        if self._backend:
            out["backend"] = self._backend
        return out


__all__ = ["TrackStage"]
