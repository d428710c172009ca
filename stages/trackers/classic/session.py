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

from ..base import TrackerSession
from .appearance import ColourModel, bhattacharyya, histogram, quantise
from .motion import FlowEstimator, similarity_from_flow
from .segment import _fill_holes, mask_from_box, mask_from_points

logger = logging.getLogger(__name__)

_OUTSIDE = -10.0  # logit of pixels far from every object


@dataclass(frozen=True)
class ClassicParams:
    """Tuning of the classic tracker (all distances in working-resolution pixels)."""

    prior_gain: float = 0.4           # log-odds per pixel of signed distance inside the warped mask
    prior_gain_out: float = 0.7       # ... and outside it (steeper: the prediction bounds growth)
    prior_max: float = 5.0            # prior clip inside the object (deep inside beats any colour evidence)
    prior_min: float = -8.0           # prior clip far outside
    shape_prior_max: float = 1.0      # prior clip inside the amodal shape but outside the visible mask
    llr_weight: float = 1.0           # weight of the colour log likelihood ratio
    llr_blur: float = 1.0             # Gaussian sigma applied to the likelihood ratio
    roi_pad: float = 0.35             # ROI padding, fraction of the object's size
    min_roi_pad: int = 12
    fg_rate: float = 0.04             # model update rates (weight of the new frame)
    bg_rate: float = 0.2
    absent_ratio: float = 0.18        # visible area / reference area under which the object is absent
    absent_llr: float = 0.4           # mean colour log likelihood ratio in the mask under which it is absent
    area_rate: float = 0.1            # reference-area EMA rate (only while mostly visible)
    reacquire_llr: float = 0.8        # likelihood threshold for re-acquisition candidates
    reacquire_bhatt: float = 0.5      # max Bhattacharyya distance near the predicted position
    reacquire_bhatt_global: float = 0.38
    reacquire_min_ratio: float = 0.2  # min candidate area / reference area near the predicted position
    reacquire_global_ratio: float = 0.45


