"""Propagation: a visible object's logits on the new frame from its last mask, the flow and its colour model.

The prior comes from the object's last mask moved two ways, blended: by a similarity transform fitted to the
forward flow inside it, and per pixel by the backward flow (which follows deformation and leaves background that
moves like the background outside).  The amodal ``shape`` (moved by the similarity, so a part that re-emerges from
behind an occluder is expected) adds a weak prior.  The colour log likelihood ratio is added, and where the object
moves differently from the background a motion cue; the stop rule (``stop``) may declare the object lost there.
The mask is the components of positive logits that the prediction supports, its growth capped.  Not thread-safe
(it moves the track's state).
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from .motion import similarity_from_flow
from .params import ClassicParams, PriorParams
from .segment import _fill_holes
from .state import NEIGHBOURS, OUTSIDE_LOGIT, Track, bbox, kept_logits, pad, signed_distance
from .stop import DECOY_FRAMES, stopped

logger = logging.getLogger(__name__)

#: the last mask's signed distance is computed in its region of interest grown by this many px more, so that the
#: edge of that crop stays outside the region the mask can move to
SD_MARGIN = 16
#: signed distance of the pixels that a warp brings in from outside that crop: far outside
FAR_OUTSIDE = -1e4
#: the similarity warp's signed distance is floored here (px) before it is blended with the dense warp's
SD_FLOOR = -50
#: the similarity is fitted to the flow on the mask eroded by this x the object's size (at least 1 px) ...
CORE_ERODE = 0.06
#: ... when that leaves at least this many pixels (else on the whole mask)
MIN_CORE = 40
#: the motion cue reaches its full weight where the flow is nearer to one motion than to the other by this x the
#: separation of the two motions (and at least CUE_MIN_SCALE px)
CUE_SCALE = 0.5
CUE_MIN_SCALE = 1.0
#: a component of positive logits is kept when at least this fraction of it lies in the prediction
MIN_PRED_OVERLAP = 0.25
#: holes in a tracked mask up to this fraction of its area are filled (noise); larger ones are background seen
#: through the object (a wheel).  Chosen on the DAVIS-2016 dev split: every hole filled -> 0.05: J from the mask
#: 0.655 -> 0.661, from a box 0.616 -> 0.621 (0.02: same; 0.15: 0.655 / 0.620)
MAX_HOLE = 0.05

#: the motion between the previous processed frame and this one: forward flow, backward flow (H, W, 2) and the
#: background's 2x3 affine motion this -> previous frame (None when it could not be fitted)
FrameFlow = tuple[np.ndarray, np.ndarray, np.ndarray | None]


def shape_prior(p: PriorParams, sd: np.ndarray) -> np.ndarray:
    """Shape prior in log-odds from a signed distance map (positive inside)."""
    return np.clip(np.where(sd > 0, sd * p.gain, sd * p.gain_out), p.min, p.max).astype(np.float32)


def components(cand: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Connected components of ``cand`` consistent with the prediction ``pred`` (``MIN_PRED_OVERLAP``), holes up
    to ``MAX_HOLE`` of their area filled."""
    if not cand.any():
        return cand
    n, lab, stats, _ = cv2.connectedComponentsWithStats(cand.astype(np.uint8), connectivity=8)
    overlap = np.bincount(lab[pred], minlength=n)
    areas = stats[:, cv2.CC_STAT_AREA]
    good = (overlap >= MIN_PRED_OVERLAP * areas) & (overlap > 0)
    good[0] = False
    if not good.any():
        return np.zeros_like(cand)
    # only small holes are noise: a large one is background seen through the object (a wheel, an arm's loop)
    return _fill_holes(good[lab], MAX_HOLE)


