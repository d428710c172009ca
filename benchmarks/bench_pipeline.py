"""Pipeline overlap benchmark: is the threaded pipeline as fast as its slowest stage and its cores allow?

Runs one workload (a source factory, a stage-list factory and optional sinks) three ways, in interleaved rounds
(``--repeats``: sequential, alone, pipeline, then again; so a change in the machine's load hits every mode alike):

1. **sequential**: one thread calls every stage's ``process`` (and every sink's ``write``) in turn; also gives
   the process's CPU time per frame, every thread included (FFmpeg's decoder and x264's threads too);
2. **alone**: each stage timed by itself, in one thread, on inputs prepared by the stages before it;
3. **pipeline**: :class:`vostream.pipeline.Pipeline` with a ``block`` policy (lossless, like a file).

Two bounds: **A** = ``1 / (slowest stage alone)`` and **B** = ``cores / (CPU time per frame of the sequential
loop)`` (CPU-bound stages share the cores).  It reports ``pipeline / sequential`` (the overlap gain),
``pipeline / A`` and ``pipeline / min(A, B)`` (target >= 0.85).  Before each pipeline run a probe measures how
many cores' worth of parallel CPU work the machine gives right now (:func:`probe_cores`); ``pipeline / min(A, B at
the probe's cores)`` reads a run on a shared machine, and every mode's *cores used* (CPU time / wall time) is
printed.

Workloads: ``synthetic`` (a Gaussian blur, an up-and-down resize and a ``time.sleep`` on 854x480 RGB frames),
``sleep`` (three sleeps: the engine's overhead in latency), ``null`` (three stages that pass items on: the
engine's CPU cost per item), ``track`` (the real decode, preprocess, classic tracker and
postprocess of ``vostream track`` on an 854x480 H.264 scene; ``--flow-preset``) and ``track-lite`` (the same with
the tracker replaced by a stand-in of ``--track-ms`` CPU ms per frame, ``--track-gil`` of it holding the GIL: do
the other stages overlap when the tracker is cheap?).  ``--outputs files`` adds the sinks of ``vostream track``
(MP4, JSON, MOT) to the track workloads.  ``--profile`` makes one more pipeline run measuring each node's wall,
CPU and GIL-held time (``stage_profile.py``; the GIL column needs py-spy).  Add a workload by registering a
:class:`Workload` in :data:`WORKLOADS`; factories are called afresh for each run, so stateful stages start clean.

    python benchmarks/bench_pipeline.py --workload track --frames 300 --profile --json out/bench_pipeline.json
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from vostream.pipeline import Pipeline, Sink, SinkSpec, Source, Stage

logger = logging.getLogger("bench_pipeline")

SourceFactory = Callable[[argparse.Namespace, int], Source[Any]]
StagesFactory = Callable[[argparse.Namespace], list[Stage[Any, Any]]]
SinksFactory = Callable[[argparse.Namespace], list[SinkSpec[Any]]]


# -- synthetic workload --------------------------------------------------------------------------------------------
@dataclass(eq=False)
class BenchItem:
    index: int
    image: np.ndarray
    capture_time: float = 0.0
    stamps: dict[str, float] = field(default_factory=dict)


class ArraySource(Source[BenchItem]):
    """``n`` items sharing one random 854x480 RGB image (reading costs nothing)."""

    name = "source"

    def __init__(self, n: int, width: int = 854, height: int = 480) -> None:
        self.n = n
        self.image = np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8)
        self.i = 0

    def read(self) -> BenchItem | None:
        if self.i >= self.n:
            return None
        self.i += 1
        return BenchItem(self.i - 1, self.image, time.time())


class BlurStage(Stage[BenchItem, BenchItem]):
    name = "blur"

    def __init__(self, ksize: int) -> None:
        self.ksize = ksize

    def process(self, item: BenchItem) -> BenchItem:
        item.image = cv2.GaussianBlur(item.image, (self.ksize, self.ksize), 0)
        return item


class ResizeStage(Stage[BenchItem, BenchItem]):
    name = "resize"

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def process(self, item: BenchItem) -> BenchItem:
        h, w = item.image.shape[:2]
        big = cv2.resize(
            item.image, (int(w * self.scale), int(h * self.scale)), interpolation=cv2.INTER_CUBIC
        )
        item.image = cv2.resize(big, (w, h), interpolation=cv2.INTER_AREA)
        return item


class SleepStage(Stage[BenchItem, BenchItem]):
    """Stands in for device work that waits with the GIL released (an accelerator sync)."""

    name = "infer"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def process(self, item: BenchItem) -> BenchItem:
        time.sleep(self.seconds)
        return item


def synthetic_source(args: argparse.Namespace, n: int) -> Source[Any]:
    return ArraySource(n)


def synthetic_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    return [BlurStage(args.blur_ksize), ResizeStage(args.resize_scale), SleepStage(args.sleep_ms / 1000.0)]


class PassStage(Stage[BenchItem, BenchItem]):
    def __init__(self, name: str) -> None:
        self.name = name

    def process(self, item: BenchItem) -> BenchItem:
        return item


def null_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    """Three stages that pass items on: the pipeline's CPU time per item is the engine's own cost (4 queue hops,
    the metrics), what fusing stages would save."""
    return [PassStage(name) for name in ("decode", "preprocess", "track")]


def sleep_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    """Three sleeps of 1/3, 2/3 and 3/3 of ``--sleep-ms``: no CPU work, so this isolates the engine's overhead
    from CPU contention (a 2-core machine cannot overlap CPU-bound stages beyond its cores)."""
    stages = []
    for i, name in enumerate(("decode", "preprocess", "track"), start=1):
        stage = SleepStage(args.sleep_ms * i / 3000.0)
        stage.name = name
        stages.append(stage)
    return stages


def _scene_video(args: argparse.Namespace) -> str:
    """The benchmark's scene as an H.264 MP4 (rendered once, kept in --media-dir)."""
    from pathlib import Path

    from vostream.samples.scenes import render_scene, write_scene

    path = Path(args.media_dir) / f"{args.scene}-{args.frames}.mp4"
    if not path.exists():
        write_scene(
            render_scene(args.scene, 854, 480, frames=max(args.frames, args.warmup, args.alone_frames)), path
        )
    return str(path)


