"""Assembling and running a whole ``track`` job: source → preprocess → track → postprocess → file sinks.

Used by the CLI (``vostream track``, ``vostream demo``) and by the runnable examples; everything here is plain
function calls on top of the engine, so a program can do the same with its own stages or sinks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vostream.apps.assemble import assemble_track
from vostream.apps.config import TrackSettings, tracker_options
from vostream.apps.live_prompts import PromptTimer, TimedPrompt, load_live_prompts
from vostream.apps.prompts import check_prompt_sequence, load_prompts_file
from vostream.pipeline.engine import Pipeline, RunReport, handle_signals
from vostream.pipeline.errors import ConfigError, OutputError, VostreamError
from vostream.pipeline.reconnect import ReconnectPolicy
from vostream.pipeline.stage import SinkSpec
from vostream.pipeline.types import Frame, Prompt, RemoveObject
from vostream.sinks import build_file_sinks
from vostream.sinks.atomic import atomic_write_text
from vostream.sinks.outdir import lock_output_dir, previous_track_outputs, remove_files
from vostream.sinks.rtsp import rtsp_out_spec
from vostream.sinks.vis_json import LIVE_JSON_ROLL_FRAMES, VisJsonSinkSpec
from vostream.stages.sources import VideoInfo, is_live_uri, open_source, probe
from vostream.stages.sources.live import LiveSource, open_live
from vostream.stages.trackers import Tracker, load_tracker

logger = logging.getLogger(__name__)


def _prepare_out_dir(out: str) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():  # mkdir would say "File exists", which reads as a clash of runs
        raise OutputError(
            f"output path {out!r} is a file, not a folder; give --out a folder (new or existing)"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"output directory {out!r} cannot be created: {exc.strerror}") from exc
    if not path.is_dir():
        raise OutputError(f"output path {out!r} exists and is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputError(f"output directory {out!r} is not writable")
    return path


def collect_prompts(settings: TrackSettings) -> list[Prompt | RemoveObject]:
    prompts = list(settings.prompts)
    if settings.prompts_file:
        prompts += load_prompts_file(settings.prompts_file)
    if not prompts:
        raise ConfigError(
            "nothing to track: give a prompt (--point X,Y, --box X0,Y0,X1,Y1, --mask PNG) "
            "or a prompts file (--prompts FILE.json)"
        )
    return prompts


def opencv_threads(requested: int | None) -> int:
    """OpenCV's thread count for a run.  The pipeline already runs its stages in parallel threads, and OpenCV's
    own pool competing with them (and with the decoder's threads) was slower on 2 cores: pipelined tracking at
    854x480 ran at ~75 fps with 1 OpenCV thread against ~48-65 fps with 2 (benchmarks/bench_pipeline.py)."""
    if requested is not None:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return 1 if cores <= 4 else cores // 2


@dataclass
class _TrackInput:
    """What :func:`build_track_pipeline` learns before it loads a tracker: the source's facts and the prompts."""

    info: VideoInfo
    prompts: list[Prompt | RemoveObject]
    live_source: LiveSource | None = None  # a live URI's source (not yet connected)
    timed: list[TimedPrompt] = dataclasses.field(default_factory=list)  # its wall-clock prompts


def build_track_pipeline(
    settings: TrackSettings, tracker: Tracker | None = None
) -> tuple[Pipeline, dict[str, Any]]:
    """The pipeline for ``settings`` plus a dict of facts for the summary.  Validates everything that can be
    validated before a frame is decoded: the source opens, prompts fit the frame, the output is writable.
    ``tracker``: an already loaded :class:`Tracker` to reuse (batch workers load theirs once); by default the
    ``settings.backend`` tracker is loaded here and returned as ``facts["_tracker"]`` for the caller to close after
    the run (:func:`run_track` does; a neural backend holds graphs and device memory)."""
    import cv2

    assert settings.source is not None and (settings.out is not None or settings.rtsp_out is not None)
    cv2.setNumThreads(opencv_threads(settings.opencv_threads))
    given = _check_input(settings)
    out_dir = _prepare_out_dir(settings.out) if settings.out is not None else None
    options = tracker_options(settings)
    owned = tracker is None
    if tracker is None:
        tracker = load_tracker(settings.backend, **options)
    try:  # a failure from here on must not leak the tracker's graphs and device memory
        pipe = _assemble(settings, given, out_dir, tracker)
    except BaseException:
        if owned:
            tracker.close()
        raise
    facts = _track_facts(settings, given, out_dir, options)
    if owned:
        facts["_tracker"] = tracker
    return pipe, facts


def _check_input(settings: TrackSettings) -> _TrackInput:
    """Step 1: open (a live URI: connect) or probe the source, gather the prompts and check that they fit it."""
    assert settings.source is not None
    if is_live_uri(settings.source):  # connect now: a wrong URL fails before anything else starts
        live_source, info, timed = open_live_for_track(settings)
        given = _TrackInput(
            info, list(settings.prompts) if timed else collect_prompts(settings), live_source, timed
        )
    else:
        given = _TrackInput(probe(settings.source), collect_prompts(settings))
    width, height = given.info.width, given.info.height
    check_prompt_sequence(given.prompts, width, height, settings.source)
    for item in given.timed:  # wall-clock prompts: their frame is not known yet, but they must fit the frame
        if isinstance(item.message, Prompt):
            item.message.check_bounds(width, height, settings.source)
    return given


def _assemble(
    settings: TrackSettings, given: _TrackInput, out_dir: Path | None, tracker: Tracker
) -> Pipeline:
    """Step 2: the source, the sinks and the pipeline around ``tracker``."""
    assert settings.source is not None
    live = given.live_source is not None
    decode_threads = (
        settings.codec_threads
        if settings.codec_threads and not live and not os.path.isdir(settings.source)
        else None
    )
    source = given.live_source or open_source(
        settings.source, max_frames=settings.max_frames, threads=decode_threads
    )
    return assemble_track(
        source,
        tracker,
        _track_sinks(settings, given, out_dir),
        prompts=given.prompts,
        queue_size=settings.live_queue_size if live else settings.queue_size,
        policy=settings.policy,
        name=Path(settings.source).name,
        fill_holes=settings.fill_holes,
        min_area=settings.min_area,
        max_queue_bytes=max(1, int(settings.max_queue_mib * 2**20)),
    )


def _track_sinks(settings: TrackSettings, given: _TrackInput, out_dir: Path | None) -> list[SinkSpec[Frame]]:
    """The file sinks under ``out_dir`` (``--save``) and the RTSP output (``--rtsp-out``)."""
    assert settings.source is not None
    live = given.live_source is not None
    # A live feed's video is written on the capture clock (real time: drops and outages stay gaps); a file's
    # at its constant rate.
    sinks = (
        build_file_sinks(
            out_dir,
            settings.save,
            fps=None if live else given.info.fps,
            source_name=Path(settings.source).name,
            clock="capture" if live else "source",
            options={"threads": str(settings.codec_threads)} if settings.codec_threads else None,
        )
        if out_dir is not None
        else []
    )
    if live:  # a live run has no end: its JSON rolls over to part files (flat memory)
        sinks = [
            dataclasses.replace(s, roll_frames=LIVE_JSON_ROLL_FRAMES) if isinstance(s, VisJsonSinkSpec) else s
            for s in sinks
        ]
    if settings.rtsp_out:
        sinks.append(rtsp_out_spec(settings, given.info.fps))
    return sinks


def _track_facts(
    settings: TrackSettings, given: _TrackInput, out_dir: Path | None, options: Mapping[str, object]
) -> dict[str, Any]:
    """Step 3: the run's facts for ``summary.json`` (and, for a live run, its timed prompts)."""
    info = given.info
    facts: dict[str, Any] = {
        "source": settings.source,
        "width": info.width,
        "height": info.height,
        "fps": info.fps,
        "frames_expected": info.frames,
        "out": None if out_dir is None else str(out_dir),
        "backend": settings.backend,
        "save": list(settings.save) if out_dir is not None else [],
        "objects": sorted({p.obj_id for p in given.prompts if hasattr(p, "points")}),
    }
    for key in ("model", "provider"):
        if options.get(key) is not None:
            facts[key] = str(options[key])
    if given.live_source is not None:
        facts["live"] = True
        facts["timed_prompts"] = given.timed
        facts["rtsp_out"] = settings.rtsp_out
    return facts


def open_live_for_track(settings: TrackSettings) -> tuple[LiveSource, VideoInfo, list[TimedPrompt]]:
    """For ``vostream track`` on a live URI: the connected :class:`LiveSource` (from a
    :class:`~vostream.apps.config.TrackSettings`), its :class:`~vostream.stages.sources.file.VideoInfo` and the
    prompts file's wall-clock prompts (its frame-index prompts are put in ``settings.prompts``).

    Connects once to probe (a wrong URL fails here with :class:`SourceError`); the returned source is not yet
    connected (the pipeline opens it)."""
    timed: list[TimedPrompt] = []
    if settings.prompts_file:
        frame_prompts, timed = load_live_prompts(settings.prompts_file)
        settings.prompts = list(settings.prompts) + frame_prompts
        settings.prompts_file = None
    if not settings.prompts and timed:
        settings.prompts = []
    policy = ReconnectPolicy(
        initial_s=min(0.5, settings.reconnect_max_delay),
        max_s=settings.reconnect_max_delay,
        max_attempts=settings.reconnect_attempts,
    )
    assert settings.source is not None
    connect = functools.partial(
        open_live,
        settings.source,
        transport=settings.rtsp_transport,
        open_timeout=settings.open_timeout,
        read_timeout=settings.read_timeout,
        reconnect=policy,
        max_frames=settings.max_frames,
        wait_first=settings.wait_for_source if settings.wait_for_source > 0 else False,
        max_lag=settings.max_stream_lag if settings.max_stream_lag > 0 else None,
    )
    # Probe with a connection of its own and close it: the pipeline's source connects when the pipeline starts,
    # so frames buffered while the tracker loads do not arrive as a stale burst.
    with connect() as probe:
        info = VideoInfo(probe.width, probe.height, probe.fps or 25.0, None, "live", 0)
    return connect(), info, timed


#: Signals that stop a run cleanly (outputs finalised): Ctrl-C, ``kill``, and the terminal going away.
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)


