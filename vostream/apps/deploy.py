"""``vostream run --config deploy.toml``: several streams in one process sharing one loaded tracker.

The file has one ``[tracker]`` table (``backend``, ``model``, ``provider``, ``threads``, ``device_id``,
``workers``, ``watch``, ``reload_seed`` and the backend's own options), an optional ``[metrics]`` table (``port``:
Prometheus text on 127.0.0.1) and one ``[[streams]]`` table per stream with the keys of a ``vostream track`` config
(``source``, ``out``, ``save``, ``[[streams.prompts]]``, live options, ...) plus ``name``.  ``docs/deploy.md`` has
the design.

Each stream is an ordinary track pipeline (``assemble.py``) whose tracker is a
:class:`~vostream.stages.trackers.shared.SharedTracker`: the model is loaded once, every stream has its own
session (its own memory banks), and one :class:`~vostream.pipeline.scheduler.RoundRobinScheduler` thread runs the
streams' frames in turn.  Streams are isolated: one that fails to start, fails or stalls is reported in its own
``summary.json`` and ``deploy-summary.json`` while the others go on.  SIGINT/SIGTERM stop every stream (outputs
finalised), a second signal cancels them (outputs still finalised, with what was written).  Each stream holds its
``out`` as ``vostream track`` does: locked for the run, the previous run's files replaced.

Hot reload (``docs/deploy.md`` §2): the tracker sits in a :class:`~vostream.stages.trackers.reload.ModelHandle`.
SIGHUP (or :meth:`Deployment.reload`, or a new export in the model directory with ``watch = true``) re-reads the
``[tracker]`` table of the deployment file, loads that model beside the running one and checks it; each stream then
switches at its next frame, every object carried over from its last mask.  A refused model leaves the running one
in place (one log line, ``vostream_model_reload_failed_total``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from vostream.apps.config import TRACKER_KEYS, TrackSettings, merge_settings, read_toml
from vostream.apps.live_prompts import PromptTimer
from vostream.apps.model_watch import ModelWatcher
from vostream.apps.prometheus import model_families, pipeline_families
from vostream.apps.track import STOP_SIGNALS, build_track_pipeline, clear_previous_outputs, write_summary
from vostream.pipeline.engine import STOP_DRAIN_S, Pipeline, RunReport
from vostream.pipeline.errors import ConfigError, OutputError, VostreamError, describe
from vostream.pipeline.scheduler import RoundRobinScheduler
from vostream.sinks.atomic import atomic_write_text
from vostream.sinks.outdir import lock_output_dir
from vostream.stages.trackers import Tracker, load_tracker
from vostream.stages.trackers.reload import (
    SEED_MODES,
    ModelHandle,
    ReloadableTracker,
    ReloadError,
    ReloadOutcome,
)
from vostream.stages.trackers.shared import SharedTracker

if TYPE_CHECKING:
    from prometheus_client.core import Metric
    from typing_extensions import NotRequired

logger = logging.getLogger(__name__)

#: keys of the shared ``[tracker]`` table that are settings of the run (the rest go to the backend)
_TRACKER_SETTINGS = ("backend", *TRACKER_KEYS)


@dataclass
class DeployConfig:
    """A parsed deployment: the shared tracker's backend and options, and one :class:`TrackSettings` per stream."""

    backend: str
    tracker_options: dict[str, object]
    streams: dict[str, TrackSettings]
    metrics_port: int | None = None
    workers: int = 1  # scheduler threads: streams whose frames are tracked at the same time
    out: Path | None = None  # where deploy-summary.json goes (the config file's folder by default)
    path: Path | None = None  # the deployment file: a reload re-reads its [tracker] table
    watch: bool = False  # reload when the model directory holds a new export
    reload_seed: str = "next"  # where the old model's last masks seed the new one (stages/trackers/reload.py)

    @property
    def model_dir(self) -> str | None:
        model = self.tracker_options.get("model")
        return str(model) if model is not None else None


class StreamModelSummary(TypedDict):
    """The model one stream runs on, in ``deploy-summary.json`` (``docs/deploy.md`` §2)."""

    generation: int
    switches: int
    last_switch_frame: int
    last_switch_ms: float
    dropped_objects: int
    failed_switches: int


class StreamSummary(TypedDict):
    """One stream of ``deploy-summary.json``."""

    source: str | None
    out: str | None
    frames: int
    fps: float
    reason: str
    error: str | None
    exit_code: int
    scheduler: dict[str, float]
    model: StreamModelSummary