def track_source(args: argparse.Namespace, n: int) -> Source[Any]:
    from vostream.stages.sources import VideoFileSource

    return VideoFileSource(_scene_video(args), max_frames=n)


def _classic(args: argparse.Namespace) -> Any:
    from vostream.stages.trackers import load_tracker

    options = {"flow_preset": args.flow_preset} if args.flow_preset else {}
    return load_tracker("classic", **options)


def _click_prompt(args: argparse.Namespace) -> Any:
    from vostream.pipeline.types import Prompt
    from vostream.samples.scenes import render_scene

    scene = render_scene(args.scene, 854, 480, frames=max(args.frames, args.warmup, args.alone_frames))
    return Prompt(1, 0, [scene.click(1)], [1])


def track_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    """The real stages of ``vostream track``: preprocess, the classic tracker (one object), postprocess."""
    from vostream.stages.postprocess import PostprocessStage
    from vostream.stages.preprocess import PreprocessStage
    from vostream.stages.track import TrackStage

    tracker = _classic(args)
    return [
        PreprocessStage(tracker.input_spec),
        TrackStage(tracker, [_click_prompt(args)]),
        PostprocessStage(),
    ]


class StandInTrackStage(Stage[Any, Any]):
    """Stands in for a cheap tracker: about ``ms`` of CPU time per frame, the first ``gil`` fraction of it in a
    pure-Python loop (holding the GIL), the rest in OpenCV blurs of the tracker's input (GIL released); then a
    result like a tracker's: logits of one disc at the tracker's resolution.

    Both loops run a fixed number of iterations, calibrated once against this thread's CPU time when the first
    frame arrives, so the cost does not depend on how loaded the machine is (and no clock is read per
    iteration: ``time.thread_time`` is a system call, and py-spy attributes the GIL to threads inside one)."""

    name = "track"

    def __init__(self, ms: float, gil: float) -> None:
        if not 0.0 <= gil <= 1.0:
            raise SystemExit(f"--track-gil must be within 0..1, got {gil}")
        self.seconds, self.gil = ms / 1000.0, gil
        self._logits: np.ndarray | None = None
        self._scratch: np.ndarray | None = None
        self._spins = self._blurs = 0

    @staticmethod
    def _spin(n: int) -> None:
        for _ in range(n):
            for _ in range(100):
                pass

    def _calibrate(self, tensor: np.ndarray) -> None:
        assert self._scratch is not None
        t = time.thread_time()
        self._spin(2000)
        per_spin = (time.thread_time() - t) / 2000
        t = time.thread_time()
        for _ in range(100):
            cv2.GaussianBlur(tensor, (5, 5), 0, dst=self._scratch)
        per_blur = (time.thread_time() - t) / 100
        self._spins = round(self.seconds * self.gil / max(per_spin, 1e-9))
        self._blurs = round(self.seconds * (1 - self.gil) / max(per_blur, 1e-9))

    def process(self, frame: Any) -> Any:
        from vostream.pipeline.types import TrackResult

        tensor = frame.tensor
        if self._logits is None or self._logits.shape[1:] != tensor.shape[:2]:
            h, w = tensor.shape[:2]
            yy, xx = np.mgrid[:h, :w]
            disc = (min(h, w) / 5 - np.hypot(yy - h / 2, xx - w / 2)) / 4
            self._logits = np.clip(disc, -6, 6).astype(np.float32)[None]
            self._scratch = np.empty_like(tensor)
            self._calibrate(tensor)
        self._spin(self._spins)
        for _ in range(self._blurs):
            cv2.GaussianBlur(tensor, (5, 5), 0, dst=self._scratch)
        frame.result = TrackResult(
            frame.index, [1], [1.0], [True], [[0, 0, 1, 1]], logits=self._logits.copy()
        )
        return frame


