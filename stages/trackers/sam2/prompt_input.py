"""A prompt as the SAM-2 models take it: points and labels in model pixels, or a mask resized like the reference's
processor (PyTorch's antialiased bilinear resize, then a threshold at 0.5).  Pure NumPy, no runtime.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Prompt


@functools.lru_cache(maxsize=64)
def _aa_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights of PyTorch's ``interpolate(mode="bilinear", align_corners=False, antialias=True)`` along one axis
    (for an upsample this is plain bilinear), as taps: output ``i`` is ``sum_k weight[i, k] * input[index[i, k]]``
    (``index``, ``weight``: (n_out, K); unused taps have weight 0).  Cached per size pair."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    rows: list[tuple[int, np.ndarray]] = []
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        j = np.arange(lo, hi)
        k = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) / support))
        total = k.sum()
        rows.append((lo, k / total if total > 0 else np.zeros_like(k)))
    taps = max(1, max(len(k) for _, k in rows))
    index = np.zeros((n_out, taps), np.intp)
    weight = np.zeros((n_out, taps), np.float64)
    for i, (lo, k) in enumerate(rows):
        index[i, : len(k)] = np.arange(lo, lo + len(k))
        weight[i, : len(k)] = k
    index.flags.writeable = weight.flags.writeable = False
    return index, weight


def resize_aa(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize a 2-D float array like PyTorch's antialiased bilinear interpolate (float32 result).

    Separable and banded: each output pixel sums a few taps per axis (float64), so the cost is ``taps x output``
    rather than the dense ``height x H x W`` matrix product, and no BLAS thread pool is involved (a dense product
    through a multi-threaded BLAS took 25-30 ms for a 96x160 -> 128x128 mask when the cores were busy tracking,
    1.4 ms on one thread: this runs for every mask prompt, including a hot reload's)."""
    x = np.asarray(x, np.float64)
    iy, wy = _aa_taps(x.shape[0], height)
    ix, wx = _aa_taps(x.shape[1], width)
    rows = np.zeros((height, x.shape[1]), np.float64)
    for k in range(iy.shape[1]):
        rows += wy[:, k, None] * x[iy[:, k], :]
    out = np.zeros((height, width), np.float64)
    for k in range(ix.shape[1]):
        out += rows[:, ix[:, k]] * wx[None, :, k]
    return out.astype(np.float32)


@dataclass
class ModelInput:
    """Prompts of one object for the current frame, in model pixels."""

    points: np.ndarray  # (K, 2) float32
    labels: np.ndarray  # (K,) int32: 1, 0, 2/3 box corners
    mask: np.ndarray | None = None  # (S, S) float32 0/1
    n_points: int = 0  # what the multimask rule counts


def model_input(prompt: Prompt, src_w: int, src_h: int, size: int) -> ModelInput:
    """``prompt`` (source pixels of a ``src_w`` x ``src_h`` stream) in the pixels of the ``size`` x ``size`` model
    input: box corners (labels 2, 3) then points, or the mask resized (a mask of the wrong size is a
    :class:`PromptError`)."""
    sx, sy = size / src_w, size / src_h
    if prompt.mask is not None:
        mask = np.asarray(prompt.mask, bool)
        if mask.shape != (src_h, src_w):
            raise PromptError(
                f"object {prompt.obj_id}: mask prompt is {mask.shape[1]}x{mask.shape[0]}, the "
                f"stream is {src_w}x{src_h}"
            )
        m = mask.astype(np.float32)
        if m.shape != (size, size):  # as HF's processor: antialiased resize, then threshold at 0.5
            m = (resize_aa(m, size, size) > 0.5).astype(np.float32)
        return ModelInput(np.zeros((1, 2), np.float32), np.full((1,), -1, np.int32), mask=m)
    pts: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    if prompt.box is not None:
        x0, y0, x1, y1 = prompt.box
        pts.append(np.array([[x0 * sx, y0 * sy], [x1 * sx, y1 * sy]], np.float32))
        labels.append(np.array([2, 3], np.int32))
    if len(prompt.points):
        pts.append((prompt.points * np.array([sx, sy], np.float32)).astype(np.float32))
        labels.append(prompt.labels.astype(np.int32))
    p = np.concatenate(pts)
    lab = np.concatenate(labels)
    return ModelInput(p, lab, n_points=len(p))


__all__ = ["ModelInput", "model_input", "resize_aa"]
