"""The SAM-2-family streaming algorithm, written once, sans I/O, against :class:`~.runtime.Runtime`.

It reproduces the reference (``transformers``' video models fed one frame at a time) with fixed device-resident
slots: per object a bank ``[C + N, T, M]`` (C conditioning slots, N recent slots) and a pointer ring ``[Q, D]``
(C conditioning pointers, ``max_object_pointers - 1`` recent ones).  The memory encoder writes each frame's memory
and pointer straight into their slots; memory attention reads them in place with a validity mask.  Per frame the
host uploads the image, the prompt points and a few small vectors, and downloads the four low-res mask planes,
their IoU and the object score.  Rules and the places we differ from the reference: ``docs/sam2-backend.md`` §0, §5.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from vostream.pipeline.errors import BackendError, PromptError
from vostream.pipeline.types import Frame, Prompt, TrackResult

from ..base import MAX_POINTS, StepAborted, TrackerSession
from ..prompting import PromptBook
from .manifest import Manifest
from .runtime import DeviceBuffer, Runtime, TransferStats

logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=64)
def _aa_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """The weights of PyTorch's ``interpolate(mode="bilinear", align_corners=False, antialias=True)`` along one axis
    (for an upsample this is plain bilinear), as taps: output ``i`` is ``sum_k weight[i, k] * input[index[i, k]]``
    (``index``, ``weight``: (n_out, K); unused taps have weight 0).  Cached per size pair."""
    scale = n_in / n_out
    support = max(scale, 1.0)
    rows: list[tuple[int, np.ndarray]] = []
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        j = np.arange(lo, hi)
        k = np.maximum(0.0, 1.0 - np.abs((j - center + 0.5) / support))
        total = k.sum()
        rows.append((lo, k / total if total > 0 else np.zeros_like(k)))
    taps = max(1, max(len(k) for _, k in rows))
    index = np.zeros((n_out, taps), np.intp)
    weight = np.zeros((n_out, taps), np.float64)
    for i, (lo, k) in enumerate(rows):
        index[i, : len(k)] = np.arange(lo, lo + len(k))
        weight[i, : len(k)] = k
    index.flags.writeable = weight.flags.writeable = False
    return index, weight


def resize_aa(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize a 2-D float array like PyTorch's antialiased bilinear interpolate (float32 result).

    Separable and banded: each output pixel sums a few taps per axis (float64), so the cost is ``taps x output``
    rather than the dense ``height x H x W`` matrix product, and no BLAS thread pool is involved (a dense product
    through a multi-threaded BLAS took 25-30 ms for a 96x160 -> 128x128 mask when the cores were busy tracking,
    1.4 ms on one thread: this runs for every mask prompt, including a hot reload's)."""
    x = np.asarray(x, np.float64)
    iy, wy = _aa_taps(x.shape[0], height)
    ix, wx = _aa_taps(x.shape[1], width)
    rows = np.zeros((height, x.shape[1]), np.float64)
    for k in range(iy.shape[1]):
        rows += wy[:, k, None] * x[iy[:, k], :]
    out = np.zeros((height, width), np.float64)
    for k in range(ix.shape[1]):
        out += rows[:, ix[:, k]] * wx[None, :, k]
    return out.astype(np.float32)


@dataclass
class _Object:
    obj_id: int
    bank: DeviceBuffer  # [C + N, T, M]
    ptrs: DeviceBuffer  # [Q, D]
    cond_steps: list[int]  # per conditioning slot: step it holds, -1 empty
    recent_steps: list[int]  # per recent slot
    ptr_steps: list[int]  # per recent pointer slot
    frames: int = 0  # frames this object took part in


@dataclass
class _Input:
    """Prompts of one object for the current frame, in model pixels."""

    points: np.ndarray  # (K, 2) float32
    labels: np.ndarray  # (K,) int32: 1, 0, 2/3 box corners
    mask: np.ndarray | None = None  # (S, S) float32 0/1
    n_points: int = 0  # what the multimask rule counts


@dataclass
class Sam2Stats:
    frames: int = 0
    cond_frames: int = 0
    evicted_cond: int = 0
    attended_slots: int = 0  # memory slots bound over all memory-attention runs (C + N each, unless views)


