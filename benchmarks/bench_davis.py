"""The classic tracker on real footage: the DAVIS-2016 dev split (40 sequences, 854x480), old vs new side by side.

Data: ``python benchmarks/davis_data.py --git-dir ...`` first (``docs/davis.md``); nothing is downloaded here.

Three prompt modes, all on frame 0 from its ground truth: ``click`` (one positive click at the maximum of the
mask's distance transform), ``box`` (the mask's bounding box), ``mask`` (the mask itself).  Every frame is decoded
from its JPEG, preprocessed with the tracker's own ``InputSpec`` (854x480 -> work size), stepped, and its logits
upsampled bilinearly to 854x480 and thresholded at 0 (as the postprocess stage does).  Scores per sequence, over
frames 1..N-1, then averaged over sequences:

- ``J``: mean IoU (a frame where both the prediction and the truth are empty counts 1);
- ``wrong``: fraction of frames whose predicted mask is non-empty with more than half of its pixels outside the
  object (the tracker sits on something else);
- ``pres``: fraction of frames where ``present`` agrees with "the truth is non-empty".

Speed: ``fps`` = frames 1..N-1 / their total time for decode + preprocess + step + upsample+threshold, one thread
(the prompt frame excluded; its time is reported as ``init_s``).

The comparison tracker (``old``) is the classic package at ``--baseline`` (a git revision, default the commit
before the rework) copied from git into a temp dir and imported under another name, so both run in one process
on the same frames::

    python benchmarks/bench_davis.py [--seqs bear,boat] [--limit 10] [--modes click,box,mask] \
        [--trackers old,new] [--seeds 3] [--json out.json]

The trackers seed OpenCV's RNG per frame (grabCut's colour models start from k-means on it), so a run is
repeatable; but a few sequences flip between holding and losing the object with that seed.  ``--seeds N`` runs
each sequence N times with every seed shifted by 0..N-1 and reports the mean and the per-seed range.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from davis_data import DEFAULT_CACHE, DEV_SPLIT, check_names

from vostream.pipeline.types import Frame, Prompt
from vostream.stages.preprocess import Preprocessor

logger = logging.getLogger("bench_davis")
REPO = Path(__file__).resolve().parents[1]
BASELINE = "d74f9534af1427291a8ea4dc036829fde60652c5"  # the classic tracker before the real-footage rework
MODES = ("click", "box", "mask")


def load_baseline(rev: str, tmp: Path) -> Any:
    """The ``ClassicTracker`` class of ``stages/trackers/classic`` at git revision ``rev``, imported from ``tmp``."""
    pkg = tmp / "classic_baseline"
    pkg.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", rev, "stages/trackers/classic/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in names:
        if not name.endswith(".py"):
            continue
        src = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{name}"], capture_output=True, text=True, check=True
        ).stdout
        src = re.sub(r"from \.\.(\w+) import", r"from vostream.stages.trackers.\1 import", src)
        (pkg / Path(name).name).write_text(src)
    sys.path.insert(0, str(tmp))
    return importlib.import_module("classic_baseline").ClassicTracker


def read_rgb(path: Path) -> np.ndarray:
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise RuntimeError(f"cannot read {path}")
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def read_gt(path: Path) -> np.ndarray:
    m = cv2.imread(str(path), cv2.IMREAD_UNCHANGED)
    if m is None:
        raise RuntimeError(f"cannot read {path}")
    return (m.max(axis=2) if m.ndim == 3 else m) > 0


def prompt_for(mode: str, gt0: np.ndarray) -> Prompt:
    if mode == "click":
        d = cv2.distanceTransform(np.pad(gt0.astype(np.uint8), 1), cv2.DIST_L2, 5)[1:-1, 1:-1]
        y, x = np.unravel_index(int(np.argmax(d)), d.shape)
        return Prompt(1, 0, np.array([[x, y]], np.float32), np.array([1], np.int32))
    if mode == "box":
        ys, xs = np.nonzero(gt0)
        return Prompt(1, 0, box=(float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)))
    return Prompt(1, 0, mask=gt0)


def run_sequence(
    tracker: Any,
    frames: list[Path],
    gts: list[np.ndarray],
    mode: str,
    dump: Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Track one sequence; per-sequence metrics and timings.  ``seed``: added to every seed the tracker gives
    OpenCV's RNG (see ``shifted_rng``)."""
    with shifted_rng(seed):
        return _run_sequence(tracker, frames, gts, mode, dump)


