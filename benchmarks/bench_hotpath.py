"""The per-frame hot-path changes of the non-tracker stages, before and after, side by side in one run.

Each row times the previous implementation (kept here, verbatim, as the reference) and the current one on the
same input, alternating, median of ``--repeats`` calls each, in one thread with one OpenCV thread, and checks
that both give identical results:

* ``overlay tint``: the video/RTSP sinks' mask tint (``sinks/overlay.py``): a NumPy gather/scatter of the masked
  pixels before, a per-colour lookup table (``cv2.LUT``) and a masked copy (``cv2.copyTo``) now;
* ``RLE layout``: the column-major copy of the masks that pycocotools encodes (``TrackResult.to_rles``): a NumPy
  copy of a transposed view before, ``cv2.transpose`` per mask now;
* ``preprocess``: the classic tracker's input (854x480 -> 480x270, INTER_AREA): resized then copied into the ring
  buffer before, resized into the ring buffer now.

    python benchmarks/bench_hotpath.py [--repeats 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from vostream.pipeline.types import TrackResult, _column_major, boxes_from_masks
from vostream.sinks.overlay import OverlayStyle, color_for, draw_overlay
from vostream.stages.preprocess import Preprocessor
from vostream.stages.trackers.base import InputSpec


def _old_tint(image: np.ndarray, result: TrackResult, alpha: float) -> np.ndarray:
    """The tint as draw_overlay did it before (contours and labels off)."""
    out = image.copy()
    h, w = out.shape[:2]
    assert result.masks is not None
    for row in range(len(result)):
        x0, y0, x1, y1 = (int(round(v)) for v in result.boxes[row])
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(w, x1), min(h, y1)
        mask = result.masks[row, y0:y1, x0:x1]
        region = out[y0:y1, x0:x1]
        colour = color_for(int(result.obj_ids[row]))
        blended = region[mask].astype(np.float32) * (1 - alpha) + np.asarray(colour, np.float32) * alpha
        region[mask] = blended.astype(np.uint8)
    return out


def _old_layout(masks: np.ndarray) -> np.ndarray:
    return np.asfortranarray(masks.transpose(1, 2, 0).astype(np.uint8))


class _OldPreprocessor(Preprocessor):
    """Preprocessor as it was for uint8 HWC: resize into a scratch buffer, then copy into the ring buffer."""

    def __call__(self, image: np.ndarray) -> np.ndarray:
        src_h, src_w = image.shape[:2]
        if self._src_size != (src_w, src_h):
            self._allocate(src_w, src_h)
        w, h = self._size
        out = self._buffers[self._next]
        self._next = (self._next + 1) % self.ring
        resized = cv2.resize(image, (w, h), dst=self._resized, interpolation=cv2.INTER_AREA)
        np.copyto(out, resized)
        return out


def side_by_side(old: Callable[[], Any], new: Callable[[], Any], repeats: int) -> tuple[float, float]:
    old(), new()
    t_old, t_new = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        old()
        t_old.append(time.perf_counter() - t)
        t = time.perf_counter()
        new()
        t_new.append(time.perf_counter() - t)
    return float(np.median(t_old)) * 1e3, float(np.median(t_new)) * 1e3


def _result(masks: np.ndarray) -> TrackResult:
    n = len(masks)
    return TrackResult(0, list(range(1, n + 1)), [1.0] * n, [True] * n, boxes_from_masks(masks), masks=masks)


def _discs(h: int, w: int, n: int) -> np.ndarray:
    yy, xx = np.mgrid[:h, :w]
    return np.stack([np.hypot(yy - h / 2, xx - w / 4 - k * w / 6) < h / 5 for k in range(n)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--json", help="write the results as JSON here")
    args = ap.parse_args(argv)
    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []

    def row(name: str, old: Callable[[], Any], new: Callable[[], Any]) -> None:
        a, b = old(), new()
        if not np.array_equal(a, b):
            raise SystemExit(f"{name}: the two implementations differ")
        t_old, t_new = side_by_side(old, new, args.repeats)
        rows.append({"case": name, "before_ms": t_old, "after_ms": t_new, "speedup": t_old / t_new})

    style = OverlayStyle(alpha=0.5, contours=False, labels=False)
    for w, h in ((854, 480), (1920, 1080)):
        image = cv2.GaussianBlur(rng.integers(0, 256, (h, w, 3), np.uint8), (5, 5), 0)
        for n in (1, 4):
            res = _result(_discs(h, w, n))
            row(
                f"overlay tint {w}x{h}, {n} object(s)",
                lambda image=image, res=res: _old_tint(image, res, 0.5),
                lambda image=image, res=res: draw_overlay(image, res, style),
            )
        thin = np.zeros((1, h, w), bool)
        rr = np.arange(min(h, w) - 20) + 10
        thin[0, rr, rr] = (
            True  # a one-pixel diagonal: a large box, few pixels (the worst case of the new way)
        )
        res = _result(thin)
        row(
            f"overlay tint {w}x{h}, thin diagonal",
            lambda image=image, res=res: _old_tint(image, res, 0.5),
            lambda image=image, res=res: draw_overlay(image, res, style),
        )
        for n in (1, 4):
            masks = _discs(h, w, n)
            row(
                f"RLE layout {w}x{h}, {n} mask(s)",
                lambda masks=masks: _old_layout(masks),
                lambda masks=masks: _column_major(masks),
            )
    spec = InputSpec(480, 270, resize="fit", dtype="uint8", layout="HWC")
    old_pre, new_pre = _OldPreprocessor(spec), Preprocessor(spec)
    frame = rng.integers(0, 256, (480, 854, 3), np.uint8)
    row("preprocess 854x480 -> 480x270", lambda: old_pre(frame), lambda: new_pre(frame))

    width = max(len(r["case"]) for r in rows)
    lines = [f"{'case':<{width}}  {'before ms':>9}  {'after ms':>8}  {'speedup':>7}"]
    lines += [
        f"{r['case']:<{width}}  {r['before_ms']:9.3f}  {r['after_ms']:8.3f}  {r['speedup']:6.1f}x"
        for r in rows
    ]
    sys.stdout.write("\n".join(lines) + "\n(identical results in every case)\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
