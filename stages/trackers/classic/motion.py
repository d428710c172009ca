"""Frame-to-frame motion: dense DIS optical flow and a robust per-object similarity transform.

Not thread-safe: a :class:`FlowEstimator` holds an OpenCV DIS instance; one per session.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import cv2
import numpy as np

from .state import Track, bbox, pad

logger = logging.getLogger(__name__)

PRESETS = {
    "ultrafast": cv2.DISOPTICAL_FLOW_PRESET_ULTRAFAST,
    "fast": cv2.DISOPTICAL_FLOW_PRESET_FAST,
    "medium": cv2.DISOPTICAL_FLOW_PRESET_MEDIUM,
}
#: an expected displacement under this many px is not worth pre-shifting the previous frame for
MIN_INIT_SHIFT = 2.0
#: RANSAC of the motion fits: iterations, confidence, refinement iterations; a fit with under MIN_INLIERS of its
#: points as inliers is rejected
RANSAC_ITERS = 200
RANSAC_CONFIDENCE = 0.98
RANSAC_REFINE = 5
MIN_INLIERS = 0.3
#: an object's similarity: fitted to at most SIMILARITY_SAMPLES of its pixels, at least MIN_SIMILARITY_SAMPLES
#: (else the median translation), inlier threshold SIMILARITY_RANSAC_PX; a per-frame scale change outside
#: [MIN_SCALE, MAX_SCALE] is taken for a failed fit
SIMILARITY_SAMPLES = 400
MIN_SIMILARITY_SAMPLES = 12
SIMILARITY_RANSAC_PX = 1.5
MIN_SCALE = 0.8
MAX_SCALE = 1.25
#: the background's motion: fitted on a grid of about BACKGROUND_SAMPLES points (at least BACKGROUND_MIN_STEP px
#: apart) outside every visible object's box padded by BACKGROUND_PAD x its size + BACKGROUND_MIN_PAD px + its
#: speed; not with under BACKGROUND_MIN_POINTS points left; inlier threshold BACKGROUND_RANSAC_PX
BACKGROUND_SAMPLES = 1500.0
BACKGROUND_MIN_STEP = 4
BACKGROUND_PAD = 0.15
BACKGROUND_MIN_PAD = 6
BACKGROUND_MIN_POINTS = 40
BACKGROUND_RANSAC_PX = 1.0


class FlowEstimator:
    """Dense optical flow ``prev -> cur`` (H, W, 2) float32 with OpenCV's DIS."""

    def __init__(self, preset: str = "ultrafast") -> None:
        self._dis = cv2.DISOpticalFlow_create(PRESETS[preset])  # type: ignore[attr-defined]

    def __call__(
        self, prev: np.ndarray, cur: np.ndarray, init: tuple[float, float] | None = None
    ) -> np.ndarray:
        """Flow ``prev -> cur``.  ``init`` (dx, dy), an expected displacement (frames were skipped), pre-shifts
        ``prev`` so DIS only has to find the residual motion; the result is mapped back to ``prev``'s pixels."""
        if init is None or not np.all(np.isfinite(init)) or np.hypot(*init) < MIN_INIT_SHIFT:
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
    flow: np.ndarray,
    mask: np.ndarray,
    max_samples: int = SIMILARITY_SAMPLES,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """2x3 similarity (rotation, uniform scale, translation) that best explains ``flow`` inside ``mask``.

    RANSAC (``cv2.estimateAffinePartial2D``) on up to ``max_samples`` pixels; falls back to the median
    translation when too few pixels or the fit fails, or the per-frame scale change is outside [MIN_SCALE, MAX_SCALE].
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
    if len(src) < MIN_SIMILARITY_SAMPLES:
        return fallback
    m, inliers = cv2.estimateAffinePartial2D(
        src,
        dst,
        method=cv2.RANSAC,
        ransacReprojThreshold=SIMILARITY_RANSAC_PX,
        maxIters=RANSAC_ITERS,
        confidence=RANSAC_CONFIDENCE,
        refineIters=RANSAC_REFINE,
    )
    if m is None or inliers is None or inliers.sum() < MIN_INLIERS * len(src):
        return fallback
    scale = float(np.hypot(m[0, 0], m[1, 0]))
    if not MIN_SCALE <= scale <= MAX_SCALE:
        return fallback
    return m.astype(np.float32)


def background_motion(bwd: np.ndarray, tracks: Iterable[Track]) -> np.ndarray | None:
    """2x3 affine map current -> previous frame of the background (RANSAC on the backward flow ``bwd`` sampled on
    a grid outside every visible object's padded box, ``BACKGROUND_*``), or None when it cannot be fitted."""
    h, w = bwd.shape[:2]
    step = max(BACKGROUND_MIN_STEP, int(np.sqrt(h * w / BACKGROUND_SAMPLES)))
    ys, xs = np.mgrid[step // 2 : h : step, step // 2 : w : step]
    keep = np.ones(ys.shape, bool)
    for tr in tracks:
        box = bbox(tr.mask) if tr.present else None
        if box is None:
            continue
        margin = int(BACKGROUND_PAD * tr.size + BACKGROUND_MIN_PAD + np.abs(tr.velocity).max())
        x0, y0, x1, y1 = pad(box, margin, w, h)
        keep &= ~((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1))
    if keep.sum() < BACKGROUND_MIN_POINTS:
        return None
    src = np.stack([xs[keep], ys[keep]], 1).astype(np.float32)
    dst = src + bwd[ys[keep], xs[keep]]
    a, inl = cv2.estimateAffine2D(
        src,
        dst,
        method=cv2.RANSAC,
        ransacReprojThreshold=BACKGROUND_RANSAC_PX,
        maxIters=RANSAC_ITERS,
        confidence=RANSAC_CONFIDENCE,
        refineIters=RANSAC_REFINE,
    )
    if a is None or inl is None or inl.sum() < MIN_INLIERS * len(src):
        return None
    return a.astype(np.float32)


__all__ = ["PRESETS", "FlowEstimator", "background_motion", "similarity_from_flow"]
