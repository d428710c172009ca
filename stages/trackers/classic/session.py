"""The classic tracker's per-stream session: flow-warped shape prior + colour likelihood, fused in log-odds.

See ``docs/classic-tracker.md`` for the algorithm.  A :class:`ClassicSession` is sans-I/O and not thread-safe:
one thread drives it (``add_prompt`` / ``remove_object`` for a frame, then ``step``).  A frame's step runs these
phases, each in its own module: the flow since the previous frame (``motion``); per object, propagation of a
visible one (``propagate``, with the stop rule of ``stop``) or the search for an absent one (``reacquire``); the
checks by motion of recent prompts (``check``); the new prompts segmented (``segment``); masks made exclusive;
per object, the presence test and the models' update (``presence``).  The tuning is :class:`ClassicParams`
(``params``); the per-object state is ``state.Track``.
"""

from __future__ import annotations

import logging

import cv2
import numpy as np

from vostream.pipeline.errors import BackendError
from vostream.pipeline.types import Frame, Prompt, TrackResult

from ..base import StepAborted, TrackerSession
from ..prompting import PromptBook, starts_object
from .appearance import quantise
from .check import Flows, MotionChecker
from .motion import FlowEstimator, background_motion
from .params import ClassicParams
from .presence import observe
from .propagate import FrameFlow, Propagator
from .reacquire import reacquire
from .segment import mask_from_box, mask_from_points, touches_border
from .state import MARGIN_LOGIT, OUTSIDE_LOGIT, Track, bbox
from .state import MotionCheck as _MotionCheck
from .state import mask_logits as _mask_logits

logger = logging.getLogger(__name__)

#: OpenCV's RNG is seeded with this + the frame index at each step (see ``step``)
RNG_SEED = 0x5EED
#: new click prompts on one frame beyond which each is segmented by colour only (the box search costs ~0.2-0.5 s
#: of CPU per click; hundreds of objects prompted at once, e.g. from a file, would otherwise take minutes)
MAX_SEARCHED_CLICKS = 16
#: a contested pixel goes to the most recently prompted object: each later prompt frame adds this to the logits
#: (more than any logit's range)
PRIORITY_STEP = 100.0