def _param(params: Any, name: str, value: str) -> Any:
    """``params`` with ``NAME`` (from ``--param NAME=VALUE``; ``GROUP.NAME`` for a field of a nested group) set to
    ``value`` as the type of the field; booleans from true/false/1/0."""
    group, _, leaf = name.partition(".")
    if not hasattr(params, group):
        raise SystemExit(f"bench_davis: ClassicParams has no field {name!r}")
    if leaf:
        return dataclasses.replace(params, **{group: _param(getattr(params, group), leaf, value)})
    current = getattr(params, name)
    if isinstance(current, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SystemExit(f"bench_davis: {name} takes true or false, not {value!r}")
        return dataclasses.replace(params, **{name: value.lower() in ("true", "1")})
    return dataclasses.replace(params, **{name: type(current)(value)})


@contextlib.contextmanager
def shifted_rng(shift: int) -> Iterator[None]:
    """Within the block, ``cv2.setRNGSeed(s)`` seeds ``s + shift``.  The trackers seed OpenCV's RNG themselves
    (per frame, for repeatable results) and grabCut's colour models start from k-means on it; shifting the seeds
    shows how much of a figure is the luck of that start."""
    orig = cv2.setRNGSeed
    cv2.setRNGSeed = lambda s: orig(int(s) + shift)
    try:
        cv2.setRNGSeed(0)
        yield
    finally:
        cv2.setRNGSeed = orig


def _run_sequence(
    tracker: Any, frames: list[Path], gts: list[np.ndarray], mode: str, dump: Path | None
) -> dict[str, Any]:
    session = tracker.new_session()
    pre = None
    ious, wrong, pres_ok, times = [], [], [], []
    init_s = 0.0
    for i, path in enumerate(frames):
        t0 = time.perf_counter()
        img = read_rgb(path)
        h, w = img.shape[:2]
        if pre is None:
            pre = Preprocessor(tracker.input_spec(w, h))
            session.add_prompt(prompt_for(mode, gts[0]))
        fr = Frame(i, img)
        fr.tensor = pre(img)
        res = session.step(fr)
        lg = res.logits[0]
        pred = cv2.resize(lg, (w, h), interpolation=cv2.INTER_LINEAR) > 0
        dt = time.perf_counter() - t0
        if i == 0:
            init_s = dt
            continue
        times.append(dt)
        gt = gts[i]
        inter = np.count_nonzero(pred & gt)
        union = np.count_nonzero(pred | gt)
        npred = np.count_nonzero(pred)
        ious.append(1.0 if union == 0 else inter / union)
        wrong.append(npred > 0 and (npred - inter) > 0.5 * npred)
        pres_ok.append(bool(res.present[0]) == bool(gt.any()))
        if dump is not None and i % 10 == 0:
            vis = img.copy()
            vis[gt] = (0.5 * vis[gt] + [0, 100, 0]).astype(np.uint8)
            vis[pred] = (0.5 * vis[pred] + [120, 0, 120]).astype(np.uint8)
            dump.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(dump / f"{i:05d}.jpg"), cv2.cvtColor(vis, cv2.COLOR_RGB2BGR))
    return {
        "J": float(np.mean(ious)),
        "wrong": float(np.mean(wrong)),
        "pres": float(np.mean(pres_ok)),
        "frames": len(times),
        "time_s": float(sum(times)),
        "init_s": init_s,
        "step_ms_median": 1000 * statistics.median(times),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data", type=Path, default=DEFAULT_CACHE, help=f"extracted dev split (default {DEFAULT_CACHE})"
    )
    ap.add_argument("--seqs", help="comma-separated subset of the dev split")
    ap.add_argument("--limit", type=int, help="only the first N sequences (alphabetical)")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument(
        "--trackers", default="old,new", help="old (the --baseline revision) and/or new (this checkout)"
    )
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the 'old' tracker")
    ap.add_argument("--work-size", default="480x270")
    ap.add_argument("--flow-preset", default=None, help="DIS preset of the new tracker (default: its own)")
    ap.add_argument(
        "--param",
        action="append",
        default=[],
        help="NAME=VALUE: override a ClassicParams field of the new tracker (for tuning; GROUP.NAME in a group, "
        "e.g. reacquire.llr=1.0)",
    )
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="run every sequence N times, the trackers' OpenCV RNG seeds shifted by 0..N-1, and average",
    )
    ap.add_argument("--dump", type=Path, help="write overlay JPEGs (every 10th frame) here, for eyeballing")
    ap.add_argument("--json", type=Path, help="write all results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    seqs = check_names(args.seqs.split(",")) if args.seqs else sorted(DEV_SPLIT)
    if args.limit:
        seqs = seqs[: args.limit]
    missing = [s for s in seqs if not (args.data / ".done" / s).exists()]
    if missing:
        print(
            f"bench_davis: {len(missing)} sequences missing under {args.data} (run benchmarks/davis_data.py)",
            file=sys.stderr,
        )
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        ap.error(f"modes are {MODES}")
    ws = tuple(int(v) for v in args.work_size.split("x"))
    trackers: dict[str, Any] = {}
    tmp = tempfile.TemporaryDirectory()
    for name in args.trackers.split(","):
        if name == "old":
            trackers["old"] = load_baseline(args.baseline, Path(tmp.name))(work_size=ws)
        elif name == "new":
            from vostream.stages.trackers.classic import ClassicParams, ClassicTracker

            params = ClassicParams()
            for item in args.param:
                params = _param(params, *item.split("=", 1))
            extra = {"flow_preset": args.flow_preset} if args.flow_preset else {}
            trackers["new"] = ClassicTracker(work_size=ws, params=params, **extra)
        else:
            ap.error(f"unknown tracker {name!r}")
    results: dict[str, dict[str, dict[str, Any]]] = {t: {m: {} for m in modes} for t in trackers}
    for seq in seqs:
        frames = sorted((args.data / "JPEGImages" / seq).glob("*.jpg"))
        gts = [read_gt(p) for p in sorted((args.data / "Annotations" / seq).glob("*.png"))]
        line = [f"{seq:<20}"]
        for mode in modes:
            for tname, tracker in trackers.items():
                dump = args.dump / tname / mode / seq if args.dump else None
                runs = [run_sequence(tracker, frames, gts, mode, dump, seed) for seed in range(args.seeds)]
                r = {k: float(np.mean([x[k] for x in runs])) for k in runs[0]}
                r["frames"] = sum(x["frames"] for x in runs)
                r["time_s"] = sum(x["time_s"] for x in runs)
                r["seeds"] = {k: [x[k] for x in runs] for k in ("J", "wrong", "pres")}
                results[tname][mode][seq] = r
                line.append(f"{mode[:2]}/{tname} J {r['J']:.2f} w {r['wrong']:.2f}")
        print("  ".join(line), flush=True)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    print(f"\n{len(seqs)} sequences, work size {args.work_size}")
    print(f"{'mode':<7}{'tracker':<9}{'J':>7}{'wrong':>8}{'pres':>7}{'fps':>7}{'init s':>8}")
    for mode in modes:
        for tname in trackers:
            rs = list(results[tname][mode].values())
            s = {
                "J": float(np.mean([r["J"] for r in rs])),
                "wrong": float(np.mean([r["wrong"] for r in rs])),
                "pres": float(np.mean([r["pres"] for r in rs])),
                "fps": sum(r["frames"] for r in rs) / sum(r["time_s"] for r in rs),
                "init_s": float(np.mean([r["init_s"] for r in rs])),
            }
            # the same averages per seed: how far one run's figures can be from the mean
            for k in ("J", "wrong"):
                per_seed = [float(np.mean([r["seeds"][k][i] for r in rs])) for i in range(args.seeds)]
                s[f"{k}_range"] = [min(per_seed), max(per_seed)]
            summary.setdefault(mode, {})[tname] = s
            spread = (
                f"  J {s['J_range'][0]:.3f}-{s['J_range'][1]:.3f}, wrong "
                f"{s['wrong_range'][0]:.3f}-{s['wrong_range'][1]:.3f} over {args.seeds} seeds"
                if args.seeds > 1
                else ""
            )
            print(
                f"{mode:<7}{tname:<9}{s['J']:>7.3f}{s['wrong']:>8.3f}{s['pres']:>7.3f}{s['fps']:>7.1f}"
                f"{s['init_s']:>8.2f}{spread}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "seqs": seqs,
                    "work_size": args.work_size,
                    "baseline": args.baseline,
                    "seeds": args.seeds,
                    "params": args.param,
                    "summary": summary,
                    "per_sequence": results,
                },
                indent=1,
            )
        )
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
