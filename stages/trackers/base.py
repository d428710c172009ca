"""The tracker interface every backend implements.

A :class:`Tracker` is a loaded backend (weights, runtime, device); it makes :class:`TrackerSession` objects, one per
video stream.  A session is *sans-I/O*: it holds no threads, queues or sockets; :mod:`vostream.stages.track` drives
it from the pipeline, tests drive it with plain calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from vostream.pipeline.types import Frame, Prompt, TrackResult

#: points (clicks, and a box's two corners) per object per frame: the size of the SAM-2 sessions' point buffers
#: (a prompt may fill all but one slot) and the limit the viewer protocol announces and enforces
MAX_POINTS = 64


@dataclass(frozen=True)
class InputSpec:
    """What the preprocess stage must produce in ``Frame.tensor`` for this tracker.

    ``resize``: ``"stretch"`` resizes to exactly ``width`` x ``height``; ``"fit"`` keeps the aspect ratio so that
    the frame fits inside ``width`` x ``height`` (the long side touches the box; never upscales), no padding.
    For float dtypes the tensor is ``(pixel / 255 - mean) / std`` per RGB channel; ``uint8`` is raw RGB.
    ``layout``: ``"HWC"`` (H, W, 3), ``"CHW"`` (3, H, W) or ``"NCHW"`` (1, 3, H, W).
    """

    width: int
    height: int
    resize: Literal["stretch", "fit"] = "stretch"
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    layout: Literal["HWC", "CHW", "NCHW"] = "HWC"
    dtype: Literal["uint8", "float32", "float16"] = "uint8"

    def output_size(self, src_w: int, src_h: int) -> tuple[int, int]:
        """(w, h) of the tensor for a ``src_w`` x ``src_h`` source."""
        if self.resize == "stretch":
            return self.width, self.height
        scale = min(self.width / src_w, self.height / src_h, 1.0)
        return max(1, round(src_w * scale)), max(1, round(src_h * scale))


class StepAborted(Exception):
    """Raised by :meth:`TrackerSession.step` when :attr:`TrackerSession.should_stop` turned true part-way: the frame
    has no result and is dropped (the run is being cancelled; the session is closed next)."""


class TrackerSession(ABC):
    """Tracking state for one stream.  Not thread-safe: one thread drives it.

    Protocol per frame: zero or more :meth:`add_prompt` / :meth:`remove_object` calls for *this* frame, then one
    :meth:`step`.  Prompt coordinates are in source pixels; the session maps them to its own input size.

    ``should_stop`` (optional, set by the track stage): a callable that turns true when the run is cancelled and
    the frame being tracked will be discarded anyway.  A session whose :meth:`step` loops over objects should call
    it between objects and raise :class:`StepAborted` when it returns true, so that a cancel (a second Ctrl-C or
    SIGTERM) takes effect within one object's time instead of one frame's (many objects can make a frame take
    seconds).  Both the SAM-2 and the classic sessions honour it.
    """

    should_stop: Callable[[], bool] | None = None

    def stop_requested(self) -> bool:
        """True when :attr:`should_stop` is set and says so (never raises: a failing callable means no)."""
        check = self.should_stop
        if check is None:
            return False
        try:
            return bool(check())
        except Exception:
            return False

    @abstractmethod
    def add_prompt(self, prompt: Prompt) -> None:
        """Queue a prompt for the next :meth:`step`.  A new ``obj_id`` starts an object; a known one is corrected
        (its prompts on that frame are replaced by these).  Raises :class:`PromptError` for a prompt that cannot be
        applied (a point outside the frame, only negative points for an unknown object).  The sessions keep their
        pending prompts in a :class:`~vostream.stages.trackers.prompting.PromptBook`, which holds these rules."""

    @abstractmethod
    def remove_object(self, obj_id: int) -> None:
        """Forget an object.  Raises :class:`PromptError` when the id is unknown."""

    @abstractmethod
    def step(self, frame: Frame) -> TrackResult:
        """Track every object into ``frame`` (``frame.tensor`` set per the tracker's :class:`InputSpec`).

        Returns one row per object: ``logits`` (N, h, w) at the tensor's resolution (> 0 is foreground) or
        full-size ``masks``; ``scores``; ``present`` (False while occluded or out of view).  Frames may be skipped
        (live feeds drop frames): the session uses ``frame.index`` / ``frame.time`` to know how far it moved.
        """

    @abstractmethod
    def reset(self) -> None:
        """Forget every object and all memory."""

    @property
    @abstractmethod
    def object_ids(self) -> list[int]:
        """Ids of the objects currently tracked, in insertion order."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release per-session resources (device buffers).  Idempotent."""

    def metrics(self) -> dict[str, Any]:
        """Backend counters for the track stage's metrics (e.g. bytes moved host<->device); {} by default."""
        return {}


class Tracker(ABC):
    """A loaded tracker backend: makes sessions.  ``close`` releases the model."""

    name: str = "tracker"

    @abstractmethod
    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        """What preprocess must produce for a ``src_w`` x ``src_h`` source."""

    @abstractmethod
    def new_session(self) -> TrackerSession:
        """A fresh session for one stream."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the model.  Idempotent."""