class Sam2Session(TrackerSession):
    """One stream on one :class:`Runtime`.  Prompts are in source pixels; ``frame.tensor`` is the preprocessed
    ``[1, 3, S, S]`` float32 image (``Sam2Tracker.input_spec``)."""

    def __init__(self, runtime: Runtime, manifest: Manifest, max_objects: int | None = None) -> None:
        self.rt = runtime
        self.max_objects = max_objects
        self.m = manifest
        self.alg = manifest.algorithm
        m = manifest
        S, g, D, M, P = m.image_size, m.grid, m.hidden_dim, m.mem_dim, m.mask_size
        self.S, self.P = S, P
        self.C, self.N, self.Q = m.cond_slots, m.recent_slots, m.pointer_slots
        self.L = self.C + self.N
        # bind only the slot / pointer range that holds memories (the rest is masked anyway): fewer keys to attend
        self._shrink = bool(runtime.dynamic_shapes and m.graphs["memory_attention"].shrinkable)
        self.R = self.Q - self.C  # recent pointer slots (max_object_pointers - 1)
        self.T, self.M, self.D = m.tokens_per_slot, M, D
        rt = runtime
        ie = m.graphs["image_encoder"]
        # per-session scratch buffers, allocated once
        self.b: dict[str, DeviceBuffer] = {}
        self.b["image"] = rt.alloc((1, 3, S, S), "float32", "image")
        for spec in ie.outputs:
            self.b[spec.name] = rt.alloc(tuple(int(v) for v in spec.shape), spec.dtype, spec.name)
        self.b["pix_feat"] = rt.alloc((1, D, g, g), "float32", "pix_feat")
        self.b["points"] = rt.alloc((1, MAX_POINTS, 2), "float32", "points")
        self.b["labels"] = rt.alloc((1, MAX_POINTS), "int32", "labels")
        self.b["mask_prompt"] = rt.alloc((1, 1, S, S), "float32", "mask_prompt")
        self.b["zero_mask"] = rt.alloc((1, 1, S, S), "float32", "zero_mask")
        self.b["has_mask"] = rt.alloc((1,), "float32", "has_mask")
        self.b["low_res_masks"] = rt.alloc((1, 4, P, P), "float32", "low_res_masks")
        self.b["iou"] = rt.alloc((1, 4), "float32", "iou")
        self.b["object_score"] = rt.alloc((1, 1), "float32", "object_score")
        self.b["obj_ptrs"] = rt.alloc((1, 4, D), "float32", "obj_ptrs")
        self.b["slot_tpos"] = rt.alloc((self.L,), "int64", "slot_tpos")
        self.b["slot_valid"] = rt.alloc((self.L,), "float32", "slot_valid")
        self.b["ptr_tdiff"] = rt.alloc((self.Q,), "float32", "ptr_tdiff")
        self.b["ptr_valid"] = rt.alloc((self.Q,), "float32", "ptr_valid")
        self.b["plane"] = rt.alloc((1,), "int64", "plane")
        self.b["token"] = rt.alloc((1,), "int64", "token")
        self.b["use_mask_prompt"] = rt.alloc((1,), "float32", "use_mask_prompt")
        self.b["binarize"] = rt.alloc((1,), "float32", "binarize")
        # small host staging arrays, reused every frame
        self._h_planes = np.empty((1, 4, P, P), np.float32)
        self._h_iou = np.empty((1, 4), np.float32)
        self._h_score = np.empty((1, 1), np.float32)
        self._objects: dict[int, _Object] = {}
        self._prompts = PromptBook()  # prompts waiting for their frame
        self._steps = 0
        self._closed = False
        self.stats = Sam2Stats()
        #: this session's host<->device traffic and graph time (the runtime's counters are shared by sessions)
        self.traffic = TransferStats()

    # ------------------------------------------------------------------------------------------- prompts
    @property
    def object_ids(self) -> list[int]:
        return self._prompts.object_ids(self._objects)

    def add_prompt(self, prompt: Prompt) -> None:
        prompt = self._prompts.check(prompt, self._objects)
        oid = int(prompt.obj_id)
        if prompt.mask is not None and (len(prompt.points) or prompt.box is not None):
            raise PromptError(
                f"object {oid}: give either a mask or points/box on one frame, not both "
                "(the SAM-2 models take a mask prompt on its own)"
            )
        known = self.object_ids
        if self.max_objects is not None and oid not in known and len(known) >= self.max_objects:
            raise PromptError(
                f"object {oid}: this session already tracks {len(known)} objects, the most the "
                f"{self.rt.name} backend was set up for (max_objects={self.max_objects})"
            )
        limit = min(MAX_POINTS - 1, self.rt.max_points or MAX_POINTS - 1)
        if len(prompt.points) + (2 if prompt.box is not None else 0) > limit:
            raise PromptError(
                f"object {oid}: at most {limit} points (a box counts as two) per object per frame "
                f"on the {self.rt.name} runtime"
            )
        self._prompts.add(prompt, self._objects)

    def remove_object(self, obj_id: int) -> None:
        self._prompts.remove(obj_id, self._objects)
        obj = self._objects.pop(int(obj_id), None)
        if obj is not None:
            self.rt.free(obj.bank)
            self.rt.free(obj.ptrs)

    def reset(self) -> None:
        for oid in list(self._objects):
            self.remove_object(oid)
        self._prompts.clear()
        self._steps = 0

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for obj in self._objects.values():
            self.rt.free(obj.bank)
            self.rt.free(obj.ptrs)
        self._objects.clear()
        for buf in self.b.values():
            self.rt.free(buf)
        self.b.clear()

    def metrics(self) -> dict[str, Any]:
        """Per-frame averages since the session started: host<->device bytes (the bank is never among them),
        graph runs and milliseconds per graph."""
        st = self.traffic
        n = max(1, self.stats.frames)
        out: dict[str, Any] = {
            "frames": self.stats.frames,
            "cond_frames": self.stats.cond_frames,
            "evicted_cond_frames": self.stats.evicted_cond,
            "memory_slots_per_attention": round(
                self.stats.attended_slots / max(1, st.runs.get("memory_attention", 0)), 3
            ),
            "h2d_bytes_per_frame": st.h2d_bytes / n,
            "d2h_bytes_per_frame": st.d2h_bytes / n,
            "d2d_bytes_per_frame": st.d2d_bytes / n,
        }
        out.update({f"{k}_ms_per_frame": round(v * 1e3 / n, 3) for k, v in st.run_s.items()})
        return out

    def _to_model(self, prompt: Prompt, src_w: int, src_h: int) -> _Input:
        sx, sy = self.S / src_w, self.S / src_h
        if prompt.mask is not None:
            mask = np.asarray(prompt.mask, bool)
            if mask.shape != (src_h, src_w):
                raise PromptError(
                    f"object {prompt.obj_id}: mask prompt is {mask.shape[1]}x{mask.shape[0]}, the "
                    f"stream is {src_w}x{src_h}"
                )
            m = mask.astype(np.float32)
            if m.shape != (self.S, self.S):  # as HF's processor: antialiased resize, then threshold at 0.5
                m = (resize_aa(m, self.S, self.S) > 0.5).astype(np.float32)
            return _Input(np.zeros((1, 2), np.float32), np.full((1,), -1, np.int32), mask=m)
        pts: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        if prompt.box is not None:
            x0, y0, x1, y1 = prompt.box
            pts.append(np.array([[x0 * sx, y0 * sy], [x1 * sx, y1 * sy]], np.float32))
            labels.append(np.array([2, 3], np.int32))
        if len(prompt.points):
            pts.append((prompt.points * np.array([sx, sy], np.float32)).astype(np.float32))
            labels.append(prompt.labels.astype(np.int32))
        p = np.concatenate(pts)
        lab = np.concatenate(labels)
        return _Input(p, lab, n_points=len(p))

    # ---------------------------------------------------------------------------------------------- step
    def step(self, frame: Frame) -> TrackResult:
        before = self.rt.stats.snapshot()
        try:
            return self._step(frame)
        finally:  # this session's share of the (possibly shared) runtime's counters
            self._add_traffic(self.rt.stats.minus(before))

    def _add_traffic(self, d: TransferStats) -> None:
        t = self.traffic
        t.h2d_bytes += d.h2d_bytes
        t.d2h_bytes += d.d2h_bytes
        t.d2d_bytes += d.d2d_bytes
        t.h2d_calls += d.h2d_calls
        t.d2h_calls += d.d2h_calls
        for k, v in d.runs.items():
            t.runs[k] = t.runs.get(k, 0) + v
        for k, x in d.run_s.items():
            t.run_s[k] = t.run_s.get(k, 0.0) + x

    def _step(self, frame: Frame) -> TrackResult:
        if self._closed:
            raise BackendError("SAM-2 session is closed")
        x = frame.tensor
        S = self.S
        if x is None or x.shape != (1, 3, S, S) or x.dtype != np.float32:
            got = None if x is None else f"{x.dtype} {x.shape}"
            raise BackendError(
                f"SAM-2 tracker: frame.tensor must be float32 (1, 3, {S}, {S}) (run the preprocess "
                f"stage with the tracker's input_spec), got {got}"
            )
        src_w, src_h = frame.width, frame.height
        due = self._prompts.due(frame.index)
        inputs: dict[int, _Input] = {}
        for oid, p in due.items():  # validate everything before changing any state
            p.check_bounds(src_w, src_h, source="the stream")
            inputs[oid] = self._to_model(p, src_w, src_h)
        self._prompts.take(due)
        if not self._objects and not inputs:  # nothing to track yet (e.g. a live feed before the first click)
            return TrackResult(
                frame.index,
                np.zeros(0, np.int64),
                np.zeros(0, np.float32),
                np.zeros(0, bool),
                np.zeros((0, 4), np.float32),
                logits=np.zeros((0, self.P, self.P), np.float32),
            )
        rt, b = self.rt, self.b
        rt.upload(b["image"], x)
        rt.run(
            "image_encoder",
            {"image": b["image"]},
            {n: b[n] for n in ("feat_s0", "feat_s1", "feat", "feat_nomem", "feat_map")},
        )
        for oid in inputs:
            if oid not in self._objects:
                self._objects[oid] = self._new_object(oid)
        any_input = bool(inputs)
        now = self._steps
        ids: list[int] = []
        logits, scores, present = [], [], []
        for oid, obj in self._objects.items():
            if self.stop_requested():  # a cancel lands between objects, not after the whole frame
                raise StepAborted(
                    f"frame {frame.index}: stopped after {len(ids)} of {len(self._objects)} objects"
                )
            inp = inputs.get(oid)
            lo, sc, pr = self._step_object(obj, inp, now, any_input)
            ids.append(oid)
            logits.append(lo)
            scores.append(sc)
            present.append(pr)
            obj.frames += 1
        self._steps += 1
        self.stats.frames += 1
        n = len(ids)
        P = self.P
        return TrackResult(
            frame.index,
            np.asarray(ids, np.int64),
            np.asarray(scores, np.float32),
            np.asarray(present, bool),
            np.zeros((n, 4), np.float32),
            logits=np.stack(logits) if n else np.zeros((0, P, P), np.float32),
        )

    def _new_object(self, oid: int) -> _Object:
        bank = self.rt.alloc((self.L, self.T, self.M), "float32", f"bank[{oid}]")
        ptrs = self.rt.alloc((self.Q, self.D), "float32", f"ptrs[{oid}]")
        return _Object(oid, bank, ptrs, [-1] * self.C, [-1] * self.N, [-1] * self.R)

    def _multimask(self, init_cond: bool, n_points: int) -> bool:
        a = self.alg
        return bool(
            a["multimask_output_in_sam"]
            and (init_cond or a["multimask_output_for_tracking"])
            and a["multimask_min_pt_num"] <= n_points <= a["multimask_max_pt_num"]
        )

    def _select(self, planes: np.ndarray, iou: np.ndarray, multimask: bool) -> tuple[int, int]:
        """(plane, token) the reference would pick from the four planes."""
        best = 1 + int(np.argmax(iou[1:]))
        if multimask:
            return best, best
        if self.alg["dynamic_multimask_via_stability"]:
            d = self.alg["stability_delta"]
            area_i = float(np.count_nonzero(planes[0] > d))
            area_u = float(np.count_nonzero(planes[0] > -d))
            stability = area_i / area_u if area_u > 0 else 1.0
            if stability < self.alg["stability_thresh"]:
                return best, 0
        return 0, 0

    def _upload_scalar(self, name: str, value: float) -> None:
        buf = self.b[name]
        self.rt.upload(buf, np.asarray([value], dtype=buf.dtype))

    def _step_object(
        self, obj: _Object, inp: _Input | None, now: int, any_input: bool
    ) -> tuple[np.ndarray, float, bool]:
        rt, b = self.rt, self.b
        P = self.P
        mask_path = inp is not None and inp.mask is not None
        if inp is None:  # tracking frame: memory attention over the bank, no prompt
            memory = self._memory_inputs(obj, now)
            rt.run("memory_attention", {"feat": b["feat"], **memory}, {"pix_feat": b["pix_feat"]})
            self.stats.attended_slots += memory["bank"].shape[0]
            pix = b["pix_feat"]
            pts, labels, n_points = np.zeros((1, 2), np.float32), np.full((1,), -1, np.int32), 0
        else:
            pix = b["feat_map"] if mask_path else b["feat_nomem"]
            pts, labels, n_points = inp.points, inp.labels, inp.n_points
        k = len(pts)
        pts_v = rt.view(b["points"], 0, (1, k, 2))
        lab_v = rt.view(b["labels"], 0, (1, k))
        rt.upload(pts_v, pts.reshape(1, k, 2))
        rt.upload(lab_v, labels.reshape(1, k))
        if mask_path:
            assert inp is not None and inp.mask is not None
            rt.upload(b["mask_prompt"], inp.mask.reshape(1, 1, self.S, self.S))
        self._upload_scalar("has_mask", 1.0 if mask_path else 0.0)
        rt.run(
            "decoder",
            {
                "pix_feat": pix,
                "feat_s0": b["feat_s0"],
                "feat_s1": b["feat_s1"],
                "points": pts_v,
                "labels": lab_v,
                "mask_prompt": b["mask_prompt"] if mask_path else b["zero_mask"],
                "has_mask": b["has_mask"],
            },
            {
                "low_res_masks": b["low_res_masks"],
                "iou": b["iou"],
                "object_score": b["object_score"],
                "obj_ptrs": b["obj_ptrs"],
            },
        )
        planes = rt.download(b["low_res_masks"], self._h_planes)[0]
        iou = rt.download(b["iou"], self._h_iou)[0]
        dec_score = float(rt.download(b["object_score"], self._h_score)[0, 0])
        init_cond = inp is not None
        multimask = True if mask_path else self._multimask(init_cond, n_points)  # HF's mask path: multimask
        plane, token = self._select(planes, iou, multimask)
        if mask_path:
            assert inp is not None and inp.mask is not None
            high = inp.mask * 20.0 - 10.0
            out = resize_aa(high, P, P)
            present = bool(np.any(inp.mask > 0))
            conf = 1.0 if present else 0.0
        else:
            present = dec_score > 0
            out = planes[plane].copy() if present else np.full((P, P), self.alg["no_obj_score"], np.float32)
            conf = float(1.0 / (1.0 + np.exp(-dec_score)) * iou[plane]) if present else 0.0
        # where this frame's memory goes
        if init_cond:
            slot = self._cond_slot(obj)
            obj.cond_steps[slot] = now
            mem_slot, ptr_slot = slot, slot
            self.stats.cond_frames += 1
        else:
            j = now % self.N
            r = now % self.R
            obj.recent_steps[j] = now
            obj.ptr_steps[r] = now
            mem_slot, ptr_slot = self.C + j, self.C + r
        if self.alg["batch_binarize"]:
            binarize = any_input
        else:
            binarize = init_cond
        self._upload_scalar("plane", plane)
        self._upload_scalar("token", token)
        self._upload_scalar("use_mask_prompt", 1.0 if mask_path else 0.0)
        self._upload_scalar("binarize", 1.0 if binarize else 0.0)
        rt.run(
            "memory_encoder",
            {
                "feat": b["feat"],
                "low_res_masks": b["low_res_masks"],
                "obj_ptrs": b["obj_ptrs"],
                "object_score": b["object_score"],
                "mask_prompt": b["mask_prompt"] if mask_path else b["zero_mask"],
                "plane": b["plane"],
                "token": b["token"],
                "use_mask_prompt": b["use_mask_prompt"],
                "binarize": b["binarize"],
            },
            {
                "maskmem": rt.view(obj.bank, mem_slot * self.T * self.M, (1, self.T, self.M)),
                "obj_ptr": rt.view(obj.ptrs, ptr_slot * self.D, (1, self.D)),
            },
        )
        return out, conf, present

    def _cond_slot(self, obj: _Object) -> int:
        """A free conditioning slot, else the oldest one (evicted: the reference would keep it).  Free slots are
        taken from the last one down, so the filled ones sit next to the recent slots: with one conditioning frame
        the bound range skips the C - 1 empty ones."""
        for i in reversed(range(self.C)):
            if obj.cond_steps[i] < 0:
                return i
        oldest = int(np.argmin(obj.cond_steps))
        self.stats.evicted_cond += 1
        logger.info(
            "object %d: more than %d conditioning frames; dropping the oldest (frame step %d)",
            obj.obj_id,
            self.C,
            obj.cond_steps[oldest],
        )
        return oldest

    def _memory_inputs(self, obj: _Object, now: int) -> dict[str, DeviceBuffer]:
        """Memory attention's bank, pointer and metadata inputs, the metadata uploaded.  The slot range ``[lo, hi)``
        and pointer range ``[plo, phi)`` bound are everything, or (runtime with dynamic shapes) the smallest ranges
        holding every valid entry; their metadata starts at offset 0 of the metadata buffers."""
        C, N, R = self.C, self.N, self.R
        tpos = np.zeros(self.L, np.int64)
        valid = np.zeros(self.L, np.float32)
        tdiff = np.zeros(self.Q, np.float32)
        pvalid = np.zeros(self.Q, np.float32)
        last = self.m.num_maskmem - 1
        for i, s in enumerate(obj.cond_steps):
            if s >= 0:
                tpos[i], valid[i] = last, 1.0
                tdiff[i], pvalid[i] = now - s, 1.0
        for j, s in enumerate(obj.recent_steps):
            age = now - s
            if s >= 0 and 1 <= age <= N:
                tpos[C + j], valid[C + j] = age - 1, 1.0
        for r, s in enumerate(obj.ptr_steps):
            age = now - s
            if s >= 0 and 1 <= age <= R:
                tdiff[C + r], pvalid[C + r] = age, 1.0
        if not valid.any():
            raise BackendError(f"object {obj.obj_id}: no memory to attend to (internal error)")
        lo, hi, plo, phi = 0, self.L, 0, self.Q
        if self._shrink:
            idx, pidx = np.flatnonzero(valid), np.flatnonzero(pvalid)
            lo, hi = int(idx[0]), int(idx[-1]) + 1
            plo, phi = int(pidx[0]), int(pidx[-1]) + 1  # a valid slot's conditioning pointer is valid too
        rt, b = self.rt, self.b
        n, q = hi - lo, phi - plo
        inputs = {
            "bank": rt.view(obj.bank, lo * self.T * self.M, (n, self.T, self.M)),
            "ptrs": rt.view(obj.ptrs, plo * self.D, (q, self.D)),
        }
        for name, host in (
            ("slot_tpos", tpos[lo:hi]),
            ("slot_valid", valid[lo:hi]),
            ("ptr_tdiff", tdiff[plo:phi]),
            ("ptr_valid", pvalid[plo:phi]),
        ):
            inputs[name] = rt.view(b[name], 0, host.shape)
            rt.upload(inputs[name], host)
        return inputs


__all__ = ["MAX_POINTS", "Sam2Session", "resize_aa"]
