"""Worker threads shared by several streams, taking them in turn: how N pipelines share one tracker.

Each stream's track stage calls :meth:`RoundRobinScheduler.run` with the work for one frame and blocks until the
worker has run it.  The worker takes the streams that have work waiting in round-robin order, so a stream waits
for at most one turn of every other stream, and a stream that has nothing waiting (a stalled or reconnecting feed)
costs the others nothing.  With one worker (the default) one thread drives the shared runtime (what AscendCL
contexts and a device want); more workers run different streams' work at the same time (CPU trackers, whose
sessions share no state).  A stream's own work never runs twice at once: its caller waits for each result.
Per-stream figures say how the worker time was shared.

Failure behaviour: an exception raised by a stream's work is raised in *that* stream's caller only; the worker
goes on with the other streams.  :meth:`close` refuses new work and wakes every waiting caller with
:class:`SchedulerClosed`.  Thread-safe: any thread may call :meth:`run`, :meth:`stats` and :meth:`close`.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from vostream.pipeline.errors import ConfigError, StageError

T = TypeVar("T")


class SchedulerClosed(StageError):
    """The scheduler was closed while work was waiting (the deployment is stopping)."""


@dataclass(eq=False)
class _Job(Generic[T]):
    stream: str
    fn: Callable[[], T]
    submitted: float
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None  # set by the worker before ``done``
    error: BaseException | None = None


@dataclass
class _StreamStats:
    runs: int = 0
    busy_s: float = 0.0
    waits_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=512))


class RoundRobinScheduler:
    """Runs each stream's work on one worker thread, streams in turn.  Work submitted before :meth:`start` (or
    entering it as a context manager) waits for it.  The turn order is the order streams were registered
    (:meth:`register`, or a stream's first :meth:`run`)."""

    def __init__(self, name: str = "scheduler", workers: int = 1) -> None:
        if workers < 1:
            raise ConfigError(f"scheduler {name!r}: workers must be >= 1, got {workers}")
        self.name = name
        self.workers = workers
        self._cond = threading.Condition()
        self._order: list[str] = []  # registration order = the turn order
        self._pending: dict[str, collections.deque[_Job[Any]]] = {}
        self._stats: dict[str, _StreamStats] = {}
        self._next = 0
        self._running: set[str] = set()  # streams whose work a worker is running now (never two at once)
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._started = time.monotonic()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def start(self) -> RoundRobinScheduler:
        with self._cond:
            if not self._threads:
                for k in range(self.workers):
                    t = threading.Thread(target=self._work, name=f"vostream-{self.name}-{k}", daemon=True)
                    t.start()
                    self._threads.append(t)
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Refuse new work, fail the waiting work with :class:`SchedulerClosed`, wait for the worker.  Idempotent."""
        with self._cond:
            self._closed = True
            waiting = [job for q in self._pending.values() for job in q]
            for q in self._pending.values():
                q.clear()
            self._cond.notify_all()
        for job in waiting:
            job.error = SchedulerClosed(self.name, "the scheduler closed before this stream's turn")
            job.done.set()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)

    def __enter__(self) -> RoundRobinScheduler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- streams -----------------------------------------------------------------------------------------------
    def register(self, stream: str) -> None:
        with self._cond:
            if stream not in self._pending:
                self._order.append(stream)
                self._pending[stream] = collections.deque()
                self._stats[stream] = _StreamStats()

    def run(self, stream: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker in ``stream``'s turn and return its result (or raise its exception)."""
        job: _Job[T] = _Job(stream, fn, time.monotonic())
        with self._cond:
            if self._closed:
                raise SchedulerClosed(self.name, f"stream {stream!r}: the scheduler is closed")
            if stream not in self._pending:
                self._order.append(stream)
                self._pending[stream] = collections.deque()
                self._stats[stream] = _StreamStats()
            self._pending[stream].append(job)
            self._cond.notify_all()
        job.done.wait()
        if job.error is not None:
            raise job.error
        return cast(T, job.result)  # fn's result (None only when fn returned None)

    def pending(self) -> dict[str, int]:
        """Work waiting per stream (a snapshot)."""
        with self._cond:
            return {name: len(q) for name, q in self._pending.items()}

    # -- the worker --------------------------------------------------------------------------------------------
    def _take(self) -> _Job[Any] | None:
        """The next stream's oldest job in turn order (call with the condition held); None when closed."""
        while not self._closed:
            n = len(self._order)
            for k in range(n):
                stream = self._order[(self._next + k) % n]
                if self._pending[stream] and stream not in self._running:
                    self._next = (self._next + k + 1) % n
                    self._running.add(stream)
                    return self._pending[stream].popleft()
            self._cond.wait()
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._take()
            if job is None:
                return
            t0 = time.monotonic()
            try:
                job.result = job.fn()
            except BaseException as exc:  # noqa: BLE001 - raised in the stream that submitted it
                job.error = exc
            t1 = time.monotonic()
            with self._cond:
                self._running.discard(job.stream)
                self._cond.notify_all()  # the stream's next work may wait for this one
                st = self._stats[job.stream]
                st.runs += 1
                st.busy_s += t1 - t0
                st.waits_ms.append((t0 - job.submitted) * 1000.0)
            job.done.set()

    # -- figures -----------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, float]]:
        """Per stream: ``runs``, ``busy_s``, ``share`` (of the worker's busy time), ``wait_ms_p50``/``p95`` (time
        from submitting to the start of the run: how long the stream waited for its turn)."""
        with self._cond:
            total = sum(s.busy_s for s in self._stats.values()) or 1.0
            out = {}
            for name, s in self._stats.items():
                waits = sorted(s.waits_ms)
                out[name] = {
                    "runs": float(s.runs),
                    "busy_s": round(s.busy_s, 4),
                    "share": round(s.busy_s / total, 4),
                    "wait_ms_p50": _quantile(waits, 0.5),
                    "wait_ms_p95": _quantile(waits, 0.95),
                }
            return out


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return round(sorted_values[i], 3)


__all__ = ["RoundRobinScheduler", "SchedulerClosed"]