class _Progress:
    """A tqdm bar on a TTY, else a log line every 10 s.  Terminal errors (the terminal closed under us: SIGHUP,
    EIO) switch it off instead of failing the run."""

    def __init__(self, total: int | None, quiet: bool) -> None:
        self.total, self.quiet, self.bar = total, quiet, None
        self._last_log = time.monotonic()
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="frame", desc="tracking", dynamic_ncols=True, leave=False)

    def update(self, done: int) -> None:
        try:
            if self.bar is not None:
                self.bar.update(done - self.bar.n)
            elif not self.quiet and time.monotonic() - self._last_log >= 10.0:
                self._last_log = time.monotonic()
                logger.info("%d/%s frames", done, self.total if self.total else "?")
        except OSError:
            self.bar, self.quiet = None, True

    def close(self, done: int) -> None:
        self.update(done)
        try:
            if self.bar is not None:
                self.bar.close()
        except OSError:
            pass


def _run_with_progress(pipe: Pipeline, total: int | None, quiet: bool) -> RunReport:
    progress = _Progress(total, quiet)
    with handle_signals(pipe, STOP_SIGNALS):
        pipe.start()
        while True:
            try:
                report = pipe.wait(timeout=0.25)
                break
            except TimeoutError:
                progress.update(pipe.metrics().frames)
        progress.close(report.frames)
    return report


