"""One video of a batch: :class:`VideoJob` in, :class:`JobResult` out, run by a :class:`JobRunner` that holds one
loaded tracker.  The same code runs in local worker processes, Ray actors and (``workers=0``) the caller.

A job is one ``track`` pipeline (``build_track_pipeline``) with queue policy ``block``: no frame is dropped.
Before it runs, the video folder's stale outputs are removed (manifest first); after it succeeds the manifest is
written last.  A failed or cancelled job removes its partial outputs, so a folder never holds outputs without a
matching manifest for long.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from vostream.apps.annotate.manifest import VideoStats
from vostream.apps.track import run_warnings
from vostream.pipeline.errors import VostreamError, describe
from vostream.pipeline.types import Control

logger = logging.getLogger(__name__)

#: the thread-pool sizes NumPy's BLAS (OpenBLAS, MKL) and OpenMP read at import
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: called with the frames done so far; returning False cancels the job
ProgressFn = Callable[[int], bool]


@dataclass(frozen=True)
class TrackOptions:
    """The batch-wide ``track`` options every job uses.  Inert and picklable (sent to workers and actors)."""

    formats: tuple[str, ...] = ("video", "json", "mot")
    backend: str = "classic"
    model: str | None = None
    tracker: dict[str, object] = field(default_factory=dict)
    fill_holes: bool = False
    min_area: int = 0
    max_frames: int | None = None
    queue_size: int = 8
    opencv_threads: int | None = None
    codec_threads: int | None = None  # FFmpeg threads of the decoder and the encoder; None: FFmpeg's choice

    def thread_env(self) -> dict[str, str]:
        """Environment for a worker process: NumPy's BLAS and OpenMP pools sized like OpenCV's (they read these
        variables when the process imports NumPy, so a worker must be started with them)."""
        n = str(self.opencv_threads or 1)
        return {name: n for name in THREAD_ENV_VARS}

    def output_settings(self) -> dict[str, object]:
        """What determines the outputs (part of each video's fingerprint)."""
        return {
            "formats": sorted(self.formats),
            "backend": self.backend,
            "model": self.model,
            "tracker": self.tracker,
            "fill_holes": self.fill_holes,
            "min_area": self.min_area,
            "max_frames": self.max_frames,
        }


@dataclass
class VideoJob:
    """One video to annotate.  Picklable."""

    key: str
    source: str
    out_dir: str
    prompts: list[Control]
    fingerprint: str
    frames_expected: int | None = None
    attempt: int = 1


class JobResultRecord(TypedDict):
    """A :class:`JobResult` as plain data, as it crosses a process or a Ray actor."""

    key: str
    status: str
    frames: int
    objects: int
    wall_s: float
    fps: float
    error: str | None
    warnings: list[str]
    worker: str


@dataclass
class JobResult:
    """What happened to one attempt at a video.  ``status``: ``done``, ``failed`` or ``cancelled``."""

    key: str
    status: str
    frames: int = 0
    objects: int = 0
    wall_s: float = 0.0
    fps: float = 0.0
    error: str | None = None
    warnings: list[str] = field(default_factory=list)
    worker: str = ""

    def to_dict(self) -> JobResultRecord:
        return JobResultRecord(
            key=self.key,
            status=self.status,
            frames=self.frames,
            objects=self.objects,
            wall_s=self.wall_s,
            fps=self.fps,
            error=self.error,
            warnings=list(self.warnings),
            worker=self.worker,
        )

    @classmethod
    def from_dict(cls, data: JobResultRecord) -> JobResult:
        return cls(**data)


class JobRunner:
    """Loads the tracker once (raises :class:`BackendError`/:class:`ConfigError` if it cannot) and runs jobs one
    at a time.  Not thread-safe: one thread calls :meth:`run`."""

    def __init__(self, options: TrackOptions, worker: str = "") -> None:
        from vostream.stages.trackers import load_tracker

        self.options = options
        self.worker = worker or f"pid {os.getpid()}"
        tracker_options = dict(options.tracker)
        if options.model is not None:
            tracker_options["model"] = options.model
        self.tracker = load_tracker(options.backend, **tracker_options)

    def close(self) -> None:
        """Release the tracker (device memory, loaded graphs).  Idempotent."""
        self.tracker.close()

    def run(self, job: VideoJob, progress: ProgressFn | None = None) -> JobResult:
        """Annotate one video.  Never raises for a failure of the video: the result says ``failed`` with the
        error.  ``progress(frames)`` is called about every 0.25 s; returning False cancels the job."""
        from vostream.apps.annotate.manifest import clean_outputs, write_manifest
        from vostream.apps.config import TrackSettings
        from vostream.apps.track import build_track_pipeline

        o = self.options
        start = time.monotonic()
        try:
            clean_outputs(job.out_dir)
            settings = TrackSettings(
                source=job.source,
                out=job.out_dir,
                save=o.formats,
                backend=o.backend,
                model=o.model,
                prompts=list(job.prompts),
                queue_size=o.queue_size,
                policy="block",
                fill_holes=o.fill_holes,
                min_area=o.min_area,
                max_frames=o.max_frames,
                tracker=dict(o.tracker),
                quiet=True,
                opencv_threads=o.opencv_threads,
                codec_threads=o.codec_threads,
            )
            pipe, facts = build_track_pipeline(settings, tracker=self.tracker)
            pipe.start()
            cancelled = False
            while True:
                try:
                    report = pipe.wait(timeout=0.25)
                    break
                except TimeoutError:
                    if progress is not None and not cancelled and not progress(pipe.metrics().frames):
                        cancelled = True
                        pipe.cancel()
            if cancelled or report.cancelled:
                clean_outputs(job.out_dir)
                return JobResult(job.key, "cancelled", report.frames, error="cancelled", worker=self.worker)
            if progress is not None:
                progress(report.frames)
            wall = time.monotonic() - start
            result = JobResult(
                job.key,
                "done",
                report.frames,
                len(facts["objects"]),
                round(wall, 3),
                round(report.frames / wall, 2) if wall > 0 else 0.0,
                None,
                run_warnings(report.metrics.as_dict()),
                self.worker,
            )
            stats = VideoStats(
                frames=result.frames,
                objects=result.objects,
                wall_s=result.wall_s,
                fps=result.fps,
                warnings=list(result.warnings),
            )
            write_manifest(job.out_dir, job.key, job.fingerprint, stats)
            return result
        except Exception as exc:  # noqa: BLE001 - one video's failure is reported, never raised
            message = describe(exc) if isinstance(exc, VostreamError) else f"{type(exc).__name__}: {exc}"
            logger.info("video %s failed: %s", job.key, message)
            try:
                clean_outputs(job.out_dir)
            except VostreamError as clean_exc:
                message += f" (and {clean_exc})"
            return JobResult(
                job.key,
                "failed",
                error=message,
                wall_s=round(time.monotonic() - start, 3),
                worker=self.worker,
            )


__all__ = [
    "THREAD_ENV_VARS",
    "JobResult",
    "JobResultRecord",
    "JobRunner",
    "ProgressFn",
    "TrackOptions",
    "VideoJob",
]
