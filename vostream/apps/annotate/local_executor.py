"""Executors that run :class:`VideoJob` objects: local worker processes (``--workers N``) and in-process
(``workers=0``).  ``annotate_ray.RayExecutor`` has the same interface.

Executor interface (driven from one thread, the batch's dispatch loop; not thread-safe):
``start()``, ``idle() -> list[int]`` (slots ready for a job), ``submit(slot, job)``, ``poll(timeout) -> list[Event]``,
``abandon()`` (kill in-flight work now), ``close()`` (idempotent).

Workers are ``spawn``ed processes; each loads its tracker once (:class:`JobRunner`) and runs one video at a time.
Each is started with NumPy's BLAS/OpenMP pools sized like its OpenCV threads (:meth:`TrackOptions.thread_env`).
They ignore SIGINT (the parent decides what a Ctrl-C means) and die with the parent (``PR_SET_PDEATHSIG`` on
Linux; elsewhere they notice a changed parent pid within a second or a quarter-second between frames, and cancel).
A worker that dies mid-video yields a ``failed`` result for that video and is replaced.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Protocol

from vostream.apps.annotate.job import JobResult, JobResultRecord, JobRunner, TrackOptions, VideoJob

logger = logging.getLogger(__name__)


@dataclass
class Event:
    """``kind``: ``ready``, ``start``, ``frames``, ``result`` or ``fatal`` (the tracker could not be loaded)."""

    kind: str
    slot: int
    key: str | None = None
    frames: int = 0
    result: JobResult | None = None
    error: str | None = None


#: what a worker process sends back: (kind, slot, generation, video key, frames, result, error)
_Message = tuple[str, int, int, "str | None", int, "JobResultRecord | None", "str | None"]


class Executor(Protocol):
    """What the batch drives (``batch._dispatch``): worker processes, Ray actors, or the calling thread."""

    def start(self) -> None: ...

    def idle(self) -> list[int]:
        """Slots ready for a video."""
        ...

    def submit(self, slot: int, job: VideoJob) -> None: ...

    def poll(self, timeout: float) -> list[Event]:
        """What happened within about ``timeout`` seconds."""
        ...

    def abandon(self) -> None:
        """Stop the running videos now (a second signal)."""
        ...

    def close(self) -> None: ...


def _die_with_parent() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent-pid checks remain
        pass


def _worker_main(
    slot: int,
    gen: int,
    options: TrackOptions,
    tasks: Queue[VideoJob | None],
    events: Queue[_Message],
    parent_pid: int,
    log_level: int,
) -> None:
    """Entry point of a worker process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    if os.getppid() != parent_pid:
        return
    logging.basicConfig(level=log_level, format=f"%(levelname)s worker {slot}: %(message)s")
    try:
        runner = JobRunner(options, worker=f"worker {slot}")
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which stops the batch
        events.put(("fatal", slot, gen, None, 0, None, f"worker {slot} cannot load the tracker: {exc}"))
        return
    events.put(("ready", slot, gen, None, 0, None, None))
    try:
        _worker_loop(runner, slot, gen, tasks, events, parent_pid)
    finally:
        runner.close()


def _worker_loop(
    runner: JobRunner,
    slot: int,
    gen: int,
    tasks: Queue[VideoJob | None],
    events: Queue[_Message],
    parent_pid: int,
) -> None:
    while True:
        try:
            job = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return
            continue
        if job is None:
            return
        events.put(("start", slot, gen, job.key, 0, None, None))
        last = [0.0]

        def progress(frames: int, last: list[float] = last, job: VideoJob = job) -> bool:
            if os.getppid() != parent_pid:
                return False
            now = time.monotonic()
            if now - last[0] >= 0.25:
                last[0] = now
                events.put(("frames", slot, gen, job.key, frames, None, None))
            return True

        result = runner.run(job, progress)
        events.put(("result", slot, gen, job.key, result.frames, result.to_dict(), None))


@contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` (variables the user set keep their values) for the duration, for the process
    started inside.  Driven from one thread (the executor's)."""
    added = {k: v for k, v in extra.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


@dataclass
class _Worker:
    slot: int
    gen: int
    proc: BaseProcess
    tasks: Queue[VideoJob | None]
    ready: bool = False
    job: VideoJob | None = None
    started: float = field(default_factory=time.monotonic)


class LocalExecutor:
    """``slots`` worker processes (``spawn``)."""

    def __init__(self, options: TrackOptions, slots: int, log_level: int = logging.WARNING) -> None:
        self.options = options
        self.slots = slots
        self.log_level = log_level
        self._ctx = mp.get_context("spawn")
        self._events: Queue[_Message] = self._ctx.Queue()
        self._workers: dict[int, _Worker] = {}
        self._gen = 0
        self._closed = False

    def _spawn(self, slot: int) -> None:
        self._gen += 1
        tasks = self._ctx.Queue()
        proc = self._ctx.Process(
            target=_worker_main,
            name=f"vostream-annotate-{slot}",
            daemon=True,
            args=(slot, self._gen, self.options, tasks, self._events, os.getpid(), self.log_level),
        )
        with _environment(self.options.thread_env()):  # spawn copies the environment now
            proc.start()
        self._workers[slot] = _Worker(slot, self._gen, proc, tasks)

    def start(self) -> None:
        for slot in range(self.slots):
            self._spawn(slot)

    def idle(self) -> list[int]:
        return [w.slot for w in self._workers.values() if w.ready and w.job is None and w.proc.is_alive()]

    def submit(self, slot: int, job: VideoJob) -> None:
        w = self._workers[slot]
        w.job = job
        w.tasks.put(job)

    def poll(self, timeout: float) -> list[Event]:
        out: list[Event] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                raw = self._events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            ev = self._accept(raw)
            if ev is not None:
                out.append(ev)
            if out and out[-1].kind in ("result", "fatal"):
                break
        out += self._check_dead()
        return out

    def _accept(self, raw: _Message) -> Event | None:
        kind, slot, gen, key, frames, result, error = raw
        w = self._workers.get(slot)
        if w is None or w.gen != gen:
            return None  # from a replaced worker
        if kind == "ready":
            w.ready = True
        res = None
        if kind == "result" and result is not None:
            res = JobResult.from_dict(result)
            w.job = None
        return Event(kind, slot, key, frames, res, error)

    def _check_dead(self) -> list[Event]:
        out: list[Event] = []
        for slot, w in list(self._workers.items()):
            if w.proc.is_alive() or self._closed:
                continue
            code = w.proc.exitcode
            if w.job is not None:
                out.append(
                    Event(
                        "result",
                        slot,
                        w.job.key,
                        0,
                        JobResult(
                            w.job.key,
                            "failed",
                            error=f"worker {slot} died (exit code {code}) while annotating this video",
                            worker=f"worker {slot}",
                        ),
                    )
                )
                logger.warning("worker %d died (exit code %s); starting a new one", slot, code)
            elif not w.ready:
                out.append(
                    Event(
                        "fatal",
                        slot,
                        error=f"worker {slot} exited (code {code}) before its tracker was loaded",
                    )
                )
                continue
            self._spawn(slot)
        return out

    def abandon(self) -> None:
        """Terminate the workers that are running a video (their videos keep no manifest)."""
        for w in self._workers.values():
            if w.job is not None and w.proc.is_alive():
                w.proc.terminate()
        for w in self._workers.values():
            w.proc.join(timeout=5)
            if w.proc.is_alive():
                w.proc.kill()
            w.job = None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for w in self._workers.values():
            if w.proc.is_alive():
                try:
                    w.tasks.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 10
        for w in self._workers.values():
            w.proc.join(timeout=max(0.1, deadline - time.monotonic()))
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(timeout=5)
        for w in self._workers.values():
            w.tasks.close()
            w.tasks.join_thread()
        self._events.close()
        self._events.join_thread()


class InlineExecutor:
    """Runs each job in the calling thread during :meth:`poll` (``workers=0``: debugging, the Python API)."""

    slots = 1

    def __init__(self, options: TrackOptions) -> None:
        self.options = options
        self._runner: JobRunner | None = None
        self._job: VideoJob | None = None
        self.cancel_requested = False
        #: polled between frames: True cancels the running video (the batch sets it to its second-signal check)
        self.cancel_check: Callable[[], bool] = lambda: False

    def start(self) -> None:
        self._runner = JobRunner(self.options, worker="inline")

    def idle(self) -> list[int]:
        return [0] if self._job is None else []

    def submit(self, slot: int, job: VideoJob) -> None:
        self._job = job

    def poll(self, timeout: float) -> list[Event]:
        job, self._job = self._job, None
        if job is None:
            time.sleep(min(timeout, 0.05))
            return []
        assert self._runner is not None
        result = self._runner.run(job, lambda frames: not (self.cancel_requested or self.cancel_check()))
        return [Event("result", 0, job.key, result.frames, result)]

    def abandon(self) -> None:
        self.cancel_requested = True

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        self._runner = None


__all__ = ["Event", "Executor", "InlineExecutor", "LocalExecutor"]
