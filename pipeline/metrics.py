"""Per-node pipeline metrics: live counters (:class:`NodeMetrics`) and plain snapshots (:class:`MetricsSnapshot`).

A node is the source, a stage or a sink.  :class:`NodeMetrics` is written by the node's own thread and read by any
thread (``pipeline.metrics()``); one lock guards it, and every sample series is a ring of the last ``window``
values, so memory stays bounded however long the stream runs.  Snapshots are frozen dataclasses of plain numbers,
JSON-able through :meth:`MetricsSnapshot.as_dict`, with :meth:`MetricsSnapshot.samples` for a Prometheus exporter.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

logger = logging.getLogger(__name__)

#: Samples kept per series (latency, age, output times).
WINDOW = 512


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation (NumPy's default method).

    NaN for an empty sequence.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class Ring:
    """The last ``maxlen`` float samples.  Not locked itself: :class:`NodeMetrics` guards it."""

    def __init__(self, maxlen: int = WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=maxlen)

    def add(self, value: float) -> None:
        self._values.append(value)

    def percentiles(self, *qs: float) -> tuple[float, ...]:
        values = list(self._values)
        return tuple(percentile(values, q) for q in qs)

    def values(self) -> list[float]:
        return list(self._values)

    def __len__(self) -> int:
        return len(self._values)


class QueueLike(Protocol):
    """What a snapshot reads from a node's input queue (:class:`~.queues.BoundedQueue` provides it)."""

    capacity: int
    policy: str
    drops: int
    discarded: int
    max_depth: int

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class NodeSnapshot:
    """One node's metrics at one moment.  Times in milliseconds; NaN when no sample exists yet."""

    name: str
    kind: str  # "source" | "stage" | "sink"
    frames_in: int = 0
    frames_out: int = 0
    filtered: int = 0
    drops: int = 0
    discarded: int = 0
    queue_depth: int = 0
    queue_max: int = 0
    queue_capacity: int = 0
    policy: str = ""
    latency_ms_p50: float = math.nan
    latency_ms_p95: float = math.nan
    age_ms_p50: float = math.nan
    age_ms_p95: float = math.nan
    fps: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """Plain JSON-able dict; NaN becomes None."""
        d = asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


