"""The stop rule: a tracked mask that suddenly moves with the background has been lost to a static look-alike.

An object that has been moving against the background (its running mean speed against it, or its last frame's if
lower, over STOP_MIN px per frame) and whose mask suddenly moves with the background (under STOP_DROP x that, on
STOP_FRAMES frames in a row) has been covered by something static that looks like it (a rider's orange trousers
behind an orange bollard): it is reported absent and searched for again, skipping what covered it for
DECOY_FRAMES, rather than followed onto the look-alike.  An object that slows down to stop is expected to be
slow and is kept.  Not judged on the first STOP_AFTER frames after a prompt (the first flows after a prompt
are unreliable).  Chosen on the DAVIS-2016 dev split: frames whose mask is mostly not the object, from a click
5.4 -> 4.8 %, from the mask 3.2 -> 2.6 %, J within 0.001.  A running mean alone also dropped a swing at each end
of its arc (J -0.035 there); an extrapolation of the last two frames missed the bollard.
"""

from __future__ import annotations

import logging

from .state import Track

logger = logging.getLogger(__name__)

STOP_MIN = 3.0
STOP_DROP = 0.2
STOP_AFTER = 3
STOP_FRAMES = 2  # ... on this many frames in a row (one is flow noise on a flat object)
DECOY_FRAMES = 30  # for this many frames the search for the lost object skips what covered it
SPEED_RATE = 0.3  # update rate of the running mean speed against the background


def stopped(tr: Track, speed: float, index: int) -> bool:
    """The stop rule (``STOP_*``) for an object whose mask moves ``speed`` px per frame against the background
    on this frame: True when it is to be declared lost; otherwise its speed is noted."""
    # expected: the running mean of its speed against the background, or the last frame's if lower (an object
    # that slows down to stop is expected to be slow); judged from STOP_AFTER frames on
    expected = min(tr.sep_ref, tr.sep_last)
    is_stopped = tr.sep_n >= STOP_AFTER and expected > STOP_MIN and speed < STOP_DROP * expected
    tr.stopped = tr.stopped + 1 if is_stopped else 0
    if is_stopped:
        if tr.stopped < STOP_FRAMES:
            return False
        logger.debug(
            "object %d: its mask stopped moving against the background at frame %d (%.1f px, %.1f expected): "
            "lost to something static",
            tr.obj_id,
            index,
            speed,
            expected,
        )
        return True
    tr.sep_ref = speed if tr.sep_n == 0 else tr.sep_ref + SPEED_RATE * (speed - tr.sep_ref)
    tr.sep_last, tr.sep_n = speed, tr.sep_n + 1
    return False


__all__ = ["DECOY_FRAMES", "STOP_AFTER", "STOP_DROP", "STOP_FRAMES", "STOP_MIN", "stopped"]
