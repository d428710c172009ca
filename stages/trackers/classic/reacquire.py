"""Re-acquisition: the search for an absent object among the regions of the frame that have its colours.

Candidates are the connected components where the object's colour log likelihood ratio is high.  One near the
position predicted from the object's last velocity may be smaller and less alike than one anywhere else
(``ReacquireParams``); what the object was last lost to by the stop rule (its decoy) is skipped for a while.  The
best candidate (colour distance plus a distance cost) becomes the object's shape, and its logits are fused as in
propagation.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from .appearance import REGION_BLUR, bhattacharyya, histogram
from .params import ClassicParams
from .propagate import components, shape_prior
from .segment import _fill_holes
from .state import NEIGHBOURS, Track, kept_logits, signed_distance

logger = logging.getLogger(__name__)

#: the predicted position extrapolates the last velocity over at most this many frames
MAX_EXTRAPOLATE = 30
#: "near" the predicted position: within SEARCH_RADIUS + SEARCH_RADIUS_GROWTH x (frames since last seen) times
#: the object's size
SEARCH_RADIUS = 1.5
SEARCH_RADIUS_GROWTH = 0.1
#: a candidate at most this x the object's reference area
MAX_RATIO = 2.5
#: a candidate more than this fraction of which lies on the object's decoy is skipped
DECOY_OVERLAP = 0.5
#: a candidate's cost: its colour distance plus this x its distance to the predicted position in object sizes
DISTANCE_COST = 0.1


def reacquire(params: ClassicParams, tr: Track, qidx: np.ndarray, index: int) -> np.ndarray | None:
    """Search for the absent object ``tr`` on frame ``index``; its logits when found (``tr.shape`` is then the
    found region), else None."""
    llr = cv2.GaussianBlur(tr.model.llr(qidx), (0, 0), REGION_BLUR)
    cand = cv2.morphologyEx((llr > params.reacquire.llr).astype(np.uint8), cv2.MORPH_OPEN, NEIGHBOURS)
    n, lab, stats, cents = cv2.connectedComponentsWithStats(cand, connectivity=8)
    if n <= 1:
        return None
    gap = max(1, index - tr.last_seen)
    best = _best_candidate(params, tr, qidx, index, lab, stats, cents)
    if best < 0:
        return None
    comp = _fill_holes(lab == best)
    logger.debug("object %d re-acquired at frame %d after %d frames", tr.obj_id, index, gap)
    sd = signed_distance(comp)
    fused = shape_prior(params.prior, sd) + params.colour.weight * llr
    keep = components(fused > 0, comp)
    tr.shape = comp
    return kept_logits(fused, keep).astype(np.float32)


def _best_candidate(
    params: ClassicParams,
    tr: Track,
    qidx: np.ndarray,
    index: int,
    lab: np.ndarray,
    stats: np.ndarray,
    cents: np.ndarray,
) -> int:
    """The label of the lowest-cost acceptable component (``lab``, ``stats``, ``cents`` from
    ``cv2.connectedComponentsWithStats``), or -1."""
    p = params.reacquire
    gap = max(1, index - tr.last_seen)
    pred = tr.centroid + tr.velocity * min(gap, MAX_EXTRAPOLATE)
    radius = tr.size * (SEARCH_RADIUS + SEARCH_RADIUS_GROWTH * gap)
    best, best_cost = -1, np.inf
    for j in range(1, len(stats)):
        area = stats[j, cv2.CC_STAT_AREA]
        ratio = area / max(tr.area_ref, 1.0)
        if ratio < p.min_ratio or ratio > MAX_RATIO:
            continue
        dist = float(np.hypot(*(cents[j] - pred)))
        near = dist < radius
        if not near and ratio < p.global_ratio:
            continue
        x, y, bw, bh = stats[j, :4]
        sub = lab[y : y + bh, x : x + bw] == j
        if tr.decoy is not None and index <= tr.decoy_until:
            if np.count_nonzero(sub & tr.decoy[y : y + bh, x : x + bw]) > DECOY_OVERLAP * area:
                continue  # what the object was lost to: static, and only looks like it
        d = bhattacharyya(histogram(qidx[y : y + bh, x : x + bw][sub]), tr.model.fg)
        if d > (p.bhatt if near else p.bhatt_global):
            continue
        cost = d + DISTANCE_COST * dist / max(tr.size, 1.0)
        if cost < best_cost:
            best, best_cost = j, cost
    return best


__all__ = ["reacquire"]