class ModelSummary(TypedDict):
    """The shared model's reloads in ``deploy-summary.json``."""

    generation: int
    reloads: int
    reload_failed: int
    last_load_s: float
    last_check_s: float
    last_error: str | None


class DeploySummary(TypedDict):
    """``deploy-summary.json``: what :func:`run_deploy` returns."""

    backend: str
    tracker_loads: int
    model: ModelSummary
    wall_s: float
    streams: dict[str, StreamSummary]
    failed: list[str]
    signalled: NotRequired[bool]  # run_deploy: whether a signal ended the run


@dataclass
class StreamRun:
    """One stream's state in a running deployment."""

    name: str
    settings: TrackSettings
    pipeline: Pipeline | None = None
    facts: dict[str, object] = field(default_factory=dict)
    timer: PromptTimer | None = None
    report: RunReport | None = None
    error: str | None = None
    exit_code: int = 0


def _check_outs(path: str | Path, streams: dict[str, TrackSettings]) -> None:
    """Every stream writes its own folder: two streams in one ``out`` would mix their masks, videos and
    summaries."""
    owner: dict[Path, str] = {}
    for name, settings in streams.items():
        if not settings.out:
            continue
        key = Path(settings.out).resolve()
        if key in owner:
            raise ConfigError(
                f"{path}: streams {owner[key]!r} and {name!r} both write to {str(settings.out)!r}; give each stream "
                "its own out"
            )
        owner[key] = name


def _stream_tables(path: str | Path, tables: object, base: Path) -> dict[str, TrackSettings]:
    """The ``[[streams]]`` tables as each stream's settings, by name; :class:`ConfigError` naming the stream."""
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{path}: no streams: add one [[streams]] table per source")
    streams: dict[str, TrackSettings] = {}
    for i, table in enumerate(tables):
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: streams[{i}] must be a table")
        table = dict(table)
        name = str(table.pop("name", f"stream{i + 1}"))
        if name in streams:
            raise ConfigError(f"{path}: two streams are named {name!r}; names must be unique")
        shared = sorted(set(table) & {*_TRACKER_SETTINGS, "tracker"})
        if shared:
            raise ConfigError(
                f"{path}: stream {name!r} sets {', '.join(shared)}: the tracker is shared by every stream; "
                "set it once in the [tracker] table"
            )
        table["__base__"] = base
        try:
            streams[name] = merge_settings(table, {})
        except ConfigError as exc:
            raise ConfigError(f"{path}: stream {name!r}: {exc}") from None
        streams[name].quiet = True
    return streams


