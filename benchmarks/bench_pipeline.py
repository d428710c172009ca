"""Pipeline overlap benchmark: is the threaded pipeline as fast as its slowest stage?

Runs one workload (a source factory + a stage-list factory) three ways:

1. **sequential**: one thread calls every stage's ``process`` in turn; also gives each stage's cost alone;
2. **pipeline**: :class:`vostream.pipeline.Pipeline` with a ``block`` policy (lossless, like a file);
3. **bound**: ``1 / (slowest stage's median time alone)``: each stage timed by itself, in one thread, on inputs
   prepared by the stages before it; the most a pipeline of these stages can sustain.

and reports ``pipeline / sequential`` (the overlap gain) and ``pipeline / bound`` (target >= 0.9).

The ``synthetic`` workload has three stages that release the GIL, of different costs, on 854x480 RGB frames:
a Gaussian blur, an up-and-down resize and a ``time.sleep``.  Add a workload by registering a
``(make_source, make_stages)`` pair in :data:`WORKLOADS`; factories are called afresh for each run, so stateful
stages (trackers) start clean.

    python benchmarks/bench_pipeline.py --frames 300 --json out/bench_pipeline.json
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import platform
import sys
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


def track_stages(args: argparse.Namespace) -> list[Stage[Any, Any]]:
    """The real stages of ``vostream track``: preprocess, the classic tracker (one object), postprocess."""
    from vostream.pipeline.types import Prompt
    from vostream.samples.scenes import render_scene
    from vostream.stages.postprocess import PostprocessStage
    from vostream.stages.preprocess import PreprocessStage
    from vostream.stages.track import TrackStage
    from vostream.stages.trackers import load_tracker

    scene = render_scene(args.scene, 854, 480, frames=max(args.frames, args.warmup, args.alone_frames))
    tracker = load_tracker("classic")
    prompt = Prompt(1, 0, [scene.click(1)], [1])
    return [PreprocessStage(tracker.input_spec), TrackStage(tracker, [prompt]), PostprocessStage()]


WORKLOADS: dict[str, tuple[SourceFactory, StagesFactory]] = {
    "synthetic": (synthetic_source, synthetic_stages),
    "sleep": (synthetic_source, sleep_stages),
    "track": (track_source, track_stages),
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


def run_sequential(
    make_source: SourceFactory, make_stages: StagesFactory, args: argparse.Namespace, n: int
) -> tuple[float, dict[str, float]]:
    """(frames per second, {stage: seconds per item}) of a plain single-thread loop."""
    source, stages = make_source(args, n), make_stages(args)
    for obj in (source, *stages):
        obj.open()
    spent = {s.name: 0.0 for s in stages}
    count = 0
    t0 = time.perf_counter()
    try:
        while (item := source.read()) is not None:
            for stage in stages:
                t = time.perf_counter()
                item = stage.process(item)
                spent[stage.name] += time.perf_counter() - t
                if item is None:
                    break
            count += 1
        wall = time.perf_counter() - t0
    finally:
        for obj in (source, *stages):
            obj.close()
    return count / wall, {k: v / max(count, 1) for k, v in spent.items()}


def measure_alone(
    make_source: SourceFactory, make_stages: StagesFactory, args: argparse.Namespace, n: int
) -> dict[str, float]:
    """{stage: median seconds per item} with each stage run alone on inputs prepared by the stages before it.

    Inputs are prepared untimed; each timed call gets a shallow copy, so a stage that replaces attributes of its
    item sees the same input every time.
    """
    source, stages = make_source(args, n), make_stages(args)
    for obj in (source, *stages):
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
    finally:
        for obj in (source, *stages):
            obj.close()
    return costs


def run_pipeline(
    make_source: SourceFactory, make_stages: StagesFactory, args: argparse.Namespace, n: int
) -> tuple[float, dict[str, Any]]:
    """(frames per second, final metrics as a dict) of the threaded pipeline (``block`` edges)."""
    sink = CountSinkSpec()
    pipe = Pipeline(
        make_source(args, n),
        make_stages(args),
        [sink],
        policy="block",
        queue_size=args.queue_size,
        name="bench",
    )
    t0 = time.perf_counter()
    report = pipe.run()
    wall = time.perf_counter() - t0
    if sink.built[0].count != n:
        raise RuntimeError(f"pipeline delivered {sink.built[0].count} of {n} items with block edges")
    return report.frames / wall, report.metrics.as_dict()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="synthetic", choices=sorted(WORKLOADS))
    ap.add_argument("--frames", type=int, default=300, help="items per run (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="items run once before measuring (default 20)")
    ap.add_argument(
        "--alone-frames", type=int, default=60, help="items to time each stage alone on (default 60)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="runs per mode; the best is kept (default 3)")
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
    ap.add_argument("--scene", default="translate", help="track workload: which synthetic scene")
    ap.add_argument("--media-dir", default="/tmp", help="track workload: where the scene video is kept")
    ap.add_argument("--json", help="write the results as JSON to this path")
    args = ap.parse_args(argv)
    if args.workload == "track" and "--cv-threads" not in (argv or sys.argv[1:]):
        from vostream.pipeline.apps.track import opencv_threads

        args.cv_threads = opencv_threads(None)  # what `vostream track` uses on this machine
    logging.basicConfig(level=logging.WARNING)
    cv2.setNumThreads(args.cv_threads)
    make_source, make_stages = WORKLOADS[args.workload]
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # other work skews the figures

    run_sequential(make_source, make_stages, args, args.warmup)
    seq = [run_sequential(make_source, make_stages, args, args.frames) for _ in range(args.repeats)]
    seq_fps = max(fps for fps, _ in seq)
    in_loop = {name: min(costs[name] for _, costs in seq) for name in seq[0][1]}
    alone = [measure_alone(make_source, make_stages, args, args.alone_frames) for _ in range(args.repeats)]
    per_stage = {name: min(costs[name] for costs in alone) for name in alone[0]}
    slowest = max(per_stage, key=lambda k: per_stage[k])
    bound_fps = 1.0 / per_stage[slowest]
    # CPU-bound stages share the cores: the pipeline cannot beat cores / (sum of the stages' CPU time) either
    # (an upper estimate: sleeps and device waits need no core, so this only binds for CPU work).
    cpu_bound_fps = _cpus() / sum(per_stage.values())
    pipe = [run_pipeline(make_source, make_stages, args, args.frames) for _ in range(args.repeats)]
    pipe_fps, metrics = max(pipe, key=lambda r: r[0])

    result = {
        "workload": args.workload,
        "frames": args.frames,
        "repeats": args.repeats,
        "queue_size": args.queue_size,
        "cv_threads": args.cv_threads,
        "cpus": _cpus(),
        "loadavg_1m_before": load_before,
        "python": platform.python_version(),
        "stage_ms_alone": {k: v * 1e3 for k, v in per_stage.items()},
        "stage_ms_in_sequential_loop": {k: v * 1e3 for k, v in in_loop.items()},
        "slowest_stage": slowest,
        "sequential_fps": seq_fps,
        "pipeline_fps": pipe_fps,
        "bound_fps": bound_fps,
        "pipeline_over_sequential": pipe_fps / seq_fps,
        "pipeline_over_bound": pipe_fps / bound_fps,
        "cores_over_sum_fps": cpu_bound_fps,
        "pipeline_metrics": metrics,
    }
    rows = [
        (f"stage {k} alone (median)", f"{v * 1e3:8.2f} ms", f"{1 / v:8.1f} fps") for k, v in per_stage.items()
    ]
    rows += [
        ("sequential loop", "", f"{seq_fps:8.1f} fps"),
        ("pipeline", "", f"{pipe_fps:8.1f} fps"),
        (f"bound (1/{slowest})", "", f"{bound_fps:8.1f} fps"),
        ("cores / sum of stages (if all CPU)", "", f"{cpu_bound_fps:8.1f} fps"),
        ("pipeline / sequential", "", f"{result['pipeline_over_sequential']:8.2f} x"),
        ("pipeline / bound", "", f"{result['pipeline_over_bound']:8.2f}   (target >= 0.90)"),
    ]
    width = max(len(r[0]) for r in rows)
    sys.stdout.write("\n".join(f"{a:<{width}}  {b:>11}  {c}" for a, b, c in rows) + "\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2)
    return 0


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


if __name__ == "__main__":
    raise SystemExit(main())
