"""``vostream annotate``: offline batch annotation of many videos, resumable, in parallel, optionally on Ray.

:func:`plan_batch` finds the videos, parses and checks the prompts file (before any work starts) and sorts the
videos into done (a verifying manifest), to do, and without prompts; :func:`run_annotate` runs the videos to do on
an executor (local processes, in-process, or Ray), retries failures, shows progress, and writes ``summary.json``
and the merged ``dataset.json``.  ``docs/annotate.md`` is the reference.

Thread-safety: :func:`run_annotate` drives everything from the calling thread; its signal handling (Ctrl-C,
SIGTERM, SIGHUP) is installed only when called from the main thread.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from vostream.apps.annotate.inputs import VideoEntry
from vostream.apps.annotate.job import JobResult, TrackOptions, VideoJob
from vostream.pipeline.errors import BackendError, ConfigError
from vostream.sinks.atomic import remove_temp_files
from vostream.sinks.outdir import LOCK_NAME as LOCK_NAME
from vostream.sinks.outdir import lock_output_dir

if TYPE_CHECKING:
    from vostream.apps.annotate.local_executor import Executor
    from vostream.apps.annotate.progress import BatchProgress

logger = logging.getLogger(__name__)

SUMMARY_NAME = "summary.json"
DATASET_NAME = "dataset.json"
EXIT_SOME_FAILED = 1
EXIT_INTERRUPTED = 130
#: loggers that print the batch's status lines unless --quiet
STATUS_LOGGERS = ("vostream.apps.annotate.batch", "vostream.apps.annotate.progress")


@dataclass
class AnnotateOptions:
    """Everything one ``vostream annotate`` run needs."""

    inputs: list[str]
    prompts: str
    out: str
    formats: tuple[str, ...] = ("video", "json", "mot")
    backend: str = "classic"
    model: str | None = None
    tracker: dict[str, object] = field(default_factory=dict)
    workers: int = 1
    ray: bool = False
    ray_address: str | None = None
    ray_gpus: float = 0.0
    ray_resources: dict[str, float] = field(default_factory=dict)
    retries: int = 1
    force: bool = False
    fill_holes: bool = False
    min_area: int = 0
    max_frames: int | None = None
    queue_size: int = 8
    opencv_threads: int | None = None
    codec_threads: int | None = None
    quiet: bool = False
    tty: bool | None = None  # progress bars: None = when stderr is a TTY

    def track_options(self) -> TrackOptions:
        """Per-worker thread limits, so that the workers, not one video's threads, fill the cores: OpenCV gets
        ``cores / (2 x workers)`` threads per stage, and with more than one worker each video's decoder and
        encoder get ``cores / workers`` FFmpeg threads (one worker: FFmpeg's own choice)."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        workers = max(1, self.workers)
        threads = self.opencv_threads
        if threads is None:
            threads = max(1, cores // (2 * workers))
        codec = self.codec_threads
        if codec is None and workers > 1:
            codec = max(1, cores // workers)
        return TrackOptions(
            tuple(self.formats),
            self.backend,
            self.model,
            dict(self.tracker),
            self.fill_holes,
            self.min_area,
            self.max_frames,
            self.queue_size,
            threads,
            codec,
        )


@dataclass
class VideoStatus:
    """One row of ``summary.json``.  ``status``: done, failed, no_prompts or pending (not reached)."""

    video: str
    source: str
    folder: str
    status: str = "pending"
    reused: bool = False
    frames: int = 0
    objects: int = 0
    time_s: float = 0.0
    fps: float = 0.0
    attempts: int = 0
    error: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class BatchPlan:
    """What :func:`plan_batch` found: every video's status row, the jobs to run, and the options."""

    videos: list[VideoEntry]
    rows: dict[str, VideoStatus]
    jobs: list[VideoJob]
    out: Path


@dataclass
class BatchReport:
    """The outcome of :func:`run_annotate`."""

    out: str
    results: dict[str, VideoStatus]
    interrupted: bool
    wall_s: float

    def count(self, status: str) -> int:
        return sum(1 for r in self.results.values() if r.status == status)

    @property
    def failed(self) -> list[str]:
        return [k for k, r in self.results.items() if r.status == "failed"]

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return EXIT_INTERRUPTED
        bad = any(r.status in ("failed", "no_prompts", "pending") for r in self.results.values())
        return EXIT_SOME_FAILED if bad else 0


# -- planning ------------------------------------------------------------------------------------------------------


def _check_options(o: AnnotateOptions) -> None:
    from vostream.apps.config import parse_save

    o.formats = parse_save(list(o.formats) if not isinstance(o.formats, str) else o.formats, "--formats")
    if o.workers < 0 or (o.ray and o.workers < 1):
        raise ConfigError(f"--workers must be >= 1, got {o.workers}")
    if o.retries < 0:
        raise ConfigError(f"--retries must be >= 0, got {o.retries}")
    if o.queue_size < 1:
        raise ConfigError(f"--queue-size must be >= 1, got {o.queue_size}")
    if o.codec_threads is not None and o.codec_threads < 1:
        raise ConfigError(f"--codec-threads must be >= 1, got {o.codec_threads}")
    if o.max_frames is not None and o.max_frames < 1:
        raise ConfigError(f"--max-frames must be >= 1, got {o.max_frames}")
    if not o.inputs:
        raise ConfigError("no INPUTS given: pass video files, directories or a list file")


def plan_batch(o: AnnotateOptions) -> BatchPlan:
    """Find the videos, load and check the prompts (every error before any work: :class:`PromptError`), and
    split the videos into done / to do / without prompts.  Creates ``--out`` (:class:`OutputError`)."""
    from vostream.apps.annotate.inputs import discover_videos
    from vostream.apps.annotate.manifest import fingerprint, verify_manifest
    from vostream.apps.annotate.prompts import check_batch_prompts, load_batch_prompts
    from vostream.sinks.atomic import ensure_dir
    from vostream.stages.sources import probe

    _check_options(o)
    videos = discover_videos(o.inputs)
    batch = load_batch_prompts(o.prompts, videos)
    sizes: dict[str, tuple[int, int] | None] = {}
    frames: dict[str, int | None] = {}
    probe_errors: dict[str, str] = {}
    for v in videos:
        if v.key not in batch:
            continue
        try:
            info = probe(v.path)
            sizes[v.key], frames[v.key] = (info.width, info.height), info.frames
        except Exception as exc:  # noqa: BLE001 - a corrupt video fails as a video, later, not the batch now
            sizes[v.key], frames[v.key] = None, None
            probe_errors[v.key] = str(exc)
    check_batch_prompts(o.prompts, batch, sizes)
    out = ensure_dir(o.out, "annotate output")
    track = o.track_options()
    rows: dict[str, VideoStatus] = {}
    jobs: list[VideoJob] = []
    for v in videos:
        row = rows[v.key] = VideoStatus(v.key, v.path, v.name)
        if v.key not in batch:
            row.status = "no_prompts"
            row.error = "no prompts for this video in the prompts file"
            logger.warning("%s: no prompts in %s; not annotated", v.key, o.prompts)
            continue
        prompts = batch[v.key].prompts
        fp = fingerprint(v.key, v.path, prompts, track.output_settings())
        if not o.force:
            manifest = verify_manifest(out / v.name, fp)
            if manifest is not None:
                stats = manifest.get("stats", {})
                row.status, row.reused = "done", True
                row.frames, row.objects = int(stats.get("frames", 0)), int(stats.get("objects", 0))
                row.time_s, row.fps = float(stats.get("wall_s", 0.0)), float(stats.get("fps", 0.0))
                row.warnings = list(stats.get("warnings", []))
                continue
        jobs.append(VideoJob(v.key, v.path, str(out / v.name), prompts, fp, frames.get(v.key)))
    return BatchPlan(videos, rows, jobs, out)


# -- locking and signals ----------------------------------------------------------------------------------------


@contextmanager
def _out_lock(out: Path) -> Iterator[None]:
    """Hold ``DIR/.vostream.lock`` for the run: two runs on one DIR would redo each other's videos."""
    with lock_output_dir(out, "vostream annotate"):
        yield


class _StopState:
    """Signal count: 1 = finish the running videos, start no new one; 2 = abandon them now."""

    def __init__(self) -> None:
        self.level = 0

    def signal(self, signum: int, _frame: FrameType | None = None) -> None:
        self.level += 1
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
        if self.level == 1:
            logger.warning(
                "%s: finishing the videos in progress, starting no new one (again to abandon them)", name
            )
        elif self.level == 2:
            logger.warning("%s: abandoning the videos in progress (they will be redone next time)", name)


@contextmanager
def _signals(state: _StopState) -> Iterator[None]:
    from vostream.apps.track import STOP_SIGNALS

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, state.signal) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# -- running -----------------------------------------------------------------------------------------------------


def _make_executor(o: AnnotateOptions, track: TrackOptions) -> Executor:
    from vostream.apps.annotate.local_executor import InlineExecutor, LocalExecutor

    if o.ray:
        from vostream.apps.annotate.ray_executor import RayExecutor, import_ray

        import_ray()
        return RayExecutor(track, max(1, o.workers), o.ray_address, o.ray_gpus, o.ray_resources)
    if o.workers == 0:
        return InlineExecutor(track)
    level = logging.INFO if logging.getLogger("vostream").isEnabledFor(logging.INFO) else logging.WARNING
    return LocalExecutor(track, o.workers, level)


def _result_line(r: JobResult) -> str:
    if r.status == "done":
        return f"{r.frames} frames, {r.objects} object(s) in {r.wall_s:.1f} s ({r.fps:.1f} fps)" + (
            f"; {'; '.join(r.warnings)}" if r.warnings else ""
        )
    return r.error or r.status


def run_annotate(o: AnnotateOptions) -> BatchReport:
    """Plan and run the batch; write ``summary.json`` (always, once planned) and ``dataset.json``.  Per-video
    failures are in the report, never raised; raises :class:`ConfigError`/:class:`PromptError` (before any work),
    :class:`OutputError` (``--out``), :class:`BackendError` (the tracker cannot be loaded, Ray unavailable)."""
    from vostream.apps.annotate.progress import BatchProgress

    start = time.monotonic()
    plan = plan_batch(o)
    rows = plan.rows
    state = _StopState()
    with _out_lock(plan.out), _signals(state):
        _clean_top_level(plan.out)
        todo = deque(plan.jobs)
        reused = sum(1 for r in rows.values() if r.reused)
        if reused:
            logger.info(
                "%d of %d video(s) already done (manifests verified); %d to annotate",
                reused,
                len(rows),
                len(todo),
            )
        progress = BatchProgress(
            len(todo), sum(j.frames_expected or 0 for j in todo), max(1, o.workers), quiet=o.quiet, tty=o.tty
        )
        executor = _make_executor(o, o.track_options()) if todo else None
        try:
            if executor is not None:
                executor.start()
                _dispatch(o, executor, todo, rows, state, progress)
        finally:
            if executor is not None:
                executor.close()
            progress.close()
        interrupted = state.level > 0
        report = BatchReport(str(plan.out), rows, interrupted, time.monotonic() - start)
        write_batch_summary(plan.out, report, o)
        if "json" in o.formats:
            merge_dataset(plan.out, [r for r in rows.values() if r.status == "done"])
    return report


def _dispatch(
    o: AnnotateOptions,
    executor: Executor,
    todo: deque[VideoJob],
    rows: dict[str, VideoStatus],
    state: _StopState,
    progress: BatchProgress,
) -> None:
    from vostream.apps.annotate.local_executor import InlineExecutor

    running: dict[int, VideoJob] = {}
    if isinstance(executor, InlineExecutor):  # in-process: the video itself checks for a second signal
        executor.cancel_check = lambda: state.level >= 2
    while todo or running:
        if state.level >= 2:
            executor.abandon()
            for job in running.values():  # a terminated worker cannot remove its open temporary files
                remove_temp_files(job.out_dir)
            break
        if state.level == 0:
            for slot in executor.idle():
                if not todo:
                    break
                job = todo.popleft()
                rows[job.key].attempts += 1
                job.attempt = rows[job.key].attempts
                running[slot] = job
                executor.submit(slot, job)
                progress.start_video(slot, job.key, job.frames_expected)
        elif not running:
            break
        for ev in executor.poll(0.2):
            if ev.kind == "fatal":
                raise BackendError(ev.error or "a worker cannot load the tracker")
            if ev.kind == "frames" and ev.slot in running:
                progress.video_frames(ev.slot, ev.frames)
            elif ev.kind == "result" and ev.result is not None:
                if ev.slot in running:
                    _record(o, running.pop(ev.slot), ev.slot, ev.result, rows, todo, state, progress)
        progress.update()


def _record(
    o: AnnotateOptions,
    job: VideoJob,
    slot: int,
    r: JobResult,
    rows: dict[str, VideoStatus],
    todo: deque[VideoJob],
    state: _StopState,
    progress: BatchProgress,
) -> None:
    row = rows[job.key]
    if r.status == "done":
        row.status, row.frames, row.objects = "done", r.frames, r.objects
        row.time_s, row.fps, row.error, row.warnings = r.wall_s, r.fps, None, list(r.warnings)
        progress.end_video(slot, job.key, "done", r.frames, job.frames_expected, True, _result_line(r))
        return
    if r.status == "cancelled":
        row.status, row.error = "pending", "interrupted"
        progress.end_video(slot, job.key, "cancelled", 0, job.frames_expected, True, "interrupted")
        return
    retry = row.attempts <= o.retries and state.level == 0
    row.error = r.error
    if retry:
        todo.append(job)  # after the other pending videos
    else:
        row.status = "failed"
    progress.end_video(
        slot,
        job.key,
        "failed",
        0,
        job.frames_expected,
        not retry,
        f"attempt {row.attempts}: {_result_line(r)}",
    )


def _clean_top_level(out: Path) -> None:
    for name in (SUMMARY_NAME, DATASET_NAME):
        for tmp in out.glob(f"{name}.*.tmp"):
            tmp.unlink(missing_ok=True)


def write_batch_summary(out: Path, report: BatchReport, o: AnnotateOptions) -> dict[str, object]:
    """``DIR/summary.json``: per video status, frames, objects, time, fps, attempts, error; totals; options."""
    from vostream.sinks.atomic import atomic_write_text

    rows = list(report.results.values())
    frames = sum(r.frames for r in rows if r.status == "done")
    busy = sum(r.time_s for r in rows if r.status == "done")
    doc = {
        "version": 1,
        "out": report.out,
        "interrupted": report.interrupted,
        "wall_s": round(report.wall_s, 3),
        "totals": {
            "videos": len(rows),
            **{s: report.count(s) for s in ("done", "failed", "no_prompts", "pending")},
            "reused": sum(1 for r in rows if r.reused),
            "frames": frames,
            "time_s": round(busy, 3),
            "fps": round(frames / busy, 2) if busy > 0 else 0.0,
        },
        "options": {
            "formats": list(o.formats),
            "backend": o.backend,
            "model": o.model,
            "workers": o.workers,
            "ray": o.ray,
            "retries": o.retries,
        },
        "videos": [asdict(r) for r in rows],
    }
    atomic_write_text(out / SUMMARY_NAME, json.dumps(doc, indent=1))
    return doc


def merge_dataset(out: Path, done: list[VideoStatus]) -> dict[str, object] | None:
    """``DIR/dataset.json``: the per-video YouTube-VIS files of the done videos, ordered by folder, merged with
    renumbered ids (``docs/annotate.md``).  Deterministic: the same done videos give the same bytes."""
    from vostream.sinks.atomic import atomic_write_text

    videos: list[dict[str, object]] = []
    annotations: list[dict[str, object]] = []
    categories: list[dict[str, object]] = []
    for row in sorted(done, key=lambda r: r.folder):
        path = out / row.folder / "annotations.json"
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            logger.warning("%s: cannot be read for the dataset (%s); left out", path, exc)
            continue
        vid = len(videos) + 1
        for v in doc.get("videos", [])[:1]:
            videos.append({**v, "id": vid, "folder": row.folder, "video": row.video})
        for c in doc.get("categories", []):
            if c not in categories:
                categories.append(c)
        for a in doc.get("annotations", []):
            annotations.append({**a, "id": len(annotations) + 1, "video_id": vid, "obj_id": a.get("id")})
    dataset: dict[str, object] = {
        "info": {"description": "vostream batch annotation", "format": "youtube-vis", "version": 1},
        "videos": videos,
        "categories": categories,
        "annotations": annotations,
    }
    atomic_write_text(out / DATASET_NAME, json.dumps(dataset, separators=(",", ":")))
    return dataset


# -- command line ------------------------------------------------------------------------------------------------


def add_annotate_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_common: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    """Add ``annotate`` to the ``vostream`` subcommands (``add_common`` adds --quiet/--verbose/--debug)."""
    a = sub.add_parser(
        "annotate",
        help="annotate many videos from a prompts file (resumable, parallel, Ray)",
        description="Track the prompted objects through every input video; outputs per video under "
        "DIR/<video-stem>/, summary.json and dataset.json at the top. Rerunning skips "
        "done videos. Reference: docs/annotate.md.",
    )
    a.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="video files, directories (searched recursively) or list files (@FILE, *.txt)",
    )
    a.add_argument(
        "--prompts",
        "-p",
        required=True,
        metavar="FILE",
        help="prompts file: JSON (per video) or CSV with header video,frame,obj_id,x,y,label",
    )
    a.add_argument("--out", "-o", required=True, metavar="DIR", help="output directory")
    a.add_argument(
        "--formats",
        "--save",
        default="video,json,mot",
        metavar="FORMATS",
        help="comma-separated outputs per video: video, png, json, mot (default video,json,mot)",
    )
    a.add_argument("--backend", default="classic", help="tracker backend (default classic)")
    a.add_argument("--model", metavar="DIR", help="model directory for neural backends")
    a.add_argument(
        "--workers",
        "-j",
        type=int,
        default=1,
        metavar="N",
        help="parallel workers: local processes, or Ray actors with --ray (default 1)",
    )
    a.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="ADDRESS",
        help="run on Ray: connect to ADDRESS (host:port), or start a local Ray without one",
    )
    a.add_argument("--ray-gpus", type=float, default=0.0, metavar="G", help="GPUs per Ray actor (default 0)")
    a.add_argument(
        "--ray-resources", metavar="JSON", help="custom resources per Ray actor, e.g. '{\"NPU\": 1}'"
    )
    a.add_argument(
        "--retries", type=int, default=1, metavar="R", help="extra attempts for a failing video (1)"
    )
    a.add_argument("--force", action="store_true", help="redo every video, even those already done")
    a.add_argument("--fill-holes", action="store_true", help="fill holes in masks")
    a.add_argument("--min-area", type=int, default=0, metavar="PX", help="remove mask specks under PX pixels")
    a.add_argument("--max-frames", type=int, metavar="N", help="stop each video after N frames")
    a.add_argument(
        "--queue-size", type=int, default=8, metavar="N", help="capacity of every queue (default 8)"
    )
    a.add_argument(
        "--opencv-threads",
        type=int,
        metavar="N",
        help="OpenCV threads per stage (default: cores / (2 x workers), at least 1)",
    )
    a.add_argument(
        "--codec-threads",
        type=int,
        metavar="N",
        help="FFmpeg threads of each video's decoder and encoder (default: cores / workers with 2 or more "
        "workers, else FFmpeg's choice)",
    )
    add_common(a)
    return a


