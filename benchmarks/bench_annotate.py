"""Benchmark ``vostream annotate``: 1 local worker, 2 local workers and a local Ray with 2 actors, side by side.

A batch of synthetic scenes (``--videos`` clips of ``--size`` and ``--frames``, one or two objects each, H.264) is
annotated from first-frame clicks with the default outputs (video, json, mot) into a fresh directory per run.
The modes run in interleaved rounds (``--rounds``; 1 worker, 2 workers, Ray, then again), so a change in the
machine's load hits them alike; the best round of each mode is kept.  Every run's wall time includes starting its
workers (spawned processes / Ray actors loading the tracker); that startup is also measured on its own, and so is
starting the local Ray itself (``ray.init``: once, not part of any run).  Every run must give the same files.

Besides wall time, the CPU time the run consumed (the workers', and the parent's) gives *cores used* (CPU / wall)
and *CPU seconds per video*: on a machine other jobs load, the scaling from 1 to 2 workers is then readable as
``(cores used with 2 / cores used with 1) x (CPU per video with 1 / CPU per video with 2)``, the first factor
being what the machine let us use and the second what the two workers cost each other.  Ray's actors are not our
child processes: their CPU is sampled from ``/proc`` every 0.1 s (``psutil``), so it misses up to that much of
each actor's last moments.

    python benchmarks/bench_annotate.py [--videos 8] [--size 480x270] [--frames 60] [--rounds 2] [--no-ray]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import resource
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vostream.apps.annotate.batch import AnnotateOptions, run_annotate
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
    """The annotations' checksum.  MP4s count by what they hold (frames, size, timestamps): libx264 does not
    always give the same bytes for the same frames (docs/annotate.md, "Determinism")."""
    import av

    h = hashlib.sha256()
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.name not in ("summary.json", "manifest.json", ".annotate.lock"):
            h.update(p.relative_to(out).as_posix().encode())
            if p.suffix == ".mp4":
                with av.open(str(p)) as c:
                    h.update(repr([(f.pts, f.width, f.height) for f in c.decode(video=0)]).encode())
            else:
                h.update(p.read_bytes())
    return h.hexdigest()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class DescendantsCPU:
    """CPU seconds of this process's descendants that are alive while it runs (Ray's raylet and actors), sampled
    every ``every`` seconds."""

    def __init__(self, every: float = 0.1) -> None:
        import psutil

        self._psutil = psutil
        self._every = every
        self._stop = threading.Event()
        self._start: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> dict[int, float]:
        out = {}
        for p in self._psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except self._psutil.Error:
                continue
        return out

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self._last.update(self._sample())

    def __enter__(self) -> DescendantsCPU:
        self._start = self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._last.update(self._sample())

    @property
    def seconds(self) -> float:
        return sum(v - self._start.get(pid, 0.0) for pid, v in self._last.items())


def run(root: Path, label: str, ray: bool = False, **options: Any) -> dict[str, Any]:
    out = root / f"out-{label}"
    shutil.rmtree(out, ignore_errors=True)
    children0, self0 = _children_cpu(), _self_cpu()
    sampler = DescendantsCPU() if ray else None
    t0 = time.perf_counter()
    opts = AnnotateOptions(
        inputs=[str(root / "vids")],
        prompts=str(root / "prompts.csv"),
        out=str(out),
        quiet=True,
        ray=ray,
        **options,
    )
    if sampler is not None:
        with sampler:
            report = run_annotate(opts)
    else:
        report = run_annotate(opts)
    wall = time.perf_counter() - t0
    if report.exit_code != 0:
        raise SystemExit(f"{label}: the batch failed: {report.failed}")
    workers_cpu = sampler.seconds if sampler is not None else _children_cpu() - children0
    cpu = workers_cpu + _self_cpu() - self0
    frames = sum(r.frames for r in report.results.values())
    videos = len(report.results)
    return {
        "run": label,
        "videos": videos,
        "frames": frames,
        "wall_s": round(wall, 2),
        "videos_per_hour": round(videos / wall * 3600),
        "fps": round(frames / wall, 1),
        "cpu_s": round(cpu, 2),
        "cpu_s_per_video": round(cpu / videos, 3),
        "cores_used": round(cpu / wall, 2),
        "video_busy_s": round(sum(r.time_s for r in report.results.values()), 2),
        "digest": digest(out),
    }


def worker_startup(options: AnnotateOptions, ray: bool = False) -> float:
    """Seconds from starting the executor until every worker (process or actor) has its tracker loaded."""
    from vostream.apps.annotate.batch import _make_executor

    executor = _make_executor(options, options.track_options())
    t0 = time.perf_counter()
    executor.start()
    ready: set[int] = set()
    try:
        while len(ready) < executor.slots:
            for ev in executor.poll(0.05):
                if ev.kind == "fatal":
                    raise SystemExit(f"startup failed: {ev.error}")
                if ev.kind == "ready":
                    ready.add(ev.slot)
        return time.perf_counter() - t0
    finally:
        executor.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--size", default="480x270")
    parser.add_argument("--frames", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every mode (default 2)")
    parser.add_argument("--no-ray", action="store_true", help="skip the Ray runs")
    parser.add_argument(
        "--codec-threads",
        type=int,
        help="FFmpeg threads per decoder/encoder in every mode (default: annotate's, i.e. cores / workers)",
    )
    parser.add_argument("--json", metavar="PATH", help="save the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("vostream").setLevel(logging.WARNING)  # workers inherit this: no per-video chatter
    w, h = (int(v) for v in args.size.lower().split("x"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    modes: list[tuple[str, dict[str, Any]]] = [
        ("workers=1", {"workers": 1}),
        ("workers=2", {"workers": 2}),
    ]
    if not args.no_ray:
        modes.append(("ray(2)", {"workers": 2, "ray": True}))
    extra = {"codec_threads": args.codec_threads} if args.codec_threads else {}
    result: dict[str, Any] = {
        "videos": args.videos,
        "size": [w, h],
        "frames_per_video": args.frames,
        "cores": cores,
        "rounds": args.rounds,
        "codec_threads": args.codec_threads,
    }
    ray_mod = None
    with tempfile.TemporaryDirectory(prefix="bench-annotate-") as tmp:
        root = make_batch(Path(tmp), args.videos, w, h, args.frames)
        logger.info(
            "batch: %d videos of %dx%d, %d frames each; %s cores", args.videos, w, h, args.frames, cores
        )
        try:
            if not args.no_ray:
                from vostream.apps.annotate.ray_executor import start_local_ray

                t0 = time.perf_counter()
                ray_mod = start_local_ray(2)  # num_cpus=2, 200 MiB object store, no dashboard
                result["ray_init_s"] = round(time.perf_counter() - t0, 2)
            startup_opts = dict(
                inputs=[str(root / "vids")], prompts=str(root / "prompts.csv"), out=str(root / "x")
            )
            startup = {}
            for label, mode in modes:
                opts = AnnotateOptions(**startup_opts, **{**mode, **extra})
                startup[label] = round(worker_startup(opts), 2)
            result["worker_startup_s"] = startup
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in modes}
            for r in range(args.rounds):
                for label, mode in modes:
                    row = run(root, label, **mode, **extra)
                    runs[label].append(row)
                    logger.info(
                        "round %d %-10s %6.2f s  %6.1f fps  CPU %6.2f s (%.2f s/video, %.2f cores)",
                        r + 1,
                        label,
                        row["wall_s"],
                        row["fps"],
                        row["cpu_s"],
                        row["cpu_s_per_video"],
                        row["cores_used"],
                    )
        finally:
            if ray_mod is not None:
                ray_mod.shutdown()
    best = {label: min(rows, key=lambda x: x["wall_s"]) for label, rows in runs.items()}
    result["runs"] = runs
    result["best"] = best
    digests = {row["digest"] for rows in runs.values() for row in rows}
    result["identical_outputs"] = len(digests) == 1
    one = best["workers=1"]
    result["scaling_2_vs_1"] = round(one["wall_s"] / best["workers=2"]["wall_s"], 2)
    lines = [
        "",
        f"{'mode':<10} {'wall s':>7} {'fps':>6} {'vs 1':>6} {'startup s':>10} {'vs 1, no startup':>17} "
        f"{'CPU s/video':>12} {'cores used':>11}",
    ]
    for label, row in best.items():
        s1, s = startup["workers=1"], startup[label]
        no_startup = (one["wall_s"] - s1) / max(row["wall_s"] - s, 1e-9)
        row["vs_1_worker"] = round(one["wall_s"] / row["wall_s"], 2)
        row["vs_1_worker_without_startup"] = round(no_startup, 2)
        lines.append(
            f"{label:<10} {row['wall_s']:7.2f} {row['fps']:6.1f} {row['vs_1_worker']:5.2f}x {s:10.2f} "
            f"{no_startup:16.2f}x {row['cpu_s_per_video']:12.2f} {row['cores_used']:11.2f}"
        )
    if "ray(2)" in best:
        result["ray_vs_local_2"] = round(best["ray(2)"]["wall_s"] / best["workers=2"]["wall_s"] - 1.0, 3)
        lines.append(
            f"Ray: ray.init {result['ray_init_s']} s (once, not in any run); Ray (2 actors) vs 2 local workers: "
            f"{result['ray_vs_local_2'] * 100:+.1f} % wall time"
        )
    lines.append(f"identical outputs in every run: {result['identical_outputs']}")
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result["loadavg_1m_before"], result["loadavg_1m_after"] = load_before, load_after
    if (
        load_before is not None
        and load_after is not None
        and max(load_before, load_after) > 0.5 * (cores or 1)
    ):
        lines.append(
            f"note: load average {load_before:.1f} before, {load_after:.1f} after on {cores} cores: other work "
            "shared the machine; treat the wall times as provisional (CPU s/video is steadier)"
        )
    logger.info("%s", "\n".join(lines))
    if not result["identical_outputs"]:
        raise SystemExit("runs gave different outputs")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
