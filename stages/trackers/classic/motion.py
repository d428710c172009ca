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
        self._dis = cv2.DISOpticalFlow_create(PRESETS[preset])

    def __call__(self, prev: np.ndarray, cur: np.ndarray, init: tuple[float, float] | None = None) -> np.ndarray:
        """Flow ``prev -> cur``.  ``init`` (dx, dy), an expected displacement (frames were skipped), pre-shifts
        ``prev`` so DIS only has to find the residual motion; the result is mapped back to ``prev``'s pixels."""
        if init is None or not np.all(np.isfinite(init)) or np.hypot(*init) < 2.0:
            return self._dis.calc(prev, cur, None)
        dx, dy = float(init[0]), float(init[1])
        h, w = prev.shape[:2]
        shifted = cv2.warpAffine(prev, np.array([[1, 0, dx], [0, 1, dy]], np.float32), (w, h),
                                 borderMode=cv2.BORDER_REPLICATE)
        residual = self._dis.calc(shifted, cur, None)
        # residual is indexed by (p + init); bring it back to p and add the shift
        flow = cv2.warpAffine(residual, np.array([[1, 0, -dx], [0, 1, -dy]], np.float32), (w, h),
                              borderMode=cv2.BORDER_REPLICATE)
        flow[..., 0] += dx
        flow[..., 1] += dy
        return flow


def similarity_from_flow(flow: np.ndarray, mask: np.ndarray, max_samples: int = 400,
                         rng: np.random.Generator | None = None, background: np.ndarray | None = None,
                         expected: np.ndarray | None = None) -> np.ndarray:
    """2x3 similarity (rotation, uniform scale, translation) that best explains ``flow`` inside ``mask``.

    RANSAC (``cv2.estimateAffinePartial2D``) on up to ``max_samples`` pixels; falls back to the median
    translation when too few pixels or the fit fails, and clamps the per-frame scale change to [0.8, 1.25].
    Occluder-aware: given the ``background`` translation and the object's ``expected`` translation (both (2,)),
    when they differ by more than a pixel, samples whose flow is closer to the background's motion than to the
    expected one (flow dragged by a static occluder or the background at the mask border) are left out of the
    fit, as long as at least a fifth of them (and 12) remain.
    """
    ys, xs = np.nonzero(mask)
    if len(ys) == 0:
        return np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    if len(ys) > max_samples:
        step = len(ys) / max_samples
        sel = (np.arange(max_samples) * step).astype(np.int64)
        ys, xs = ys[sel], xs[sel]
    d = flow[ys, xs]
    if background is not None and expected is not None and np.hypot(*(expected - background)) > 1.0:
        obj = np.sum((d - expected) ** 2, 1) < np.sum((d - background) ** 2, 1)
        if obj.sum() >= max(12, 0.2 * len(d)):
            ys, xs, d = ys[obj], xs[obj], d[obj]
    src = np.stack([xs, ys], 1).astype(np.float32)
    dst = src + d
    med = np.median(d, axis=0)
    fallback = np.array([[1, 0, med[0]], [0, 1, med[1]]], np.float32)
    if len(src) < 12:
        return fallback
    m, inliers = cv2.estimateAffinePartial2D(src, dst, method=cv2.RANSAC, ransacReprojThreshold=1.5,
                                             maxIters=200, confidence=0.98, refineIters=5)
    if m is None or inliers is None or inliers.sum() < 0.3 * len(src):
        return fallback
    scale = float(np.hypot(m[0, 0], m[1, 0]))
    if not 0.8 <= scale <= 1.25:
        return fallback
    return m.astype(np.float32)


__all__ = ["PRESETS", "FlowEstimator", "similarity_from_flow"]


def sample_points(mask: np.ndarray, max_samples: int = 300) -> np.ndarray:
    """Up to ``max_samples`` (x, y) float32 pixel positions of ``mask``, evenly spread over its pixels."""
    ys, xs = np.nonzero(mask)
    if len(ys) > max_samples:
        sel = (np.arange(max_samples) * (len(ys) / max_samples)).astype(np.int64)
        ys, xs = ys[sel], xs[sel]
    return np.stack([xs, ys], 1).astype(np.float32)


def photometric_error(prev: np.ndarray, cur: np.ndarray, pts: np.ndarray, m: np.ndarray, cap: float = 30.0) -> float:
    """Mean truncated |cur(m p) - prev(p)| over the points ``pts`` (N, 2) of ``prev``: how well the motion ``m``
    (2x3) explains the object's appearance between two grey frames.  Points moved out of the frame count ``cap``."""
    if len(pts) == 0:
        return cap
    dst = pts @ m[:, :2].T + m[:, 2]
    a = prev[pts[:, 1].astype(np.int64), pts[:, 0].astype(np.int64)].astype(np.float32)
    b = cv2.remap(cur, dst[None, :, 0].copy(), dst[None, :, 1].copy(), cv2.INTER_LINEAR,
                  borderMode=cv2.BORDER_CONSTANT, borderValue=-1.0)
    b = b.reshape(-1).astype(np.float32)
    err = np.minimum(np.abs(b - a), cap)
    h, w = cur.shape[:2]
    outside = (dst[:, 0] < 0) | (dst[:, 1] < 0) | (dst[:, 0] > w - 1) | (dst[:, 1] > h - 1)
    err[outside] = cap
    return float(err.mean())


def background_motion(flow: np.ndarray, objects: np.ndarray | None, step: int = 8) -> np.ndarray:
    """(2,) median flow on a regular grid outside ``objects`` (bool mask of all tracked objects, may be None):
    the dominant (camera / background) translation between the two frames."""
    sub = flow[step // 2::step, step // 2::step].reshape(-1, 2)
    if objects is not None:
        keep = ~objects[step // 2::step, step // 2::step].reshape(-1)
        if keep.sum() >= 16:
            sub = sub[keep]
    return np.median(sub, axis=0).astype(np.float32)


def translation(d: np.ndarray) -> np.ndarray:
    """2x3 pure translation by ``d`` (dx, dy)."""
    return np.array([[1, 0, d[0]], [0, 1, d[1]]], np.float32)


__all__ += ["background_motion", "photometric_error", "sample_points", "translation"]
