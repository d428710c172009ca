"""The dataflow engine: a source, a chain of stages and a fan-out of sinks, each in its own thread.

See ``docs/pipeline.md`` for the full behaviour.  In short: nodes are joined by :class:`~.queues.BoundedQueue`
edges (``block`` or ``latest``); end of stream flows as a marker; :meth:`Pipeline.stop` drains,
:meth:`Pipeline.cancel` discards; the first exception anywhere stops the pipeline (upstream aborted, downstream
drained, every ``close()`` called once) and :meth:`Pipeline.wait` raises it, wrapped in :class:`StageError`
unless it already is a :class:`VostreamError`.

Thread-safety: every public method of :class:`Pipeline` may be called from any thread; :meth:`Pipeline.stop` and
:meth:`Pipeline.cancel` only set flags, so they are also safe inside signal handlers.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, cast

from .errors import ConfigError, Interrupted, StageError, VostreamError
from .metrics import MetricsSnapshot, NodeMetrics, snapshot_all
from .queues import EMPTY, POLL_S, BoundedQueue
from .stage import BLOCK, LATEST, POLICIES, Sink, SinkSpec, Source, Stage

if TYPE_CHECKING:
    from typing_extensions import Never

logger = logging.getLogger(__name__)

#: How often (seconds) a node refreshes its object's ``stats()`` into the metrics.
STATS_EVERY_S = 0.25

#: How long (seconds) a stop by a signal finishes the items in flight before it discards the rest: long enough for
#: the few frames queued in an ordinary run, short where each frame is slow (hundreds of objects).  Outputs are
#: final either way.
STOP_DRAIN_S = 1.0

#: Default byte budget of one pipeline's queues (``max_queue_bytes``), shared evenly by its edges.
DEFAULT_MAX_QUEUE_BYTES = 256 * 1024 * 1024


class _EndOfStream:
    def __repr__(self) -> str:
        return "END_OF_STREAM"


#: the marker a node puts on its output queues when it ends
END_OF_STREAM: Final = _EndOfStream()


# ---------------------------------------------------------------------------------------------------------------
# Public result types
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunReport:
    """What a finished run did.  ``frames``: items that left the last stage (the source when there is none).

    ``reason``: ``"end"`` (end of stream), ``"stop"``, ``"cancel"``, ``"signal"`` or ``"error"``.
    ``interrupted`` is True when the run ended before the end of stream for any reason but an error.
    """

    name: str
    frames: int
    wall_s: float
    fps: float
    interrupted: bool
    cancelled: bool
    reason: str
    metrics: MetricsSnapshot
    error: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "frames": self.frames,
            "wall_s": self.wall_s,
            "fps": self.fps,
            "interrupted": self.interrupted,
            "cancelled": self.cancelled,
            "reason": self.reason,
            "error": self.error,
            "metrics": self.metrics.as_dict(),
        }

    @classmethod
    def of(
        cls,
        name: str,
        wall: float,
        frames: int,
        reason: str,
        cancelled: bool,
        metrics: MetricsSnapshot,
        error: tuple[_Node, BaseException] | None,
    ) -> RunReport:
        """The report of a run that took ``wall`` seconds and ended for ``reason`` (:func:`_end_reason`)."""
        return cls(
            name=name,
            frames=frames,
            wall_s=wall,
            fps=frames / wall if wall > 0 else 0.0,
            interrupted=reason in ("stop", "cancel", "signal"),
            cancelled=cancelled,
            reason=reason,
            metrics=metrics,
            error=None
            if error is None
            else f"{error[0].kind} '{error[0].name}': {type(error[1]).__name__}: {error[1]}",
        )

    def summary(self) -> str:
        head = f"{self.name}: {self.frames} frames in {self.wall_s:.2f}s ({self.fps:.1f} fps), {self.reason}"
        return head + "\n" + self.metrics.summary()


class ControlReceipt:
    """Tracks one control message across the stages.  Thread-safe.

    ``consumed_by``: stages whose ``handle_control`` returned True; ``errors``: ``(stage, ConfigError)`` pairs;
    ``undelivered``: stages that ended before they could take it.  :meth:`wait` returns once every stage is done.
    """

    def __init__(self, message: object, stages: Sequence[str]) -> None:
        self.message = message
        self.consumed_by: list[str] = []
        self.errors: list[tuple[str, BaseException]] = []
        self.undelivered: list[str] = []
        self._pending = set(stages)
        self._lock = threading.Lock()
        self._done = threading.Event()
        if not self._pending:
            self._done.set()

    def _settle(
        self, stage: str, consumed: bool = False, error: BaseException | None = None, delivered: bool = True
    ) -> None:
        with self._lock:
            if consumed:
                self.consumed_by.append(stage)
            if error is not None:
                self.errors.append((stage, error))
            if not delivered:
                self.undelivered.append(stage)
            self._pending.discard(stage)
            finished = not self._pending
        if finished:
            if not self.consumed_by and not self.errors:
                logger.warning("control message %r was not consumed by any stage", self.message)
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def consumed(self) -> bool:
        return bool(self.consumed_by)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every stage handled (or could no longer take) the message; False on timeout."""
        return self._done.wait(timeout)