@dataclass(frozen=True)
class MetricsSnapshot:
    """Every node's metrics at one moment, in pipeline order (source, stages, sinks).

    ``frames``: items that left the last stage so far (the source when there is no stage): a progress count.
    """

    pipeline: str
    elapsed_s: float
    nodes: tuple[NodeSnapshot, ...] = ()
    frames: int = 0

    def __getitem__(self, name: str) -> NodeSnapshot:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(
            f"no node named {name!r} in pipeline '{self.pipeline}'; "
            f"known: {', '.join(n.name for n in self.nodes)}"
        )

    @property
    def source(self) -> NodeSnapshot:
        """The source's node (the first; named ``source:<id>``)."""
        return self.nodes[0]

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def as_dict(self) -> dict[str, object]:
        """JSON-able: ``{"pipeline", "elapsed_s", "frames", "nodes": [node.as_dict(), ...]}``."""
        return {
            "pipeline": self.pipeline,
            "elapsed_s": self.elapsed_s,
            "frames": self.frames,
            "nodes": [n.as_dict() for n in self.nodes],
        }

    def summary(self) -> str:
        """One line for logs: per node frames out, fps, p95 latency, queue depth and drops."""
        parts = []
        for n in self.nodes:
            text = f"{n.name} {n.frames_out}f {n.fps:.1f}fps"
            if not math.isnan(n.latency_ms_p95):
                text += f" p95 {n.latency_ms_p95:.1f}ms"
            if n.queue_capacity:
                text += f" q{n.queue_depth}/{n.queue_capacity}"
            if n.drops:
                text += f" drop {n.drops}"
            parts.append(text)
        return f"[{self.pipeline} {self.elapsed_s:.1f}s {self.frames}f] " + " | ".join(parts)

    _COUNTERS = ("frames_in", "frames_out", "filtered", "drops", "discarded")
    _GAUGES = (
        "queue_depth",
        "queue_max",
        "queue_capacity",
        "latency_ms_p50",
        "latency_ms_p95",
        "age_ms_p50",
        "age_ms_p95",
        "fps",
    )

    def samples(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """``(metric, labels, value)`` for every numeric field, Prometheus-style names
        (``vostream_node_frames_out_total``, ``vostream_node_fps``, ...).  NaN values are skipped; numeric
        ``extra`` entries appear as ``vostream_node_extra`` with a ``key`` label."""
        for n in self.nodes:
            labels = {"pipeline": self.pipeline, "node": n.name, "kind": n.kind}
            for f in self._COUNTERS:
                yield f"vostream_node_{f}_total", labels, float(getattr(n, f))
            for f in self._GAUGES:
                v = float(getattr(n, f))
                if not math.isnan(v):
                    yield f"vostream_node_{f}", labels, v
            for k, value in n.extra.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    yield "vostream_node_extra", {**labels, "key": str(k)}, float(value)


class NodeMetrics:
    """Live counters of one node.  Written by the node's thread, read by any thread; one lock guards it.

    ``clock`` (monotonic seconds) times latencies and rates; ``wall`` (epoch seconds, like ``Frame.capture_time``)
    measures frame age.  Inject a :class:`~vostream.pipeline.testing.ManualClock` in tests.
    """

    def __init__(
        self,
        name: str,
        kind: str,
        queue: QueueLike | None = None,
        *,
        window: int = WINDOW,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.kind = kind
        self.queue = queue
        self.clock = clock
        self.wall = wall
        self._lock = threading.Lock()
        self.frames_in = 0
        self.frames_out = 0
        self.filtered = 0
        self._latency = Ring(window)
        self._age = Ring(window)
        self._out_times = Ring(window)
        self._extra: dict[str, object] = {}

    def record_in(self) -> None:
        with self._lock:
            self.frames_in += 1

    def record_latency(self, seconds: float) -> None:
        with self._lock:
            self._latency.add(seconds)

    def record_filtered(self) -> None:
        with self._lock:
            self.filtered += 1

    def record_out(self, item: object = None) -> None:
        """One item left the node; its age is taken from ``item.capture_time`` when that is set (non-zero)."""
        now = self.clock()
        capture = getattr(item, "capture_time", None)
        age = None
        if isinstance(capture, (int, float)) and not isinstance(capture, bool) and capture > 0:
            age = self.wall() - float(capture)
        with self._lock:
            self.frames_out += 1
            self._out_times.add(now)
            if age is not None:
                self._age.add(age)

    def set_extra(self, stats: dict[str, object]) -> None:
        """Replace the object's own ``stats()`` dict (called from the node's thread)."""
        with self._lock:
            self._extra = dict(stats)

    def snapshot(self) -> NodeSnapshot:
        with self._lock:
            lat50, lat95 = self._latency.percentiles(50, 95)
            age50, age95 = self._age.percentiles(50, 95)
            times = self._out_times.values()
            fps = 0.0
            if len(times) >= 2 and times[-1] > times[0]:
                fps = (len(times) - 1) / (times[-1] - times[0])
            q = self.queue
            return NodeSnapshot(
                name=self.name,
                kind=self.kind,
                frames_in=self.frames_in,
                frames_out=self.frames_out,
                filtered=self.filtered,
                drops=q.drops if q is not None else 0,
                discarded=q.discarded if q is not None else 0,
                queue_depth=len(q) if q is not None else 0,
                queue_max=q.max_depth if q is not None else 0,
                queue_capacity=q.capacity if q is not None else 0,
                policy=q.policy if q is not None else "",
                latency_ms_p50=lat50 * 1e3,
                latency_ms_p95=lat95 * 1e3,
                age_ms_p50=age50 * 1e3,
                age_ms_p95=age95 * 1e3,
                fps=fps,
                extra=dict(self._extra),
            )


def snapshot_all(
    pipeline: str, elapsed_s: float, nodes: Iterable[NodeMetrics], frames: int = 0
) -> MetricsSnapshot:
    return MetricsSnapshot(pipeline, elapsed_s, tuple(n.snapshot() for n in nodes), frames)


__all__ = ["WINDOW", "MetricsSnapshot", "NodeMetrics", "NodeSnapshot", "Ring", "percentile", "snapshot_all"]