@dataclass
class _Track:
    """Typed state of one object."""

    obj_id: int
    mask: np.ndarray                  # (h, w) bool, last visible mask at working resolution (empty while absent)
    shape: np.ndarray                 # (h, w) bool, amodal shape estimate: the last fully visible mask, moved
    model: ColourModel
    area_ref: float                   # reference (fully visible) area, scale-adjusted
    centroid: np.ndarray              # (2,) x, y of the last visible mask
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(2, np.float32))  # px per frame index
    last_seen: int = 0                # frame index of the last visible mask
    present: bool = True
    score: float = 1.0
    size: float = 1.0                 # sqrt of area_ref
    ratio: float = 1.0                # last visible area / area_ref
    prompted_at: int = 0              # frame index of the last prompt (contested pixels go to the newest)


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

    def __init__(self, params: ClassicParams | None = None, flow_preset: str = "ultrafast") -> None:
        self.params = params or ClassicParams()
        self._flow = FlowEstimator(flow_preset)
        self._tracks: dict[int, _Track] = {}
        self._pending: dict[int, Prompt] = {}
        self._prev_gray: np.ndarray | None = None
        self._prev_index = 0
        self._src_size: tuple[int, int] | None = None   # (W, H) of the source frames
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
            raise PromptError(f"object {oid}: a prompt with only negative points needs a known object; add a "
                              f"positive point, a box or a mask to start object {oid}")
        if self._src_size is not None:
            prompt.check_bounds(*self._src_size, source="the stream")
        if only_negative and oid in self._pending and oid not in self._tracks:
            # merge the negatives into the pending prompt that starts this object
            p = self._pending[oid]
            prompt = Prompt(oid, prompt.frame_index, np.concatenate([p.points, prompt.points]),
                            np.concatenate([p.labels, prompt.labels]), p.box, p.mask)
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
        img = frame.tensor
        if img is None:
            raise BackendError("classic tracker: frame.tensor is not set; run the preprocess stage "
                               "(Preprocessor(tracker.input_spec(w, h))) before step()")
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise BackendError(f"classic tracker: expected an (h, w, 3) uint8 RGB tensor, got {img.dtype} "
                               f"{img.shape}; use the tracker's input_spec for preprocessing")
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
        refresh = {oid for oid, p in pending.items() if p.box is not None or p.mask is not None
                   or np.any(p.labels == 1)}
        need_flow = any(t.present and oid not in refresh for oid, t in self._tracks.items())
        flow = None
        if need_flow and self._prev_gray is not None and self._prev_gray.shape == gray.shape:
            # skipped frames: seed the flow with the objects' expected displacement since the last frame
            moving = [t.velocity * max(1, frame.index - self._prev_index) for oid, t in self._tracks.items()
                      if t.present and oid not in refresh]
            init = tuple(np.mean(moving, axis=0)) if frame.index - self._prev_index > 1 and moving else None
            flow = self._flow(self._prev_gray, gray, init)
        self._prev_index = frame.index
        self._prev_gray = gray

        logits: dict[int, np.ndarray] = {}
        scale_change: dict[int, float] = {}
        for oid, tr in self._tracks.items():
            if oid in refresh:
                continue
            if tr.present:
                lg, s2 = self._propagate(tr, img, qidx, flow, frame.index)
                logits[oid], scale_change[oid] = lg, s2
            else:
                found = self._reacquire(tr, qidx, frame.index)
                if found is not None:
                    logits[oid] = found
        prompted: set[int] = set()
        for oid, p in pending.items():
            sp = p.scaled(w / src[0], h / src[1], (w, h))
            pts = (sp.points + 0.5 * np.array([w / src[0], h / src[1]], np.float32) - 0.5).clip(
                0, [w - 1, h - 1])
            pos, neg = pts[sp.labels == 1], pts[sp.labels == 0]
            if sp.mask is not None:
                mask = sp.mask
            elif sp.box is not None:
                mask = mask_from_box(img, sp.box, pos, neg)
            elif len(pos):
                mask = mask_from_points(img, qidx, pos, neg)
            else:  # negative-only correction of a known object: refine its current estimate
                cur = logits[oid] > 0 if oid in logits else self._tracks[oid].mask
                mask = mask_from_points(img, qidx, pos, neg, prior=cur)
            logits[oid] = np.clip(_signed_distance(mask) * 1.5, -6, 6).astype(np.float32)
            self._init_track(oid, mask, qidx, frame.index, keep_area=oid in self._tracks and oid not in refresh)
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
        tr = _Track(oid, mask.copy(), mask.copy(), model, area, c, last_seen=index, size=float(np.sqrt(area)),
                    prompted_at=index)
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

    def _propagate(self, tr: _Track, img: np.ndarray, qidx: np.ndarray,
                   flow: np.ndarray | None, index: int) -> tuple[np.ndarray, float]:
        """Fused logits (h, w) for a visible object and the area scale factor of its motion.

        The prior comes from the object's amodal ``shape`` (so a part that re-emerges from behind an occluder is
        expected); the motion is fitted to the flow of its visible ``mask``.  ``tr.shape`` is moved in place.
        """
        p = self.params
        h, w = qidx.shape
        box = _bbox(tr.shape | tr.mask)
        assert box is not None
        pad = max(p.min_roi_pad, int(p.roi_pad * tr.size)) + 16
        x0, y0, x1, y1 = _pad(box, pad, w, h)
        sd = _signed_distance(tr.mask[y0:y1, x0:x1])
        sd_shape = _signed_distance(tr.shape[y0:y1, x0:x1])
        if flow is not None:
            m = similarity_from_flow(flow, tr.mask)
        else:
            m = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
        s2 = float(abs(np.linalg.det(m[:, :2])))
        # warp the ROI's signed distance (in ROI coordinates) to the full frame
        t = m.copy()
        t[:, 2] += m[:, :2] @ np.array([x0, y0], np.float32)
        sdw = cv2.warpAffine(sd, t, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                             borderValue=-1e4)
        sdw_shape = cv2.warpAffine(sd_shape, t, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                                   borderValue=-1e4)
        tr.shape = sdw_shape > 0
        pred = (sdw > 0) | tr.shape
        out = np.full((h, w), _OUTSIDE, np.float32)
        pbox = _bbox(pred)
        if pbox is None:  # moved out of the frame
            return out, s2
        pad = max(p.min_roi_pad, int(p.roi_pad * tr.size))
        rx0, ry0, rx1, ry1 = _pad(pbox, pad, w, h)
        prior = np.maximum(self._prior(sdw[ry0:ry1, rx0:rx1]),
                           np.minimum(self._prior(sdw_shape[ry0:ry1, rx0:rx1]), p.shape_prior_max))
        llr = tr.model.llr(qidx[ry0:ry1, rx0:rx1])
        if p.llr_blur > 0:
            llr = cv2.GaussianBlur(llr, (0, 0), p.llr_blur)
        fused = prior + p.llr_weight * llr
        keep = self._components(fused > 0, pred[ry0:ry1, rx0:rx1])
        out[ry0:ry1, rx0:rx1] = np.where(keep, np.maximum(fused, 0.05), np.minimum(fused, -0.05))
        return out, s2

    def _prior(self, sd: np.ndarray) -> np.ndarray:
        """Shape prior in log-odds from a signed distance map (positive inside)."""
        p = self.params
        return np.clip(np.where(sd > 0, sd * p.prior_gain, sd * p.prior_gain_out), p.prior_min,
                       p.prior_max).astype(np.float32)

    @staticmethod
    def _components(cand: np.ndarray, pred: np.ndarray) -> np.ndarray:
        """Connected components of ``cand`` consistent with the prediction ``pred``, holes filled."""
        if not cand.any():
            return cand
        n, lab, stats, _ = cv2.connectedComponentsWithStats(cand.astype(np.uint8), connectivity=8)
        overlap = np.bincount(lab[pred], minlength=n)
        areas = stats[:, cv2.CC_STAT_AREA]
        good = (overlap >= 0.25 * areas) & (overlap > 0)
        good[0] = False
        if not good.any():
            return np.zeros_like(cand)
        keep = good[lab]
        return _fill_holes(keep)

    def _reacquire(self, tr: _Track, qidx: np.ndarray, index: int) -> np.ndarray | None:
        """Search for an absent object; its logits when found, else None."""
        p = self.params
        h, w = qidx.shape
        llr = cv2.GaussianBlur(tr.model.llr(qidx), (0, 0), 1.5)
        cand = cv2.morphologyEx((llr > p.reacquire_llr).astype(np.uint8), cv2.MORPH_OPEN, np.ones((3, 3), np.uint8))
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
            sub = lab[y:y + bh, x:x + bw] == j
            d = bhattacharyya(histogram(qidx[y:y + bh, x:x + bw][sub]), tr.model.fg)
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
        stack = np.stack([np.where(logits[i] > 0, logits[i] + 100.0 * order[prompted_at[i]], logits[i])
                          for i in ids])
        best = stack.argmax(0)
        for k, oid in enumerate(ids):
            lg = logits[oid]
            lose = (lg > 0) & (best != k)
            if lose.any():
                lg[lose] = -0.05

    def _finish(self, frame: Frame, logits: dict[int, np.ndarray], qidx: np.ndarray, scale_change: dict[int, float],
                prompted: set[int]) -> TrackResult:
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
                ratio = area / max(tr.area_ref, 1.0)
                tr.ratio = ratio
                mean_llr = float(tr.model.llr(qidx[mask]).mean()) if area else 0.0
                if ratio < p.absent_ratio or mean_llr < p.absent_llr:
                    if tr.present:
                        logger.debug("object %d lost at frame %d (area ratio %.2f, mean llr %.2f)", oid, frame.index,
                                     ratio, mean_llr)
                    tr.present, tr.score = False, 0.0
                    tr.mask = np.zeros((h, w), bool)
                    continue
                if ratio > 0.7:
                    tr.area_ref += p.area_rate * (area - tr.area_ref)
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
        logger.info("classic tracker: input size changed from %dx%d to %dx%d; rescaling object state", ow, oh, w, h)
        for tr in self._tracks.values():
            tr.mask = cv2.resize(tr.mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)
            tr.shape = cv2.resize(tr.shape.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST).astype(bool)
            tr.centroid = tr.centroid * np.array([w / ow, h / oh], np.float32)
            tr.velocity = tr.velocity * np.array([w / ow, h / oh], np.float32)
            f = (w * h) / float(ow * oh)
            tr.area_ref *= f
            tr.size = float(np.sqrt(tr.area_ref))
            if tr.present and not tr.mask.any():
                tr.present = False
        self._prev_gray = None


__all__ = ["ClassicParams", "ClassicSession"]