def write_summary(
    path: Path, facts: dict[str, Any], report: RunReport, error: str | None = None
) -> dict[str, Any]:
    """``summary.json``: the run's facts, frame count, speed, per-stage metrics and, for a failed run, the error."""
    summary = {k: v for k, v in facts.items() if not k.startswith("_")}
    summary.update(
        {
            "frames": report.frames,
            "wall_s": round(report.wall_s, 3),
            "fps": round(report.fps, 2),
            "interrupted": report.interrupted,
            "error": error,
            "metrics": report.metrics.as_dict(),
        }
    )
    atomic_write_text(path, json.dumps(summary, indent=2, default=str))
    return summary


def run_warnings(metrics: dict[str, Any]) -> list[str]:
    """What a user should know about a finished run, from its metrics (``MetricsSnapshot.as_dict()``)."""
    out = []
    for node in metrics.get("nodes", []):
        extra = node.get("extra") or {}
        if extra.get("corrupt_frames"):
            out.append(f"{extra['corrupt_frames']} corrupt frame(s) in the source were skipped")
        if extra.get("truncated"):
            out.append("the source ended early; it looks truncated (frames before the damage were used)")
        if extra.get("unapplied_prompts"):
            out.append(f"{extra['unapplied_prompts']} prompt(s) were for frames past the end of the source")
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['frames']} frames in {summary['wall_s']:.2f} s ({summary['fps']:.1f} fps)"
        + (" — interrupted, outputs finalised" if summary["interrupted"] else "")
    ]

    def ms(value: float | None) -> str:  # a node that handled no item has no latency
        return f"{value:7.2f}" if value is not None else "      -"

    for node in summary["metrics"].get("nodes", []):
        lines.append(
            f"  {node['name']:<22} {node['frames_out']:6d} frames  p50 {ms(node['latency_ms_p50'])} ms  "
            f"p95 {ms(node['latency_ms_p95'])} ms  drops {node['drops']}"
        )
    lines += [f"warning: {w}" for w in run_warnings(summary["metrics"])]
    lines.append(f"outputs in {summary['out']}")
    return "\n".join(lines)


