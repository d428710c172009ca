"""Benchmark the classic tracker on the synthetic scenes: accuracy (IoU) and speed (fps).

Each scene is rendered at ``--size``, encoded to H.264 MP4 and decoded back with PyAV (so compression artefacts
count), then tracked from a single first-frame click per object (the scene's click point).  Logits are upsampled
to the source size with ``cv2.resize`` (bilinear) and thresholded at 0, as the postprocess stage does, and scored
with :func:`vostream.samples.scenes.score_sequence` (frame 0 excluded).

Speed: ``step`` time including preprocessing (resize into the tracker's input), and with the upsample+threshold;
then fps vs number of objects (1, 2, 4) on one scene (objects beyond the scene's own are clicks on background
patches: they cost the same per object).

    python benchmarks/bench_tracker.py [--size 854x480] [--scene NAME ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from vostream.pipeline.types import Frame, Prompt
from vostream.samples.scenes import SCENES, encoded_frames, render_scene, score_sequence
from vostream.stages.preprocess import Preprocessor
from vostream.stages.trackers.classic import ClassicTracker

logger = logging.getLogger("bench_tracker")


def track_scene(
    tracker: ClassicTracker,
    frames: np.ndarray,
    clicks: dict[int, tuple[float, float]],
    keep_masks: bool = True,
) -> tuple[list[np.ndarray], list[float], list[float]]:
    """Track ``frames`` from first-frame clicks; (per-frame (N, H, W) masks, step times, upsample times)."""
    h, w = frames.shape[1:3]
    pre = Preprocessor(tracker.input_spec(w, h))
    session = tracker.new_session()
    for oid, (x, y) in clicks.items():
        session.add_prompt(Prompt(oid, 0, np.array([[x, y]], np.float32), np.array([1], np.int32)))
    masks, t_step, t_up = [], [], []
    for i, img in enumerate(frames):
        t0 = time.perf_counter()
        fr = Frame(i, img)
        fr.tensor = pre(img)
        res = session.step(fr)
        t1 = time.perf_counter()
        assert res.logits is not None
        m = np.stack([cv2.resize(lg, (w, h), interpolation=cv2.INTER_LINEAR) > 0 for lg in res.logits])
        t2 = time.perf_counter()
        t_step.append(t1 - t0)
        t_up.append(t2 - t1)
        if keep_masks:
            masks.append(m)
    return masks, t_step, t_up


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="854x480")
    ap.add_argument("--scene", action="append", choices=sorted(SCENES))
    ap.add_argument("--work-size", default="480x270")
    ap.add_argument("--raw", action="store_true", help="skip the MP4 round trip (no compression artefacts)")
    ap.add_argument("--speed-scene", default="crossing")
    ap.add_argument("--no-speed", action="store_true")
    ap.add_argument("--json", help="write the results as JSON here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    w, h = (int(v) for v in args.size.lower().split("x"))
    tracker = ClassicTracker(work_size=args.work_size)
    out: dict = {"size": [w, h], "work_size": list(tracker.work_size), "encoded": not args.raw, "scenes": {}}
    ious = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scene or list(SCENES):
            scene = render_scene(name, w, h)
            frames = scene.frames if args.raw else encoded_frames(scene, tmp)
            clicks = {oid: scene.click(oid) for oid in scene.obj_ids}
            masks, ts, tu = track_scene(tracker, frames, clicks)
            sc = score_sequence(masks, scene)
            ms = 1000 * statistics.median(ts[1:])
            out["scenes"][name] = {
                "iou": sc.mean,
                "per_object": sc.per_object,
                "step_ms_median": ms,
                "upsample_ms_median": 1000 * statistics.median(tu[1:]),
                "min_frame_iou": float(sc.per_frame.min()),
            }
            ious.append(sc.mean)
            logger.info(
                "%-18s IoU %.3f  (min frame %.2f)  step %.1f ms", name, sc.mean, sc.per_frame.min(), ms
            )
        out["mean_iou"] = float(np.mean(ious))
        if not args.no_speed:
            scene = render_scene(args.speed_scene, w, h)
            frames = scene.frames if args.raw else encoded_frames(scene, tmp)
            extra = [(0.1 * w, 0.9 * h), (0.9 * w, 0.1 * h), (0.5 * w, 0.9 * h)]
            pts = [scene.click(oid) for oid in scene.obj_ids] + extra
            out["speed"] = {}
            for n in (1, 2, 4):
                _, ts, tu = track_scene(tracker, frames, {k + 1: pts[k] for k in range(n)}, keep_masks=False)
                step = statistics.median(ts[1:])
                full = statistics.median([a + b for a, b in zip(ts[1:], tu[1:])])
                out["speed"][str(n)] = {
                    "fps_step": 1 / step,
                    "fps_with_upsample": 1 / full,
                    "step_ms": 1000 * step,
                    "p95_ms": 1000 * float(np.percentile(ts[1:], 95)),
                }
    print(f"\n{'scene':<20}{'IoU':>8}{'step ms':>10}")
    for name, r in out["scenes"].items():
        print(f"{name:<20}{r['iou']:>8.3f}{r['step_ms_median']:>10.1f}")
    print(f"{'mean':<20}{out['mean_iou']:>8.3f}")
    if "speed" in out:
        print(f"\n{'objects':<10}{'fps (step)':>12}{'fps (+upsample)':>17}{'p95 ms':>9}")
        for n, r in out["speed"].items():
            print(f"{n:<10}{r['fps_step']:>12.1f}{r['fps_with_upsample']:>17.1f}{r['p95_ms']:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