def track_lite_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    """The real preprocess and postprocess around :class:`StandInTrackStage` (``--track-ms``, ``--track-gil``):
    do the stages other than the tracker overlap when the tracker is cheap?"""
    from vostream.stages.postprocess import PostprocessStage
    from vostream.stages.preprocess import PreprocessStage

    return [
        PreprocessStage(_classic(args).input_spec),
        StandInTrackStage(args.track_ms, args.track_gil),
        PostprocessStage(),
    ]


def file_sinks(args: argparse.Namespace) -> list[SinkSpec[Any]]:
    """``--outputs files``: the sinks of ``vostream track`` (annotated MP4, YouTube-VIS JSON, MOT) into a fresh
    temporary directory (removed at exit)."""
    import atexit
    import shutil
    import tempfile

    from vostream.sinks import build_file_sinks

    if args.outputs == "none":
        return []
    out = tempfile.mkdtemp(prefix="bench-pipeline-")
    atexit.register(shutil.rmtree, out, True)
    return build_file_sinks(out, ("video", "json", "mot"), fps=25.0, source_name="bench.mp4")


def no_sinks(args: argparse.Namespace) -> list[SinkSpec[Any]]:
    return []


@dataclass(frozen=True)
class Workload:
    source: SourceFactory
    stages: StagesFactory
    sinks: SinksFactory = no_sinks


WORKLOADS: dict[str, Workload] = {
    "synthetic": Workload(synthetic_source, synthetic_stages),
    "sleep": Workload(synthetic_source, sleep_stages),
    "null": Workload(synthetic_source, null_stages),
    "track": Workload(track_source, track_stages, file_sinks),
    "track-lite": Workload(track_source, track_lite_stages, file_sinks),
}


# -- measurement ---------------------------------------------------------------------------------------------------
class CountSink(Sink[Any]):
    def __init__(self) -> None:
        self.count = 0

    def write(self, item: Any) -> None:
        self.count += 1

    def close(self) -> None:
        pass


class CountSinkSpec(SinkSpec[Any]):
    name = "count"

    def __init__(self) -> None:
        self.built: list[CountSink] = []

    def build(self) -> CountSink:
        self.built.append(CountSink())
        return self.built[-1]


@dataclass
class SequentialRun:
    fps: float
    cpu_ms_per_frame: float  # the whole process (every thread: FFmpeg's, x264's, OpenCV's too)
    stage_ms: dict[str, float]  # wall time per item of each stage/sink inside the loop