def clear_previous_outputs(out: str | Path) -> None:
    """Remove what an earlier ``track`` run wrote into ``out`` (``docs/outputs.md``: only vostream's own files), so
    a new run never leaves the old run's masks or video beside its own outputs."""
    old = previous_track_outputs(out)
    if old:
        remove_files(old, out)
        logger.info("%s: replaced the previous run's outputs (%d files)", out, len(old))


def run_track(settings: TrackSettings) -> RunReport:
    pipe, facts = build_track_pipeline(settings)
    tracker = facts.pop("_tracker", None)
    with contextlib.ExitStack() as held:
        try:
            if facts["out"]:  # a second run on this --out fails here; the earlier run's outputs go
                held.enter_context(lock_output_dir(facts["out"], "vostream track"))
                clear_previous_outputs(facts["out"])
        except BaseException:
            if tracker is not None:
                tracker.close()
            raise
        return _run_locked(settings, pipe, facts, tracker)


def _run_locked(
    settings: TrackSettings, pipe: Pipeline, facts: dict[str, Any], tracker: Tracker | None
) -> RunReport:
    timer = None
    if facts.get("timed_prompts"):  # a live feed's prompts with wall-clock triggers
        timer = PromptTimer(pipe.send_control, pipe.source, facts["timed_prompts"])  # type: ignore[arg-type]
    facts.pop("timed_prompts", None)
    try:
        if timer is not None:
            timer.start()
        report = _run_with_progress(pipe, facts["frames_expected"] or settings.max_frames, settings.quiet)
    except VostreamError as exc:
        if pipe.report is not None and facts["out"]:  # the run failed part-way: record what was done
            try:
                write_summary(Path(facts["out"]) / "summary.json", facts, pipe.report, error=str(exc))
            except VostreamError as summary_exc:  # e.g. the disk is still full: report the run's own error
                logger.warning("%s", summary_exc)
        raise
    finally:
        if timer is not None:
            timer.close()
        if (
            tracker is not None
        ):  # frees the backend's graphs and device memory (the sessions closed with the run)
            tracker.close()
    if not facts["out"]:
        if not settings.quiet:
            logger.info("%s", report.summary())
        return report
    summary = write_summary(Path(facts["out"]) / "summary.json", facts, report)
    if not settings.quiet:
        try:
            print(format_summary(summary), file=sys.stderr)
        except OSError:  # the terminal went away (SIGHUP); the outputs and summary.json are written
            pass
    return report


__all__ = [
    "build_track_pipeline",
    "clear_previous_outputs",
    "collect_prompts",
    "format_summary",
    "run_track",
    "write_summary",
]
