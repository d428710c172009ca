"""Frame-to-frame motion: dense DIS optical flow and a robust per-object similarity transform.

Not thread-safe: a :class:`FlowEstimator` holds an OpenCV DIS instance; one per session.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

logger = logging.getLogger(__name__)

PRESETS = {
    "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
    "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
    "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
}


class FlowEstimator:
    """Dense optical flow ``prev -> cur`` (H, W, 2) float32 with OpenCV's DIS."""

    def __init__(self, preset: str = "ultrafast") -> None:
        self._dis = cv2.DISOpticalFlow_create(PRESETS[preset])  # type: ignore[attr-defined]

    def __call__(
        self, prev: np.ndarray, cur: np.ndarray, init: tuple[float, float] | None = None
    ) -> np.ndarray:
        """Flow ``prev -> cur``.  ``init`` (dx, dy), an expected displacement (frames were skipped), pre-shifts
        ``prev`` so DIS only has to find the residual motion; the result is mapped back to ``prev``'s pixels."""
        if init is None or not np.all(np.isfinite(init)) or np.hypot(*init) < 2.0:
            return self._dis.calc(prev, cur, None)
        dx, dy = float(init[0]), float(init[1])
        h, w = prev.shape[:2]
        shifted = cv2.warpAffine(
            prev, np.array([[1, 0, dx], [0, 1, dy]], np.float32), (w, h), borderMode=cv2.BORDER_REPLICATE
        )
        residual = self._dis.calc(shifted, cur, None)
        # residual is indexed by (p + init); bring it back to p and add the shift
        flow = np.asarray(
            cv2.warpAffine(
                residual,
                np.array([[1, 0, -dx], [0, 1, -dy]], np.float32),
                (w, h),
                borderMode=cv2.BORDER_REPLICATE,
            ),
            np.float32,
        )
        flow[..., 0] += dx
        flow[..., 1] += dy
        return flow


def similarity_from_flow(
    flow: np.ndarray, mask: np.ndarray, max_samples: int = 400, rng: np.random.Generator | None = None
) -> np.ndarray:
    """2x3 similarity (rotation, uniform scale, translation) that best explains ``flow`` inside ``mask``.

    RANSAC (``cv2.estimateAffinePartial2D``) on up to ``max_samples`` pixels; falls back to the median
    translation when too few pixels or the fit fails, and clamps the per-frame scale change to [0.8, 1.25].
    """
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    if len(ys) > max_samples:
        step = len(ys) / max_samples
        sel = (np.arange(max_samples) * step).astype(np.int64)
        ys, xs = ys[sel], xs[sel]
    d = flow[ys, xs]
    src = np.stack([xs, ys], 1).astype(np.float32)
    dst = src + d
    med = np.median(d, axis=0)
    fallback = np.array([[1, 0, med[0]], [0, 1, med[1]]], np.float32)
    if len(src) < 12:
        return fallback
    m, inliers = cv2.estimateAffinePartial2D(
        src, dst, method=cv2.RANSAC, ransacReprojThreshold=1.5, maxIters=200, confidence=0.98, refineIters=5
    )
    if m is None or inliers is None or inliers.sum() < 0.3 * len(src):
        return fallback
    scale = float(np.hypot(m[0, 0], m[1, 0]))
    if not 0.8 <= scale <= 1.25:
        return fallback
    return m.astype(np.float32)


__all__ = ["PRESETS", "FlowEstimator", "similarity_from_flow"]
