"""Benchmark ``vostream annotate``: videos per hour and frames per second with 1 and 2 local workers (the scaling
ratio) and with a local Ray (2 actors); Ray's overhead against local workers.

A batch of synthetic scenes (``--videos`` clips of ``--size`` and ``--frames``, one or two objects each, H.264) is
annotated from first-frame clicks with the default outputs (video, json, mot) into a fresh directory per run.
Every run's wall time includes starting its workers (spawned processes / Ray actors loading the tracker); the time
to start a local Ray itself is measured apart.  Every run must produce the same files (checked).

    python benchmarks/bench_annotate.py [--videos 8] [--size 480x270] [--frames 60] [--no-ray] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from vostream.pipeline.apps.annotate.batch import AnnotateOptions, run_annotate
from vostream.samples.scenes import render_scene, write_scene

logger = logging.getLogger("bench_annotate")
SCENE_CYCLE = ("translate", "crossing", "illumination", "camera_pan", "deform", "distractor")


def make_batch(root: Path, videos: int, w: int, h: int, frames: int) -> Path:
    rows = ["video,frame,obj_id,x,y,label"]
    (root / "vids").mkdir(parents=True)
    for i in range(videos):
        name = SCENE_CYCLE[i % len(SCENE_CYCLE)]
        scene = render_scene(name, w, h, frames=frames, seed=i)
        key = f"{i:03d}_{name}.mp4"
        write_scene(scene, root / "vids" / key)
        for k, oid in enumerate(scene.obj_ids):
            x, y = (int(round(float(v))) for v in scene.clicks[k])
            rows.append(f"{key},0,{oid},{x},{y},1")
    (root / "prompts.csv").write_text("\n".join(rows) + "\n")
    return root


def digest(out: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in ("summary.json", "manifest.json", ".annotate.lock"):
            h.update(p.relative_to(out).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def run(root: Path, label: str, **options: Any) -> dict[str, Any]:
    out = root / f"out-{label}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    report = run_annotate(
        AnnotateOptions(
            inputs=[str(root / "vids")],
            prompts=str(root / "prompts.csv"),
            out=str(out),
            quiet=True,
            **options,
        )
    )
    wall = time.perf_counter() - t0
    if report.exit_code != 0:
        raise SystemExit(f"{label}: the batch failed: {report.failed}")
    frames = sum(r.frames for r in report.results.values())
    videos = len(report.results)
    row = {
        "run": label,
        "videos": videos,
        "frames": frames,
        "wall_s": round(wall, 2),
        "videos_per_hour": round(videos / wall * 3600),
        "fps": round(frames / wall, 1),
        "digest": digest(out),
    }
    logger.info(
        "%-10s %3d videos %5d frames  %6.2f s  %7d videos/h  %6.1f fps",
        label,
        videos,
        frames,
        wall,
        row["videos_per_hour"],
        row["fps"],
    )
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--size", default="480x270")
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runs")
    parser.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("vostream").setLevel(logging.WARNING)  # workers inherit this: no per-video chatter
    w, h = (int(v) for v in args.size.lower().split("x"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with tempfile.TemporaryDirectory(prefix="bench-annotate-") as tmp:
        root = make_batch(Path(tmp), args.videos, w, h, args.frames)
        logger.info(
            "batch: %d videos of %dx%d, %d frames each; %s cores", args.videos, w, h, args.frames, cores
        )
        rows = [run(root, "workers=1", workers=1), run(root, "workers=2", workers=2)]
        result: dict[str, Any] = {
            "videos": args.videos,
            "size": [w, h],
            "frames_per_video": args.frames,
            "cores": cores,
            "runs": rows,
        }
        result["scaling_2_vs_1"] = round(rows[0]["wall_s"] / rows[1]["wall_s"], 2)
        if not args.no_ray:
            from vostream.pipeline.apps.annotate.ray_executor import start_local_ray

            t0 = time.perf_counter()
            ray = start_local_ray(2)
            result["ray_start_s"] = round(time.perf_counter() - t0, 2)
            try:
                rows.append(run(root, "ray(2)", workers=2, ray=True))
            finally:
                ray.shutdown()
            result["ray_overhead"] = round(rows[2]["wall_s"] / rows[1]["wall_s"] - 1.0, 3)
        same = len({r["digest"] for r in rows}) == 1
        result["identical_outputs"] = same
        logger.info(
            "scaling 2 vs 1 workers: %.2fx%s; identical outputs: %s",
            result["scaling_2_vs_1"],
            (
                f"; Ray start {result['ray_start_s']} s, Ray vs local (2 workers) "
                f"{result['ray_overhead'] * 100:+.1f} %"
            )
            if "ray_overhead" in result
            else "",
            same,
        )
        if not same:
            raise SystemExit("runs gave different outputs")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
