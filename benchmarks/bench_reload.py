"""Hot model reload (``docs/deploy.md`` §2): how long a reload takes, and what the streams see while it happens.

1. **Reload time**: ``ModelHandle.reload`` with no stream running, ``--repeats`` times: the load (manifest, graphs)
   and the check (input compared, two steps on a synthetic frame), median and max.
2. **Under running streams**: ``--streams`` paced live-like feeds (``--fps``, ``--size``, a moving square, one object
   prompted by a box) share one tracker through the deployment's scheduler, exactly as ``vostream run`` wires them
   (``SharedTracker(ReloadableTracker(handle))``, ``latest`` queues).  After ``--warmup`` seconds the model is
   reloaded ``--reloads`` times, ``--every`` seconds apart, from a background thread.  A sink records every frame's
   index and age (capture to the sink).  Reported, side by side from the same run:

   - **gap**: frames without a result (a live queue dropped them: latest-wins) at the switch (captured after the new
     model was installed, up to the new model's fifth frame; target 0), while the new model loads and is checked
     (captured then: the load shares the CPU with the streams), and elsewhere (steady state), each out of the frames
     in that window;
   - **extra latency**: frame age (capture to the sink) above the steady median: the worst frame at the switch,
     p95 / max of the frames captured during the load; and the switch work the session measured itself.

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

from fakes.media import square_box, square_frame  # noqa: E402

from vostream.apps.assemble import assemble_track  # noqa: E402
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
        self.start_wall = 0.0  # frame i is captured at start_wall + i / fps
        self._stop = threading.Event()

    def open(self) -> None:
        self.start = time.monotonic()
        self.start_wall = time.time()

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


class RecordSink(Sink[Frame]):
    def __init__(self, record: Record) -> None:
        self.record = record
        self.name = "record"

    def write(self, item: Frame) -> None:
        now = time.time()
        self.record.indices.append(item.index)
        self.record.ages_ms.append((now - item.capture_time) * 1000.0)

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
    from fakes import sam2_reference as ref

    from vostream.apps.export import export_model

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
    sources = []
    for s in range(args.streams):
        name = f"s{s}"
        spec = RecordSpec()
        sources.append(PacedSource(name, args.fps, width, height))
        pipe = assemble_track(
            sources[-1],
            SharedTracker(ReloadableTracker(handle, name), scheduler, name),
            [spec],
            prompts=[Prompt(1, 0, box=box)],
            queue_size=1,
            name=name,
        )
        runs.append((name, pipe, spec.record))
    for _, pipe, _ in runs:
        pipe.start()
    windows: list[tuple[float, float, float]] = []  # (reload start, installed, generation), wall clock
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
    counts = {
        "load": [0, 0],
        "switch": [0, 0],
        "steady": [0, 0],
    }  # window -> [frames without a result, frames]
    extra: dict[str, list[float]] = {"load_p95": [], "load_max": [], "switch_max": []}
    steady_ages: list[float] = []
    for (name, _, rec), source in zip(runs, sources):
        assert len(rec.indices) == len(set(rec.indices)), f"{name}: a frame had two results"
        age = dict(zip(rec.indices, rec.ages_ms))
        last = max(rec.indices)
        due = {i: source.start_wall + i / args.fps for i in range(last + 1)}
        window: dict[int, str] = {}
        for (t0, t1, _), (f, _) in zip(windows, switches[name]):
            for i in range(last + 1):
                if t0 <= due[i] <= t1:
                    window[i] = "load"  # captured while the new model loaded and was checked
                elif due[i] > t1 and i <= f + 5:
                    window[i] = "switch"  # captured after it was installed, up to the new model's fifth frame
        first = int(args.fps)  # the first second: start-up, not steady state
        for i in range(first, last + 1):
            kind = window.get(i, "steady")
            if kind in counts:
                counts[kind][0] += i not in age
                counts[kind][1] += 1
        steady = [a for i, a in age.items() if i >= first and i not in window]
        med = float(np.median(steady))
        steady_ages.append(med)
        for (t0, t1, _), (f, _) in zip(windows, switches[name]):
            during = [age[i] for i in range(last + 1) if t0 <= due[i] <= t1 and i in age]
            if during:
                extra["load_p95"].append(float(np.percentile(during, 95)) - med)
                extra["load_max"].append(max(during) - med)
            at = [age[i] for i in range(f, f + 6) if i in age and due[i] > t1]
            if at:
                extra["switch_max"].append(max(at) - med)
        per_stream[name] = {
            "frames": len(rec.indices),
            "steady_age_ms_p50": round(med, 1),
            "switch_frames": [f for f, _ in switches[name]],
            "switch_ms": [round(ms, 1) for _, ms in switches[name]],
        }

    def q(values: list[float], fn: Any) -> float | None:
        return round(float(fn(values)), 1) if values else None

    return {
        "streams": per_stream,
        "reloads": len(windows),
        "reload_ms": [round((t1 - t0) * 1000.0, 1) for t0, t1, _ in windows],
        "missing": {k: {"frames": v[1], "without_result": v[0]} for k, v in counts.items()},
        "steady_age_ms_p50": round(float(np.median(steady_ages)), 1),
        "switch_extra_ms_p50": q(extra["switch_max"], np.median),
        "switch_extra_ms_max": q(extra["switch_max"], max),
        "switch_work_ms_p50": q([ms for v in switches.values() for _, ms in v], np.median),
        "load_extra_ms_p95": q(extra["load_p95"], np.median),
        "load_extra_ms_max": q(extra["load_max"], max),
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
    print(
        f"{'round':<5} | {'seed':<5} | {'reload ms':>9} | {'no result: load':>15} | {'at switch':>9} | "
        f"{'steady':>7} | {'steady age':>10} | {'switch +ms p50/max':>18} | {'work ms':>7} | "
        f"{'load +ms p95/max':>16}"
    )
    for r in live:
        m = r["missing"]
        print(
            f"{r['round']:<5} | {r['seed']:<5} | {statistics.median(r['reload_ms']):>9.1f} | "
            f"{m['load']['without_result']:>6}/{m['load']['frames']:<8} | "
            f"{m['switch']['without_result']:>3}/{m['switch']['frames']:<5} | "
            f"{m['steady']['without_result']:>3}/{m['steady']['frames']:<3} | {r['steady_age_ms_p50']:>10} | "
            f"{r['switch_extra_ms_p50']!s:>8} / {r['switch_extra_ms_max']!s:<7} | {r['switch_work_ms_p50']!s:>7} | "
            f"{r['load_extra_ms_p95']!s:>7} / {r['load_extra_ms_max']!s:<6}"
        )
    print(
        "no result = frames a live queue dropped (latest-wins), by when they were captured: while the new model "
        "loaded / from its install to the new model's fifth frame / elsewhere after the first second.  Ages: capture -> sink, ms above "
        "the steady median ('switch': the worst of the old model's last and the new one's first five frames captured after the install; 'load': frames captured during the load).  "
        "work = the session's own switch time."
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
