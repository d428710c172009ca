"""Hot model reload (``docs/deploy.md`` §2): how long a reload takes, and what the streams see while it happens.

1. **Reload time**: ``ModelHandle.reload`` with no stream running, ``--repeats`` times: the load (manifest, graphs)
   and the check (input compared, two steps on a synthetic frame), median and max.
2. **Under running streams**: ``--streams`` paced live-like feeds (``--fps``, ``--size``, a moving square, one object
   prompted by a box) share one tracker through the deployment's scheduler, exactly as ``vostream run`` wires them
   (``SharedTracker(ReloadableTracker(handle))``, ``latest`` queues).  After ``--warmup`` seconds the model is
   reloaded ``--reloads`` times, ``--every`` seconds apart, from a background thread.  A sink records every frame's
   index and age (capture to the sink).  Reported, side by side from the same run:

   - **gap**: frames with no result within ±5 frames of each switch (target 0), next to the frames a stream lost
     in steady state (live queues drop the oldest frame when the tracker falls behind);
   - **switch frame**: its age minus the steady-state median age (the switch runs a new session and one seeding
     step of the new model on that frame), and ``last_switch_ms`` as the session measured it;
   - **during the load**: p95 and max age of the frames tracked while the new model loads and is checked (the load
     shares the CPU with the streams), minus the steady median.

   Both seed modes (``--seeds next,same``) run in the same process, alternating over ``--rounds`` rounds.

    python benchmarks/bench_reload.py [--backend onnx|classic] [--model EXPORT_DIR] [--streams 2] [--reloads 5]
                                      [--fps 30] [--size 854x480] [--json out.json]

``--backend onnx`` without ``--model`` exports a tiny random SAM 2 model first (torch + transformers needed, as for
the tests).  Runs for about ``rounds x 2 x (warmup + reloads * every)`` seconds (~75 s by default) after the
export.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from media import square_box, square_frame  # noqa: E402

from vostream.pipeline.apps.assemble import assemble_track  # noqa: E402
from vostream.pipeline.scheduler import RoundRobinScheduler  # noqa: E402
from vostream.pipeline.stage import Sink, SinkSpec, Source  # noqa: E402
from vostream.pipeline.types import Frame, Prompt  # noqa: E402
from vostream.stages.trackers import Tracker, load_tracker  # noqa: E402
from vostream.stages.trackers.reload import ModelHandle, ReloadableTracker  # noqa: E402
from vostream.stages.trackers.shared import SharedTracker  # noqa: E402


class PacedSource(Source[Frame]):
    """A live-like feed: frame ``i`` is released at ``start + i / fps`` (a moving square, 120 frames cycled)."""

    live = True

    def __init__(self, name: str, fps: float, width: int, height: int) -> None:
        self.name = name
        self.period = 1.0 / fps
        self.images = [square_frame(i, width, height, size=height // 4, step=2) for i in range(120)]
        self.index = 0
        self.start = 0.0
        self._stop = threading.Event()

    def open(self) -> None:
        self.start = time.monotonic()

    def read(self) -> Frame | None:
        due = self.start + self.index * self.period
        if self._stop.wait(max(0.0, due - time.monotonic())):
            return None
        i = self.index
        self.index += 1
        return Frame(i, self.images[i % len(self.images)], capture_time=time.time(), source_id=self.name)

    def interrupt(self) -> None:
        self._stop.set()


@dataclass
class Record:
    indices: list[int] = field(default_factory=list)
    ages_ms: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)


class RecordSink(Sink[Frame]):
    def __init__(self, record: Record) -> None:
        self.record = record
        self.name = "record"

    def write(self, item: Frame) -> None:
        now = time.time()
        self.record.indices.append(item.index)
        self.record.ages_ms.append((now - item.capture_time) * 1000.0)
        self.record.wall.append(now)

    def close(self) -> None:
        pass


class RecordSpec(SinkSpec[Frame]):
    name = "record"
    policy = "block"  # the recorder must see every frame that has a result

    def __init__(self) -> None:
        self.record = Record()

    def build(self) -> Sink[Frame]:
        return RecordSink(self.record)


def tiny_model(tmp: Path) -> Path:
    import sam2_reference as ref

    from vostream.pipeline.apps.export import export_model

    ckpt = ref.save_tiny("sam2", tmp / "ckpt")
    export_model(str(ckpt), tmp / "export")
    return tmp / "export"


def reload_times(load: Any, repeats: int) -> dict[str, Any]:
    handle = ModelHandle(load())
    loads, checks = [], []
    for _ in range(repeats):
        outcome = handle.reload(load)
        loads.append(outcome.load_s * 1000.0)
        checks.append(outcome.check_s * 1000.0)
    handle.close()
    totals = [a + b for a, b in zip(loads, checks)]
    return {
        "load_ms_p50": round(statistics.median(loads), 1),
        "check_ms_p50": round(statistics.median(checks), 1),
        "total_ms_p50": round(statistics.median(totals), 1),
        "total_ms_max": round(max(totals), 1),
    }


def under_streams(load: Any, args: argparse.Namespace, seed: str) -> dict[str, Any]:
    width, height = (int(v) for v in args.size.lower().split("x"))
    tracker: Tracker = load()
    handle = ModelHandle(tracker, seed=seed)
    scheduler = RoundRobinScheduler("tracker", workers=1).start()
    box = square_box(0, width, height, size=height // 4, step=2)
    runs = []
    for s in range(args.streams):
        name = f"s{s}"
        spec = RecordSpec()
        pipe = assemble_track(
            PacedSource(name, args.fps, width, height),
            SharedTracker(ReloadableTracker(handle, name), scheduler, name),
            [spec],
            prompts=[Prompt(1, 0, box=box)],
            queue_size=1,
            name=name,
        )
        runs.append((name, pipe, spec.record))
    for _, pipe, _ in runs:
        pipe.start()
    windows: list[
        tuple[float, float, float]
    ] = []  # (reload start, installed, generation) in wall-clock seconds
    switches: dict[str, list[tuple[int, float]]] = {name: [] for name, _, _ in runs}
    try:
        time.sleep(args.warmup)
        for _ in range(args.reloads):
            t0 = time.time()
            outcome = handle.reload(load)
            t1 = time.time()
            windows.append((t0, t1, outcome.generation))
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                if all(handle.streams[n].generation == outcome.generation for n, _, _ in runs):
                    break
                time.sleep(0.005)
            for name, _, _ in runs:
                info = handle.streams[name]
                switches[name].append((info.last_switch_frame, info.last_switch_ms))
            time.sleep(max(0.0, args.every - (time.time() - t0)))
    finally:
        for _, pipe, _ in runs:
            pipe.stop(drain=True)
        for _, pipe, _ in runs:
            pipe.wait(30)
        scheduler.close()
        handle.close()

    per_stream = {}
    all_steady, switch_extra, load_extra_p95, load_extra_max = [], [], [], []
    gaps, steady_missing, steady_frames = 0, 0, 0
    for name, _, rec in runs:
        idx = np.asarray(rec.indices)
        ages = np.asarray(rec.ages_ms)
        wall = np.asarray(rec.wall)
        assert len(idx) == len(set(rec.indices)), f"{name}: a frame had two results"
        near = np.zeros(len(idx), bool)
        for t0, t1, _ in windows:
            near |= (wall >= t0) & (wall <= t1 + 0.5)
        sw_frames = [f for f, _ in switches[name]]
        for f in sw_frames:
            near |= np.abs(idx - f) <= 5
        steady = ages[~near & (idx > 30)]
        med = float(np.median(steady))
        all_steady.append(med)
        present = set(rec.indices)
        for f in sw_frames:
            gaps += sum(1 for k in range(f - 5, f + 6) if k not in present)
            # the last frame of the old model and the new model's first: whichever took longer
            hit = np.flatnonzero((idx == f) | (idx == f + 1))
            if len(hit):
                switch_extra.append(float(ages[hit].max()) - med)
        for t0, t1, _ in windows:
            during = ages[(wall >= t0) & (wall <= t1)]
            if len(during):
                load_extra_p95.append(float(np.percentile(during, 95)) - med)
                load_extra_max.append(float(during.max()) - med)
        lo, hi = 31, int(idx.max()) if len(idx) else 0
        span = [k for k in range(lo, hi + 1) if not any(abs(k - f) <= 5 for f in sw_frames)]
        steady_frames += len(span)
        steady_missing += sum(1 for k in span if k not in present)
        per_stream[name] = {
            "frames": len(idx),
            "steady_age_ms_p50": round(med, 1),
            "switch_frames": sw_frames,
            "switch_ms": [round(ms, 1) for _, ms in switches[name]],
        }
    return {
        "streams": per_stream,
        "reloads": len(windows),
        "reload_ms": [round((t1 - t0) * 1000.0, 1) for t0, t1, _ in windows],
        "gap_frames_at_switches": gaps,
        "gap_window_frames": 11 * len(windows) * len(runs),
        "steady_missing_frames": steady_missing,
        "steady_frames": steady_frames,
        "steady_age_ms_p50": round(float(np.median(all_steady)), 1),
        "switch_frame_extra_ms_p50": round(float(np.median(switch_extra)), 1) if switch_extra else None,
        "switch_frame_extra_ms_max": round(float(max(switch_extra)), 1) if switch_extra else None,
        "switch_ms_p50": round(float(np.median([ms for v in switches.values() for _, ms in v])), 1),
        "during_load_extra_ms_p95": round(float(np.median(load_extra_p95)), 1) if load_extra_p95 else None,
        "during_load_extra_ms_max": round(float(max(load_extra_max)), 1) if load_extra_max else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="onnx", choices=("onnx", "classic"))
    ap.add_argument("--model", type=Path, help="an export directory (default: export a tiny random SAM 2)")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--reloads", type=int, default=5)
    ap.add_argument("--every", type=float, default=3.0, help="seconds between reloads")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=5, help="reloads timed with no stream running")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--size", default="854x480")
    ap.add_argument("--seeds", default="next,same", help="seed modes to compare (docs/deploy.md section 2)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the seed modes")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as t:
        model = args.model
        if args.backend == "onnx" and model is None:
            model = tiny_model(Path(t))

        def load() -> Tracker:
            if args.backend == "onnx":
                return load_tracker("onnx", model=str(model))
            return load_tracker("classic")

        idle = reload_times(load, args.repeats)
        live: list[dict[str, Any]] = []
        for round_ in range(args.rounds):  # the seed modes alternate, so machine load falls on both alike
            for seed in args.seeds.split(","):
                live.append({"round": round_ + 1, "seed": seed, **under_streams(load, args, seed)})
    result = {
        "backend": args.backend,
        "model": str(args.model or "tiny random SAM 2 (export made here)")
        if args.backend == "onnx"
        else None,
        "streams": args.streams,
        "feed": f"{args.size}@{args.fps:g}",
        "reload_idle": idle,
        "under_streams": live,
    }
    print(
        f"reload with no stream running ({args.repeats}x): load {idle['load_ms_p50']} ms + check "
        f"{idle['check_ms_p50']} ms = {idle['total_ms_p50']} ms (max {idle['total_ms_max']} ms)"
    )
    print(f"under {args.streams} streams of {args.size}@{args.fps:g}, {args.reloads} reloads per row:")
    head = (
        f"{'round':<5} | {'seed':<5} | {'reload ms p50':>13} | {'gap (+-5 of a switch)':>21} | {'steady drops':>12} | "
        f"{'steady age':>10} | {'switch frame':>15} | {'switch work':>11} | {'during load p95/max':>19}"
    )
    print(head)
    for r in live:
        gap = f"{r['gap_frames_at_switches']}/{r['gap_window_frames']}"
        steady = f"{r['steady_missing_frames']}/{r['steady_frames']}"
        switch = f"+{r['switch_frame_extra_ms_p50']} (max +{r['switch_frame_extra_ms_max']})"
        during = f"+{r['during_load_extra_ms_p95']} / +{r['during_load_extra_ms_max']}"
        print(
            f"{r['round']:<5} | {r['seed']:<5} | {statistics.median(r['reload_ms']):>13.1f} | {gap:>21} | {steady:>12} | "
            f"{r['steady_age_ms_p50']:>10} | {switch:>15} | {r['switch_ms_p50']:>11} | {during:>19}"
        )
    print(
        "(ms; ages are capture -> sink; 'switch frame' = the later of the old model's last and the new model's"
    )
    print(" first frame, minus the steady median; 'switch work' = what the session measured for the switch)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
