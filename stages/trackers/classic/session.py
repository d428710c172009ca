"""The classic tracker's per-stream session: flow-warped shape prior + colour likelihood, fused in log-odds.

See ``docs/classic-tracker.md`` for the algorithm.  A :class:`ClassicSession` is sans-I/O and not thread-safe:
one thread drives it (``add_prompt`` / ``remove_object`` for a frame, then ``step``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import cv2
import numpy as np

from vostream.pipeline.errors import BackendError, PromptError
from vostream.pipeline.types import Frame, Prompt, TrackResult

from ..base import StepAborted, TrackerSession
from .appearance import ColourModel, bhattacharyya, histogram, quantise
from .motion import FlowEstimator, similarity_from_flow
from .segment import (
    BOX_CHECK_FRAMES,
    BOX_CHECK_MOTION,
    CLICK_AGREE,
    CLICK_CHECK_FRAMES,
    MIN_KEEP,
    VOTES,
    _fill_holes,
    box_motion,
    mask_from_box,
    mask_from_points,
    padded_box,
    refine_box_by_motion,
    refine_click_by_motion,
    touches_border,
)

logger = logging.getLogger(__name__)

_OUTSIDE = -10.0  # logit of pixels far from every object
#: new click prompts on one frame beyond which each is segmented by colour only (the box search costs ~0.2-0.5 s
#: of CPU per click; hundreds of objects prompted at once, e.g. from a file, would otherwise take minutes)
MAX_SEARCHED_CLICKS = 16
#: a check by motion (``segment.refine_box_by_motion``, ``refine_click_by_motion``) replaces the mask only when it
#: changes it (IoU with the prompt's mask under SAME_MASK) and when the corrected mask, carried to the current
#: frame by the flow, lies mostly (>= CARRIED) on the tracked object
SAME_MASK = 0.9
#: an object that has been moving against the background (its running mean speed against it, or its last frame's if
#: lower, over STOP_MIN px per frame) and whose mask suddenly moves with the background (under STOP_DROP x that, on
#: STOP_FRAMES frames in a row) has been covered by something static that looks like it (a rider's orange trousers
#: behind an orange bollard): it is reported absent and searched for again, skipping what covered it for
#: DECOY_FRAMES, rather than followed onto the look-alike.  An object that slows down to stop is expected to be
#: slow and is kept.  Not judged on the first STOP_AFTER frames after a prompt (the first flows after a prompt
#: are unreliable).  Chosen on the DAVIS-2016 dev split: frames whose mask is mostly not the object, from a click
#: 5.4 -> 4.8 %, from the mask 3.2 -> 2.6 %, J within 0.001.  A running mean alone also dropped a swing at each end
#: of its arc (J -0.035 there); an extrapolation of the last two frames missed the bollard.
STOP_MIN = 3.0
STOP_DROP = 0.2
STOP_AFTER = 3
STOP_FRAMES = 2  # ... on this many frames in a row (one is flow noise on a flat object)
DECOY_FRAMES = 30  # for this many frames the search for the lost object skips what covered it
#: holes in a tracked mask up to this fraction of its area are filled (noise); larger ones are background seen
#: through the object (a wheel).  Chosen on the DAVIS-2016 dev split: every hole filled -> 0.05: J from the mask
#: 0.655 -> 0.661, from a box 0.616 -> 0.621 (0.02: same; 0.15: 0.655 / 0.620)
MAX_HOLE = 0.05
CARRIED = 0.7
#: a check's result with at least this fraction of it inside the prompt's mask, and under MIN_KEEP of that mask, is
#: the object's moving part beside a larger static look-alike (``_moving_part``)
PART_INSIDE = 0.9
#: a click whose region the motion does not grow is checked like a box prompt, in its mask's box padded by this
CLICK_FALLBACK_PAD = 0.1


@dataclass(frozen=True)
class ClassicParams:
    """Tuning of the classic tracker (all distances in working-resolution pixels)."""

    prior_gain: float = 0.4  # log-odds per pixel of signed distance inside the warped mask
    prior_gain_out: float = 0.7  # ... and outside it (steeper: the prediction bounds growth)
    prior_max: float = 5.0  # prior clip inside the object (deep inside beats any colour evidence)
    prior_min: float = -8.0  # prior clip far outside
    shape_prior_max: float = 1.0  # prior clip inside the amodal shape but outside the visible mask
    llr_weight: float = 1.0  # weight of the colour log likelihood ratio
    llr_blur: float = 1.0  # Gaussian sigma applied to the likelihood ratio
    roi_pad: float = 0.35  # ROI padding, fraction of the object's size
    min_roi_pad: int = 12
    fg_rate: float = 0.04  # model update rates (weight of the new frame)
    bg_rate: float = 0.2
    absent_ratio: float = 0.18  # visible area / reference area under which the object is absent
    absent_llr: float = 0.4  # mean colour log likelihood ratio in the mask under which it is absent
    absent_llr_frac: float = 0.4  # ... or under this fraction of its typical value, whichever is lower
    area_rate: float = 0.1  # reference-area EMA rate (only while mostly visible)
    reacquire_llr: float = 0.8  # likelihood threshold for re-acquisition candidates
    reacquire_bhatt: float = 0.5  # max Bhattacharyya distance near the predicted position
    reacquire_bhatt_global: float = 0.38
    reacquire_min_ratio: float = 0.2  # min candidate area / reference area near the predicted position
    reacquire_global_ratio: float = 0.45
    dense_weight: float = 0.6  # weight of the dense-flow (per-pixel) warp vs the similarity warp of the mask
    motion_weight: float = 1.5  # log-odds of the motion cue (moves like the background vs like the object)
    motion_min: float = 1.0  # object's motion relative to the background (px) needed for the motion cue
    # a box or click prompt's mask is checked by motion a few frames later (segment.refine_box_by_motion,
    # refine_click_by_motion): background that moves like the background leaves it, a click's part grows to what
    # moves with it; False keeps every prompt's mask as segmented on its frame
    check_by_motion: bool = True
    max_growth: float = 1.3  # visible area at most this x the reference area (x the motion's scale)
    frame_growth: float = 1.12  # ... and at most this x its last visible area
    area_grow_rate: float = 0.03  # reference-area EMA rate when the area grows (area_rate when it shrinks)
    # A box or mask prompt gives the object's whole extent (unless it touches the frame's border): the reference
    # area then never grows past the prompt's mask area (x the motion's scale since).  A click's mask is often a
    # part of the object, so its reference is not capped.  Without the cap, the mask crept into what moves and
    # looks like a box-prompted object (a boat's reflection below it): up to max_growth x a reference that grew
    # with it, frame after frame.
    extent_cap: bool = True


@dataclass
class _Track:
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
    # where the mask stopped moving with the object (STOP_DROP): not re-acquired there
    decoy: np.ndarray | None = None
    decoy_until: int = -1  # ... up to this frame index
    stopped: int = 0  # consecutive frames the mask has moved with the background (STOP_DROP)
    llr_ref: float = 1.0  # typical mean colour log likelihood ratio inside the mask (EMA)
    extent: float = 0.0  # a box or mask prompt's mask area, x the motion's scale since (extent_cap); 0: none
    motion: np.ndarray | None = None  # 2x3 similarity of the last propagation (previous -> this frame)
    prompted_at: int = 0  # frame index of the last prompt (contested pixels go to the newest)
    check: _MotionCheck | None = None  # a prompt waiting for its check by motion


@dataclass
class _MotionCheck:
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


def _moving_part(ref: np.ndarray, mask: np.ndarray) -> bool:
    """Whether a check by motion's result ``ref`` is a minority part of the prompt's ``mask``: within it
    (``PART_INSIDE``) and under ``MIN_KEEP`` of it, which ``refine_box_by_motion`` returns only when what it dropped
    is surely background.  Such a part is applied at a click's first estimate and carried by its own motion."""
    n = int(np.count_nonzero(ref))
    return bool(0 < n < MIN_KEEP * np.count_nonzero(mask) and np.count_nonzero(ref & mask) >= PART_INSIDE * n)