def run_sequential(workload: Workload, args: argparse.Namespace, n: int) -> SequentialRun:
    """A plain single-thread loop: read, every stage's ``process``, every sink's ``write``, in turn."""
    source, stages = workload.source(args, n), workload.stages(args)
    sinks = [spec.build() for spec in workload.sinks(args)]
    for obj in (source, *stages, *sinks):
        obj.open()
    spent = {s.name: 0.0 for s in (*stages, *sinks)}
    count = 0
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        while (item := source.read()) is not None:
            for stage in stages:
                t = time.perf_counter()
                item = stage.process(item)
                spent[stage.name] += time.perf_counter() - t
                if item is None:
                    break
            else:
                for sink in sinks:
                    t = time.perf_counter()
                    sink.write(item)
                    spent[sink.name] += time.perf_counter() - t
            count += 1
    finally:
        for obj in (source, *stages, *sinks):
            obj.close()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0  # closing flushes the encoder: counted
    return SequentialRun(
        count / wall, cpu / max(count, 1) * 1e3, {k: v / max(count, 1) for k, v in spent.items()}
    )


def measure_alone(workload: Workload, args: argparse.Namespace, n: int) -> dict[str, float]:
    """{node: median seconds per item} with each node run alone on inputs prepared by the nodes before it.

    Inputs are prepared untimed; each timed call gets a shallow copy, so a stage that replaces attributes of its
    item sees the same input every time.  Sinks get the last stage's outputs in order.
    """
    source, stages = workload.source(args, n), workload.stages(args)
    sinks = [spec.build() for spec in workload.sinks(args)]
    for obj in (source, *stages, *sinks):
        obj.open()
    try:
        inputs, read_times = [], []
        while True:
            t = time.perf_counter()
            item = source.read()
            read_times.append(time.perf_counter() - t)
            if item is None:
                break
            inputs.append(item)
        costs: dict[str, float] = {"source": float(np.median(read_times[:-1] or read_times))}
        for stage in stages:
            times, outputs = [], []
            for item in inputs:
                x = copy.copy(item)
                t = time.perf_counter()
                out = stage.process(x)
                times.append(time.perf_counter() - t)
                if out is not None:
                    outputs.append(out)
            costs[stage.name] = float(np.median(times))
            inputs = outputs
        for sink in sinks:
            times = []
            for item in inputs:
                t = time.perf_counter()
                sink.write(item)
                times.append(time.perf_counter() - t)
            costs[sink.name] = float(np.median(times))
    finally:
        for obj in (source, *stages, *sinks):
            obj.close()
    return costs


@dataclass
class PipelineRun:
    fps: float
    cpu_ms_per_frame: float
    metrics: dict[str, Any]
    profile: dict[str, Any] | None = None


def run_pipeline(workload: Workload, args: argparse.Namespace, n: int, profile: bool = False) -> PipelineRun:
    """The threaded pipeline (``block`` edges).  ``profile``: also each node's wall, CPU and GIL-held time
    (``stage_profile.py``)."""
    count = CountSinkSpec()
    source, stages, sinks = workload.source(args, n), workload.stages(args), workload.sinks(args)
    sinks = [*sinks, count]
    times: list[Any] = []
    native = gil = None
    if profile:
        from stage_profile import GilSampler, NativeThreads, timed

        source, stages, sinks, times = timed(source, stages, sinks)
        native = NativeThreads()
        gil = GilSampler(keep=args.profile_stacks, nonblocking=not args.profile_blocking)
    pipe = Pipeline(source, stages, sinks, policy="block", queue_size=args.queue_size, name="bench")
    if gil is not None and native is not None:
        gil.start()
        native.start()
    t0, c0 = time.perf_counter(), time.process_time()
    pipe.start()
    if native is not None:
        native.exclude(t.native_id for t in threading.enumerate() if t.native_id is not None)
    report = pipe.wait()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    delivered = count.built[0].count
    if delivered != n:
        raise RuntimeError(f"pipeline delivered {delivered} of {n} items with block edges")
    result = PipelineRun(report.frames / wall, cpu / max(report.frames, 1) * 1e3, report.metrics.as_dict())
    if gil is not None and native is not None:
        held = gil.stop()
        result.profile = _profile_table(times, native.stop(), held, gil, report.frames, wall, cpu)
    return result


