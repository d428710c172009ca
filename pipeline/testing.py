"""Fakes for testing pipelines, shipped in the package: sources, sinks, stages and a clock.

Each fake records what happened to it (items, the threads it ran in, how often ``close()`` ran) so tests can assert
on behaviour without mocks.  The counters are plain attributes updated under the GIL; read them after the run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from .stage import Sink, SinkSpec, Source, Stage

logger = logging.getLogger(__name__)

T = TypeVar("T")


@runtime_checkable
class _Captured(Protocol):
    """An item with a wall-clock ``capture_time`` (a :class:`Token`, a ``Frame``)."""

    capture_time: float


__test__ = False  # not a test module, whatever pytest's collection rules say


@dataclass(eq=False)
class Token:
    """A small stand-in for a frame: ``index``, ``capture_time`` (wall clock), ``stamps`` like ``Frame``."""

    __test__ = False

    index: int
    capture_time: float = 0.0
    stamps: dict[str, float] = field(default_factory=dict)
    payload: object = None


def tokens(n: int) -> list[Token]:
    """``n`` tokens with indices 0..n-1 (a :class:`ListSource` sets ``capture_time`` when it reads each)."""
    return [Token(i) for i in range(n)]


class ManualClock:
    """A clock that moves only when told: ``monotonic()`` and ``time()`` (epoch) advance together."""

    __test__ = False

    def __init__(self, start: float = 1000.0, epoch: float = 1_700_000_000.0) -> None:
        self._t = float(start)
        self._offset = float(epoch) - float(start)
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._t

    def time(self) -> float:
        with self._lock:
            return self._t + self._offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        with self._lock:
            self._t += seconds

    __call__ = monotonic


class _Lifecycle:
    """open/close bookkeeping shared by the fakes."""

    def __init__(self) -> None:
        self.open_calls = 0
        self.close_calls = 0
        self.threads: set[str] = set()

    def _note_thread(self) -> None:
        self.threads.add(threading.current_thread().name)


class ListSource(Source[T], _Lifecycle):
    """Yields ``items`` in order, then ``None``.  ``delay`` seconds between reads (real sleep, interruptible).

    ``live`` picks the pipeline's default policy.  ``fail_at=i`` raises ``exc`` instead of returning item ``i``;
    ``block_after=i`` blocks in ``read()`` before item ``i`` until :meth:`interrupt` (or :meth:`release`), like a
    stalled camera.  Items with a ``capture_time`` attribute equal to 0 get ``time.time()`` when read.
    """

    __test__ = False

    def __init__(
        self,
        items: Iterable[T],
        live: bool = False,
        delay: float = 0.0,
        *,
        name: str = "source",
        fail_at: int | None = None,
        exc: BaseException | None = None,
        block_after: int | None = None,
        open_exc: BaseException | None = None,
    ) -> None:
        _Lifecycle.__init__(self)
        self.items = list(items)
        self.live = live
        self.delay = delay
        self.name = name
        self.length = len(self.items)
        self.fail_at = fail_at
        self.exc = exc if exc is not None else RuntimeError("fake source failure")
        self.block_after = block_after
        self.open_exc = open_exc
        self.reads = 0
        self.interrupts = 0
        self._interrupted = threading.Event()
        self._released = threading.Event()
        self.blocked = threading.Event()  # set while read() is blocked on block_after

    def open(self) -> None:
        self.open_calls += 1
        self._note_thread()
        if self.open_exc is not None:
            raise self.open_exc

    def read(self) -> T | None:
        self._note_thread()
        i = self.reads
        if self.block_after is not None and i == self.block_after and not self._released.is_set():
            self.blocked.set()
            while not (self._interrupted.is_set() or self._released.is_set()):
                self._interrupted.wait(0.01)
            self.blocked.clear()
            if self._interrupted.is_set():
                return None
        if self.delay and self._interrupted.wait(self.delay):
            return None
        if self.fail_at is not None and i == self.fail_at:
            raise self.exc
        if i >= len(self.items):
            return None
        self.reads += 1
        item = self.items[i]
        if isinstance(item, _Captured) and item.capture_time == 0.0:
            item.capture_time = time.time()
        return item

    def release(self) -> None:
        """Unblock a ``block_after`` read without ending the stream."""
        self._released.set()

    def interrupt(self) -> None:
        self.interrupts += 1
        self._interrupted.set()

    def close(self) -> None:
        self.close_calls += 1
        self._note_thread()

    def stats(self) -> dict[str, object]:
        return {"reads": self.reads}


class FnStage(Stage[object, object], _Lifecycle):
    """Applies ``fn`` to each item (``None`` drops it); records controls and their threads.  Takes any items."""

    __test__ = False

    def __init__(
        self,
        fn: Callable[[object], object] = lambda x: x,
        *,
        name: str = "fn",
        finish_items: Sequence[object] = (),
        consume_controls: bool = True,
    ) -> None:
        _Lifecycle.__init__(self)
        self.fn = fn
        self.name = name
        self.finish_items = list(finish_items)
        self.consume_controls = consume_controls
        self.seen: list[object] = []
        self.controls: list[tuple[object, str, int]] = []  # (message, thread name, items seen before it)
        self.finish_calls = 0

    def open(self) -> None:
        self.open_calls += 1
        self._note_thread()

    def process(self, item: object) -> object:
        self._note_thread()
        self.seen.append(item)
        return self.fn(item)

    def finish(self) -> Iterable[object]:
        self.finish_calls += 1
        return list(self.finish_items)

    def handle_control(self, message: object) -> bool:
        self.controls.append((message, threading.current_thread().name, len(self.seen)))
        if isinstance(message, BaseException):
            raise message
        return self.consume_controls

    def close(self) -> None:
        self.close_calls += 1
        self._note_thread()

    def stats(self) -> dict[str, object]:
        return {"seen": len(self.seen)}


class SlowStage(FnStage):
    """Sleeps ``delay`` seconds per item (``time.sleep`` releases the GIL, like real work)."""

    __test__ = False

    def __init__(
        self, delay: float, *, name: str = "slow", fn: Callable[[object], object] = lambda x: x
    ) -> None:
        super().__init__(fn, name=name)
        self.delay = delay

    def process(self, item: object) -> object:
        time.sleep(self.delay)
        return super().process(item)


class FailingStage(FnStage):
    """Passes items through and raises ``exc`` on the item after ``after`` items (``after=0``: the first).

    ``where="open"`` or ``"finish"`` or ``"close"`` raises there instead.
    """

    __test__ = False

    def __init__(
        self,
        after: int = 0,
        exc: BaseException | None = None,
        *,
        name: str = "failing",
        where: str = "process",
    ) -> None:
        super().__init__(name=name)
        self.after = after
        self.exc = exc if exc is not None else ValueError("fake stage failure")
        self.where = where

    def open(self) -> None:
        super().open()
        if self.where == "open":
            raise self.exc

    def process(self, item: object) -> object:
        if self.where == "process" and len(self.seen) >= self.after:
            self.seen.append(item)
            raise self.exc
        return super().process(item)

    def finish(self) -> Iterable[object]:
        super().finish()
        if self.where == "finish":
            raise self.exc
        return ()

    def close(self) -> None:
        super().close()
        if self.where == "close":
            raise self.exc


class ListSink(Sink[T], _Lifecycle):
    """Collects items in :attr:`items`; ``delay`` seconds per write; raises ``exc`` on write ``fail_at``."""

    __test__ = False

    def __init__(self, spec: ListSinkSpec[T]) -> None:
        _Lifecycle.__init__(self)
        self.spec = spec
        self.name = spec.name
        self.items: list[T] = []
        self.closed = False

    def open(self) -> None:
        self.open_calls += 1
        self._note_thread()
        if self.spec.open_exc is not None:
            raise self.spec.open_exc

    def write(self, item: T) -> None:
        self._note_thread()
        if self.closed:
            raise AssertionError(f"sink '{self.name}': write after close")
        if self.spec.fail_at is not None and len(self.items) == self.spec.fail_at:
            raise self.spec.exc
        if self.spec.delay:
            time.sleep(self.spec.delay)
        self.items.append(item)

    def close(self) -> None:
        self.close_calls += 1
        self.closed = True
        self._note_thread()

    def stats(self) -> dict[str, object]:
        return {"written": len(self.items)}


class ListSinkSpec(SinkSpec[T]):
    """Builds a :class:`ListSink`; the built sinks are kept in :attr:`sinks` (the last one is :attr:`sink`)."""

    __test__ = False

    def __init__(
        self,
        name: str = "list",
        policy: str | None = None,
        queue_size: int = 8,
        *,
        delay: float = 0.0,
        fail_at: int | None = None,
        exc: BaseException | None = None,
        open_exc: BaseException | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self.queue_size = queue_size
        self.delay = delay
        self.fail_at = fail_at
        self.exc = exc if exc is not None else OSError("fake sink failure")
        self.open_exc = open_exc
        self.sinks: list[ListSink[T]] = []

    def build(self) -> ListSink[T]:
        sink = ListSink(self)
        self.sinks.append(sink)
        return sink

    @property
    def sink(self) -> ListSink[T]:
        if not self.sinks:
            raise LookupError(f"sink spec '{self.name}' was never built")
        return self.sinks[-1]

    @property
    def items(self) -> list[T]:
        return self.sink.items


__all__ = [
    "FailingStage",
    "FnStage",
    "ListSink",
    "ListSinkSpec",
    "ListSource",
    "ManualClock",
    "SlowStage",
    "Token",
    "tokens",
]