def _mask_logits(mask: np.ndarray) -> np.ndarray:
    """Logits for a freshly segmented mask: its signed distance, scaled and clipped."""
    return np.clip(_signed_distance(mask) * 1.5, -6, 6).astype(np.float32)


def _signed_distance(mask: np.ndarray) -> np.ndarray:
    m = mask.astype(np.uint8)
    inside = cv2.distanceTransform(m, cv2.DIST_L2, 3)
    outside = cv2.distanceTransform(1 - m, cv2.DIST_L2, 3)
    return inside - outside


def _bbox(mask: np.ndarray) -> tuple[int, int, int, int] | None:
    rows = np.flatnonzero(mask.any(axis=1))
    if not len(rows):
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


def _pad(box: tuple[int, int, int, int], pad: int, w: int, h: int) -> tuple[int, int, int, int]:
    x0, y0, x1, y1 = box
    return max(0, x0 - pad), max(0, y0 - pad), min(w, x1 + pad), min(h, y1 + pad)


class ClassicSession(TrackerSession):
    """Tracking state for one stream (see module doc).  Not thread-safe."""

    def __init__(self, params: ClassicParams | None = None, flow_preset: str = "medium") -> None:
        self.params = params or ClassicParams()
        self._flow = FlowEstimator(flow_preset)
        self._flow_back = FlowEstimator(flow_preset)
        self._tracks: dict[int, _Track] = {}
        self._pending: dict[int, Prompt] = {}
        self._prev_gray: np.ndarray | None = None
        self._prev_index = 0
        self._gap = 1  # frame indices between the previous processed frame and this one (skipped frames)
        self._src_size: tuple[int, int] | None = None  # (W, H) of the source frames
        self._work_size: tuple[int, int] | None = None  # (w, h) of the tensors

    # ---------------------------------------------------------------------------------------------- prompts
    @property
    def object_ids(self) -> list[int]:
        ids = list(self._tracks)
        ids += [i for i in self._pending if i not in self._tracks]
        return ids

    def add_prompt(self, prompt: Prompt) -> None:
        if not isinstance(prompt, Prompt):
            raise PromptError(f"add_prompt expects a Prompt, got {type(prompt).__name__}")
        oid = int(prompt.obj_id)
        only_negative = prompt.box is None and prompt.mask is None and not np.any(prompt.labels == 1)
        if only_negative and oid not in self._tracks and oid not in self._pending:
            raise PromptError(
                f"object {oid}: a prompt with only negative points needs a known object; add a "
                f"positive point, a box or a mask to start object {oid}"
            )
        if self._src_size is not None:
            prompt.check_bounds(*self._src_size, source="the stream")
        if only_negative and oid in self._pending and oid not in self._tracks:
            # merge the negatives into the pending prompt that starts this object
            prompt = self._pending[oid].with_points_of(prompt)
        self._pending[oid] = prompt

    def remove_object(self, obj_id: int) -> None:
        oid = int(obj_id)
        if oid not in self._tracks and oid not in self._pending:
            raise PromptError(f"cannot remove object {oid}: it is not tracked (known ids: {self.object_ids})")
        self._tracks.pop(oid, None)
        self._pending.pop(oid, None)

    def reset(self) -> None:
        self._tracks.clear()
        self._pending.clear()
        self._prev_gray = None

    # ---------------------------------------------------------------------------------------------- step
    def step(self, frame: Frame) -> TrackResult:
        # grabCut's k-means draws from OpenCV's per-thread RNG: seed it from the frame, so that results depend on
        # the video and the prompts only, not on what the thread ran before (a batch worker's earlier videos)
        cv2.setRNGSeed(0x5EED + frame.index)
        img = frame.tensor
        if img is None:
            raise BackendError(
                "classic tracker: frame.tensor is not set; run the preprocess stage "
                "(Preprocessor(tracker.input_spec(w, h))) before step()"
            )
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise BackendError(
                f"classic tracker: expected an (h, w, 3) uint8 RGB tensor, got {img.dtype} "
                f"{img.shape}; use the tracker's input_spec for preprocessing"
            )
        src = (frame.width, frame.height)
        h, w = img.shape[:2]
        for p in self._pending.values():  # validate everything before changing any state
            p.check_bounds(*src, source=f"frame {frame.index}")
        if self._work_size is not None and self._work_size != (w, h):
            self._rescale(w, h)
        self._src_size, self._work_size = src, (w, h)

        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        qidx = quantise(img)
        pending, self._pending = self._pending, {}
        refresh = {
            oid
            for oid, p in pending.items()
            if p.box is not None or p.mask is not None or np.any(p.labels == 1)
        }
        need_flow = any(t.present and oid not in refresh for oid, t in self._tracks.items())
        flow = None
        if need_flow and self._prev_gray is not None and self._prev_gray.shape == gray.shape:
            # skipped frames: seed the flow with the objects' expected displacement since the last frame
            moving = [
                t.velocity * max(1, frame.index - self._prev_index)
                for oid, t in self._tracks.items()
                if t.present and oid not in refresh
            ]
            init = tuple(np.mean(moving, axis=0)) if frame.index - self._prev_index > 1 and moving else None
            fwd = self._flow(self._prev_gray, gray, init)
            bwd = self._flow_back(gray, self._prev_gray, None if init is None else (-init[0], -init[1]))
            flow = (fwd, bwd, self._background_motion(bwd))
        self._gap = max(1, frame.index - self._prev_index)
        self._prev_index = frame.index
        self._prev_gray = gray

        logits: dict[int, np.ndarray] = {}
        scale_change: dict[int, float] = {}
        for done, (oid, tr) in enumerate(self._tracks.items()):
            if self.stop_requested():  # a cancel lands between objects, not after the whole frame
                raise StepAborted(f"frame {frame.index}: stopped after {done} of {len(self._tracks)} objects")
            if oid in refresh:
                continue
            if tr.present:
                logits[oid], scale_change[oid] = self._propagate(tr, img, qidx, flow, frame.index)
            else:
                found = self._reacquire(tr, qidx, frame.index)
                if found is not None:
                    logits[oid] = found
        flows: dict[tuple[int, bool], np.ndarray] = {}  # objects prompted on the same frame share their flows
        for oid, tr in self._tracks.items():
            if tr.check is not None and oid not in refresh:
                if self.stop_requested():
                    raise StepAborted(
                        f"frame {frame.index}: stopped before the check by motion of object {oid}"
                    )
                self._check_by_motion(tr, gray, qidx, logits, flows)
        prompted: set[int] = set()
        clicks = sum(
            1 for p in pending.values() if p.box is None and p.mask is None and np.any(p.labels == 1)
        )
        search = clicks <= MAX_SEARCHED_CLICKS
        if not search:
            logger.info(
                "frame %d: %d new click prompts; more than %d on one frame are segmented by colour only "
                "(no box search), so that many prompts do not take minutes",
                frame.index,
                clicks,
                MAX_SEARCHED_CLICKS,
            )
        for oid, p in pending.items():
            if self.stop_requested():
                raise StepAborted(
                    f"frame {frame.index}: stopped before segmenting the prompt of object {oid}"
                )
            sp = p.scaled(w / src[0], h / src[1], (w, h))
            pts = (sp.points + 0.5 * np.array([w / src[0], h / src[1]], np.float32) - 0.5).clip(
                0, [w - 1, h - 1]
            )
            pos, neg = pts[sp.labels == 1], pts[sp.labels == 0]
            if sp.mask is not None:
                mask = sp.mask
            elif sp.box is not None:
                mask = mask_from_box(img, sp.box, pos, neg, contrast=True)
            elif len(pos):
                mask = mask_from_points(img, qidx, pos, neg, search=search)
            else:  # negative-only correction of a known object: refine its current estimate
                cur = logits[oid] > 0 if oid in logits else self._tracks[oid].mask
                mask = mask_from_points(img, qidx, pos, neg, prior=cur)
            logits[oid] = _mask_logits(mask)
            self._init_track(
                oid, mask, qidx, frame.index, keep_area=oid in self._tracks and oid not in refresh
            )
            at_border = touches_border(mask) or (
                sp.box is not None and (min(sp.box[:2]) < 2 or sp.box[2] > w - 2 or sp.box[3] > h - 2)
            )
            if self.params.extent_cap and (sp.mask is not None or sp.box is not None) and not at_border:
                # (an object at the frame's border may run past it: more of it can come into view)
                self._tracks[oid].extent = float(mask.sum())
            if not self.params.check_by_motion or sp.mask is not None:
                pass
            elif sp.box is not None:
                self._tracks[oid].check = _MotionCheck("box", img.copy(), gray, sp.box, mask, pos, neg)
            elif len(pos) and search and mask.any():
                self._tracks[oid].check = _MotionCheck(
                    "click",
                    img.copy(),
                    gray,
                    (0.0, 0.0, 0.0, 0.0),
                    mask,
                    pos,
                    neg,
                    grow=w * h <= src[0] * src[1],
                )
            prompted.add(oid)

        self._exclusive(logits, {oid: self._tracks[oid].prompted_at for oid in logits})
        return self._finish(frame, logits, qidx, scale_change, prompted)

    # ---------------------------------------------------------------------------------------------- internals
    def _init_track(self, oid: int, mask: np.ndarray, qidx: np.ndarray, index: int, keep_area: bool) -> None:
        ring = self._ring(mask)
        model = ColourModel.from_pixels(qidx[mask], qidx[ring])
        area = float(mask.sum())
        ys, xs = np.nonzero(mask)
        c = np.array([xs.mean(), ys.mean()], np.float32)
        old = self._tracks.get(oid)
        tr = _Track(
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
        if old is not None and keep_area:
            tr.area_ref = max(area, old.area_ref)
        self._tracks[oid] = tr

    def _ring(self, mask: np.ndarray, inner: int = 3, outer: int | None = None) -> np.ndarray:
        size = np.sqrt(max(1.0, float(mask.sum())))
        outer = outer or max(8, int(0.35 * size))
        box = _bbox(mask)
        out = np.zeros(mask.shape, bool)
        if box is None:
            return out
        x0, y0, x1, y1 = _pad(box, outer + 1, mask.shape[1], mask.shape[0])
        m = mask[y0:y1, x0:x1].astype(np.uint8)
        k = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (3, 3))
        big = cv2.dilate(m, k, iterations=outer)
        small = cv2.dilate(m, k, iterations=inner)
        out[y0:y1, x0:x1] = (big > 0) & (small == 0)
        return out

    def _background_motion(self, bwd: np.ndarray) -> np.ndarray | None:
        """2x3 affine map current -> previous frame of the background (RANSAC on the backward flow sampled on a
        grid outside every visible object's padded box), or None when it cannot be fitted."""
        h, w = bwd.shape[:2]
        step = max(4, int(np.sqrt(h * w / 1500.0)))
        ys, xs = np.mgrid[step // 2 : h : step, step // 2 : w : step]
        keep = np.ones(ys.shape, bool)
        for tr in self._tracks.values():
            box = _bbox(tr.mask) if tr.present else None
            if box is None:
                continue
            pad = int(0.15 * tr.size + 6 + np.abs(tr.velocity).max())
            x0, y0, x1, y1 = _pad(box, pad, w, h)
            keep &= ~((xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1))
        if keep.sum() < 40:
            return None
        src = np.stack([xs[keep], ys[keep]], 1).astype(np.float32)
        dst = src + bwd[ys[keep], xs[keep]]
        a, inl = cv2.estimateAffine2D(
            src,
            dst,
            method=cv2.RANSAC,
            ransacReprojThreshold=1.0,
            maxIters=200,
            confidence=0.98,
            refineIters=5,
        )
        if a is None or inl is None or inl.sum() < 0.3 * len(src):
            return None
        return a.astype(np.float32)

    def _propagate(
        self,
        tr: _Track,
        img: np.ndarray,
        qidx: np.ndarray,
        flow: tuple[np.ndarray, np.ndarray, np.ndarray | None] | None,
        index: int,
    ) -> tuple[np.ndarray, float]:
        """Fused logits (h, w) for a visible object and the area scale factor of its motion.

        The prior comes from the object's last mask moved two ways, blended: by a similarity transform fitted to
        the forward flow inside it, and per pixel by the backward flow (which follows deformation and leaves
        background that moves like the background outside).  The amodal ``shape`` (moved by the similarity, so a
        part that re-emerges from behind an occluder is expected) adds a weak prior.  ``tr.shape`` is moved in
        place.  Where the object moves differently from the background, a motion cue is added.
        """
        p = self.params
        h, w = qidx.shape
        box = _bbox(tr.shape | tr.mask)
        assert box is not None
        pad = max(p.min_roi_pad, int(p.roi_pad * tr.size)) + 16
        x0, y0, x1, y1 = _pad(box, pad, w, h)
        sd = _signed_distance(tr.mask[y0:y1, x0:x1])
        sd_shape = _signed_distance(tr.shape[y0:y1, x0:x1])
        fwd, bwd, bg = flow if flow is not None else (None, None, None)
        if fwd is not None:
            # fitted on the mask's core: boundary pixels that are really background would bias the scale
            core = cv2.erode(
                tr.mask.astype(np.uint8), np.ones((3, 3), np.uint8), iterations=max(1, int(0.06 * tr.size))
            ).astype(bool)
            m = similarity_from_flow(fwd, core if core.sum() >= 40 else tr.mask)
        else:
            m = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
        s2 = float(abs(np.linalg.det(m[:, :2])))
        tr.motion = m
        # warp the ROI's signed distance (in ROI coordinates) to the full frame
        t = m.copy()
        t[:, 2] += m[:, :2] @ np.array([x0, y0], np.float32)
        sdw = cv2.warpAffine(
            sd, t, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=-1e4
        )
        sdw_shape = cv2.warpAffine(
            sd_shape, t, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=-1e4
        )
        tr.shape = sdw_shape > 0
        pred = (sdw > 0) | tr.shape
        out = np.full((h, w), _OUTSIDE, np.float32)
        pbox = _bbox(pred)
        if pbox is None:  # moved out of the frame
            return out, s2
        pad = max(p.min_roi_pad, int(p.roi_pad * tr.size))
        rx0, ry0, rx1, ry1 = _pad(pbox, pad, w, h)
        sdr = sdw[ry0:ry1, rx0:rx1]
        gx = gy = None
        if bwd is not None and p.dense_weight > 0:
            gy, gx = np.mgrid[ry0:ry1, rx0:rx1].astype(np.float32)
            bw = bwd[ry0:ry1, rx0:rx1]
            sdd = cv2.remap(
                sd,
                gx + bw[..., 0] - x0,
                gy + bw[..., 1] - y0,
                cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            )
            sdr = p.dense_weight * sdd + (1 - p.dense_weight) * np.maximum(sdr, -50)
        pred_r = (sdr > 0) | tr.shape[ry0:ry1, rx0:rx1]
        prior = np.maximum(
            self._prior(sdr), np.minimum(self._prior(sdw_shape[ry0:ry1, rx0:rx1]), p.shape_prior_max)
        )
        llr = tr.model.llr(qidx[ry0:ry1, rx0:rx1])
        if p.llr_blur > 0:
            llr = cv2.GaussianBlur(llr, (0, 0), p.llr_blur)
        fused = prior + p.llr_weight * llr
        if bg is not None and bwd is not None and p.motion_weight > 0:
            # motion cue: does the pixel's backward flow fit the object's motion or the background's better?
            if gx is None or gy is None:
                gy, gx = np.mgrid[ry0:ry1, rx0:rx1].astype(np.float32)
            bw = bwd[ry0:ry1, rx0:rx1]
            bgx, bgy, obx, oby, sep = _motion_fields(bg, m, gx, gy)
            core = sdr > 0
            sep_med = float(np.median(sep[core])) if core.any() else 0.0
            # per frame index, so that skipped frames (a live feed dropping them) do not read as a change of speed
            if core.any() and self._stopped(tr, sep_med / self._gap, index):
                tr.decoy = (sdw > 0) | tr.mask
                tr.decoy[ry0:ry1, rx0:rx1] |= self._components(fused > 0, pred_r)
                tr.decoy_until = index + DECOY_FRAMES
                return out, s2
            if core.any() and sep_med > p.motion_min:
                r_bg = np.sqrt((bw[..., 0] - bgx) ** 2 + (bw[..., 1] - bgy) ** 2)
                r_ob = np.sqrt((bw[..., 0] - obx) ** 2 + (bw[..., 1] - oby) ** 2)
                fused += p.motion_weight * np.clip((r_bg - r_ob) / np.maximum(1.0, 0.5 * sep), -1.0, 1.0)
        keep = self._components(fused > 0, pred_r)
        max_area = int(s2 * min(p.max_growth * tr.area_ref, p.frame_growth * max(float(tr.mask.sum()), 1.0)))
        if keep.sum() > max_area > 0:
            # more than the object can plausibly grow in one frame: keep its most confident pixels
            c = float(np.partition(fused[keep], -max_area)[-max_area])
            fused = fused - c
            keep = self._components(fused > 0, pred_r)
        out[ry0:ry1, rx0:rx1] = np.where(keep, np.maximum(fused, 0.05), np.minimum(fused, -0.05))
        return out, s2

    @staticmethod
    def _stopped(tr: _Track, speed: float, index: int) -> bool:
        """The stop rule (``STOP_*``) for an object whose mask moves ``speed`` px per frame against the background
        on this frame: True when it is to be declared lost; otherwise its speed is noted."""
        # expected: the running mean of its speed against the background, or the last frame's if lower (an object
        # that slows down to stop is expected to be slow); judged from STOP_AFTER frames on
        expected = min(tr.sep_ref, tr.sep_last)
        stopped = tr.sep_n >= STOP_AFTER and expected > STOP_MIN and speed < STOP_DROP * expected
        tr.stopped = tr.stopped + 1 if stopped else 0
        if stopped:
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
        tr.sep_ref = speed if tr.sep_n == 0 else tr.sep_ref + 0.3 * (speed - tr.sep_ref)
        tr.sep_last, tr.sep_n = speed, tr.sep_n + 1
        return False

    def _check_by_motion(
        self,
        tr: _Track,
        gray: np.ndarray,
        qidx: np.ndarray,
        logits: dict[int, np.ndarray],
        flows: dict[tuple[int, bool], np.ndarray],
    ) -> None:
        """A few frames after a box or click prompt: re-segment the prompt frame with the motion since then
        (``refine_box_by_motion`` at the first frame after a box at which the box's mask has moved
        ``BOX_CHECK_MOTION`` against the background, by ``BOX_CHECK_FRAMES``; ``refine_click_by_motion`` at both
        ``CLICK_CHECK_FRAMES`` after clicks, the two estimates must agree, else - or when motion finds no region
        to grow to - the click's own mask is checked as a box's would be) and, when that changes the mask, carry
        it to this frame through the backward flow and restart the object's models from it.  Once per prompt;
        dropped while the object is absent or when the frame size changes."""
        mc = tr.check
        assert mc is not None
        mc.seen += 1
        last = BOX_CHECK_FRAMES if mc.kind == "box" else CLICK_CHECK_FRAMES[-1]
        if mc.seen not in (range(1, BOX_CHECK_FRAMES + 1) if mc.kind == "box" else CLICK_CHECK_FRAMES):
            return
        if mc.seen >= last:
            tr.check = None
        if tr.obj_id not in logits or mc.gray.shape != gray.shape:
            tr.check = None
            return
        if (id(mc.gray), True) not in flows:
            flows[id(mc.gray), True] = self._flow(mc.gray, gray)
        fwd = flows[id(mc.gray), True]
        if mc.kind == "box":
            if mc.seen < last and box_motion(mc.box, mc.mask, fwd) < BOX_CHECK_MOTION:
                return  # too little motion yet to tell the object from the background: a later frame
            ref = refine_box_by_motion(mc.img, mc.box, mc.mask, fwd, mc.pos, mc.neg, votes=VOTES, robust=True)
            if mc.seen < last and (ref is None or (ref & mc.mask).sum() >= SAME_MASK * (ref | mc.mask).sum()):
                return  # nothing to change yet: the flow to a later frame may tell more
            tr.check = None
        else:
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
                elif (ref & mc.mask).sum() >= SAME_MASK * (ref | mc.mask).sum():
                    tr.check = None  # the region moving with the click is its mask: nothing to confirm later
                    return
                elif _moving_part(ref, mc.mask):
                    # nothing grown to confirm; applied now, as by the next estimate the track sits on the rest
                    tr.check = None
                else:
                    mc.first = ref
                    return
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
        if ref is None or (ref & mc.mask).sum() >= SAME_MASK * (ref | mc.mask).sum():
            logger.debug("object %d: %s check by motion kept the mask", tr.obj_id, mc.kind)
            return
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
        cur = logits[tr.obj_id] > 0
        # the corrected mask, carried over several frames, must sit on the tracked object: inside it (a box check
        # removes background) or around it (a click check grows the part to the object)
        inner, outer = (moved, cur) if mc.kind == "box" or ref is mc.fallback or part else (cur, moved)
        near = cv2.dilate(outer.astype(np.uint8), np.ones((3, 3), np.uint8), iterations=3).astype(bool)
        if not moved.any() or (inner & near).sum() < CARRIED * inner.sum():
            logger.debug("object %d: the mask from the check by motion could not be carried", tr.obj_id)
            return
        logger.debug(
            "object %d: %s check by motion: %d -> %d px",
            tr.obj_id,
            mc.kind,
            int(mc.mask.sum()),
            int(ref.sum()),
        )
        nt = self._restart(tr, moved, qidx)
        nt.centroid = tr.centroid
        logits[tr.obj_id] = _mask_logits(moved)

    def _restart(self, tr: _Track, mask: np.ndarray, qidx: np.ndarray) -> _Track:
        """Replace ``tr`` by a track whose models start from ``mask`` (this frame), keeping what the new mask does
        not change: motion, velocity, prompt frame and a pending check by motion."""
        self._init_track(tr.obj_id, mask, qidx, tr.last_seen, keep_area=False)
        nt = self._tracks[tr.obj_id]
        nt.velocity, nt.prompted_at, nt.motion = tr.velocity, tr.prompted_at, tr.motion
        if tr.extent:  # the check by motion re-segmented the prompt: its extent is the new mask's
            nt.extent = nt.area_ref
        nt.check = tr.check
        return nt

    def _prior(self, sd: np.ndarray) -> np.ndarray:
        """Shape prior in log-odds from a signed distance map (positive inside)."""
        p = self.params
        return np.clip(
            np.where(sd > 0, sd * p.prior_gain, sd * p.prior_gain_out), p.prior_min, p.prior_max
        ).astype(np.float32)

    @staticmethod
    def _components(cand: np.ndarray, pred: np.ndarray) -> np.ndarray:
        """Connected components of ``cand`` consistent with the prediction ``pred``, holes up to ``MAX_HOLE`` of
        their area filled."""
        if not cand.any():
            return cand
        n, lab, stats, _ = cv2.connectedComponentsWithStats(cand.astype(np.uint8), connectivity=8)
        overlap = np.bincount(lab[pred], minlength=n)
        areas = stats[:, cv2.CC_STAT_AREA]
        good = (overlap >= 0.25 * areas) & (overlap > 0)
        good[0] = False
        if not good.any():
            return np.zeros_like(cand)
        # only small holes are noise: a large one is background seen through the object (a wheel, an arm's loop)
        return _fill_holes(good[lab], MAX_HOLE)

    def _reacquire(self, tr: _Track, qidx: np.ndarray, index: int) -> np.ndarray | None:
        """Search for an absent object; its logits when found, else None."""
        p = self.params
        h, w = qidx.shape
        llr = cv2.GaussianBlur(tr.model.llr(qidx), (0, 0), 1.5)
        cand = cv2.morphologyEx(
            (llr > p.reacquire_llr).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8)
        )
        n, lab, stats, cents = cv2.connectedComponentsWithStats(cand, connectivity=8)
        if n <= 1:
            return None
        gap = max(1, index - tr.last_seen)
        pred = tr.centroid + tr.velocity * min(gap, 30)
        radius = tr.size * (1.5 + 0.1 * gap)
        best, best_cost = -1, np.inf
        for j in range(1, n):
            area = stats[j, cv2.CC_STAT_AREA]
            ratio = area / max(tr.area_ref, 1.0)
            if ratio < p.reacquire_min_ratio or ratio > 2.5:
                continue
            dist = float(np.hypot(*(cents[j] - pred)))
            near = dist < radius
            if not near and ratio < p.reacquire_global_ratio:
                continue
            x, y, bw, bh = stats[j, :4]
            sub = lab[y : y + bh, x : x + bw] == j
            if tr.decoy is not None and index <= tr.decoy_until:
                if np.count_nonzero(sub & tr.decoy[y : y + bh, x : x + bw]) > 0.5 * area:
                    continue  # what the object was lost to: static, and only looks like it
            d = bhattacharyya(histogram(qidx[y : y + bh, x : x + bw][sub]), tr.model.fg)
            if d > (p.reacquire_bhatt if near else p.reacquire_bhatt_global):
                continue
            cost = d + 0.1 * dist / max(tr.size, 1.0)
            if cost < best_cost:
                best, best_cost = j, cost
        if best < 0:
            return None
        comp = _fill_holes(lab == best)
        logger.debug("object %d re-acquired at frame %d after %d frames", tr.obj_id, index, gap)
        sd = _signed_distance(comp)
        fused = self._prior(sd) + p.llr_weight * llr
        keep = self._components(fused > 0, comp)
        tr.shape = comp
        return np.where(keep, np.maximum(fused, 0.05), np.minimum(fused, -0.05)).astype(np.float32)

    @staticmethod
    def _exclusive(logits: dict[int, np.ndarray], prompted_at: dict[int, int]) -> None:
        """Make masks exclusive.  A pixel claimed by several objects goes to the most recently prompted one (the
        user's latest intent: a new click on an already tracked object takes it over), and between objects
        prompted on the same frame to the largest logit."""
        if len(logits) < 2:
            return
        ids = list(logits)
        order = {v: r for r, v in enumerate(sorted(set(prompted_at.values())))}
        stack = np.stack(
            [np.where(logits[i] > 0, logits[i] + 100.0 * order[prompted_at[i]], logits[i]) for i in ids]
        )
        best = stack.argmax(0)
        for k, oid in enumerate(ids):
            lg = logits[oid]
            lose = (lg > 0) & (best != k)
            if lose.any():
                lg[lose] = -0.05

    def _finish(
        self,
        frame: Frame,
        logits: dict[int, np.ndarray],
        qidx: np.ndarray,
        scale_change: dict[int, float],
        prompted: set[int],
    ) -> TrackResult:
        p = self.params
        h, w = qidx.shape
        W, H = frame.width, frame.height
        ids = list(self._tracks)
        out = np.full((len(ids), h, w), _OUTSIDE, np.float32)
        scores = np.zeros(len(ids), np.float32)
        present = np.zeros(len(ids), bool)
        boxes = np.zeros((len(ids), 4), np.float32)
        for k, oid in enumerate(ids):
            tr = self._tracks[oid]
            lg = logits.get(oid)
            if lg is None:
                tr.present, tr.score = False, 0.0
                tr.mask = np.zeros((h, w), bool)
                continue
            mask = lg > 0
            area = float(mask.sum())
            if oid not in prompted:
                tr.area_ref *= scale_change.get(oid, 1.0)
                tr.extent *= scale_change.get(oid, 1.0)
                ratio = area / max(tr.area_ref, 1.0)
                tr.ratio = ratio
                mean_llr = float(tr.model.llr(qidx[mask]).mean()) if area else 0.0
                if ratio < p.absent_ratio or mean_llr < min(p.absent_llr, p.absent_llr_frac * tr.llr_ref):
                    if tr.present:
                        logger.debug(
                            "object %d lost at frame %d (area ratio %.2f, mean llr %.2f)",
                            oid,
                            frame.index,
                            ratio,
                            mean_llr,
                        )
                    tr.present, tr.score = False, 0.0
                    tr.mask = np.zeros((h, w), bool)
                    continue
                if ratio > 0.7:
                    tr.llr_ref += 0.1 * (mean_llr - tr.llr_ref)
                    rate = p.area_grow_rate if area > tr.area_ref else p.area_rate
                    tr.area_ref += rate * (area - tr.area_ref)
                    if tr.extent:
                        tr.area_ref = min(tr.area_ref, tr.extent)
                if ratio > 0.8:
                    tr.shape = mask
                tr.size = float(np.sqrt(tr.area_ref))
                if ratio > 0.5:
                    ring = self._ring(mask)
                    inner = cv2.erode(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
                    tr.model.update(qidx[inner], qidx[ring], p.fg_rate, p.bg_rate)
            ys, xs = np.nonzero(mask)
            c = np.array([xs.mean(), ys.mean()], np.float32)
            gap = max(1, frame.index - tr.last_seen)
            if tr.present and oid not in prompted and tr.ratio >= 0.8:
                tr.velocity = 0.5 * tr.velocity + 0.5 * (c - tr.centroid) / gap
            tr.centroid, tr.last_seen, tr.mask, tr.present = c, frame.index, mask, True
            tr.score = float(np.mean(1.0 / (1.0 + np.exp(-lg[mask])))) if area else 0.0
            out[k] = lg
            scores[k], present[k] = tr.score, True
            x0, y0, x1, y1 = _bbox(mask) or (0, 0, 0, 0)
            boxes[k] = (x0 * W / w, y0 * H / h, min(W, x1 * W / w), min(H, y1 * H / h))
        return TrackResult(frame.index, np.array(ids, np.int64), scores, present, boxes, logits=out)

    def _rescale(self, w: int, h: int) -> None:
        """The tensor size changed mid-stream (new source resolution): resize the per-object state."""
        ow, oh = self._work_size or (w, h)
        logger.info(
            "classic tracker: input size changed from %dx%d to %dx%d; rescaling object state", ow, oh, w, h
        )
        for tr in self._tracks.values():
            tr.mask = cv2.resize(tr.mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(
                bool
            )
            tr.shape = cv2.resize(tr.shape.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(
                bool
            )
            tr.centroid = tr.centroid * np.array([w / ow, h / oh], np.float32)
            tr.velocity = tr.velocity * np.array([w / ow, h / oh], np.float32)
            f = (w * h) / float(ow * oh)
            tr.area_ref *= f
            tr.extent *= f
            tr.size = float(np.sqrt(tr.area_ref))
            tr.check = None
            if tr.present and not tr.mask.any():
                tr.present = False
        self._prev_gray = None


def _motion_fields(
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


__all__ = ["ClassicParams", "ClassicSession"]
