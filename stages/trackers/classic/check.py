"""The check by motion: a few frames after a box or click prompt, its mask is re-segmented on the prompt frame
with the motion since then, and the result carried to the current frame.

A box (``segment.refine_box_by_motion``) is checked at the first frame after the prompt at which the box's mask has
moved ``segment.BOX_CHECK_MOTION`` against the background, by ``segment.BOX_CHECK_FRAMES``.  Clicks
(``segment.refine_click_by_motion``) are checked at both ``segment.CLICK_CHECK_FRAMES``, and the two estimates must
agree; else - or when motion finds no region to grow to - the click's own mask is checked as a box's would be.
Once per prompt; dropped while the object is absent or when the frame size changes.  Not thread-safe (it shares
the session's flow estimators).
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from .motion import FlowEstimator, similarity_from_flow
from .segment import (
    BOX_CHECK_FRAMES,
    BOX_CHECK_MOTION,
    CLICK_AGREE,
    CLICK_CHECK_FRAMES,
    MIN_KEEP,
    VOTES,
    box_motion,
    padded_box,
    refine_box_by_motion,
    refine_click_by_motion,
)
from .state import NEIGHBOURS, MotionCheck, Track

logger = logging.getLogger(__name__)

#: a check replaces the mask only when it changes it (IoU with the prompt's mask under SAME_MASK) and when the
#: corrected mask, carried to the current frame by the flow, lies mostly (>= CARRIED) on the tracked object (within
#: CARRY_NEAR px of it)
SAME_MASK = 0.9
CARRIED = 0.7
CARRY_NEAR = 3
#: a check's result with at least this fraction of it inside the prompt's mask, and under MIN_KEEP of that mask, is
#: the object's moving part beside a larger static look-alike (``_moving_part``)
PART_INSIDE = 0.9
#: a click whose region the motion does not grow is checked like a box prompt, in its mask's box padded by this
CLICK_FALLBACK_PAD = 0.1

#: flows from a prompt frame to this frame, shared by the objects prompted on the same frame: keyed by the id of
#: the prompt frame's gray image and True for the forward flow (prompt -> this frame), False for the backward one
Flows = dict[tuple[int, bool], np.ndarray]


def _moving_part(ref: np.ndarray, mask: np.ndarray) -> bool:
    """Whether a check by motion's result ``ref`` is a minority part of the prompt's ``mask``: within it
    (``PART_INSIDE``) and under ``MIN_KEEP`` of it, which ``refine_box_by_motion`` returns only when what it dropped
    is surely background.  Such a part is applied at a click's first estimate and carried by its own motion."""
    n = int(np.count_nonzero(ref))
    return bool(0 < n < MIN_KEEP * np.count_nonzero(mask) and np.count_nonzero(ref & mask) >= PART_INSIDE * n)


def _same(ref: np.ndarray, mask: np.ndarray) -> bool:
    """Whether the check's result ``ref`` leaves the prompt's ``mask`` as it is (``SAME_MASK``)."""
    return bool((ref & mask).sum() >= SAME_MASK * (ref | mask).sum())