def load_deploy(path: str | Path) -> DeployConfig:
    """Read and check a deployment file.  Raises :class:`ConfigError` naming the stream and key at fault."""
    raw = read_toml(path, "deployment file")
    base = Path(path).resolve().parent
    unknown = sorted(set(raw) - {"tracker", "metrics", "streams"})
    if unknown:
        raise ConfigError(
            f"{path}: unknown key(s) or table(s) {unknown}; a deployment file has [tracker], [metrics] and "
            "[[streams]]"
        )
    for key in ("tracker", "metrics"):
        if not isinstance(raw.get(key, {}), dict):
            raise ConfigError(f"{path}: '{key}' must be a table ([{key}]), got {raw[key]!r}")
    tracker = dict(raw.get("tracker") or {})
    backend = str(tracker.pop("backend", "classic"))
    workers = tracker.pop("workers", None)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"{path}: [tracker] workers must be a whole number >= 1, got {workers!r}")
    watch = tracker.pop("watch", False)
    if not isinstance(watch, bool):
        raise ConfigError(f"{path}: [tracker] watch must be true or false, got {watch!r}")
    reload_seed = tracker.pop("reload_seed", "next")
    if reload_seed not in SEED_MODES:
        raise ConfigError(
            f"{path}: [tracker] reload_seed must be one of {', '.join(map(repr, SEED_MODES))}, got {reload_seed!r}"
        )
    if watch and "model" not in tracker:
        raise ConfigError(
            f"{path}: [tracker] watch = true needs a model directory to watch (model = ...); the {backend!r} "
            "backend has none here (send SIGHUP to reload it)"
        )
    options = {k: tracker[k] for k in tracker}
    if "model" in options and isinstance(options["model"], str) and "://" not in options["model"]:
        options["model"] = str(base / options["model"])
    metrics = raw.get("metrics") or {}
    if set(metrics) - {"port"}:
        raise ConfigError(
            f"{path}: unknown key(s) {sorted(set(metrics) - {'port'})} in [metrics]; it takes 'port'"
        )
    port = metrics.get("port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536):
        raise ConfigError(f"{path}: [metrics] port must be 0..65535, got {port!r}")
    streams = _stream_tables(path, raw.get("streams"), base)
    _check_outs(path, streams)
    if (
        workers is None
    ):  # a CPU tracker's sessions share nothing: one worker per core; a device gets one thread
        workers = min(len(streams), os.cpu_count() or 1) if backend == "classic" else 1
    return DeployConfig(
        backend,
        options,
        streams,
        metrics_port=port,
        out=base,
        workers=workers,
        path=Path(path).resolve(),
        watch=watch,
        reload_seed=reload_seed,
    )


class Deployment:
    """A running deployment: :meth:`start`, then :meth:`wait`; :meth:`stop` from any thread."""

    def __init__(self, config: DeployConfig, tracker: Tracker | None = None) -> None:
        self.config = config
        self.owned = tracker is None
        self.tracker = tracker
        self.handle: ModelHandle | None = None
        self.scheduler = RoundRobinScheduler("tracker", workers=config.workers)
        self.streams = {name: StreamRun(name, s) for name, s in config.streams.items()}
        self._metrics_server: ThreadingHTTPServer | None = None
        self._watcher: ModelWatcher | None = None
        self._reloads: list[threading.Thread] = []
        self._outputs = contextlib.ExitStack()  # the streams' output locks, held until wait() ends
        self._stopping: bool | None = None  # None: running; True/False: stop() asked to drain / cancel
        self.started_at = 0.0

    def start(self) -> None:
        """Listen for metrics, load the tracker once and start every stream that can start (the others are
        recorded as failed).  A :meth:`stop` that came first (a signal during the tracker's load) stops each
        stream as it starts."""
        if self.config.metrics_port is not None:  # before anything runs: a port in use starts nothing
            self._serve_metrics(self.config.metrics_port)
        if self.tracker is None:
            self.tracker = load_tracker(self.config.backend, **self.config.tracker_options)
        self.handle = ModelHandle(
            self.tracker,
            model=self.config.model_dir or self.config.backend,
            owned=self.owned,
            seed=self.config.reload_seed,
        )
        self.scheduler.start()
        self.started_at = time.monotonic()
        for run in self.streams.values():
            try:
                shared = SharedTracker(ReloadableTracker(self.handle, run.name), self.scheduler, run.name)
                pipe, facts = build_track_pipeline(run.settings, tracker=shared)
                if run.settings.out:  # as `vostream track`: the folder is this run's, the last run's files go
                    self._outputs.enter_context(
                        lock_output_dir(run.settings.out, f"vostream run ({run.name})")
                    )
                    clear_previous_outputs(run.settings.out)
                run.pipeline, run.facts = pipe, facts
                timed = facts.pop("timed_prompts", None)
                pipe.start()
                if self._stopping is not None:
                    pipe.stop(drain=self._stopping, within_s=STOP_DRAIN_S)
                if timed:
                    run.timer = PromptTimer(pipe.send_control, pipe.source, timed)  # type: ignore[arg-type]
                    run.timer.start()
            except VostreamError as exc:
                run.error, run.exit_code = describe(exc), exc.exit_code
                logger.error("stream %s did not start: %s", run.name, run.error)
        if self.config.watch and self.config.model_dir is not None:
            self._watcher = ModelWatcher(self.config.model_dir, self.request_reload).start()

    # -- hot reload ----------------------------------------------------------------------------------------------
    def reload(self) -> ReloadOutcome:
        """Load the model the deployment file names now (its ``[tracker]`` table is re-read; ``[[streams]]`` changes
        need a restart) beside the running one, check it and install it; the streams switch at their next frame.
        Blocking.  Raises :class:`ReloadError` (already logged) when the model is refused."""
        handle = self.handle
        if handle is None:
            raise ReloadError("the deployment has not started; nothing to reload")
        config = self.config
        if config.path is not None:
            try:
                config = load_deploy(config.path)
            except VostreamError as exc:  # a broken file refuses the reload like a broken model
                raise handle.refuse(describe(exc)) from exc
        outcome = handle.reload(
            lambda: load_tracker(config.backend, **config.tracker_options),
            model=config.model_dir or config.backend,
        )
        # the [tracker] table now in force (what the summary reports)
        self.config.backend, self.config.tracker_options = config.backend, config.tracker_options
        return outcome

    def request_reload(self) -> None:
        """Start :meth:`reload` in a background thread and return at once (safe from a signal handler).  The
        outcome is logged; a refusal also counts in ``vostream_model_reload_failed_total``."""

        def run() -> None:
            try:
                self.reload()
            except ReloadError:
                pass  # logged by the handle, counted in its stats

        thread = threading.Thread(target=run, name="vostream-reload", daemon=True)
        self._reloads = [t for t in self._reloads if t.is_alive()] + [thread]
        thread.start()

    def stop(self, drain: bool = True) -> None:
        """Stop every stream (``drain``: finish what is queued; else cancel), also those not started yet.  Safe
        from a signal handler."""
        self._stopping = drain if self._stopping is None else self._stopping and drain
        for run in self.streams.values():
            if run.pipeline is not None:
                if drain:
                    run.pipeline.stop(drain=True, within_s=STOP_DRAIN_S)
                else:
                    run.pipeline.cancel()

    def wait(self) -> DeploySummary:
        """Wait for every stream, write each one's ``summary.json`` and ``deploy-summary.json``; release the
        tracker.  Returns the deployment summary."""
        try:
            for run in self.streams.values():
                if run.pipeline is None:
                    continue
                try:
                    while True:
                        try:
                            run.report = run.pipeline.wait(timeout=0.25)
                            break
                        except TimeoutError:
                            continue
                except VostreamError as exc:
                    run.error, run.exit_code = describe(exc), exc.exit_code
                    run.report = run.pipeline.report
                    logger.error("stream %s failed: %s", run.name, run.error)
                finally:
                    if run.timer is not None:
                        run.timer.close()
                out = run.facts.get("out")
                if out and run.report is not None:
                    write_summary(Path(str(out)) / "summary.json", run.facts, run.report, run.error)
        finally:
            if self._watcher is not None:
                self._watcher.close()
            self.scheduler.close()
            if self._metrics_server is not None:
                self._metrics_server.shutdown()
            if self.handle is not None:
                self.handle.close()  # every generation still loaded; the first only when the deployment loaded it
            elif self.owned and self.tracker is not None:
                self.tracker.close()
            for thread in self._reloads:
                thread.join(10.0)  # a reload under way closes what it loaded once it sees the handle closed
            self._outputs.close()
        return self.summary()

    def summary(self) -> DeploySummary:
        sched = self.scheduler.stats()
        handle = self.handle
        switches = dict(handle.stream_items()) if handle is not None else {}
        streams: dict[str, StreamSummary] = {}
        for name, run in self.streams.items():
            info = switches.get(name)
            streams[name] = {
                "source": run.settings.source,
                "out": run.settings.out,
                "frames": run.report.frames if run.report is not None else 0,
                "fps": round(run.report.fps, 2) if run.report is not None else 0.0,
                "reason": run.report.reason if run.report is not None else "not started",
                "error": run.error,
                "exit_code": run.exit_code,
                "scheduler": sched.get(name, {}),
                "model": {
                    "generation": info.generation if info else 0,
                    "switches": info.switches if info else 0,
                    "last_switch_frame": info.last_switch_frame if info else -1,
                    "last_switch_ms": round(info.last_switch_ms, 3) if info else 0.0,
                    "dropped_objects": info.dropped_objects if info else 0,
                    "failed_switches": info.failed_switches if info else 0,
                },
            }
        stats = handle.stats if handle is not None else None
        return {
            "backend": self.config.backend,
            "tracker_loads": 1 + (stats.reloads if stats else 0),
            "model": {
                "generation": handle.generation if handle is not None else 0,
                "reloads": stats.reloads if stats else 0,
                "reload_failed": stats.failed if stats else 0,
                "last_load_s": round(stats.last_load_s, 4) if stats else 0.0,
                "last_check_s": round(stats.last_check_s, 4) if stats else 0.0,
                "last_error": stats.last_error if stats else None,
            },
            "wall_s": round(time.monotonic() - self.started_at, 3),
            "streams": streams,
            "failed": sorted(n for n, r in self.streams.items() if r.error),
        }

    # -- metrics -------------------------------------------------------------------------------------------------
    def metrics_text(self) -> str:
        """Prometheus text: every stream's pipeline metrics with a ``stream`` label, plus the scheduler's."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_DeployCollector(self))
        return generate_latest(registry).decode()

    def _serve_metrics(self, port: int) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        deployment = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = deployment.metrics_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        try:
            server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        except OSError as exc:
            raise OutputError(
                f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}; choose another "
                "port (0 picks a free one)"
            ) from None
        self.metrics_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, name="vostream-metrics", daemon=True).start()
        self._metrics_server = server
        logger.info("metrics on http://127.0.0.1:%d/metrics", self.metrics_port)


class _DeployCollector:
    def __init__(self, deployment: Deployment) -> None:
        self.deployment = deployment

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        streams = self.deployment.streams.values()
        yield from pipeline_families(
            ({"stream": r.name}, r.pipeline) for r in streams if r.pipeline is not None
        )
        share = GaugeMetricFamily(
            "vostream_scheduler_share", "share of the tracker's time", labels=["stream"]
        )
        wait = GaugeMetricFamily(
            "vostream_scheduler_wait_ms", "wait for the stream's turn", labels=["stream", "quantile"]
        )
        for name, st in self.deployment.scheduler.stats().items():
            share.add_metric([name], st["share"])
            wait.add_metric([name, "0.5"], st["wait_ms_p50"])
            wait.add_metric([name, "0.95"], st["wait_ms_p95"])
        yield share
        yield wait
        yield from model_families(self.deployment.handle, "stream")


def run_deploy(config: DeployConfig, quiet: bool = False) -> DeploySummary:
    """Run a deployment to its end (files end, live feeds run until a signal).  Returns the summary; it is also
    written to ``deploy-summary.json`` beside the deployment file."""
    deployment = Deployment(config)
    count = 0
    hup = getattr(signal, "SIGHUP", None)  # POSIX only
    previous = {s: signal.getsignal(s) for s in (*STOP_SIGNALS, *([hup] if hup is not None else []))}

    def handler(signum: int, frame: object) -> None:
        nonlocal count
        count += 1
        if count == 1:
            deployment.stop(drain=True)
        else:  # cancel: every stream closes its outputs with what it wrote, within a bounded time
            deployment.stop(drain=False)

    def reload_handler(signum: int, frame: object) -> None:
        logger.info("SIGHUP: reloading the model")
        deployment.request_reload()

    main = threading.current_thread() is threading.main_thread()
    if main:
        for s in STOP_SIGNALS:
            signal.signal(s, handler)
        if hup is not None:
            signal.signal(hup, reload_handler)
    try:
        deployment.start()
        summary = deployment.wait()
    finally:
        if main:
            for s, h in previous.items():
                if (
                    count and s in STOP_SIGNALS
                ):  # stopped by a signal: a late one (a third Ctrl-C) changes nothing
                    signal.signal(s, signal.SIG_IGN)
                else:
                    signal.signal(s, h if h is not None else signal.SIG_DFL)
    summary["signalled"] = count > 0
    if config.out is not None:
        atomic_write_text(config.out / "deploy-summary.json", json.dumps(summary, indent=1))
    if not quiet:
        for name, st in summary["streams"].items():
            status = f"error: {st['error']}" if st["error"] else st["reason"]
            print(f"{name}: {st['frames']} frames, {st['fps']} fps, {status}", file=sys.stderr)
    return summary


def add_run_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_common: Callable[[argparse.ArgumentParser], None],
) -> None:
    p = sub.add_parser(
        "run",
        help="run several streams in one process sharing one tracker (a deployment file)",
        description="Run the [[streams]] of a deployment file (docs/deploy.md) with one shared tracker.",
    )
    p.add_argument("--config", required=True, metavar="DEPLOY.toml", help="the deployment file")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on 127.0.0.1:PORT")
    p.epilog = (
        "SIGHUP reloads the model named in the file's [tracker] table without stopping a stream "
        "(docs/deploy.md section 2)."
    )
    add_common(p)


def cmd_run(args: argparse.Namespace) -> int:
    if not args.quiet:  # reloads and each stream's switch are status lines of a deployment
        logging.getLogger("vostream.stages.trackers.reload").setLevel(logging.INFO)
        logging.getLogger("vostream.apps.model_watch").setLevel(logging.INFO)
    config = load_deploy(args.config)
    if args.metrics_port is not None:
        config.metrics_port = args.metrics_port
    summary = run_deploy(config, quiet=bool(args.quiet))
    codes = [st["exit_code"] for st in summary["streams"].values() if st["exit_code"]]
    if codes:  # the first failed stream's code (2 config, 3 input, 4 output, 5 backend, 6 stage)
        return int(codes[0])
    return 130 if summary["signalled"] else 0


__all__ = [
    "DeployConfig",
    "Deployment",
    "StreamRun",
    "add_run_parser",
    "cmd_run",
    "load_deploy",
    "run_deploy",
]
