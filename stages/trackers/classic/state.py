"""Per-object state of the classic tracker (:class:`Track`, :class:`MotionCheck`) and the mask geometry its steps
share: signed distances, boxes, the ring of surroundings, logits of a mask.  Not thread-safe (owned by a session).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import cv2
import numpy as np

from .appearance import ColourModel

logger = logging.getLogger(__name__)

#: logit of pixels far from every object (outside each object's region of interest)
OUTSIDE_LOGIT = -10.0
#: logits of a freshly segmented mask (a prompt's): its signed distance (px) x this, clipped to +-MASK_LOGIT_CLIP
MASK_LOGIT_GAIN = 1.5
MASK_LOGIT_CLIP = 6
#: a pixel kept in (dropped from) a mask gets at least this logit (at most minus it), so that thresholding the
#: logits at 0 gives back the mask exactly
MARGIN_LOGIT = 0.05
#: the 8-neighbourhood: one-pixel steps of erosion, dilation and opening
NEIGHBOURS = np.ones((3, 3), np.uint8)
#: ... and the 4-neighbourhood (a round step: the ring's dilations)
CROSS = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
#: the colour model's surroundings of a mask: a ring from RING_GAP px outside it to RING_WIDTH x the square root of
#: its area (at least RING_MIN_WIDTH px)
RING_GAP = 3
RING_WIDTH = 0.35
RING_MIN_WIDTH = 8


@dataclass
class MotionCheck:
    """A prompt's mask waiting for its check by motion (``segment.refine_box_by_motion`` for a box,
    ``segment.refine_click_by_motion`` for clicks): what the check needs from the prompt frame."""

    kind: str  # "box" | "click"
    img: np.ndarray  # (h, w, 3) uint8 prompt frame at working resolution (a copy: tensors are pooled buffers)
    gray: np.ndarray
    box: tuple[float, float, float, float]  # the box prompt, working resolution (unused for clicks)
    mask: np.ndarray  # the prompt's mask
    pos: np.ndarray  # (K, 2) the prompt's positive clicks (x, y, working resolution): hard constraints
    neg: np.ndarray  # ... and negative ones
    seen: int = 0  # frames processed since the prompt
    first: np.ndarray | None = None  # clicks: the first of the two estimates that must agree
    fallback: np.ndarray | None = None  # clicks: the box check of the click's own mask
    # clicks: the mask may grow to what moves with it.  Not on a source smaller than the working size (enlarged
    # for tracking): its flow has no more detail than the source, and growth there dragged background along (a
    # 256x144 synthetic pan: IoU 0.90 -> 0.82); such a click only gets the box check of its own mask
    grow: bool = True


@dataclass
class Track:
    """Typed state of one object."""

    obj_id: int
    mask: np.ndarray  # (h, w) bool, last visible mask at working resolution (empty while absent)
    shape: np.ndarray  # (h, w) bool, amodal shape estimate: the last fully visible mask, moved
    model: ColourModel
    area_ref: float  # reference (fully visible) area, scale-adjusted
    centroid: np.ndarray  # (2,) x, y of the last visible mask
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(2, np.float32))  # px per frame index
    last_seen: int = 0  # frame index of the last visible mask
    present: bool = True
    score: float = 1.0
    size: float = 1.0  # sqrt of area_ref
    ratio: float = 1.0  # last visible area / area_ref
    # how fast it moves against the background (px per frame): running mean, last frame, frames measured
    sep_ref: float = 0.0
    sep_last: float = 0.0
    sep_n: int = 0
    # where the mask stopped moving with the object (stop.STOP_DROP): not re-acquired there
    decoy: np.ndarray | None = None
    decoy_until: int = -1  # ... up to this frame index
    stopped: int = 0  # consecutive frames the mask has moved with the background (stop.STOP_DROP)
    llr_ref: float = 1.0  # typical mean colour log likelihood ratio inside the mask (EMA)
    extent: float = 0.0  # a box or mask prompt's mask area, x the motion's scale since (extent_cap); 0: none
    motion: np.ndarray | None = None  # 2x3 similarity of the last propagation (previous -> this frame)
    prompted_at: int = 0  # frame index of the last prompt (contested pixels go to the newest)
    check: MotionCheck | None = None  # a prompt waiting for its check by motion

    @classmethod
    def from_mask(cls, oid: int, mask: np.ndarray, qidx: np.ndarray, index: int) -> Track:
        """A track whose models start from ``mask`` on frame ``index`` (``qidx``: its colour-cell indices)."""
        model = ColourModel.from_pixels(qidx[mask], qidx[ring(mask)])
        area = float(mask.sum())
        ys, xs = np.nonzero(mask)
        c = np.array([xs.mean(), ys.mean()], np.float32)
        tr = cls(
            oid,
            mask.copy(),
            mask.copy(),
            model,
            area,
            c,
            last_seen=index,
            size=float(np.sqrt(area)),
            prompted_at=index,
        )
        tr.llr_ref = float(model.llr(qidx[mask]).mean())
        return tr

    def rescale(self, w: int, h: int, ow: int, oh: int) -> None:
        """The working size changed from (ow, oh) to (w, h): resize the masks, positions and areas; a pending
        check by motion is dropped (its frame has the old size)."""
        self.mask = cv2.resize(self.mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(
            bool
        )
        self.shape = cv2.resize(self.shape.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(
            bool
        )
        self.centroid = self.centroid * np.array([w / ow, h / oh], np.float32)
        self.velocity = self.velocity * np.array([w / ow, h / oh], np.float32)
        f = (w * h) / float(ow * oh)
        self.area_ref *= f
        self.extent *= f
        self.size = float(np.sqrt(self.area_ref))
        self.check = None
        if self.present and not self.mask.any():
            self.present = False


def mask_logits(mask: np.ndarray) -> np.ndarray:
    """Logits for a freshly segmented mask: its signed distance, scaled and clipped."""
    return np.clip(signed_distance(mask) * MASK_LOGIT_GAIN, -MASK_LOGIT_CLIP, MASK_LOGIT_CLIP).astype(
        np.float32
    )


def kept_logits(fused: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``fused`` logits made to agree with the mask ``keep``: positive exactly on it (``MARGIN_LOGIT``)."""
    return np.where(keep, np.maximum(fused, MARGIN_LOGIT), np.minimum(fused, -MARGIN_LOGIT))