def _profile_table(
    times: list[Any],
    native: dict[str, float],
    held: dict[str, float],
    gil: Any,
    frames: int,
    wall: float,
    cpu: float,
) -> dict[str, Any]:
    per = 1e3 / max(frames, 1)
    rows = []
    for t in times:
        if t.name == "count":
            continue
        gil_ms = held.get(t.thread_name, 0.0) * per if not gil.error else None
        rows.append(
            {
                "node": t.name,
                "kind": t.kind,
                "calls": t.calls,
                "wall_ms": t.wall_s * per,
                "thread_cpu_ms": t.thread_cpu_s * per,  # the whole thread: the engine's per-item work too
                "gil_ms": gil_ms,
                "gil_share_of_cpu": None
                if gil_ms is None or t.thread_cpu_s <= 0
                else gil_ms / (t.thread_cpu_s * per),
            }
        )
    measured = {t.thread_name for t in times}
    others_gil = sum(v for k, v in held.items() if k not in measured) * per
    return {
        "nodes": rows,
        "native_threads_cpu_ms": {k: v * per for k, v in native.items()},
        "process_cpu_ms": cpu * per,
        "wall_ms": wall * per,
        "gil_ms_total": None if gil.error else sum(held.values()) * per,
        "gil_ms_other_threads": None if gil.error else others_gil,
        "gil_error": gil.error,
        "gil_warnings": gil.warnings,
    }


def _print_profile(p: dict[str, Any]) -> None:
    out = ["", "per node, in the pipeline (ms per frame; CPU = this thread's; GIL = held by this thread):"]
    out.append(f"  {'node':<28} {'wall':>7} {'CPU':>7} {'GIL':>7} {'GIL/CPU':>8}")
    for r in p["nodes"]:
        gil = "   n/a" if r["gil_ms"] is None else f"{r['gil_ms']:7.2f}"
        share = "    n/a" if r["gil_share_of_cpu"] is None else f"{r['gil_share_of_cpu'] * 100:7.0f}%"
        out.append(f"  {r['node'][:28]:<28} {r['wall_ms']:7.2f} {r['thread_cpu_ms']:7.2f} {gil} {share}")
    for name, ms in p["native_threads_cpu_ms"].items():
        out.append(f"  {name[:40]:<40} {'':>3} CPU {ms:6.2f}")
    out.append(
        f"  whole process: CPU {p['process_cpu_ms']:.2f} ms per frame over {p['wall_ms']:.2f} ms of wall time"
    )
    if p["gil_error"]:
        out.append(f"  GIL: not measured: {p['gil_error']}")
    else:
        total = p["gil_ms_total"]
        out.append(
            f"  GIL held by any thread: {total:.2f} ms per frame ({total / p['wall_ms'] * 100:.0f}% of the time; "
            f"other threads {p['gil_ms_other_threads']:.2f}); the GIL alone would allow {1e3 / max(total, 1e-9):.0f} fps"
        )
        for w in p["gil_warnings"]:
            out.append(f"  py-spy: {w}")
    sys.stdout.write("\n".join(out) + "\n")


