"""Decode throughput of ``VideoFileSource`` against the ``ffmpeg`` CLI on the same file, same thread count.

For each generated clip (854x480 and 1920x1080 H.264 by default) it times, alternating, median of ``--repeat``:

* ``ffmpeg``        ``ffmpeg -threads N -i FILE -f null -``            decode only (the reference)
* ``ffmpeg+rgb``    ``ffmpeg -threads N -i FILE -pix_fmt rgb24 -f null -``   decode + conversion to RGB
* ``pyav``          PyAV decode loop, no conversion                      (our decode cost)
* ``vostream``      ``VideoFileSource`` → upright RGB ``Frame``s          (what the pipeline gets)

and prints frames/s plus the ratio ``vostream / ffmpeg`` (target >= 0.8) and ``vostream / ffmpeg+rgb``.
Usage: ``python benchmarks/bench_decode.py [--threads N] [--frames 600] [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import av

from vostream.stages.sources import VideoFileSource

logger = logging.getLogger("bench_decode")


def make_clip(path: Path, width: int, height: int, frames: int, fps: int = 30) -> Path:
    """An H.264 clip of ffmpeg's ``testsrc2`` pattern (moving, detailed: a realistic decode load)."""
    if path.exists():
        return path
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-y",
            "-f",
            "lavfi",
            "-i",
            f"testsrc2=size={width}x{height}:rate={fps}",
            "-frames:v",
            str(frames),
            "-c:v",
            "libx264",
            "-preset",
            "veryfast",
            "-pix_fmt",
            "yuv420p",
            str(path),
        ],
        check=True,
    )
    return path


def run_ffmpeg(path: Path, threads: int, rgb: bool) -> int:
    cmd = ["ffmpeg", "-v", "error", "-nostdin", "-threads", str(threads), "-i", str(path)]
    cmd += ["-pix_fmt", "rgb24"] if rgb else []
    cmd += ["-f", "null", "-"]
    subprocess.run(cmd, check=True)
    return -1  # frame count taken from the other runs


def run_pyav(path: Path, threads: int) -> int:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.thread_type = "AUTO"
        s.codec_context.thread_count = threads
        return sum(1 for _ in c.decode(s))


def run_vostream(path: Path, threads: int) -> int:
    n = 0
    with VideoFileSource(path, threads=threads) as source:
        for _ in source:
            n += 1
    return n


def bench_file(path: Path, threads: int, repeat: int) -> dict[str, float | int | str]:
    runners: dict[str, Callable[[], int]] = {
        "ffmpeg": lambda: run_ffmpeg(path, threads, rgb=False),
        "ffmpeg+rgb": lambda: run_ffmpeg(path, threads, rgb=True),
        "pyav": lambda: run_pyav(path, threads),
        "vostream": lambda: run_vostream(path, threads),
    }
    times: dict[str, list[float]] = {k: [] for k in runners}
    frames = run_pyav(path, threads)  # also warms the page cache
    for _ in range(repeat):  # alternate the contenders so drift hits all of them alike
        for name, fn in runners.items():
            t0 = time.perf_counter()
            got = fn()
            times[name].append(time.perf_counter() - t0)
            if got >= 0 and got != frames:
                raise RuntimeError(f"{name} decoded {got} frames, expected {frames}")
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        size = f"{s.width}x{s.height}"
    row: dict[str, float | int | str] = {
        "file": path.name,
        "size": size,
        "frames": frames,
        "threads": threads,
    }
    for name, ts in times.items():
        row[f"{name}_fps"] = round(frames / statistics.median(ts), 1)
    row["ratio_vs_ffmpeg"] = round(float(row["vostream_fps"]) / float(row["ffmpeg_fps"]), 3)
    row["ratio_vs_ffmpeg_rgb"] = round(float(row["vostream_fps"]) / float(row["ffmpeg+rgb_fps"]), 3)
    row["rgb_share"] = round(1 - float(row["vostream_fps"]) / float(row["pyav_fps"]), 3)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--frames", type=int, default=600, help="frames of the 854x480 clip")
    parser.add_argument("--frames-1080", type=int, default=240, help="frames of the 1080p clip (0: skip)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to keep the generated clips")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument(
        "--opencv-threads",
        type=int,
        default=None,
        help="OpenCV threads (default: what `vostream track` uses on this machine)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if shutil.which("ffmpeg") is None:
        logger.error("bench_decode needs the ffmpeg command-line tool on PATH")
        return 2
    import cv2

    from vostream.apps.track import opencv_threads

    cv2.setNumThreads(opencv_threads(args.opencv_threads))
    work = args.dir or Path(tempfile.mkdtemp(prefix="vostream-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    clips = [make_clip(work / f"testsrc-854x480-{args.frames}.mp4", 854, 480, args.frames)]
    if args.frames_1080:
        clips.append(
            make_clip(work / f"testsrc-1920x1080-{args.frames_1080}.mp4", 1920, 1080, args.frames_1080)
        )
    rows = [bench_file(p, args.threads, args.repeat) for p in clips]
    cols = [
        "size",
        "frames",
        "threads",
        "ffmpeg_fps",
        "ffmpeg+rgb_fps",
        "pyav_fps",
        "vostream_fps",
        "ratio_vs_ffmpeg",
        "ratio_vs_ffmpeg_rgb",
        "rgb_share",
    ]
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(str(r[c]).rjust(w) for c, w in zip(cols, widths)) for r in rows]
    sys.stdout.write("\n".join(lines) + "\n")
    if args.json:
        args.json.write_text(
            json.dumps({"rows": rows, "cpu_count": os.cpu_count(), "pyav": av.__version__}, indent=2)
        )
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
