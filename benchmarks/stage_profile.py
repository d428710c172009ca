"""Where a running pipeline's time goes, per node: wall time, CPU time and GIL-held time.

Used by ``bench_pipeline.py --profile``.  Three instruments, all run on the real :class:`Pipeline` (its threads,
its queues):

* :func:`timed` wraps the source, each stage and each sink spec in a proxy that keeps the wrapped object's name
  and contract and measures, in the node's own thread, the wall time and the thread's CPU time
  (``time.thread_time``) of every ``read``/``process``/``write`` call, plus the thread's whole CPU time from
  ``open`` to ``close`` (the engine's own per-item work in that thread is the difference);
* :class:`NativeThreads` samples ``/proc`` (psutil) for the CPU time of threads Python did not start: FFmpeg's
  decoder threads (named ``av:<codec>:...``) and the encoder's and OpenCV's pools;
* :class:`GilSampler` attaches ``py-spy record --gil`` (``$PY_SPY`` or the one on ``PATH``) to this process: a sample is recorded only for the thread
  that holds the GIL, so ``samples / rate`` is the time each Python thread held it.  Needs py-spy and ptrace
  permission; without them the GIL column is empty and the reason is printed.

A thread's CPU time minus its GIL-held time is work done with the GIL released (OpenCV, NumPy on large arrays,
PyAV): the part that can overlap with other threads.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from vostream.pipeline import Sink, SinkSpec, Source, Stage


@dataclass
class NodeTimes:
    """What one node's proxy measured (seconds)."""

    name: str
    kind: str
    calls: int = 0
    wall_s: float = 0.0  # inside read/process/write
    thread_cpu_s: float = 0.0  # this thread's CPU from open() to close(): the engine's work included
    thread_name: str = ""
    _cpu_at_open: float | None = None

    def opened(self) -> None:
        if self._cpu_at_open is None:
            self._cpu_at_open = time.thread_time()
            self.thread_name = threading.current_thread().name

    def closed(self) -> None:
        if self._cpu_at_open is not None:
            self.thread_cpu_s = time.thread_time() - self._cpu_at_open


class _Clock:
    """Wall time of each call.  (No per-call ``thread_time``: it is a system call, and py-spy's samples pile up
    on system calls made while holding the GIL; the thread's CPU time is read at open and close only.)"""

    __slots__ = ("times", "wall")

    def __init__(self, times: NodeTimes) -> None:
        self.times = times
        self.wall = 0.0

    def __enter__(self) -> None:
        self.wall = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.times.calls += 1
        self.times.wall_s += time.perf_counter() - self.wall


class TimedSource(Source[Any]):
    def __init__(self, inner: Source[Any], times: NodeTimes) -> None:
        self.inner, self.times, self._clock = inner, times, _Clock(times)
        self.name, self.live, self.length = inner.name, inner.live, inner.length

    def open(self) -> None:
        self.times.opened()
        self.inner.open()

    def read(self) -> Any:
        with self._clock:
            return self.inner.read()

    def interrupt(self) -> None:
        self.inner.interrupt()

    def close(self) -> None:
        self.inner.close()
        self.times.closed()

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()


class TimedStage(Stage[Any, Any]):
    def __init__(self, inner: Stage[Any, Any], times: NodeTimes) -> None:
        self.inner, self.times, self._clock = inner, times, _Clock(times)
        self.name = inner.name

    def bind_should_stop(self, should_stop: Any) -> None:
        bind = getattr(self.inner, "bind_should_stop", None)
        if callable(bind):
            bind(should_stop)

    def open(self) -> None:
        self.times.opened()
        self.inner.open()

    def process(self, item: Any) -> Any:
        with self._clock:
            return self.inner.process(item)

    def finish(self) -> Iterable[Any]:
        return self.inner.finish()

    def handle_control(self, message: Any) -> bool:
        return self.inner.handle_control(message)

    def close(self) -> None:
        self.inner.close()
        self.times.closed()

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()


class TimedSink(Sink[Any]):
    def __init__(self, inner: Sink[Any], times: NodeTimes) -> None:
        self.inner, self.times, self._clock = inner, times, _Clock(times)
        self.name = inner.name

    def open(self) -> None:
        self.times.opened()
        self.inner.open()

    def write(self, item: Any) -> None:
        with self._clock:
            self.inner.write(item)

    def close(self) -> None:
        self.inner.close()
        self.times.closed()

    def stats(self) -> dict[str, Any]:
        return self.inner.stats()


class TimedSinkSpec(SinkSpec[Any]):
    def __init__(self, inner: SinkSpec[Any], times: NodeTimes) -> None:
        self.inner, self.times = inner, times
        self.name, self.policy, self.queue_size = inner.name, inner.policy, inner.queue_size

    def build(self) -> Sink[Any]:
        return TimedSink(self.inner.build(), self.times)


def timed(
    source: Source[Any], stages: list[Stage[Any, Any]], sinks: list[SinkSpec[Any]]
) -> tuple[Source[Any], list[Stage[Any, Any]], list[SinkSpec[Any]], list[NodeTimes]]:
    """Proxies of ``source``, ``stages`` and ``sinks`` and the :class:`NodeTimes` they fill, in pipeline order."""
    times = [NodeTimes(source.name, "source")]
    src = TimedSource(source, times[0])
    wrapped = []
    for s in stages:
        times.append(NodeTimes(s.name, "stage"))
        wrapped.append(TimedStage(s, times[-1]))
    specs = []
    for k in sinks:
        times.append(NodeTimes(k.name, "sink"))
        specs.append(TimedSinkSpec(k, times[-1]))
    return src, wrapped, specs, times


