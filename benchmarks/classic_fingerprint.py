"""Fingerprint of the classic tracker's outputs, to show that a refactoring changes no figure: bit for bit.

Records a SHA-1 per frame of each ``TrackResult`` (ids, scores, present, boxes, logits) over

- a DAVIS-2016 dev-split subset (``--seqs``, first ``--frames`` frames) from a click, a box and a mask on frame 0
  (prompts as in ``bench_davis.py``), with a negative click on the background mid-stream (click runs) and a
  second object mid-stream (box runs);
- three of those sequences with frames skipped (every third frame index);
- the synthetic scenes from their clicks, at 640x360 and at 256x144 (enlarged for tracking);

and how many debug messages of each kind the tracker logged (which paths ran: re-acquisition, stop rule, checks by
motion...).  Run it on the code before and after a change, then compare::

    python benchmarks/classic_fingerprint.py /tmp/before.json          # with the old code on PYTHONPATH
    python benchmarks/classic_fingerprint.py /tmp/after.json
    python benchmarks/classic_fingerprint.py --compare /tmp/before.json /tmp/after.json

OpenCV's RNG is seeded by the tracker per frame (``bench_davis.shifted_rng(0)`` around each run), so a run is
repeatable.  About 1,000 tracker steps: a few minutes on one idle core.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_davis as bd

from vostream.pipeline.types import Frame, Prompt, TrackResult
from vostream.samples.scenes import SCENES, render_scene
from vostream.stages.preprocess import Preprocessor
from vostream.stages.trackers.classic import ClassicTracker

SEQS = "bmx-bumps,boat,drift-chicane,hockey,kite-surf,motocross-bumps,soccerball,dance-twirl"
SKIP = 3  # the skipped-frames runs keep every SKIP-th frame
NEG_AT, SECOND_AT = 12, 20  # frame of the negative click (click runs) and of the second object (box runs)


class _Counter(logging.Handler):
    """Counts log records per message template (numbers blanked)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[re.sub(r"[-\d.]+", "#", str(record.msg))[:70]] += 1


def digest(res: TrackResult) -> str:
    h = hashlib.sha1()
    for a in (res.obj_ids, res.scores, res.present, res.boxes, res.logits):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def _background_click(gt: np.ndarray, index: int) -> Prompt:
    """A negative click on object 1 at the middle background pixel well away (12 px) from the truth."""
    far = ~cv2.dilate(gt.astype(np.uint8), np.ones((25, 25), np.uint8)).astype(bool)
    ys, xs = np.nonzero(far)
    k = len(xs) // 2
    return Prompt(1, index, np.array([[xs[k], ys[k]]], np.float32), np.array([0], np.int32))


def run_davis(
    tracker: ClassicTracker, data: Path, seq: str, mode: str, frames: int, skip: int = 1
) -> list[str]:
    paths = sorted((data / "JPEGImages" / seq).glob("*.jpg"))[: skip * frames : skip]
    gts = [bd.read_gt(p) for p in sorted((data / "Annotations" / seq).glob("*.png"))[: skip * frames : skip]]
    out: list[str] = []
    with bd.shifted_rng(0):
        session = tracker.new_session()
        pre = None
        for k, path in enumerate(paths):
            img = bd.read_rgb(path)
            if pre is None:
                pre = Preprocessor(tracker.input_spec(img.shape[1], img.shape[0]))
                session.add_prompt(bd.prompt_for(mode, gts[0]))
            if skip == 1 and mode == "click" and k == NEG_AT:
                session.add_prompt(_background_click(gts[k], k))
            if skip == 1 and mode == "box" and k == SECOND_AT:
                session.add_prompt(
                    Prompt(2, k, np.array([[30.0, 30.0]], np.float32), np.array([1], np.int32))
                )
            fr = Frame(skip * k, img)
            fr.tensor = pre(img)
            out.append(digest(session.step(fr)))
    return out


def run_scene(tracker: ClassicTracker, name: str, small: bool) -> list[str]:
    scene = render_scene(name, 640, 360)
    k = 256 / 640 if small else 1.0
    frames = [cv2.resize(f, (256, 144)) if small else f for f in scene.frames]
    h, w = frames[0].shape[:2]
    pre = Preprocessor(tracker.input_spec(w, h))
    session = tracker.new_session()
    for oid in scene.obj_ids:
        x, y = scene.click(oid)
        session.add_prompt(Prompt(oid, 0, np.array([[x * k, y * k]], np.float32), np.array([1], np.int32)))
    out = []
    for i, img in enumerate(frames):
        fr = Frame(i, img)
        fr.tensor = pre(img)
        out.append(digest(session.step(fr)))
    return out


def compare(a_path: Path, b_path: Path) -> int:
    a, b = (json.loads(p.read_text()) for p in (a_path, b_path))
    ha, hb = a["hashes"], b["hashes"]
    differ = sorted(k for k in ha.keys() | hb.keys() if ha.get(k) != hb.get(k))
    frames = sum(len(v) for v in ha.values())
    print(
        f"{len(ha)} runs, {frames} frames: " + ("identical" if not differ else f"{len(differ)} runs differ")
    )
    for k in differ:
        x, y = ha.get(k, []), hb.get(k, [])
        first = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        print(f"  {k}: from frame {first}")
    same_logs = a["log_counts"] == b["log_counts"]
    print("log message counts: " + ("identical" if same_logs else "differ"))
    return 0 if not differ and same_logs else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, nargs="?", help="write the fingerprint here (JSON)")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two fingerprints")
    ap.add_argument("--data", type=Path, default=bd.DEFAULT_CACHE)
    ap.add_argument("--seqs", default=SEQS)
    ap.add_argument("--frames", type=int, default=40)
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if args.out is None:
        ap.error("give an output file or --compare A B")
    counter = _Counter()
    log = logging.getLogger("vostream.stages.trackers.classic")
    log.setLevel(logging.DEBUG)
    log.addHandler(counter)
    log.propagate = False
    tracker = ClassicTracker(work_size=(480, 270))
    seqs = bd.check_names(args.seqs.split(","))
    hashes: dict[str, Any] = {}
    for seq in seqs:
        for mode in bd.MODES:
            hashes[f"{seq}/{mode}"] = run_davis(tracker, args.data, seq, mode, args.frames)
        print(seq, flush=True)
    for seq in seqs[:3]:
        for mode in ("click", "box"):
            hashes[f"skip/{seq}/{mode}"] = run_davis(tracker, args.data, seq, mode, args.frames, SKIP)
    for name in SCENES:
        for small in (False, True):
            hashes[f"scene/{name}{'/small' if small else ''}"] = run_scene(tracker, name, small)
        print(name, flush=True)
    args.out.write_text(
        json.dumps({"hashes": hashes, "log_counts": dict(sorted(counter.counts.items()))}, indent=0)
    )
    for msg, n in sorted(counter.counts.items()):
        print(f"{n:6d}  {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
