"""An object's bookkeeping once its logits on a frame are known: absent or visible, its reference area and typical
colour likelihood, colour models, amodal shape, centroid, velocity and score.  Not thread-safe (it updates the
track in place).
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from .params import ClassicParams
from .state import NEIGHBOURS, Track, ring

logger = logging.getLogger(__name__)

#: the references (area, typical colour likelihood) follow the mask only while its area is over this fraction of
#: the reference area (mostly visible) ...
REF_UPDATE = 0.7
#: ... the typical colour likelihood at this rate
LLR_REF_RATE = 0.1
#: over this fraction the mask is the object's amodal shape, and its centroid's motion updates the velocity
FULLY_VISIBLE = 0.8
#: over this fraction the colour models learn from the mask (its inside, eroded by a pixel) and its surroundings
MODEL_UPDATE = 0.5
#: update rate of the velocity
VELOCITY_RATE = 0.5


def observe(
    params: ClassicParams,
    tr: Track,
    lg: np.ndarray | None,
    qidx: np.ndarray,
    index: int,
    scale: float,
    prompted: bool,
) -> bool:
    """Update ``tr`` from its logits ``lg`` on frame ``index`` (None: not found); ``scale``: the area scale of its
    motion since the previous frame; ``prompted``: its mask comes from a prompt on this frame (no presence test, no
    reference or model update).  True when the object is visible."""
    h, w = qidx.shape
    if lg is None:
        tr.present, tr.score = False, 0.0
        tr.mask = np.zeros((h, w), bool)
        return False
    mask = lg > 0
    area = float(mask.sum())
    if not prompted and not _follow(params, tr, mask, area, qidx, index, scale):
        tr.present, tr.score = False, 0.0
        tr.mask = np.zeros((h, w), bool)
        return False
    ys, xs = np.nonzero(mask)
    c = np.array([xs.mean(), ys.mean()], np.float32)
    gap = max(1, index - tr.last_seen)
    if tr.present and not prompted and tr.ratio >= FULLY_VISIBLE:
        tr.velocity = (1 - VELOCITY_RATE) * tr.velocity + VELOCITY_RATE * (c - tr.centroid) / gap
    tr.centroid, tr.last_seen, tr.mask, tr.present = c, index, mask, True
    tr.score = float(np.mean(1.0 / (1.0 + np.exp(-lg[mask])))) if area else 0.0
    return True


def _follow(
    params: ClassicParams,
    tr: Track,
    mask: np.ndarray,
    area: float,
    qidx: np.ndarray,
    index: int,
    scale: float,
) -> bool:
    """The presence test (``AbsenceParams``) of a propagated mask, and when it passes the references, shape and
    colour models updated from it; False when the object is absent."""
    a, ar, c = params.absence, params.area, params.colour
    tr.area_ref *= scale
    tr.extent *= scale
    ratio = area / max(tr.area_ref, 1.0)
    tr.ratio = ratio
    mean_llr = float(tr.model.llr(qidx[mask]).mean()) if area else 0.0
    if ratio < a.ratio or mean_llr < min(a.llr, a.llr_frac * tr.llr_ref):
        if tr.present:
            logger.debug(
                "object %d lost at frame %d (area ratio %.2f, mean llr %.2f)",
                tr.obj_id,
                index,
                ratio,
                mean_llr,
            )
        return False
    if ratio > REF_UPDATE:
        tr.llr_ref += LLR_REF_RATE * (mean_llr - tr.llr_ref)
        rate = ar.grow_rate if area > tr.area_ref else ar.rate
        tr.area_ref += rate * (area - tr.area_ref)
        if tr.extent:
            tr.area_ref = min(tr.area_ref, tr.extent)
    if ratio > FULLY_VISIBLE:
        tr.shape = mask
    tr.size = float(np.sqrt(tr.area_ref))
    if ratio > MODEL_UPDATE:
        inner = cv2.erode(mask.astype(np.uint8), NEIGHBOURS).astype(bool)
        tr.model.update(qidx[inner], qidx[ring(mask)], c.fg_rate, c.bg_rate)
    return True


__all__ = ["observe"]
