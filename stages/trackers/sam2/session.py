"""The SAM-2-family streaming algorithm, written once, sans I/O, against :class:`~.runtime.Runtime`.

It reproduces the reference (``transformers``' video models fed one frame at a time) with fixed device-resident
slots: per object a bank ``[C + N, T, M]`` (C conditioning slots, N recent slots) and a pointer ring ``[Q, D]``
(C conditioning pointers, ``max_object_pointers - 1`` recent ones).  The memory encoder writes each frame's memory
and pointer straight into their slots; memory attention reads them in place with a validity mask.  Per frame the
host uploads the image, the prompt points and a few small vectors, and downloads the four low-res mask planes,
their IoU and the object score.  Rules and the places we differ from the reference: ``docs/sam2-backend.md`` §0, §5.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from vostream.pipeline.errors import BackendError, PromptError
from vostream.pipeline.types import Frame, Prompt, TrackResult

from ..base import MAX_POINTS, StepAborted, TrackerSession
from ..prompting import PromptBook
from .manifest import Manifest
from .prompt_input import ModelInput, model_input, resize_aa
from .runtime import DeviceBuffer, Runtime, TransferStats

logger = logging.getLogger(__name__)


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
class Sam2Stats:
    frames: int = 0
    cond_frames: int = 0
    evicted_cond: int = 0
    attended_slots: int = 0  # memory slots bound over all memory-attention runs (C + N each, unless views)


def _scratch(rt: Runtime, m: Manifest) -> dict[str, DeviceBuffer]:
    """A session's scratch buffers (graph I/O other than the bank and pointers), allocated once."""
    S, g, D, P = m.image_size, m.grid, m.hidden_dim, m.mask_size
    L, Q = m.cond_slots + m.recent_slots, m.pointer_slots
    b: dict[str, DeviceBuffer] = {}
    b["image"] = rt.alloc((1, 3, S, S), "float32", "image")
    for spec in m.graphs["image_encoder"].outputs:
        b[spec.name] = rt.alloc(tuple(int(v) for v in spec.shape), spec.dtype, spec.name)
    for name, shape, dtype in (
        ("pix_feat", (1, D, g, g), "float32"),
        ("points", (1, MAX_POINTS, 2), "float32"),
        ("labels", (1, MAX_POINTS), "int32"),
        ("mask_prompt", (1, 1, S, S), "float32"),
        ("zero_mask", (1, 1, S, S), "float32"),
        ("has_mask", (1,), "float32"),
        ("low_res_masks", (1, 4, P, P), "float32"),
        ("iou", (1, 4), "float32"),
        ("object_score", (1, 1), "float32"),
        ("obj_ptrs", (1, 4, D), "float32"),
        ("slot_tpos", (L,), "int64"),
        ("slot_valid", (L,), "float32"),
        ("ptr_tdiff", (Q,), "float32"),
        ("ptr_valid", (Q,), "float32"),
        ("plane", (1,), "int64"),
        ("token", (1,), "int64"),
        ("use_mask_prompt", (1,), "float32"),
        ("binarize", (1,), "float32"),
    ):
        b[name] = rt.alloc(shape, dtype, name)
    return b


def _add_traffic(t: TransferStats, d: TransferStats) -> None:
    """Add ``d``'s counts and times to ``t``."""
    t.h2d_bytes += d.h2d_bytes
    t.d2h_bytes += d.d2h_bytes
    t.d2d_bytes += d.d2d_bytes
    t.h2d_calls += d.h2d_calls
    t.d2h_calls += d.d2h_calls
    for k, v in d.runs.items():
        t.runs[k] = t.runs.get(k, 0) + v
    for k, x in d.run_s.items():
        t.run_s[k] = t.run_s.get(k, 0.0) + x


def _multimask(alg: dict[str, Any], init_cond: bool, n_points: int) -> bool:
    """Whether the reference asks the decoder for several masks on this frame (``alg``: the manifest's rules)."""
    return bool(
        alg["multimask_output_in_sam"]
        and (init_cond or alg["multimask_output_for_tracking"])
        and alg["multimask_min_pt_num"] <= n_points <= alg["multimask_max_pt_num"]
    )