def signed_distance(mask: np.ndarray) -> np.ndarray:
    """Distance to the mask's outline (px): positive inside, negative outside."""
    m = mask.astype(np.uint8)
    inside = cv2.distanceTransform(m, cv2.DIST_L2, cv2.DIST_MASK_3)
    outside = cv2.distanceTransform(1 - m, cv2.DIST_L2, cv2.DIST_MASK_3)
    return inside - outside


def bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """x0, y0, x1, y1 (exclusive) of the mask's pixels; None when it is empty."""
    rows = np.flatnonzero(mask.any(axis=1))
    if not len(rows):
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def pad(box: tuple[int, int, int, int], margin: int, w: int, h: int) -> tuple[int, int, int, int]:
    """``box`` grown by ``margin`` px on every side, clipped to a w x h frame."""
    x0, y0, x1, y1 = box
    return max(0, x0 - margin), max(0, y0 - margin), min(w, x1 + margin), min(h, y1 + margin)


def ring(mask: np.ndarray) -> np.ndarray:
    """The mask's surroundings (``RING_*``): the background sample of its colour model."""
    size = np.sqrt(max(1.0, float(mask.sum())))
    outer = max(RING_MIN_WIDTH, int(RING_WIDTH * size))
    box = bbox(mask)
    out = np.zeros(mask.shape, bool)
    if box is None:
        return out
    x0, y0, x1, y1 = pad(box, outer + 1, mask.shape[1], mask.shape[0])
    m = mask[y0:y1, x0:x1].astype(np.uint8)
    big = cv2.dilate(m, CROSS, iterations=outer)
    small = cv2.dilate(m, CROSS, iterations=RING_GAP)
    out[y0:y1, x0:x1] = (big > 0) & (small == 0)
    return out


__all__ = [
    "MotionCheck",
    "Track",
    "bbox",
    "kept_logits",
    "mask_logits",
    "pad",
    "ring",
    "signed_distance",
]