class MotionChecker:
    """Runs the pending check by motion of one object per call (see the module doc)."""

    def __init__(self, flow: FlowEstimator, flow_back: FlowEstimator) -> None:
        self._flow = flow
        self._flow_back = flow_back

    def __call__(
        self, tr: Track, gray: np.ndarray, logits: dict[int, np.ndarray], flows: Flows
    ) -> np.ndarray | None:
        """Advance the check of ``tr`` (``tr.check``) by this frame (``gray``; ``logits``: this frame's so far).
        The corrected mask carried to this frame when the check changes the mask (the caller restarts the
        object's models from it), else None."""
        mc = tr.check
        assert mc is not None
        mc.seen += 1
        last = BOX_CHECK_FRAMES if mc.kind == "box" else CLICK_CHECK_FRAMES[-1]
        if mc.seen not in (range(1, BOX_CHECK_FRAMES + 1) if mc.kind == "box" else CLICK_CHECK_FRAMES):
            return None
        if mc.seen >= last:
            tr.check = None
        if tr.obj_id not in logits or mc.gray.shape != gray.shape:
            tr.check = None
            return None
        if (id(mc.gray), True) not in flows:
            flows[id(mc.gray), True] = self._flow(mc.gray, gray)
        fwd = flows[id(mc.gray), True]
        ready, ref = (
            self._box_result(tr, mc, fwd, last) if mc.kind == "box" else self._click_result(tr, mc, fwd, last)
        )
        if not ready:
            return None
        if ref is None or _same(ref, mc.mask):
            logger.debug("object %d: %s check by motion kept the mask", tr.obj_id, mc.kind)
            return None
        return self._carry(tr, mc, ref, fwd, gray, logits[tr.obj_id] > 0, flows)

    @staticmethod
    def _box_result(tr: Track, mc: MotionCheck, fwd: np.ndarray, last: int) -> tuple[bool, np.ndarray | None]:
        """(ready, result) of a box's check with the flow ``fwd`` from the prompt frame: not ready while the
        object has moved too little yet, or the check changes nothing yet, before the ``last`` frame."""
        if mc.seen < last and box_motion(mc.box, mc.mask, fwd) < BOX_CHECK_MOTION:
            return False, None  # too little motion yet to tell the object from the background: a later frame
        ref = refine_box_by_motion(mc.img, mc.box, mc.mask, fwd, mc.pos, mc.neg, votes=VOTES, robust=True)
        if mc.seen < last and (ref is None or _same(ref, mc.mask)):
            return False, None  # nothing to change yet: the flow to a later frame may tell more
        tr.check = None
        return True, ref

    @staticmethod
    def _click_result(
        tr: Track, mc: MotionCheck, fwd: np.ndarray, last: int
    ) -> tuple[bool, np.ndarray | None]:
        """(ready, result) of a click's check: the first estimate is kept to be confirmed by the second, unless
        it is final already (no region to grow to, nothing to change, a moving part)."""
        ref = refine_click_by_motion(mc.img, mc.mask, fwd, mc.pos, mc.neg) if mc.grow else None
        if mc.seen < last:
            # no region to grow to: check the click's own mask as a box prompt's would be (what in its box
            # moves like the background leaves it), now or, if the later estimate finds none, then
            mc.fallback = refine_box_by_motion(
                mc.img, padded_box(mc.mask, CLICK_FALLBACK_PAD), mc.mask, fwd, mc.pos, mc.neg
            )
            if ref is None:
                tr.check = None
                ref = mc.fallback
            elif _same(ref, mc.mask):
                tr.check = None  # the region moving with the click is its mask: nothing to confirm later
                return False, None
            elif _moving_part(ref, mc.mask):
                # nothing grown to confirm; applied now, as by the next estimate the track sits on the rest
                tr.check = None
            else:
                mc.first = ref
                return False, None
        elif ref is None:
            ref = mc.fallback
        elif mc.first is None or (ref & mc.first).sum() < CLICK_AGREE * (ref | mc.first).sum():
            logger.debug(
                "object %d: the click's motion estimates disagree (%s vs %d px, IoU %.2f); box check instead",
                tr.obj_id,
                None if mc.first is None else int(mc.first.sum()),
                int(ref.sum()),
                0.0 if mc.first is None else (ref & mc.first).sum() / (ref | mc.first).sum(),
            )
            ref = mc.fallback
        return True, ref

    def _carry(
        self,
        tr: Track,
        mc: MotionCheck,
        ref: np.ndarray,
        fwd: np.ndarray,
        gray: np.ndarray,
        cur: np.ndarray,
        flows: Flows,
    ) -> np.ndarray | None:
        """The check's result ``ref`` (on the prompt frame) carried to this frame, or None when it does not land
        on the tracked object's current mask ``cur`` (``CARRIED``)."""
        h, w = gray.shape
        part = _moving_part(ref, mc.mask)
        if part:
            # carried by its own motion: the backward flow at this frame is mostly that of the static rest around
            # it (drift-chicane: a stripe carried that way sat on the smoke behind the car)
            move = similarity_from_flow(fwd, ref)
            moved = cv2.warpAffine(ref.astype(np.uint8), move, (w, h), flags=cv2.INTER_NEAREST).astype(bool)
        else:
            if (id(mc.gray), False) not in flows:
                flows[id(mc.gray), False] = self._flow_back(gray, mc.gray)
            bwd = flows[id(mc.gray), False]
            gx, gy = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
            moved = cv2.remap(
                ref.astype(np.uint8), gx + bwd[..., 0], gy + bwd[..., 1], cv2.INTER_NEAREST, borderValue=0
            ).astype(bool)
        # the corrected mask, carried over several frames, must sit on the tracked object: inside it (a box check
        # removes background) or around it (a click check grows the part to the object)
        inner, outer = (moved, cur) if mc.kind == "box" or ref is mc.fallback or part else (cur, moved)
        near = cv2.dilate(outer.astype(np.uint8), NEIGHBOURS, iterations=CARRY_NEAR).astype(bool)
        if not moved.any() or (inner & near).sum() < CARRIED * inner.sum():
            logger.debug("object %d: the mask from the check by motion could not be carried", tr.obj_id)
            return None
        logger.debug(
            "object %d: %s check by motion: %d -> %d px",
            tr.obj_id,
            mc.kind,
            int(mc.mask.sum()),
            int(ref.sum()),
        )
        return moved


__all__ = ["MotionChecker"]