def _select(alg: dict[str, Any], planes: np.ndarray, iou: np.ndarray, multimask: bool) -> tuple[int, int]:
    """(plane, token) the reference would pick from the four planes."""
    best = 1 + int(np.argmax(iou[1:]))
    if multimask:
        return best, best
    if alg["dynamic_multimask_via_stability"]:
        d = alg["stability_delta"]
        area_i = float(np.count_nonzero(planes[0] > d))
        area_u = float(np.count_nonzero(planes[0] > -d))
        stability = area_i / area_u if area_u > 0 else 1.0
        if stability < alg["stability_thresh"]:
            return best, 0
    return 0, 0


class Sam2Session(TrackerSession):
    """One stream on one :class:`Runtime`.  Prompts are in source pixels; ``frame.tensor`` is the preprocessed
    ``[1, 3, S, S]`` float32 image (``Sam2Tracker.input_spec``)."""

    def __init__(self, runtime: Runtime, manifest: Manifest, max_objects: int | None = None) -> None:
        self.rt = runtime
        self.max_objects = max_objects
        self.m = manifest
        self.alg = manifest.algorithm
        m = manifest
        self.S, self.P = m.image_size, m.mask_size
        self.C, self.N, self.Q = m.cond_slots, m.recent_slots, m.pointer_slots
        self.L = self.C + self.N
        # bind only the slot / pointer range that holds memories (the rest is masked anyway): fewer keys to attend
        self._shrink = bool(runtime.dynamic_shapes and m.graphs["memory_attention"].shrinkable)
        self.R = self.Q - self.C  # recent pointer slots (max_object_pointers - 1)
        self.T, self.M, self.D = m.tokens_per_slot, m.mem_dim, m.hidden_dim
        self.b: dict[str, DeviceBuffer] = _scratch(runtime, m)  # per-session scratch buffers, allocated once
        # small host staging arrays, reused every frame
        self._h_planes = np.empty((1, 4, self.P, self.P), np.float32)
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

    # ---------------------------------------------------------------------------------------------- step
    def step(self, frame: Frame) -> TrackResult:
        before = self.rt.stats.snapshot()
        try:
            return self._step(frame)
        finally:  # this session's share of the (possibly shared) runtime's counters
            _add_traffic(self.traffic, self.rt.stats.minus(before))

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
        inputs: dict[int, ModelInput] = {}
        for oid, p in due.items():  # validate everything before changing any state
            p.check_bounds(src_w, src_h, source="the stream")
            inputs[oid] = model_input(p, src_w, src_h, self.S)
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

    def _upload_scalar(self, name: str, value: float) -> None:
        buf = self.b[name]
        self.rt.upload(buf, np.asarray([value], dtype=buf.dtype))

    def _step_object(
        self, obj: _Object, inp: ModelInput | None, now: int, any_input: bool
    ) -> tuple[np.ndarray, float, bool]:
        """One object on this frame: its conditioning (the prompt, or memory attention over its bank), the decoder,
        the plane the reference would pick, then this frame's memory encoded into the object's next slots."""
        mask_path = inp is not None and inp.mask is not None
        init_cond = inp is not None
        pix, pts, labels, n_points = self._conditioning(obj, inp, now)
        planes, iou, dec_score = self._run_decoder(pix, pts, labels, inp.mask if inp is not None else None)
        multimask = (
            True if mask_path else _multimask(self.alg, init_cond, n_points)
        )  # HF's mask path: multimask
        plane, token = _select(self.alg, planes, iou, multimask)
        out, conf, present = self._output(inp, planes, iou, dec_score, plane)
        mem_slot, ptr_slot = self._memory_slots(obj, now, init_cond)
        binarize = any_input if self.alg["batch_binarize"] else init_cond
        self._encode_memory(obj, mem_slot, ptr_slot, plane, token, mask_path, binarize)
        return out, conf, present

    def _conditioning(
        self, obj: _Object, inp: ModelInput | None, now: int
    ) -> tuple[DeviceBuffer, np.ndarray, np.ndarray, int]:
        """The decoder's image features and prompt: on a tracking frame memory attention's output over the bank and
        no prompt; on a prompted frame the features without memory (points) or the feature map (a mask).  Returns
        (features, points, labels, how many points the multimask rule counts)."""
        rt, b = self.rt, self.b
        if inp is None:  # tracking frame: memory attention over the bank, no prompt
            memory = self._memory_inputs(obj, now)
            rt.run("memory_attention", {"feat": b["feat"], **memory}, {"pix_feat": b["pix_feat"]})
            self.stats.attended_slots += memory["bank"].shape[0]
            return b["pix_feat"], np.zeros((1, 2), np.float32), np.full((1,), -1, np.int32), 0
        pix = b["feat_map"] if inp.mask is not None else b["feat_nomem"]
        return pix, inp.points, inp.labels, inp.n_points

    def _run_decoder(
        self, pix: DeviceBuffer, pts: np.ndarray, labels: np.ndarray, mask: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """Upload the prompt (points and labels, or the mask), run the decoder; returns the four low-res mask
        planes, their IoU and the object score (host arrays reused every frame)."""
        rt, b = self.rt, self.b
        k = len(pts)
        pts_v = rt.view(b["points"], 0, (1, k, 2))
        lab_v = rt.view(b["labels"], 0, (1, k))
        rt.upload(pts_v, pts.reshape(1, k, 2))
        rt.upload(lab_v, labels.reshape(1, k))
        if mask is not None:
            rt.upload(b["mask_prompt"], mask.reshape(1, 1, self.S, self.S))
        self._upload_scalar("has_mask", 1.0 if mask is not None else 0.0)
        rt.run(
            "decoder",
            {
                "pix_feat": pix,
                "feat_s0": b["feat_s0"],
                "feat_s1": b["feat_s1"],
                "points": pts_v,
                "labels": lab_v,
                "mask_prompt": b["mask_prompt"] if mask is not None else b["zero_mask"],
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
        return planes, iou, dec_score

    def _output(
        self, inp: ModelInput | None, planes: np.ndarray, iou: np.ndarray, dec_score: float, plane: int
    ) -> tuple[np.ndarray, float, bool]:
        """The object's (logits, confidence, present) on this frame: a mask prompt as given (logits +-10), else
        the chosen plane when the object score says present, else the "no object" score everywhere."""
        P = self.P
        if inp is not None and inp.mask is not None:
            high = inp.mask * 20.0 - 10.0
            present = bool(np.any(inp.mask > 0))
            return resize_aa(high, P, P), 1.0 if present else 0.0, present
        present = dec_score > 0
        out = planes[plane].copy() if present else np.full((P, P), self.alg["no_obj_score"], np.float32)
        conf = float(1.0 / (1.0 + np.exp(-dec_score)) * iou[plane]) if present else 0.0
        return out, conf, present

    def _memory_slots(self, obj: _Object, now: int, init_cond: bool) -> tuple[int, int]:
        """Where this frame's memory and pointer go: a conditioning slot on a prompted frame, else the recent slots
        of step ``now`` (rings); the chosen slots are marked as holding step ``now``."""
        if init_cond:
            slot = self._cond_slot(obj)
            obj.cond_steps[slot] = now
            self.stats.cond_frames += 1
            return slot, slot
        j = now % self.N
        r = now % self.R
        obj.recent_steps[j] = now
        obj.ptr_steps[r] = now
        return self.C + j, self.C + r

    def _encode_memory(
        self,
        obj: _Object,
        mem_slot: int,
        ptr_slot: int,
        plane: int,
        token: int,
        mask_path: bool,
        binarize: bool,
    ) -> None:
        """Run the memory encoder on the decoder's outputs still on the device, writing the memory and the object
        pointer straight into their slots of the object's bank and pointer ring."""
        rt, b = self.rt, self.b
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