def motion_fields(
    bg: np.ndarray, m: np.ndarray, gx: np.ndarray, gy: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """At pixels (gx, gy): the backward displacement the background's affine motion ``bg`` predicts, the one the
    object's motion ``m`` predicts (inverted: backward), and how far apart the two are (px)."""
    mi = cv2.invertAffineTransform(m)
    bgx = bg[0, 0] * gx + bg[0, 1] * gy + bg[0, 2] - gx
    bgy = bg[1, 0] * gx + bg[1, 1] * gy + bg[1, 2] - gy
    obx = mi[0, 0] * gx + mi[0, 1] * gy + mi[0, 2] - gx
    oby = mi[1, 0] * gx + mi[1, 1] * gy + mi[1, 2] - gy
    return bgx, bgy, obx, oby, np.sqrt((bgx - obx) ** 2 + (bgy - oby) ** 2)


def _object_motion(tr: Track, fwd: np.ndarray | None) -> np.ndarray:
    """2x3 similarity previous -> this frame of the object, fitted to the forward flow on the mask's core (boundary
    pixels that are really background would bias the scale); the identity without flow."""
    if fwd is None:
        return np.array([[1, 0, 0], [0, 1, 0]], np.float32)
    core = cv2.erode(
        tr.mask.astype(np.uint8), NEIGHBOURS, iterations=max(1, int(CORE_ERODE * tr.size))
    ).astype(bool)
    return similarity_from_flow(fwd, core if core.sum() >= MIN_CORE else tr.mask)


class Propagator:
    """Propagation of one visible object per call (see the module doc)."""

    def __init__(self, params: ClassicParams) -> None:
        self.params = params

    def __call__(
        self,
        tr: Track,
        qidx: np.ndarray,
        flow: FrameFlow | None,
        index: int,
        gap: int,
    ) -> tuple[np.ndarray, float]:
        """Fused logits (h, w) for the visible object ``tr`` on frame ``index`` (``gap`` frame indices after the
        previous processed one) and the area scale factor of its motion; ``flow``: (forward, backward, background
        motion) since the previous frame, or None.  ``tr.shape`` and ``tr.motion`` are moved in place."""
        p = self.params.prior
        h, w = qidx.shape
        fwd, bwd, bg = flow if flow is not None else (None, None, None)
        m = _object_motion(tr, fwd)
        s2 = float(abs(np.linalg.det(m[:, :2])))
        tr.motion = m
        (x0, y0), sd, sdw, sdw_shape = self._warp(tr, m, w, h)
        tr.shape = sdw_shape > 0
        out = np.full((h, w), OUTSIDE_LOGIT, np.float32)
        pbox = bbox((sdw > 0) | tr.shape)
        if pbox is None:  # moved out of the frame
            return out, s2
        rx0, ry0, rx1, ry1 = pad(pbox, max(p.min_roi_pad, int(p.roi_pad * tr.size)), w, h)
        roi = np.s_[ry0:ry1, rx0:rx1]
        sdr = sdw[roi]
        gy, gx = np.mgrid[roi].astype(np.float32)
        if bwd is not None and p.dense_weight > 0:
            # the dense warp: each pixel takes the signed distance where its backward flow lands
            bw = bwd[roi]
            sdd = cv2.remap(
                sd,
                gx + bw[..., 0] - x0,
                gy + bw[..., 1] - y0,
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            )
            sdr = p.dense_weight * sdd + (1 - p.dense_weight) * np.maximum(sdr, SD_FLOOR)
        pred = (sdr > 0) | tr.shape[roi]
        fused = self._prior_and_colour(tr, sdr, sdw_shape[roi], qidx[roi])
        if bg is not None and bwd is not None and self.params.motion.weight > 0:
            lost, cue = self._motion_cue(tr, m, bg, bwd[roi], gx, gy, sdr > 0, index, gap)
            if lost:
                tr.decoy = (sdw > 0) | tr.mask
                tr.decoy[roi] |= components(fused > 0, pred)
                tr.decoy_until = index + DECOY_FRAMES
                return out, s2
            if cue is not None:
                fused += cue
        fused, keep = self._capped(tr, fused, pred, s2)
        out[roi] = kept_logits(fused, keep)
        return out, s2

    def _warp(
        self, tr: Track, m: np.ndarray, w: int, h: int
    ) -> tuple[tuple[int, int], np.ndarray, np.ndarray, np.ndarray]:
        """The signed distances of the last mask and of the amodal shape in a crop around them, and both warped by
        the similarity ``m`` to the full frame: ((x0, y0) of the crop, the mask's crop, the mask's, the shape's)."""
        p = self.params.prior
        box = bbox(tr.shape | tr.mask)
        assert box is not None
        x0, y0, x1, y1 = pad(box, max(p.min_roi_pad, int(p.roi_pad * tr.size)) + SD_MARGIN, w, h)
        sd = signed_distance(tr.mask[y0:y1, x0:x1])
        sd_shape = signed_distance(tr.shape[y0:y1, x0:x1])
        # warp the crop's signed distance (in crop coordinates) to the full frame
        t = m.copy()
        t[:, 2] += m[:, :2] @ np.array([x0, y0], np.float32)
        sdw, sdw_shape = (
            cv2.warpAffine(
                s, t, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=FAR_OUTSIDE
            )
            for s in (sd, sd_shape)
        )
        return (x0, y0), sd, sdw, sdw_shape

    def _prior_and_colour(
        self, tr: Track, sdr: np.ndarray, sd_shape: np.ndarray, qidx: np.ndarray
    ) -> np.ndarray:
        """The shape prior (the visible mask's, or the weaker amodal shape's where larger) plus the weighted colour
        log likelihood ratio, on the region of interest."""
        p, c = self.params.prior, self.params.colour
        prior = np.maximum(shape_prior(p, sdr), np.minimum(shape_prior(p, sd_shape), p.shape_max))
        llr = tr.model.llr(qidx)
        if c.blur > 0:
            llr = cv2.GaussianBlur(llr, (0, 0), c.blur)
        return prior + c.weight * llr

    def _motion_cue(
        self,
        tr: Track,
        m: np.ndarray,
        bg: np.ndarray,
        bw: np.ndarray,
        gx: np.ndarray,
        gy: np.ndarray,
        core: np.ndarray,
        index: int,
        gap: int,
    ) -> tuple[bool, np.ndarray | None]:
        """(lost, cue): whether the stop rule declares the object lost, else the motion cue in log-odds - does the
        pixel's backward flow ``bw`` fit the object's motion ``m`` or the background's ``bg`` better? - or None
        when the object does not move against the background (``MotionCueParams.min_sep``)."""
        p = self.params.motion
        bgx, bgy, obx, oby, sep = motion_fields(bg, m, gx, gy)
        if not core.any():
            return False, None
        sep_med = float(np.median(sep[core]))
        # per frame index, so that skipped frames (a live feed dropping them) do not read as a change of speed
        if stopped(tr, sep_med / gap, index):
            return True, None
        if sep_med <= p.min_sep:
            return False, None
        r_bg = np.sqrt((bw[..., 0] - bgx) ** 2 + (bw[..., 1] - bgy) ** 2)
        r_ob = np.sqrt((bw[..., 0] - obx) ** 2 + (bw[..., 1] - oby) ** 2)
        return False, p.weight * np.clip(
            (r_bg - r_ob) / np.maximum(CUE_MIN_SCALE, CUE_SCALE * sep), -1.0, 1.0
        )

    def _capped(
        self, tr: Track, fused: np.ndarray, pred: np.ndarray, s2: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The components of positive ``fused`` logits that the prediction supports; when they are more than the
        object can plausibly grow to in one frame (``AreaParams``), only its most confident pixels: (logits, mask)."""
        a = self.params.area
        keep = components(fused > 0, pred)
        max_area = int(s2 * min(a.max_growth * tr.area_ref, a.frame_growth * max(float(tr.mask.sum()), 1.0)))
        if keep.sum() > max_area > 0:
            c = float(np.partition(fused[keep], -max_area)[-max_area])
            fused = fused - c
            keep = components(fused > 0, pred)
        return fused, keep


__all__ = ["MAX_HOLE", "FrameFlow", "Propagator", "components", "motion_fields", "shape_prior"]