class NativeThreads:
    """CPU seconds of this process's threads that Python did not start, grouped by their OS name (``comm``).

    Samples ``/proc`` every ``every`` seconds while running (a thread's last sample before it exits is kept, so
    up to ``every`` seconds of a short-lived thread's CPU can be missed)."""

    def __init__(self, every: float = 0.1) -> None:
        import psutil

        self._proc = psutil.Process()
        self._every = every
        self._seen: dict[int, tuple[str, float]] = {}
        self._base: dict[int, float] = {}
        self._python_tids: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="native-threads-sampler")

    def _sample(self) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in self._proc.threads()}

    def _comm(self, tid: int) -> str:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return "?"

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            for tid, cpu in self._sample().items():
                if tid not in self._seen:
                    self._seen[tid] = (self._comm(tid), cpu)
                else:
                    self._seen[tid] = (self._seen[tid][0], cpu)

    def start(self) -> None:
        self._base = self._sample()
        self._thread.start()

    def exclude(self, native_ids: Iterable[int]) -> None:
        """Threads started by Python (the pipeline's): the proxies measure them instead."""
        self._python_tids.update(native_ids)

    def stop(self) -> dict[str, float]:
        """{group: CPU seconds} of the non-Python threads since :meth:`start`."""
        self._stop.set()
        self._thread.join()
        python_ids = {t.native_id for t in threading.enumerate()} | self._python_tids
        groups: Counter[str] = Counter()
        for tid, (comm, cpu) in self._seen.items():
            if tid not in python_ids:
                groups[_native_group(comm)] += cpu - self._base.get(tid, 0.0)
        return dict(groups)


def _native_group(comm: str) -> str:
    if comm.startswith("av:"):
        return f"FFmpeg {comm.split(':')[1]} threads" if comm.count(":") >= 2 else "FFmpeg threads"
    return "other native threads (x264, OpenCV pools)"


class GilSampler:
    """``py-spy record --gil`` on this process: per Python thread, the seconds it held the GIL.

    :attr:`error` says why nothing was measured (py-spy missing, ptrace refused).  By default py-spy samples
    without pausing the process (``--nonblocking``): checked against ``bench_pipeline``'s stand-in tracker, that
    read 5-10 % for a GIL-free stage and 57-61 % for one holding the GIL ~55 % of its time, while pausing the
    process per sample read 86-88 % for the latter.  What is measured is wall time holding the GIL: a holder the
    OS preempts (a loaded machine) keeps it, so under load the figures grow.  py-spy can also fall behind (it then
    warns, kept in :attr:`warnings`)."""

    def __init__(self, rate: int = 250, keep: str | None = None, nonblocking: bool = True) -> None:
        self.rate = rate
        self.nonblocking = nonblocking
        self.keep = keep  # copy py-spy's raw output (collapsed stacks) here
        self.error: str | None = None
        self.warnings: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._dir = tempfile.mkdtemp(prefix="gil-")
        self._out = os.path.join(self._dir, "gil.txt")

    def start(self) -> None:
        exe = os.environ.get("PY_SPY") or shutil.which("py-spy")
        if exe is None:
            self.error = "py-spy is not installed (pip install py-spy, or PY_SPY=/path/to/py-spy)"
            return
        cmd = [exe, "record", "--gil", "--threads", "--format", "raw"]
        if self.nonblocking:
            cmd.append("--nonblocking")
        cmd += ["--rate", str(self.rate), "--pid", str(os.getpid()), "--output", self._out]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(0.5)  # attach before the measured run starts
        if self._proc.poll() is not None:
            out = self._proc.communicate()[0].strip().splitlines()
            self.error = (
                f"py-spy could not attach: {out[-1] if out else 'exit ' + str(self._proc.returncode)}"
            )
            self._proc = None

    def stop(self) -> dict[str, float]:
        """{Python thread name: seconds holding the GIL}."""
        if self._proc is None:
            return {}
        self._proc.send_signal(signal.SIGINT)
        try:
            out = self._proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            self._proc.kill()
            out = self._proc.communicate()[0]
        self.warnings = [line.strip() for line in out.splitlines() if "behind" in line]
        held: Counter[str] = Counter()
        try:
            with open(self._out, encoding="utf-8") as fh:
                for line in fh:
                    stack, _, count = line.rstrip("\n").rpartition(" ")
                    head = stack.split(";", 1)[0]
                    m = re.match(r"thread \((?:0x)?[0-9a-fA-F]+\)(?:: (.*))?", head)
                    name = (m.group(1) or "?") if m else head
                    held[name] += int(count)
        except OSError as exc:
            self.error = f"py-spy wrote no samples: {exc}"
            return {}
        finally:
            if self.keep and os.path.exists(self._out):
                shutil.copyfile(self._out, self.keep)
            shutil.rmtree(self._dir, ignore_errors=True)
        return {name: n / self.rate for name, n in held.items()}