# ---------------------------------------------------------------------------------------------------------------
# Internal node state
# ---------------------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Node:
    """One thread's worth of state.  ``order``: 0 source, 1..n stages, n+1 sinks (for upstream/downstream)."""

    name: str
    kind: str
    order: int
    obj: Source[object] | Stage[Never, object] | SinkSpec[Never]
    inq: BoundedQueue[object] | None
    outs: list[BoundedQueue[object]]
    metrics: NodeMetrics
    controls: deque[tuple[object, ControlReceipt]] = field(default_factory=deque)
    abort: bool = False  # discard queued items and leave (set by cancel or by an error downstream)
    thread: threading.Thread | None = None
    ordinal: int = 0  # items received (stages, sinks) or read (source)
    stats_at: float = 0.0
    ended: bool = False


def _unique(names: Sequence[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}#{seen[n]}")
    return out


def _frame_index(item: object, ordinal: int) -> int:
    index = getattr(item, "index", None)
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    return ordinal


def _check_parts(
    name: str,
    source: object,
    stages: Sequence[object],
    sinks: Sequence[object],
    queue_size: object,
    max_queue_bytes: object,
) -> None:
    """A :class:`ConfigError` naming the pipeline for a part that is not a Source/Stage/SinkSpec or a bad bound."""
    if not isinstance(source, Source):
        raise ConfigError(f"pipeline '{name}': source must be a vostream Source, got {type(source).__name__}")
    for s in stages:
        if not isinstance(s, Stage):
            raise ConfigError(
                f"pipeline '{name}': every stage must be a vostream Stage, got {type(s).__name__}"
            )
    for spec in sinks:
        if not isinstance(spec, SinkSpec):
            raise ConfigError(
                f"pipeline '{name}': every sink must be a SinkSpec (an inert description whose "
                f"build() makes the sink), got {type(spec).__name__}"
            )
    if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
        raise ConfigError(f"pipeline '{name}': queue_size must be an integer >= 1, got {queue_size!r}")
    if max_queue_bytes is not None and (
        isinstance(max_queue_bytes, bool) or not isinstance(max_queue_bytes, int) or max_queue_bytes < 1
    ):
        raise ConfigError(
            f"pipeline '{name}': max_queue_bytes must be an integer >= 1 or None, got {max_queue_bytes!r}"
        )


def _build_graph(
    name: str,
    source: Source[object],
    stages: Sequence[Stage[Never, object]],
    sinks: Sequence[SinkSpec[Never]],
    policy: str | Mapping[str, str] | None,
    queue_size: int,
    max_queue_bytes: int | None,
) -> list[_Node]:
    """The nodes in pipeline order (source, stages, sinks), each stage's and sink's input edge a bounded queue with
    its policy (see :class:`Pipeline`); the byte budget split evenly between the edges."""
    edges = len(stages) + len(sinks)
    edge_bytes = None if max_queue_bytes is None or not edges else max(1, max_queue_bytes // edges)
    default = LATEST if getattr(source, "live", False) else BLOCK
    per_edge: Mapping[str, str] = {}
    if isinstance(policy, str):
        default = policy
    elif policy is not None:
        per_edge = dict(policy)
    names = _unique([source.name] + [s.name for s in stages] + [s.name for s in sinks])
    src_name, stage_names, sink_names = names[0], names[1 : 1 + len(stages)], names[1 + len(stages) :]
    for p in [default, *per_edge.values()]:
        if p not in POLICIES:
            raise ConfigError(f"pipeline '{name}': unknown edge policy {p!r}; use 'block' or 'latest'")
    unknown = set(per_edge) - set(stage_names) - set(sink_names)
    if unknown:
        raise ConfigError(
            f"pipeline '{name}': policy names unknown edge(s) {sorted(unknown)}; edges are named "
            f"after their consumer: {', '.join(stage_names + sink_names) or '(none)'}"
        )
    prev = _Node(src_name, "source", 0, source, None, [], NodeMetrics(src_name, "source"))
    nodes = [prev]
    for i, (stage, sname) in enumerate(zip(stages, stage_names), start=1):
        q: BoundedQueue[object] = BoundedQueue(queue_size, per_edge.get(sname, default), sname, edge_bytes)
        node = _Node(sname, "stage", i, stage, q, [], NodeMetrics(sname, "stage", q))
        prev.outs.append(q)
        nodes.append(node)
        prev = node
    for spec, kname in zip(sinks, sink_names):  # every sink reads the last stage's output
        pol = per_edge.get(kname) or spec.policy or default
        if pol not in POLICIES:
            raise ConfigError(f"sink '{kname}': unknown policy {pol!r}; use 'block', 'latest' or None")
        q = BoundedQueue(spec.queue_size, pol, kname, edge_bytes)
        prev.outs.append(q)
        nodes.append(_Node(kname, "sink", len(stages) + 1, spec, q, [], NodeMetrics(kname, "sink", q)))
    return nodes


def _refresh_stats(
    node: _Node, obj: Source[object] | Stage[object, object] | Sink[object], force: bool = False
) -> None:
    """Copy ``obj.stats()`` into the node's metrics, at most every :data:`STATS_EVERY_S` unless ``force``."""
    now = time.monotonic()
    if not force and now - node.stats_at < STATS_EVERY_S:
        return
    node.stats_at = now
    try:
        stats = obj.stats()
    except Exception:  # stats are best effort: never fail a run for them
        logger.exception("%s '%s': stats() failed", node.kind, node.name)
        return
    if stats:
        node.metrics.set_extra(stats)


def _raise(pipeline: str, error: tuple[_Node, BaseException, int | None] | None) -> None:
    """Raise a run's first error: a :class:`VostreamError` as is (noting where it happened), anything else as a
    :class:`StageError` naming the node, with the original as ``__cause__``."""
    if error is None:
        return
    node, exc, index = error
    if isinstance(exc, VostreamError):
        note = f"(in pipeline '{pipeline}', {node.kind} '{node.name}')"
        if hasattr(exc, "add_note") and note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        raise exc
    raise StageError(node.name, f"{type(exc).__name__}: {exc}", index) from exc


def _queue_control(stages: Sequence[_Node], message: object, lock: threading.Lock) -> ControlReceipt:
    """Append ``message`` to every stage's controls (settled at once for a stage that has ended) and wake it."""
    receipt = ControlReceipt(message, [n.name for n in stages])
    for node in stages:
        with lock:
            if node.ended:
                receipt._settle(node.name, delivered=False)
                continue
            node.controls.append((message, receipt))
        assert node.inq is not None
        node.inq.wake()
    return receipt


def _deliver_controls(node: _Node, stage: Stage[object, object], lock: threading.Lock) -> None:
    """Hand the node's queued control messages to ``stage.handle_control`` in order, settling each receipt."""
    if not node.controls:  # per-item fast path without the pipeline lock (a deque's length is atomic)
        return
    while True:
        with lock:
            if not node.controls:
                return
            message, receipt = node.controls.popleft()
        try:
            consumed = bool(stage.handle_control(message))
        except ConfigError as exc:
            logger.warning("stage '%s' rejected control message %r: %s", node.name, message, exc)
            receipt._settle(node.name, error=exc)
            continue
        except BaseException:
            receipt._settle(node.name, delivered=False)
            raise
        receipt._settle(node.name, consumed=consumed)


def _end_reason(failed: bool, cancelled: bool, signalled: bool, natural_end: bool) -> str:
    """Why a run ended, for :attr:`RunReport.reason`: error, signal, cancel, end (the source ran out) or stop."""
    if failed:
        return "error"
    if cancelled:
        return "signal" if signalled else "cancel"
    if natural_end:
        return "end"
    return "signal" if signalled else "stop"


class Pipeline:
    """Run ``source`` → ``stages`` → fan-out to ``sinks``, each in its own thread, joined by bounded queues.

    ``policy``: ``None`` (``latest`` when ``source.live`` else ``block``), ``"block"``/``"latest"`` for every edge,
    or a mapping ``{edge name: policy}`` naming a stage's or sink's input edge (others follow the default).  A
    sink's ``SinkSpec.policy`` wins over the default but not over the mapping.  ``queue_size`` bounds each stage
    edge; each sink's edge holds ``SinkSpec.queue_size``.  ``max_queue_bytes`` (default 256 MiB, ``None``: no byte
    bound) is split evenly between the edges: an edge also holds at most its share in bytes of items (sized by
    ``item.nbytes``, e.g. ``Frame.nbytes``), and always one item.  A pipeline runs once.

    Types: the source is a ``Source`` of anything, each stage a ``Stage`` of whatever the node before it produces
    (``Stage[Never, object]`` accepts every stage), each sink a ``SinkSpec`` of the last node's items; that the
    chain's item types match is the caller's part (a mismatch fails in the stage that gets the wrong item).
    """

    def __init__(
        self,
        source: Source[object],
        stages: Sequence[Stage[Never, object]] = (),
        sinks: Sequence[SinkSpec[Never]] = (),
        *,
        policy: str | Mapping[str, str] | None = None,
        queue_size: int = 8,
        name: str = "pipeline",
        max_queue_bytes: int | None = DEFAULT_MAX_QUEUE_BYTES,
    ) -> None:
        _check_parts(name, source, stages, sinks, queue_size, max_queue_bytes)
        self.max_queue_bytes = max_queue_bytes
        self.name = name
        self.source = source
        self._nodes = _build_graph(name, source, stages, sinks, policy, queue_size, max_queue_bytes)
        self._stages = [n for n in self._nodes if n.kind == "stage"]
        self._sinks = [n for n in self._nodes if n.kind == "sink"]
        self._last = (
            self._stages[-1] if self._stages else self._nodes[0]
        )  # whose output is "the pipeline's output"

        self._lock = threading.Lock()
        # set from normal threads (never from a signal handler) to rouse the supervisor
        self._wake = threading.Event()
        self._done = threading.Event()
        self._all_open = threading.Event()
        self._opened = 0
        self._stop = False
        self._drain = True
        self._cancel = False
        self._signalled = False
        self._natural_end = False
        self._drain_until: float | None = None  # a drain that is not over by then becomes a cancel
        self._error: tuple[_Node, BaseException, int | None] | None = None
        self._started_at: float | None = None
        self._finished_at: float | None = None
        self._supervisor: threading.Thread | None = None
        self.report: RunReport | None = None

    # -- public API -----------------------------------------------------------------------------------------------
    @property
    def node_names(self) -> list[str]:
        """Node names in pipeline order: source, stages, sinks (edges are named after their consumer)."""
        return [n.name for n in self._nodes]

    @property
    def running(self) -> bool:
        return self._started_at is not None and not self._done.is_set()

    def start(self) -> None:
        """Start every thread.  Raises :class:`ConfigError` if this pipeline was started before."""
        with self._lock:
            if self._started_at is not None:
                raise ConfigError(
                    f"pipeline '{self.name}' was already started; build a new Pipeline to run again"
                )
            self._started_at = time.monotonic()
        if not self._sinks and not self._stages:
            logger.info("pipeline '%s' has no stages and no sinks: items are read and discarded", self.name)
        if len(self._nodes) == 1:
            self._all_open.set()
        runners = {"source": self._run_source, "stage": self._run_stage, "sink": self._run_sink}
        for node in self._nodes:
            node.thread = threading.Thread(
                target=runners[node.kind], args=(node,), daemon=True, name=f"vostream-{self.name}-{node.name}"
            )
        for node in self._nodes:
            assert node.thread is not None
            node.thread.start()
        self._supervisor = threading.Thread(
            target=self._supervise, daemon=True, name=f"vostream-{self.name}-supervisor"
        )
        self._supervisor.start()

    def wait(self, timeout: float | None = None) -> RunReport:
        """Wait for the run to end; return its :class:`RunReport` or raise its error.

        Raises the failing node's :class:`VostreamError` as is, or :class:`StageError` naming the node (the original
        exception as ``__cause__``); ``TimeoutError`` when ``timeout`` passes first (the pipeline keeps running).
        Waits in short slices so signal handlers run promptly in the main thread.
        """
        if self._started_at is None:
            raise ConfigError(f"pipeline '{self.name}' was not started; call start() or run()")
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._done.wait(0.1):
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"pipeline '{self.name}' still running after {timeout} s; "
                        "call stop() or cancel() to end it"
                    )
        except KeyboardInterrupt as exc:  # Ctrl-C without handle_signals(): finalise outputs, then leave
            if isinstance(exc, Interrupted):
                raise
            self._signalled = True
            self.cancel()
            self._done.wait()
            raise Interrupted(f"pipeline '{self.name}' interrupted; outputs were closed") from exc
        if self._supervisor is not None:
            self._supervisor.join()
        _raise(self.name, self._error)
        assert self.report is not None
        return self.report

    def run(self) -> RunReport:
        """:meth:`start` then :meth:`wait`."""
        self.start()
        return self.wait()

    def stop(self, drain: bool = True, within_s: float | None = None) -> None:
        """End the run: the source stops; with ``drain`` every item in flight is finished (stages' ``finish()``
        included) -- for at most ``within_s`` seconds, then as by :meth:`cancel` -- else queued items are discarded
        as by :meth:`cancel`.  Idempotent; only sets flags."""
        if not drain:
            self.cancel()
            return
        if within_s is not None and self._drain_until is None:
            self._drain_until = time.monotonic() + within_s
        self._stop = True

    def cancel(self) -> None:
        """End the run now: the source stops, queued items are discarded, ``finish()`` is skipped, sinks are
        closed with what they already wrote.  Idempotent; only sets flags."""
        self._cancel = True
        self._stop = True

    def send_control(self, message: object) -> ControlReceipt:
        """Queue ``message`` for every stage's ``handle_control``, delivered in that stage's thread before its
        next item (or while it waits for one).  Thread-safe; messages keep their order per stage."""
        return _queue_control(self._stages, message, self._lock)

    def metrics(self) -> MetricsSnapshot:
        """A live snapshot of every node's metrics (safe from any thread, any time)."""
        start = self._started_at
        end = self._finished_at if self._finished_at is not None else time.monotonic()
        return snapshot_all(
            self.name,
            0.0 if start is None else end - start,
            (n.metrics for n in self._nodes),
            frames=self._last.metrics.frames_out,
        )

    def __enter__(self) -> Pipeline:  # noqa: PYI034 - Self needs Python 3.11
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._started_at is None:
            return
        if exc is not None:
            self.cancel()
            with contextlib.suppress(Exception):
                self.wait()
            return
        self.stop(drain=True)
        self.wait()

    # -- error bookkeeping ------------------------------------------------------------------------------------------
    def _fail(self, node: _Node, exc: BaseException, item: object = None) -> None:
        """Record ``exc`` from ``node``; abort every node upstream of it and stop the source."""
        if node.kind == "source":
            index: int | None = node.ordinal  # the index of the item it failed to produce
        else:
            index = None if item is None else _frame_index(item, node.ordinal - 1)
        with self._lock:
            first = self._error is None
            if first:
                self._error = (node, exc, index)
        logger.log(
            logging.ERROR if first else logging.WARNING,
            "pipeline '%s': %s '%s' %s: %s: %s",
            self.name,
            node.kind,
            node.name,
            "failed" if first else "also failed",
            type(exc).__name__,
            exc,
        )
        for other in self._nodes:
            if other.order < node.order:
                other.abort = True
        self._stop = True
        self._wake.set()

    # -- node threads -----------------------------------------------------------------------------------------------
    def _aborted(self, node: _Node) -> bool:
        return node.abort or self._cancel

    def _mark_open(self) -> None:
        with self._lock:
            self._opened += 1
            if self._opened >= len(self._nodes) - 1:
                self._all_open.set()

    def _emit(self, node: _Node, item: object) -> None:
        stamps = getattr(item, "stamps", None)
        if isinstance(stamps, dict):
            stamps[node.name] = time.monotonic()
        node.metrics.record_out(item)
        for q in node.outs:
            q.put(item, abort=lambda: self._aborted(node))

    def _end_node(
        self, node: _Node, obj: Source[object] | Stage[object, object] | Sink[object] | None
    ) -> None:
        """Common exit: refuse further input, close, pass the end marker on, settle pending controls.

        Closing before passing the marker on keeps the documented order: the source is closed before any stage,
        stages before the sinks."""
        if node.inq is not None:
            node.inq.close()
        if obj is not None:
            try:
                obj.close()
            except BaseException as exc:  # noqa: BLE001 - reported through wait()
                self._fail(node, exc)
            _refresh_stats(node, obj, force=True)
        for q in node.outs:
            q.put_final(END_OF_STREAM)
        with self._lock:
            node.ended = True
            pending = list(node.controls)
            node.controls.clear()
        for _, receipt in pending:
            receipt._settle(node.name, delivered=False)
        self._wake.set()

    def _run_source(self, node: _Node) -> None:
        source = cast("Source[object]", node.obj)
        try:
            source.open()
            while not self._all_open.wait(POLL_S):
                if self._aborted(node) or self._stop:
                    return
            while not (self._stop or self._aborted(node)):
                t0 = time.monotonic()
                try:
                    item = source.read()
                except BaseException as exc:
                    if self._stop:
                        logger.debug(
                            "source '%s' raised after stop was requested (treated as end): %s", node.name, exc
                        )
                        return
                    raise
                if item is None:
                    self._natural_end = not self._stop  # an interrupted read also returns None
                    return
                node.metrics.record_latency(time.monotonic() - t0)
                node.ordinal += 1
                self._emit(node, item)
                _refresh_stats(node, source)
        except BaseException as exc:  # noqa: BLE001 - reported through wait()
            self._fail(node, exc)
        finally:
            self._end_node(node, source)

    def _run_stage(self, node: _Node) -> None:
        # each stage gets what the node before it produced: matching the chain's item types is the caller's part
        stage = cast("Stage[object, object]", node.obj)
        inq = node.inq
        assert inq is not None
        item: object = None
        try:
            bind = getattr(stage, "bind_should_stop", None)
            if callable(bind):  # optional hook: long process() calls may poll it and give up early on cancel
                bind(lambda: self._aborted(node))
            stage.bind_output(max((q.capacity for q in node.outs), default=0))
            stage.open()
            self._mark_open()
            while True:
                item = None
                _deliver_controls(node, stage, self._lock)
                if self._aborted(node):
                    inq.clear()
                    return
                got = inq.get(POLL_S)
                if got is EMPTY:
                    continue
                if got is END_OF_STREAM:
                    _deliver_controls(node, stage, self._lock)
                    item = None
                    for out in stage.finish():
                        if self._aborted(node):
                            break
                        self._emit(node, out)
                    return
                item = got
                # a control sent while this stage waited for the item must apply before it is processed
                _deliver_controls(node, stage, self._lock)
                node.ordinal += 1
                node.metrics.record_in()
                t0 = time.monotonic()
                out = stage.process(item)
                node.metrics.record_latency(time.monotonic() - t0)
                if out is None:
                    node.metrics.record_filtered()
                else:
                    self._emit(node, out)
                _refresh_stats(node, stage)
        except BaseException as exc:  # noqa: BLE001 - reported through wait()
            self._fail(node, exc, item)
        finally:
            self._end_node(node, stage)

    def _run_sink(self, node: _Node) -> None:
        spec = cast("SinkSpec[object]", node.obj)
        inq = node.inq
        assert inq is not None
        sink: Sink[object] | None = None
        item: object = None
        try:
            sink = spec.build()
            sink.open()
            self._mark_open()
            while True:
                if self._aborted(node):
                    inq.clear()
                    return
                got = inq.get(POLL_S)
                if got is EMPTY:
                    continue
                if got is END_OF_STREAM:
                    return
                item = got
                node.ordinal += 1
                node.metrics.record_in()
                t0 = time.monotonic()
                sink.write(item)
                node.metrics.record_latency(time.monotonic() - t0)
                node.metrics.record_out(item)
                _refresh_stats(node, sink)
        except BaseException as exc:  # noqa: BLE001 - reported through wait()
            self._fail(node, exc, item)
        finally:
            self._end_node(node, sink)

    # -- supervisor ---------------------------------------------------------------------------------------------
    def _supervise(self) -> None:
        """Turn stop/cancel flags into actions (interrupt the source, abort nodes), join every node thread,
        then publish the report.  Polls: flags may be set from a signal handler, which must not touch locks."""
        interrupted = False
        cancelled = False
        source_node = self._nodes[0]
        threads = [n.thread for n in self._nodes if n.thread is not None]
        while any(t.is_alive() for t in threads):
            self._wake.wait(POLL_S)
            self._wake.clear()
            if self._drain_until is not None and not self._cancel and time.monotonic() >= self._drain_until:
                logger.warning(
                    "pipeline '%s': still draining after the stop's time limit: cancelling", self.name
                )
                self._cancel = True
            if self._cancel and not cancelled:
                cancelled = True
                for n in self._nodes:
                    n.abort = True
            if (
                self._stop
                and not interrupted
                and source_node.thread is not None
                and source_node.thread.is_alive()
            ):
                interrupted = True
                try:
                    self.source.interrupt()
                except Exception:
                    logger.exception("source '%s': interrupt() failed", source_node.name)
        for t in threads:
            t.join()
        self._finished_at = time.monotonic()
        self.report = RunReport.of(
            self.name,
            self._finished_at - (self._started_at or self._finished_at),
            self._last.metrics.frames_out,
            _end_reason(self._error is not None, self._cancel, self._signalled, self._natural_end),
            self._cancel,
            self.metrics(),
            None if self._error is None else self._error[:2],
        )
        logger.info("%s", self.report.summary())
        self._done.set()


@contextlib.contextmanager
def handle_signals(
    pipeline: Pipeline,
    signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM),
    drain_s: float | None = STOP_DRAIN_S,
) -> Iterator[None]:
    """Map the first SIGINT/SIGTERM to ``pipeline.stop(drain=True, within_s=drain_s)``, the second to
    ``cancel()``, the third to an immediate :class:`Interrupted` in the main thread; restore the previous handlers
    on exit.

    Main thread only (Python's rule for signal handlers): elsewhere raises :class:`ConfigError`.
    """
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError(
            "handle_signals() must be used in the main thread (Python delivers signals there); "
            "call pipeline.stop() from your own handler instead"
        )
    previous = {s: signal.getsignal(s) for s in signals}
    count = 0

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)

    def handler(signum: int, frame: object) -> None:
        nonlocal count
        count += 1
        pipeline._signalled = True
        if count == 1:
            pipeline.stop(drain=True, within_s=drain_s)  # flags only: safe here
        elif count == 2:
            pipeline.cancel()
        else:
            restore()
            raise Interrupted(
                f"pipeline '{pipeline.name}': interrupted three times; leaving without waiting for "
                "its threads"
            )

    for s in signals:
        signal.signal(s, handler)
    try:
        yield
    finally:
        restore()


__all__ = [
    "DEFAULT_MAX_QUEUE_BYTES",
    "END_OF_STREAM",
    "ControlReceipt",
    "Pipeline",
    "RunReport",
    "handle_signals",
]