def probe_cores(seconds: float = 1.0) -> float:
    """How many cores' worth of work a CPU-bound job gets right now: OpenCV blurs (GIL released) in one thread
    for ``seconds / 2``, then in one thread per core for ``seconds``; the ratio of the two rates.  About the
    number of cores on an idle machine; less when other work shares it, or when the virtual CPUs do not run in
    parallel at full speed (seen on the 2-core development VM: 1.1-1.9).  Run next to each pipeline run, it says
    how much of the machine that run could have had."""
    image = np.random.default_rng(1).integers(0, 256, (270, 480, 3), np.uint8)

    def blurs(until: float, counts: list[int]) -> None:
        out, n = np.empty_like(image), 0
        while time.perf_counter() < until:
            cv2.GaussianBlur(image, (9, 9), 0, dst=out)
            n += 1
        counts.append(n)

    one: list[int] = []
    blurs(time.perf_counter() + seconds / 2, one)
    rate_one = one[0] / (seconds / 2)
    many: list[int] = []
    stop = time.perf_counter() + seconds
    threads = [threading.Thread(target=blurs, args=(stop, many)) for _ in range(_cpus())]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(many) / seconds / max(rate_one, 1e-9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="synthetic", choices=sorted(WORKLOADS))
    ap.add_argument("--frames", type=int, default=300, help="items per run (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="items run once before measuring (default 20)")
    ap.add_argument(
        "--alone-frames", type=int, default=60, help="items to time each stage alone on (default 60)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of (sequential, alone, pipeline), interleaved so each mode sees the same load; the best of "
        "each mode is kept (default 3)",
    )
    ap.add_argument("--queue-size", type=int, default=8)
    ap.add_argument("--blur-ksize", type=int, default=15)
    ap.add_argument("--resize-scale", type=float, default=1.25)
    ap.add_argument("--sleep-ms", type=float, default=10.0)
    ap.add_argument(
        "--cv-threads",
        type=int,
        default=1,
        help="cv2.setNumThreads (default 1: each stage uses one core, overlap comes from the pipeline)",
    )
    ap.add_argument("--scene", default="translate", help="track workloads: which synthetic scene")
    ap.add_argument("--media-dir", default="/tmp", help="track workloads: where the scene video is kept")
    ap.add_argument(
        "--flow-preset", help="track: the classic tracker's DIS preset (default: the tracker's own)"
    )
    ap.add_argument(
        "--track-ms", type=float, default=4.0, help="track-lite: CPU ms per frame of the stand-in"
    )
    ap.add_argument(
        "--track-gil", type=float, default=0.0, help="track-lite: share of that time holding the GIL (0..1)"
    )
    ap.add_argument(
        "--outputs",
        choices=("none", "files"),
        default="none",
        help="track workloads: 'files' adds the sinks of vostream track (MP4, JSON, MOT) into a temporary folder",
    )
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval (seconds; Python's default 0.005): how long a thread waiting for the GIL "
        "lets the holder run before asking it to drop the GIL",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="one more pipeline run measuring each node's wall, CPU and GIL-held time (py-spy)",
    )
    ap.add_argument(
        "--profile-stacks", metavar="PATH", help="with --profile: keep py-spy's GIL-holding stacks (raw) here"
    )
    ap.add_argument(
        "--profile-blocking",
        action="store_true",
        help="with --profile: let py-spy pause the process for each sample (by default it does not: checked "
        "against the stand-in tracker, pausing overstated GIL-held time, 86-88%% instead of ~55%%)",
    )
    ap.add_argument("--json", help="write the results as JSON to this path")
    args = ap.parse_args(argv)
    if args.workload.startswith("track") and "--cv-threads" not in (argv or sys.argv[1:]):
        from vostream.apps.track import opencv_threads

        args.cv_threads = opencv_threads(None)  # what `vostream track` uses on this machine
    logging.basicConfig(level=logging.WARNING)
    cv2.setNumThreads(args.cv_threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    workload = WORKLOADS[args.workload]
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other work skews the figures

    run_sequential(workload, args, args.warmup)
    seq, alone, pipe, available = [], [], [], []
    for _ in range(args.repeats):  # interleaved: a change in the machine's load hits every mode alike
        seq.append(run_sequential(workload, args, args.frames))
        alone.append(measure_alone(workload, args, args.alone_frames))
        available.append(probe_cores())
        pipe.append(run_pipeline(workload, args, args.frames))
    best_seq = max(seq, key=lambda r: r.fps)
    in_loop = {name: min(r.stage_ms[name] for r in seq) for name in seq[0].stage_ms}
    per_stage = {name: min(costs[name] for costs in alone) for name in alone[0]}
    slowest = max(per_stage, key=lambda k: per_stage[k])
    bound_fps = 1.0 / per_stage[slowest]
    # CPU-bound stages share the cores: the pipeline cannot beat cores / (CPU time per frame) either.  The sum of
    # the stages alone misses the decoder's and encoder's own threads; the sequential loop's process CPU time per
    # frame counts them (an upper estimate for sleeps and device waits, which need no core).
    sum_bound_fps = _cpus() / sum(per_stage.values())
    cpu_bound_fps = _cpus() / (min(r.cpu_ms_per_frame for r in seq) / 1e3)
    target_fps = min(bound_fps, cpu_bound_fps)
    best_i = max(range(len(pipe)), key=lambda i: pipe[i].fps)
    best_pipe, cores_available = pipe[best_i], available[best_i]
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    result: dict[str, Any] = {
        "workload": args.workload,
        "frames": args.frames,
        "repeats": args.repeats,
        "queue_size": args.queue_size,
        "cv_threads": args.cv_threads,
        "cpus": _cpus(),
        "loadavg_1m_before": load_before,
        "loadavg_1m_after": load_after,
        "python": platform.python_version(),
        "stage_ms_alone": {k: v * 1e3 for k, v in per_stage.items()},
        "stage_ms_in_sequential_loop": {k: v * 1e3 for k, v in in_loop.items()},
        "slowest_stage": slowest,
        "sequential_fps": best_seq.fps,
        "sequential_cpu_ms_per_frame": best_seq.cpu_ms_per_frame,
        "pipeline_fps": best_pipe.fps,
        "pipeline_cpu_ms_per_frame": best_pipe.cpu_ms_per_frame,
        "bound_fps": bound_fps,
        "pipeline_over_sequential": best_pipe.fps / best_seq.fps,
        "pipeline_over_bound": best_pipe.fps / bound_fps,
        "cores_over_sum_fps": sum_bound_fps,
        "cores_over_cpu_fps": cpu_bound_fps,
        "target_bound_fps": target_fps,
        "pipeline_over_target_bound": best_pipe.fps / target_fps,
        "pipeline_metrics": best_pipe.metrics,
        # CPU time / wall time: how much of the machine each mode got (on a loaded machine, less than its cores)
        "sequential_cores_used": best_seq.cpu_ms_per_frame * best_seq.fps / 1e3,
        "pipeline_cores_used": best_pipe.cpu_ms_per_frame * best_pipe.fps / 1e3,
        "switch_interval_s": sys.getswitchinterval(),
        "cores_available_probe": cores_available,  # measured just before the best pipeline run
        # bound B with the cores the probe got instead of all of them: what a loaded machine allowed
        "probe_bound_fps": cores_available / (min(r.cpu_ms_per_frame for r in seq) / 1e3),
    }
    result["pipeline_over_probe_bound"] = best_pipe.fps / min(bound_fps, result["probe_bound_fps"])
    for key in ("flow_preset", "track_ms", "track_gil", "outputs"):
        result[key] = getattr(args, key)
    rows = [
        (f"stage {k} alone (median)", f"{v * 1e3:8.2f} ms", f"{1 / v:8.1f} fps") for k, v in per_stage.items()
    ]
    rows += [
        (
            "sequential loop",
            f"{best_seq.cpu_ms_per_frame:8.2f} ms",
            f"{best_seq.fps:8.1f} fps   (ms: CPU per frame; {result['sequential_cores_used']:.2f} cores used)",
        ),
        (
            "pipeline",
            f"{best_pipe.cpu_ms_per_frame:8.2f} ms",
            f"{best_pipe.fps:8.1f} fps   ({result['pipeline_cores_used']:.2f} cores used; a parallel CPU-bound "
            f"probe got {cores_available:.2f} cores' worth just before)",
        ),
        (f"bound A: 1 / slowest ({slowest})", "", f"{bound_fps:8.1f} fps"),
        ("cores / sum of stages alone", "", f"{sum_bound_fps:8.1f} fps"),
        ("bound B: cores / CPU per frame (seq.)", "", f"{cpu_bound_fps:8.1f} fps"),
        ("pipeline / sequential", "", f"{result['pipeline_over_sequential']:8.2f} x"),
        ("pipeline / bound A", "", f"{result['pipeline_over_bound']:8.2f}"),
        ("pipeline / min(A, B)", "", f"{result['pipeline_over_target_bound']:8.2f}   (target >= 0.85)"),
        (
            "pipeline / min(A, B at the probe's cores)",
            "",
            f"{result['pipeline_over_probe_bound']:8.2f}   (the same, for the share of the machine this run had)",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    sys.stdout.write("\n".join(f"{a:<{width}}  {b:>11}  {c}" for a, b, c in rows) + "\n")
    if load_before is not None and load_after is not None and max(load_before, load_after) > 0.5 * _cpus():
        sys.stdout.write(
            f"note: load average {load_before:.1f} before, {load_after:.1f} after on {_cpus()} cores: other work "
            f"shared the machine; treat these figures as provisional\n"
        )
    if args.profile:
        result["profile"] = run_pipeline(workload, args, args.frames, profile=True).profile
        _print_profile(result["profile"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    raise SystemExit(main())