def options_from_args(args: argparse.Namespace) -> AnnotateOptions:
    inputs = list(args.inputs)
    address = args.ray
    if address and ":" not in address and address != "auto" and os.path.exists(address):
        inputs.insert(0, address)  # ``--ray videos/``: argparse gave the first input to --ray
        address = ""
    resources: dict[str, float] = {}
    if args.ray_resources:
        try:
            resources = json.loads(args.ray_resources)
            if not isinstance(resources, dict) or not all(
                isinstance(v, (int, float)) for v in resources.values()
            ):
                raise ValueError
        except ValueError:
            raise ConfigError(
                f"--ray-resources {args.ray_resources!r}: expected a JSON object of numbers, "
                f"e.g. '{{\"NPU\": 1}}'"
            ) from None
    return AnnotateOptions(
        inputs=inputs,
        prompts=args.prompts,
        out=args.out,
        formats=tuple(args.formats.split(",")),
        backend=args.backend,
        model=args.model,
        workers=args.workers,
        ray=address is not None,
        ray_address=address or None,
        ray_gpus=args.ray_gpus,
        ray_resources=resources,
        retries=args.retries,
        force=args.force,
        fill_holes=args.fill_holes,
        min_area=args.min_area,
        max_frames=args.max_frames,
        queue_size=args.queue_size,
        opencv_threads=args.opencv_threads,
        codec_threads=args.codec_threads,
        quiet=bool(args.quiet),
    )


def cmd_annotate(args: argparse.Namespace) -> int:
    """``vostream annotate``: run the batch, print one summary line, return the exit code."""
    import sys

    options = options_from_args(args)
    if not options.quiet:
        for name in STATUS_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    report = run_annotate(options)
    if not options.quiet:
        line = (
            f"annotate: {report.count('done')} done ({sum(1 for r in report.results.values() if r.reused)} "
            f"already), {report.count('failed')} failed, {report.count('no_prompts')} without prompts, "
            f"{report.count('pending')} pending in {report.wall_s:.1f} s; summary in "
            f"{Path(report.out) / SUMMARY_NAME}"
        )
        try:
            print(line, file=sys.stderr)
        except OSError:
            pass
    return report.exit_code


__all__ = [
    "AnnotateOptions",
    "BatchPlan",
    "BatchReport",
    "VideoStatus",
    "add_annotate_parser",
    "cmd_annotate",
    "merge_dataset",
    "plan_batch",
    "run_annotate",
    "write_batch_summary",
]
