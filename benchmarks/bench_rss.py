"""Memory over a long stream: is the resident set size flat over 10,000 frames?

Runs the real pipeline (preprocess → classic tracker → postprocess → sinks) on an endless synthetic scene made on
the fly (a textured object moving over a panning textured background; no file, so decode is not measured here),
and samples the process RSS every ``--every`` frames from a sink.  Reports RSS after warm-up, the maximum, the
final value and the least-squares slope in MiB per 1,000 frames after warm-up (flat: |slope| well under 1 MiB).

The sinks are the streaming ones whose memory must not grow with the stream: MOT text and the annotated MP4.  The
YouTube-VIS JSON sink keeps one RLE string per frame and object until it writes the file (about 100-300 bytes
each); ``--with-json`` adds it, to measure that cost.

    python benchmarks/bench_rss.py --frames 10000 --json bench-out/rss.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from vostream.pipeline import Pipeline
from vostream.pipeline.stage import Sink, SinkSpec, Source
from vostream.pipeline.types import Frame, Prompt
from vostream.sinks import MotSinkSpec, VideoSinkSpec, VisJsonSinkSpec
from vostream.stages.postprocess import PostprocessStage
from vostream.stages.preprocess import PreprocessStage
from vostream.stages.track import TrackStage
from vostream.stages.trackers import load_tracker


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class EndlessScene(Source[Frame]):
    """A textured disc moving on a Lissajous path over a slowly panning textured background."""

    name = "synthetic"

    def __init__(self, n: int, width: int, height: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.n, self.w, self.h = n, width, height
        big = rng.integers(0, 255, (height // 8 + 8, width // 8 + 40, 3), np.uint8)
        self.bg = cv2.GaussianBlur(
            cv2.resize(big, (width + 320, height + 64), interpolation=cv2.INTER_CUBIC), (0, 0), 2
        )
        self.r = min(width, height) // 8
        tex = rng.integers(0, 255, (8, 8, 3), np.uint8)
        tex = cv2.resize(tex, (2 * self.r, 2 * self.r), interpolation=cv2.INTER_CUBIC)
        self.obj = (tex // 3 + np.array([160, 40, 40], np.uint8)).astype(np.uint8)
        yy, xx = np.mgrid[-self.r : self.r, -self.r : self.r]
        self.disc = (xx**2 + yy**2) < self.r**2
        self.i = 0
        self.length = n

    def centre(self, i: int) -> tuple[int, int]:
        cx = self.w / 2 + (self.w / 2 - self.r - 4) * np.sin(i / 97.0)
        cy = self.h / 2 + (self.h / 2 - self.r - 4) * np.sin(i / 61.0)
        return int(cx), int(cy)

    def read(self) -> Frame | None:
        if self.i >= self.n:
            return None
        i = self.i
        self.i += 1
        off = int(160 + 150 * np.sin(i / 211.0))
        img = np.ascontiguousarray(self.bg[32 : 32 + self.h, off : off + self.w])
        cx, cy = self.centre(i)
        region = img[cy - self.r : cy + self.r, cx - self.r : cx + self.r]
        region[self.disc] = self.obj[self.disc]
        return Frame(i, img, capture_time=time.time())


class RssProbe(Sink[Frame]):
    name = "rss"

    def __init__(self, every: int, samples: list[tuple[int, float]]) -> None:
        self.every, self.samples = every, samples

    def write(self, frame: Frame) -> None:
        if frame.index % self.every == 0:
            self.samples.append((frame.index, rss_mib()))

    def close(self) -> None:
        pass


class RssProbeSpec(SinkSpec[Frame]):
    name = "rss"

    def __init__(self, every: int) -> None:
        self.every = every
        self.samples: list[tuple[int, float]] = []

    def build(self) -> Sink[Frame]:
        return RssProbe(self.every, self.samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=10_000)
    ap.add_argument("--size", default="320x240")
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--with-json", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.split("x"))
    source = EndlessScene(args.frames, w, h)
    tracker = load_tracker("classic")
    cx, cy = source.centre(0)
    probe = RssProbeSpec(args.every)
    with tempfile.TemporaryDirectory() as tmp:
        sinks: list[SinkSpec[Any]] = [
            probe,
            MotSinkSpec(Path(tmp) / "mot.txt"),
            VideoSinkSpec(Path(tmp) / "overlay.mp4", fps=30),
        ]
        if args.with_json:
            sinks.append(VisJsonSinkSpec(Path(tmp) / "annotations.json"))
        stages = [
            PreprocessStage(tracker.input_spec),
            TrackStage(tracker, [Prompt(1, 0, [[cx, cy]], [1])]),
            PostprocessStage(),
        ]
        t0 = time.perf_counter()
        report = Pipeline(source, stages, sinks, name="rss").run()
        wall = time.perf_counter() - t0
    samples = probe.samples
    after = [(i, r) for i, r in samples if i >= args.warmup]
    xs = np.array([i for i, _ in after], np.float64)
    ys = np.array([r for _, r in after], np.float64)
    slope = float(np.polyfit(xs, ys, 1)[0] * 1000) if len(after) >= 2 else float("nan")
    result = {
        "frames": report.frames,
        "size": args.size,
        "wall_s": round(wall, 1),
        "fps": round(report.frames / wall, 1),
        "rss_after_warmup_mib": round(float(ys[0]), 1) if len(ys) else None,
        "rss_max_mib": round(float(ys.max()), 1) if len(ys) else None,
        "rss_final_mib": round(float(ys[-1]), 1) if len(ys) else None,
        "slope_mib_per_1000_frames": round(slope, 3),
        "with_json": args.with_json,
        "samples": samples,
    }
    print(f"{report.frames} frames at {args.size} in {wall:.0f} s ({result['fps']} fps)")
    print(
        f"RSS after {args.warmup} frames {result['rss_after_warmup_mib']} MiB, max {result['rss_max_mib']} MiB, "
        f"final {result['rss_final_mib']} MiB, slope {result['slope_mib_per_1000_frames']} MiB / 1000 frames"
    )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
