"""The classic tracker's tuning, one frozen dataclass per step of the algorithm (``docs/classic-tracker.md``).

:class:`ClassicParams` holds the two switches and one group per step.  Distances are in working-resolution pixels,
logits and log likelihood ratios in nats, rates are the weight of the new frame in an exponential moving average.
The values were chosen on the DAVIS-2016 dev split and the synthetic scenes.  Fixed rules of a step that are not
meant to be tuned per tracker (the stop rule's thresholds, the check by motion's agreement levels, the segmentation
of prompts) are named constants beside the code of that step, each documented there.

Override one value with :func:`dataclasses.replace` on its group::

    ClassicParams(reacquire=dataclasses.replace(ReacquireParams(), llr=1.0))
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PriorParams:
    """Propagation: the shape prior, in log-odds, from the object's last mask warped into the new frame."""

    gain: float = 0.4  #: log-odds per pixel of signed distance inside the warped mask
    gain_out: float = 0.7  #: ... and outside it (steeper: the prediction bounds growth)
    max: float = 5.0  #: prior clip inside the object (deep inside beats any colour evidence)
    min: float = -8.0  #: prior clip far outside
    shape_max: float = 1.0  #: prior clip inside the amodal shape but outside the visible mask
    #: weight of the dense-flow (per-pixel) warp vs the similarity warp of the mask
    dense_weight: float = 0.6
    #: the region of interest around the prediction: padding, fraction of the object's size
    roi_pad: float = 0.35
    min_roi_pad: int = 12  #: ... and at least this many pixels


@dataclass(frozen=True)
class ColourParams:
    """The colour cue: log likelihood ratio of the object's and its surroundings' colour histograms."""

    weight: float = 1.0  #: weight of the colour log likelihood ratio added to the prior
    #: Gaussian sigma (px) applied to the likelihood ratio of a tracked object (the other colour-region blurs are
    #: ``segment.REGION_BLUR``)
    blur: float = 1.0
    fg_rate: float = 0.04  #: update rate of the object's histogram
    bg_rate: float = 0.2  #: update rate of the surroundings' histogram


@dataclass(frozen=True)
class MotionCueParams:
    """The motion cue: does a pixel move like the object or like the background?"""

    weight: float = 1.5  #: log-odds of the cue (moves like the background vs like the object)
    min_sep: float = 1.0  #: the object's motion relative to the background (px) needed for the cue


@dataclass(frozen=True)
class AreaParams:
    """How fast the visible area and the reference (fully visible) area may change."""

    max_growth: float = 1.3  #: visible area at most this x the reference area (x the motion's scale)
    frame_growth: float = 1.12  #: ... and at most this x its last visible area
    rate: float = 0.1  #: reference-area EMA rate when the area shrinks (only while mostly visible)
    grow_rate: float = 0.03  #: ... and when it grows


@dataclass(frozen=True)
class AbsenceParams:
    """When a tracked object is declared absent (occluded or gone)."""

    ratio: float = 0.18  #: visible area / reference area under which the object is absent
    llr: float = 0.4  #: mean colour log likelihood ratio in the mask under which it is absent
    llr_frac: float = 0.4  #: ... or under this fraction of its typical value, whichever is lower


@dataclass(frozen=True)
class ReacquireParams:
    """The search for an absent object: components of high colour likelihood that look like it."""

    llr: float = 0.8  #: likelihood threshold for candidates
    bhatt: float = 0.5  #: max Bhattacharyya distance to the object's colours near the predicted position
    bhatt_global: float = 0.38  #: ... and anywhere else
    min_ratio: float = 0.2  #: min candidate area / reference area near the predicted position
    global_ratio: float = 0.45  #: ... and anywhere else


@dataclass(frozen=True)
class ClassicParams:
    """Tuning of the classic tracker: two switches and one group per step (all distances in working pixels)."""

    #: a box or click prompt's mask is checked by motion a few frames later (segment.refine_box_by_motion,
    #: refine_click_by_motion): background that moves like the background leaves it, a click's part grows to what
    #: moves with it; False keeps every prompt's mask as segmented on its frame
    check_by_motion: bool = True
    #: A box or mask prompt gives the object's whole extent (unless it touches the frame's border): the reference
    #: area then never grows past the prompt's mask area (x the motion's scale since).  A click's mask is often a
    #: part of the object, so its reference is not capped.  Without the cap, the mask crept into what moves and
    #: looks like a box-prompted object (a boat's reflection below it): up to max_growth x a reference that grew
    #: with it, frame after frame.
    extent_cap: bool = True
    prior: PriorParams = field(default_factory=PriorParams)
    colour: ColourParams = field(default_factory=ColourParams)
    motion: MotionCueParams = field(default_factory=MotionCueParams)
    area: AreaParams = field(default_factory=AreaParams)
    absence: AbsenceParams = field(default_factory=AbsenceParams)
    reacquire: ReacquireParams = field(default_factory=ReacquireParams)


__all__ = [
    "AbsenceParams",
    "AreaParams",
    "ClassicParams",
    "ColourParams",
    "MotionCueParams",
    "PriorParams",
    "ReacquireParams",
]