class ClassicSession(TrackerSession):
    """Tracking state for one stream (see module doc).  Not thread-safe."""

    def __init__(self, params: ClassicParams | None = None, flow_preset: str = "medium") -> None:
        self.params = params or ClassicParams()
        self._flow = FlowEstimator(flow_preset)
        self._flow_back = FlowEstimator(flow_preset)
        self._propagate = Propagator(self.params)
        self._check = MotionChecker(self._flow, self._flow_back)
        self._tracks: dict[int, Track] = {}
        self._prompts = PromptBook()  # prompts waiting for their frame
        self._prev_gray: np.ndarray | None = None
        self._prev_index = 0
        self._gap = 1  # frame indices between the previous processed frame and this one (skipped frames)
        self._src_size: tuple[int, int] | None = None  # (W, H) of the source frames
        self._work_size: tuple[int, int] | None = None  # (w, h) of the tensors

    # ---------------------------------------------------------------------------------------------- prompts
    @property
    def object_ids(self) -> list[int]:
        return self._prompts.object_ids(self._tracks)

    def add_prompt(self, prompt: Prompt) -> None:
        prompt = self._prompts.check(prompt, self._tracks)
        if self._src_size is not None:
            prompt.check_bounds(*self._src_size, source="the stream")
        self._prompts.add(prompt, self._tracks)

    def remove_object(self, obj_id: int) -> None:
        self._prompts.remove(obj_id, self._tracks)
        self._tracks.pop(int(obj_id), None)

    def reset(self) -> None:
        self._tracks.clear()
        self._prompts.clear()
        self._prev_gray = None

    # ---------------------------------------------------------------------------------------------- step
    def step(self, frame: Frame) -> TrackResult:
        # grabCut's k-means draws from OpenCV's per-thread RNG: seed it from the frame, so that results depend on
        # the video and the prompts only, not on what the thread ran before (a batch worker's earlier videos)
        cv2.setRNGSeed(RNG_SEED + frame.index)
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
        pending = self._prompts.due(frame.index)
        for p in pending.values():  # validate everything before changing any state
            p.check_bounds(*src, source=f"frame {frame.index}")
        if self._work_size is not None and self._work_size != (w, h):
            self._rescale(w, h)
        self._src_size, self._work_size = src, (w, h)

        gray = cv2.cvtColor(img, cv2.COLOR_RGB2GRAY)
        qidx = quantise(img)
        self._prompts.take(pending)
        refresh = {oid for oid, p in pending.items() if starts_object(p)}
        flow = self._frame_flow(frame.index, gray, refresh)
        self._gap = max(1, frame.index - self._prev_index)
        self._prev_index = frame.index
        self._prev_gray = gray

        logits, scale_change = self._follow_objects(frame.index, qidx, flow, refresh)
        self._check_prompts(frame.index, gray, qidx, logits, refresh)
        prompted = self._apply_pending(frame, pending, refresh, logits, img, gray, qidx)
        self._exclusive(logits, {oid: self._tracks[oid].prompted_at for oid in logits})
        return self._finish(frame, logits, qidx, scale_change, prompted)

    # ---------------------------------------------------------------------------------------------- phases
    def _frame_flow(self, index: int, gray: np.ndarray, refresh: set[int]) -> FrameFlow | None:
        """Forward and backward flow between the previous processed frame and this one, and the background's
        motion (``motion.background_motion``); None when no object is to be propagated or there is no previous
        frame of this size."""
        need_flow = any(t.present and oid not in refresh for oid, t in self._tracks.items())
        if not need_flow or self._prev_gray is None or self._prev_gray.shape != gray.shape:
            return None
        # skipped frames: seed the flow with the objects' expected displacement since the last frame
        moving = [
            t.velocity * max(1, index - self._prev_index)
            for oid, t in self._tracks.items()
            if t.present and oid not in refresh
        ]
        init = tuple(np.mean(moving, axis=0)) if index - self._prev_index > 1 and moving else None
        fwd = self._flow(self._prev_gray, gray, init)
        bwd = self._flow_back(gray, self._prev_gray, None if init is None else (-init[0], -init[1]))
        return fwd, bwd, background_motion(bwd, self._tracks.values())

    def _follow_objects(
        self,
        index: int,
        qidx: np.ndarray,
        flow: FrameFlow | None,
        refresh: set[int],
    ) -> tuple[dict[int, np.ndarray], dict[int, float]]:
        """Logits of every known object not prompted anew on this frame: a visible one propagated, an absent one
        searched for (left out when not found); and the area scale of each propagated object's motion."""
        logits: dict[int, np.ndarray] = {}
        scale_change: dict[int, float] = {}
        for done, (oid, tr) in enumerate(self._tracks.items()):
            if self.stop_requested():  # a cancel lands between objects, not after the whole frame
                raise StepAborted(f"frame {index}: stopped after {done} of {len(self._tracks)} objects")
            if oid in refresh:
                continue
            if tr.present:
                logits[oid], scale_change[oid] = self._propagate(tr, qidx, flow, index, self._gap)
            else:
                found = reacquire(self.params, tr, qidx, index)
                if found is not None:
                    logits[oid] = found
        return logits, scale_change

    def _check_prompts(
        self, index: int, gray: np.ndarray, qidx: np.ndarray, logits: dict[int, np.ndarray], refresh: set[int]
    ) -> None:
        """The pending checks by motion (``check``); an object whose mask a check corrects restarts from it."""
        flows: Flows = {}  # objects prompted on the same frame share their flows
        for oid, tr in self._tracks.items():
            if tr.check is not None and oid not in refresh:
                if self.stop_requested():
                    raise StepAborted(f"frame {index}: stopped before the check by motion of object {oid}")
                moved = self._check(tr, gray, logits, flows)
                if moved is not None:
                    nt = self._restart(tr, moved, qidx)
                    nt.centroid = tr.centroid
                    logits[oid] = _mask_logits(moved)

    def _apply_pending(
        self,
        frame: Frame,
        pending: dict[int, Prompt],
        refresh: set[int],
        logits: dict[int, np.ndarray],
        img: np.ndarray,
        gray: np.ndarray,
        qidx: np.ndarray,
    ) -> set[int]:
        """Segment this frame's prompts (``segment``) and start or restart their objects; the ids prompted."""
        src = (frame.width, frame.height)
        h, w = img.shape[:2]
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
        return prompted

    # ---------------------------------------------------------------------------------------------- internals
    def _init_track(self, oid: int, mask: np.ndarray, qidx: np.ndarray, index: int, keep_area: bool) -> None:
        """Start object ``oid`` from ``mask`` on frame ``index``; ``keep_area``: its reference area does not
        shrink below the previous track's."""
        tr = Track.from_mask(oid, mask, qidx, index)
        old = self._tracks.get(oid)
        if old is not None and keep_area:
            tr.area_ref = max(tr.area_ref, old.area_ref)
        self._tracks[oid] = tr

    def _restart(self, tr: Track, mask: np.ndarray, qidx: np.ndarray) -> Track:
        """Replace ``tr`` by a track whose models start from ``mask`` (this frame), keeping what the new mask does
        not change: motion, velocity, prompt frame and a pending check by motion."""
        self._init_track(tr.obj_id, mask, qidx, tr.last_seen, keep_area=False)
        nt = self._tracks[tr.obj_id]
        nt.velocity, nt.prompted_at, nt.motion = tr.velocity, tr.prompted_at, tr.motion
        if tr.extent:  # the check by motion re-segmented the prompt: its extent is the new mask's
            nt.extent = nt.area_ref
        nt.check = tr.check
        return nt

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
            [
                np.where(logits[i] > 0, logits[i] + PRIORITY_STEP * order[prompted_at[i]], logits[i])
                for i in ids
            ]
        )
        best = stack.argmax(0)
        for k, oid in enumerate(ids):
            lg = logits[oid]
            lose = (lg > 0) & (best != k)
            if lose.any():
                lg[lose] = -MARGIN_LOGIT

    def _finish(
        self,
        frame: Frame,
        logits: dict[int, np.ndarray],
        qidx: np.ndarray,
        scale_change: dict[int, float],
        prompted: set[int],
    ) -> TrackResult:
        """Per object, the presence test and the models' update (``presence.observe``); the frame's result."""
        h, w = qidx.shape
        W, H = frame.width, frame.height
        ids = list(self._tracks)
        out = np.full((len(ids), h, w), OUTSIDE_LOGIT, np.float32)
        scores = np.zeros(len(ids), np.float32)
        present = np.zeros(len(ids), bool)
        boxes = np.zeros((len(ids), 4), np.float32)
        for k, oid in enumerate(ids):
            tr = self._tracks[oid]
            lg = logits.get(oid)
            scale = scale_change.get(oid, 1.0)
            if not observe(self.params, tr, lg, qidx, frame.index, scale, oid in prompted):
                continue
            assert lg is not None  # observe: visible
            out[k] = lg
            scores[k], present[k] = tr.score, True
            x0, y0, x1, y1 = bbox(tr.mask) or (0, 0, 0, 0)
            boxes[k] = (x0 * W / w, y0 * H / h, min(W, x1 * W / w), min(H, y1 * H / h))
        return TrackResult(frame.index, np.array(ids, np.int64), scores, present, boxes, logits=out)

    def _rescale(self, w: int, h: int) -> None:
        """The tensor size changed mid-stream (new source resolution): resize the per-object state."""
        ow, oh = self._work_size or (w, h)
        logger.info(
            "classic tracker: input size changed from %dx%d to %dx%d; rescaling object state", ow, oh, w, h
        )
        for tr in self._tracks.values():
            tr.rescale(w, h, ow, oh)
        self._prev_gray = None


__all__ = ["ClassicParams", "ClassicSession"]
