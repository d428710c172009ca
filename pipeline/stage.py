"""The three contracts the engine runs: :class:`Source`, :class:`Stage` and :class:`Sink` (built from a
:class:`SinkSpec`).

Each runs in its own thread, driven by :class:`vostream.pipeline.Pipeline`; none of them owns a thread, a queue or
a socket of the engine's.  All methods of one object are called from that object's thread, except
:meth:`Source.interrupt`, which another thread calls to unblock a pending :meth:`Source.read`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Generic, TypeVar

#: a stage's input (contravariant: a stage that takes any item fits anywhere) and output (covariant)
In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)
#: what a source produces (covariant)
T_co = TypeVar("T_co", covariant=True)
#: what a sink consumes (contravariant: a sink of any item takes frames)
T_contra = TypeVar("T_contra", contravariant=True)

#: Edge policies.  ``block``: the producer waits for room (lossless; files and batch work).
#: ``latest``: a full queue drops its *oldest* item to admit the new one (bounded latency; live feeds).
BLOCK = "block"
LATEST = "latest"
POLICIES = (BLOCK, LATEST)


class Source(ABC, Generic[T_co]):
    """Produces items until it returns ``None`` (end of stream).

    ``live`` picks the default edge policy: ``latest`` for live feeds, ``block`` for files.  ``length`` is the
    expected number of items when known (for progress bars), else ``None``.
    """

    name: str = "source"
    live: bool = False
    length: int | None = None

    def open(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources (open the file or connection).  Raise :class:`SourceError` on failure."""

    @abstractmethod
    def read(self) -> T_co | None:
        """Return the next item, or ``None`` at end of stream.  May block; must honour :meth:`interrupt`."""

    def interrupt(self) -> None:  # noqa: B027 - optional hook
        """Called from another thread when the pipeline stops: make a blocked :meth:`read` return soon."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources.  Idempotent."""

    def stats(self) -> dict[str, object]:
        """Source-specific counters (corrupt frames skipped, reconnects, ...) merged into the metrics."""
        return {}


class Stage(ABC, Generic[In, Out]):
    """Transforms items one at a time in its own thread."""

    name: str = "stage"

    def open(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources before the first item (load a model, allocate buffers)."""

    def bind_output(self, capacity: int) -> None:  # noqa: B027 - optional hook
        """Called by the pipeline before :meth:`open`: at most ``capacity`` of this stage's outputs wait in its
        output edge(s) at once (0: no stage or sink reads them).  A stage that reuses output buffers keeps more
        than ``capacity`` of them, plus those its consumer may still hold, so that no item in flight is
        overwritten; ``docs/pipeline.md``."""

    @abstractmethod
    def process(self, item: In) -> Out | None:
        """Return the transformed item, or ``None`` to drop it (counted as ``filtered``)."""

    def finish(self) -> Iterable[Out]:
        """Called once at end of stream (not on cancel): items still held back, in order."""
        return ()

    def handle_control(self, message: object) -> bool:
        """A control message (for example a :class:`~vostream.pipeline.types.Prompt`) sent with
        :meth:`Pipeline.send_control`; delivered in this stage's thread before its next item, and also while it
        waits for input.  Return True if this stage consumed it."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources.  Idempotent; called on success, error and cancel alike."""

    def stats(self) -> dict[str, object]:
        return {}


class Sink(ABC, Generic[T_contra]):
    """The running side of an output: owns files or sockets.  Usable as a context manager."""

    name: str = "sink"

    def open(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources.  Raise :class:`OutputError` when the output cannot be written."""

    @abstractmethod
    def write(self, item: T_contra) -> None:
        """Consume one item."""

    @abstractmethod
    def close(self) -> None:
        """Flush and finalise (a valid MP4, a complete JSON).  Idempotent.  Called after an error and on Ctrl-C
        too, so everything written so far stays valid."""

    def stats(self) -> dict[str, object]:
        return {}

    def __enter__(self) -> Sink[T_contra]:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SinkSpec(ABC, Generic[T_contra]):
    """The inert, picklable description of a sink.  :meth:`build` returns the :class:`Sink` that owns resources.

    ``policy`` is what happens when this sink is slower than the pipeline: ``block`` (lose nothing; the whole
    pipeline slows to this sink's pace) or ``latest`` (this sink alone skips frames).  ``None`` follows the
    source: ``block`` for files, ``latest`` for live feeds.
    """

    name: str = "sink"
    policy: str | None = None
    queue_size: int = 8

    @abstractmethod
    def build(self) -> Sink[T_contra]:
        """Create the sink (not yet opened)."""


__all__ = ["BLOCK", "LATEST", "POLICIES", "Sink", "SinkSpec", "Source", "Stage"]
