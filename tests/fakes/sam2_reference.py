"""Hugging Face reference harness for the SAM-2-family parity tests (not itself a test module).

What: tiny, randomly initialised ``transformers`` 5.24 video models of the three families we export
(``Sam2VideoModel`` "sam2", ``EdgeTamVideoModel`` "edgetam", ``Sam3TrackerVideoModel`` "sam3_tracker"), a
deterministic synthetic video, and a driver that runs HF's own streaming tracker (one ``add_new_frame`` per frame,
no video up front) with a prompt schedule and returns per-frame, per-object low-res logits and object scores.

Why: our ONNX export + streaming tracker must reproduce HF frame by frame. The harness drives the HF
``*InferenceSession`` directly (no processor, so no torchvision and no hub downloads) and stores prompts in exactly
the format HF's ``Sam2VideoProcessor.add_inputs_to_inference_session`` stores them:

- clicks: ``point_coords`` float32 [1, 1, K, 2] in model-input pixels (0..S, x then y; the processor rescales
  from the original frame size to ``target_size`` = S, it does not normalise to [0, 1]), ``point_labels`` int64
  [1, 1, K] (1 positive, 0 negative). No padding is stored (the -10 pad only appears when one processor call gets
  several objects with different point counts); the prompt encoder itself appends one (0, 0) point labelled -1.
- a box: its two corners (x0, y0), (x1, y1) become the *first* two points, labels 2 and 3, before any clicks
  (int32 labels if the box comes alone, int64 when clicks are concatenated, as torch.cat promotes).
- a mask: float32 [1, 1, S, S] of 0/1 in ``mask_inputs_per_obj`` (the processor thresholds a resized mask at 0.5).
  A mask prompt clears the point prompt of that object on that frame, and vice versa.

Random weights make the reference degenerate in ways that hide bugs or make parity flaky; ``make_tiny_model``
fixes them (all seeded, deterministic):

- the object-score logits are ~±0.003, so "object present" (score > 0) is a knife edge; the head is rewired so that
  every score is far from 0 (|score| >= 1.58 over the default 32-frame run, 5 seeds x 3 families) and, with
  ``obj_score="mixed"``, negative exactly on the frames where ``make_frames`` draws its grey curtain;
- mask logits are ~1e-3 and IoU predictions 0.5 +/- 5e-4 (argmax gaps ~2e-5); the mask hypernetworks' and the
  IoU head's last layers are scaled (logits std ~1.5-4.5, IoU gaps >= 0.02);
- several parameters are initialised to exact zeros (no-memory / no-object embeddings, temporal position tables,
  the memory fuser's layer scale, the Hiera position embeddings), which would hide slot-indexing and occlusion
  bugs; they get small random values.

The reference runs on one torch thread (``torch_threads``) so that results do not depend on the core count; use
``load_tiny`` (not bare ``from_pretrained``) when a reloaded model must give bit-identical outputs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FAMILIES: tuple[str, ...] = ("sam2", "edgetam", "sam3_tracker")

#: frames of the default test video on which a flat grey curtain hides the whole scene ("mixed" scores < 0 there)
DEFAULT_OCCLUDED: tuple[int, ...] = (6, 7, 8, 25, 26)

_H = 128  # hidden size of every tiny model (fpn, decoder, memory attention)


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"sam2_reference: unknown family {family!r}; expected one of {FAMILIES}")


# ----------------------------------------------------------------------------------------------------------------
# tiny configs and models
# ----------------------------------------------------------------------------------------------------------------


def _hiera_vision_config(size: int) -> Any:
    from transformers import Sam2HieraDetConfig, Sam2VisionConfig

    backbone = Sam2HieraDetConfig(
        hidden_size=16,
        num_attention_heads=1,
        image_size=[size, size],
        blocks_per_stage=[1, 1, 2, 1],
        embed_dim_per_stage=[16, 32, 64, 128],
        num_attention_heads_per_stage=[1, 1, 1, 1],
        window_size_per_stage=[4, 4, 4, 4],
        global_attention_blocks=[3],
    )
    return Sam2VisionConfig(
        backbone_config=backbone,
        backbone_channel_list=[128, 64, 32, 16],
        backbone_feature_sizes=[[size // 4] * 2, [size // 8] * 2, [size // 16] * 2],
        fpn_hidden_size=_H,
    )


def _memory_kwargs(grid: int) -> dict[str, Any]:
    return {
        "memory_attention_hidden_size": _H,
        "memory_attention_num_layers": 1,
        "memory_attention_rope_feat_sizes": [grid, grid],
        "memory_encoder_hidden_size": _H,
        "memory_encoder_output_channels": 64,
        "mask_downsampler_embed_dim": _H,
        "memory_fuser_embed_dim": _H,
        "memory_fuser_intermediate_dim": 128,
        "memory_fuser_num_layers": 1,
    }


def tiny_config(family: str, size: int | None = None) -> Any:
    """The HF video config of the tiny model of ``family`` (S=128 Hiera for sam2/edgetam, S=112 Sam3ViT for sam3).

    ``size``: the same networks (same weights) configured for another input size, written out here field by field
    as a check on the exporter's own ``--image-size`` resizing.

    These are the configs verified in docs/sam2-backend.md section 8 (EdgeTAM uses a Hiera vision config so that no
    timm backbone is needed).
    """
    _check_family(family)
    import transformers as tf

    decoder_kw: dict[str, Any] = {
        "hidden_size": _H,
        "mlp_dim": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "iou_head_hidden_dim": 32,
    }
    if family == "sam2":
        size = size or 128
        return tf.Sam2VideoConfig(
            vision_config=_hiera_vision_config(size),
            image_size=size,
            prompt_encoder_config=tf.Sam2VideoPromptEncoderConfig(
                hidden_size=_H, image_size=size, patch_size=16, mask_input_channels=4
            ),
            mask_decoder_config=tf.Sam2VideoMaskDecoderConfig(**decoder_kw),
            memory_attention_feed_forward_hidden_size=128,
            **_memory_kwargs(size // 16),
        )
    if family == "edgetam":
        size = size or 128
        return tf.EdgeTamVideoConfig(
            vision_config=_hiera_vision_config(size),
            image_size=size,
            prompt_encoder_config=tf.EdgeTamVideoPromptEncoderConfig(
                hidden_size=_H, image_size=size, patch_size=16, mask_input_channels=4
            ),
            mask_decoder_config=tf.EdgeTamVideoMaskDecoderConfig(**decoder_kw),
            memory_attention_rope_k_sizes=[2, 2],
            perceiver_resampler_num_latents=8,
            perceiver_resampler_num_latents_2d=4,
            perceiver_resampler_num_layers=1,
            memory_attention_mlp_hidden_size=128,
            **_memory_kwargs(size // 16),
        )
    size = size or 112
    vit = tf.Sam3ViTConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=size,
        patch_size=14,
        window_size=4,
        global_attn_indexes=[1],
        pretrain_image_size=56,
    )
    return tf.Sam3TrackerVideoConfig(  # type: ignore[call-arg]  # image_size is popped from **kwargs
        vision_config=tf.Sam3VisionConfig(backbone_config=vit, fpn_hidden_size=_H),
        image_size=size,
        prompt_encoder_config=tf.Sam3TrackerVideoPromptEncoderConfig(
            hidden_size=_H, image_size=size, patch_size=14, mask_input_channels=4
        ),
        mask_decoder_config=tf.Sam3TrackerVideoMaskDecoderConfig(**decoder_kw),
        memory_attention_feed_forward_hidden_size=128,
        **_memory_kwargs(size // 14),
    )


def model_class(family: str) -> Any:
    """The HF model class of ``family`` (for ``from_pretrained``)."""
    _check_family(family)
    import transformers as tf

    return {
        "sam2": tf.Sam2VideoModel,
        "edgetam": tf.EdgeTamVideoModel,
        "sam3_tracker": tf.Sam3TrackerVideoModel,
    }[family]


def family_of(model: Any) -> str:
    """The family name of an HF video model instance."""
    name = type(model).__name__
    for family, cls_name in (
        ("sam2", "Sam2VideoModel"),
        ("edgetam", "EdgeTamVideoModel"),
        ("sam3_tracker", "Sam3TrackerVideoModel"),
    ):
        if name == cls_name:
            return family
    raise TypeError(
        f"sam2_reference: {name} is not one of Sam2VideoModel, EdgeTamVideoModel, Sam3TrackerVideoModel"
    )


def session_class(family: str) -> type:
    """The HF ``*InferenceSession`` class of ``family``."""
    _check_family(family)
    if family == "sam2":
        from transformers.models.sam2_video.modeling_sam2_video import Sam2VideoInferenceSession

        return Sam2VideoInferenceSession
    if family == "edgetam":
        from transformers.models.edgetam_video.modeling_edgetam_video import EdgeTamVideoInferenceSession

        return EdgeTamVideoInferenceSession
    from transformers.models.sam3_tracker_video.modeling_sam3_tracker_video import (
        Sam3TrackerVideoInferenceSession,
    )

    return Sam3TrackerVideoInferenceSession


def image_size(model: Any) -> int:
    """The square model-input size S of an HF video model (``config.image_size``)."""
    return int(model.config.image_size)


def mask_size(model: Any) -> int:
    """Side P of the low-res mask logits (``pred_masks``) = 4 g, g = S / patch (32 for all three tiny models; 256
    for 1024-px SAM 2, 288 for 1008-px SAM 3)."""
    return int(model.prompt_encoder.mask_input_size[0])


def mean_std(family: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel RGB (mean, std) of the HF preprocessing for ``family``, float32 [3] each.

    sam2 / edgetam: ``Sam2VideoVideoProcessor`` and ``Sam2ImageProcessor`` use ImageNet's IMAGENET_DEFAULT_MEAN/STD
    (0.485, 0.456, 0.406) / (0.229, 0.224, 0.225). sam3_tracker: ``Sam3ImageProcessor`` uses IMAGENET_STANDARD_MEAN/STD
    = 0.5 / 0.5 (the SAM 3 checkpoints' processor config says the same; the sam3 tracker has no video processor of its
    own in the auto mappings, so its checkpoint config supplies one).
    """
    _check_family(family)
    if family == "sam3_tracker":
        return np.full(3, 0.5, np.float32), np.full(3, 0.5, np.float32)
    return np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


# ----------------------------------------------------------------------------------------------------------------
# synthetic video
# ----------------------------------------------------------------------------------------------------------------

#: the shapes of the synthetic video, in drawing order: (name, RGB colour)
SHAPES: tuple[tuple[str, tuple[int, int, int]], ...] = (
    ("disk", (220, 40, 40)),
    ("rect", (40, 70, 220)),
    ("diamond", (40, 200, 60)),
)


def _shape_params(i: int, size: int) -> list[tuple[str, float, float, float]]:
    """(kind, cx, cy, r) of every shape on frame ``i`` of a ``size`` x ``size`` video (smooth, periodic paths)."""
    s = size / 128.0
    t = i / 32.0 * 2.0 * np.pi
    return [
        ("disk", size * (0.30 + 0.12 * np.sin(t)), size * (0.35 + 0.10 * np.cos(1.3 * t)), 14.0 * s),
        ("rect", size * (0.68 - 0.10 * np.sin(0.8 * t)), size * (0.66 + 0.08 * np.sin(t + 1.0)), 13.0 * s),
        ("diamond", size * (0.70 + 0.08 * np.cos(t)), size * (0.25 + 0.06 * np.sin(2.0 * t)), 10.0 * s),
    ]


def shape_masks(i: int, size: int) -> dict[str, np.ndarray]:
    """Ground-truth bool [size, size] masks of the shapes on frame ``i`` (before occlusion; later shapes on top)."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    masks: dict[str, np.ndarray] = {}
    for kind, cx, cy, r in _shape_params(i, size):
        if kind == "disk":
            m = (xx - cx) ** 2 + (yy - cy) ** 2 <= r * r
        elif kind == "rect":
            m = (np.abs(xx - cx) <= 1.3 * r) & (np.abs(yy - cy) <= 0.8 * r)
        else:
            m = np.abs(xx - cx) + np.abs(yy - cy) <= r
        for other in masks.values():  # the shape drawn later wins
            other &= ~m
        masks[kind] = m
    return masks


def shape_box(i: int, size: int, name: str) -> tuple[float, float, float, float]:
    """Tight (x0, y0, x1, y1) box in pixels of shape ``name`` on frame ``i``."""
    m = shape_masks(i, size)[name]
    ys, xs = np.nonzero(m)
    return float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)


def shape_center(i: int, size: int, name: str) -> tuple[float, float]:
    """(x, y) centre in pixels of shape ``name`` on frame ``i``."""
    for kind, cx, cy, _ in _shape_params(i, size):
        if kind == name:
            return float(cx), float(cy)
    raise KeyError(f"sam2_reference.shape_center: no shape {name!r}; shapes are {[n for n, _ in SHAPES]}")


def make_frames(
    n: int, size: int, seed: int = 0, occluded: Iterable[int] = DEFAULT_OCCLUDED
) -> list[np.ndarray]:
    """A deterministic synthetic video: ``n`` uint8 [size, size, 3] RGB frames.

    A textured background (sinusoidal colour bands plus fixed noise, panning one pixel per frame) with three moving
    coloured shapes (red disk, blue rectangle, green diamond; see ``shape_masks``). On the frames in ``occluded``
    a flat grey curtain (with faint noise) hides everything: the "mixed" object-score head of ``make_tiny_model``
    is negative on exactly those frames. Pass ``occluded=()`` for a clean video.
    """
    if n < 1 or size < 16:
        raise ValueError(f"sam2_reference.make_frames: need n >= 1 and size >= 16, got n={n}, size={size}")
    rng = np.random.default_rng(seed)
    occ = set(occluded)
    yy, xx = np.mgrid[0:size, 0 : size + n].astype(np.float32)
    base = np.stack(
        [
            110.0 + 40.0 * np.sin(xx / 9.0) * np.cos(yy / 13.0),
            120.0 + 35.0 * np.cos((xx + yy) / 11.0),
            100.0 + 30.0 * np.sin(yy / 7.0 + xx / 17.0),
        ],
        axis=-1,
    )
    base += rng.normal(0.0, 12.0, base.shape)
    frames: list[np.ndarray] = []
    for i in range(n):
        img = base[:, i : i + size].copy()
        for name, colour in SHAPES:
            img[shape_masks(i, size)[name]] = colour
        if i in occ:
            img[:] = 128.0
            img += rng.normal(0.0, 3.0, img.shape)
        frames.append(np.clip(np.rint(img), 0, 255).astype(np.uint8))
    return frames


def to_tensor(rgb: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """float32 [1, 3, S, S] = (rgb / 255 - mean) / std, NCHW, from a uint8 [S, S, 3] RGB frame (no resizing)."""
    a = np.asarray(rgb)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"sam2_reference.to_tensor: expected an [H, W, 3] RGB frame, got shape {a.shape}")
    m = np.asarray(mean, np.float32).reshape(1, 1, 3)
    s = np.asarray(std, np.float32).reshape(1, 1, 3)
    x = (a.astype(np.float32) / np.float32(255.0) - m) / s
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


# ----------------------------------------------------------------------------------------------------------------
# prompts and the streaming driver
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class PromptSpec:
    """One object's prompt on one frame, in model-input pixels (0..S).

    ``points`` are (x, y) clicks with ``labels`` 1 (positive) / 0 (negative); ``box`` is (x0, y0, x1, y1);
    ``mask`` is a bool [S, S] mask and excludes points and box (as in HF).
    """

    obj_id: int
    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: tuple[float, float, float, float] | None = None
    mask: np.ndarray | None = None


@dataclass
class RefOut:
    """HF output for one object on one frame: ``logits`` = low-res ``pred_masks`` float32 [P, P] (``mask_size``),
    -1024 everywhere when the decoder says the object is absent (score <= 0); ``score`` = object-score logit
    (> 0: present). Mask prompts give logits = antialiased 1/4 of mask*20-10 and score +10 (or -10 if empty)."""

    logits: np.ndarray
    score: float


def _prompt_tensors(spec: PromptSpec, size: int, frame_idx: int) -> tuple[str, Any]:
    """Convert ``spec`` to what HF's processor stores: ("points", {point_coords, point_labels}) or ("mask", tensor)."""
    import torch

    where = f"sam2_reference: prompt for object {spec.obj_id} on frame {frame_idx}"
    if spec.mask is not None:
        if spec.points or spec.labels or spec.box is not None:
            raise ValueError(
                f"{where}: a mask prompt cannot be combined with points or a box (HF rejects it too)"
            )
        m = np.asarray(spec.mask)
        if m.shape != (size, size):
            raise ValueError(f"{where}: mask must be [S, S] = [{size}, {size}], got {m.shape}")
        # HF stores the mask as session dtype (float32) 0/1, [1, 1, S, S]; at S it is not resized or re-thresholded
        return "mask", torch.from_numpy(m.astype(bool)).to(torch.float32)[None, None]
    if len(spec.points) != len(spec.labels):
        raise ValueError(f"{where}: {len(spec.points)} points but {len(spec.labels)} labels")
    if any(lab not in (0, 1) for lab in spec.labels):
        raise ValueError(f"{where}: click labels must be 1 (positive) or 0 (negative), got {spec.labels}")
    pts = np.asarray(spec.points, np.float32).reshape(-1, 2)
    coords = torch.from_numpy(pts)[None, None]  # [1, 1, K, 2], model pixels
    labels = torch.tensor(spec.labels, dtype=torch.int64).reshape(
        1, 1, -1
    )  # the processor makes int64 labels
    if spec.box is not None:
        box = torch.tensor(spec.box, dtype=torch.float32).reshape(1, 1, 2, 2)  # (x0, y0), (x1, y1)
        box_labels = torch.tensor([[[2, 3]]], dtype=torch.int32)
        if labels.shape[2] == 0:
            labels = labels.to(torch.int32)  # the processor's empty label tensor is int32
        coords = torch.cat([box, coords], dim=2)  # box corners first, then the clicks
        labels = torch.cat([box_labels, labels], dim=2)
    if coords.shape[2] == 0:
        raise ValueError(f"{where}: no points, box or mask given")
    all_xy = coords.reshape(-1, 2)
    if bool((all_xy < 0).any()) or bool((all_xy > size).any()):
        raise ValueError(f"{where}: coordinates must lie in model pixels 0..{size}, got {all_xy.tolist()}")
    return "points", {"point_coords": coords, "point_labels": labels}


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Temporarily run torch CPU ops on ``n`` threads (None: leave the setting alone).

    The reference runs on one thread by default: the tiny models are no faster on two, results do not depend on
    the machine's core count (the thread count changes float results at the 1e-9 level), and on a loaded machine
    multi-threaded torch degrades from ~30 ms to over 1 s per frame.
    """
    import torch

    if n is None:
        yield
        return
    before = torch.get_num_threads()
    if before == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ReferenceRunner:
    """HF streaming reference, one frame per ``step``: the frame's prompts, then ``model(frame=...)``.

    Call sequence per frame i (found by reading ``Sam2VideoModel.forward`` and the processor): store each prompt
    with ``session.add_point_inputs`` / ``add_mask_inputs`` under frame index i (= frames added so far; the frame
    itself need not exist yet), clear the other prompt kind of that object on that frame, set
    ``session.obj_with_new_inputs`` to *all* objects prompted on this frame, then call
    ``model(inference_session=session, frame=tensor)``, which adds the frame and tracks every object. Passing
    ``frame=`` matters: it selects HF's streaming path (pointer temporal encodings normalised by
    ``max_object_pointers_in_encoder`` instead of ``min(frames so far, max)``). Frames before the first prompt are
    only added (``add_new_frame``), so HF frame indices always equal stream steps.
    """

    def __init__(self, model: Any, threads: int | None = 1) -> None:
        import torch

        self.model = model
        self.threads = threads
        self.family = family_of(model)
        self.size = image_size(model)
        # the default dtype "float32" is a string and breaks add_new_frame; pass the torch dtype
        self.session = session_class(self.family)(inference_device="cpu", dtype=torch.float32)
        self.frames_seen = 0
        self.last_step_s = 0.0

    def step(self, tensor: np.ndarray, prompts: Sequence[PromptSpec] = ()) -> dict[int, RefOut]:
        """Process one frame (float32 [1, 3, S, S]) with its prompts; returns {obj_id: RefOut} for all objects."""
        import torch

        arr = np.asarray(tensor, np.float32)
        if arr.shape != (1, 3, self.size, self.size):
            raise ValueError(
                f"sam2_reference.ReferenceRunner.step: frame {self.frames_seen} must be float32 [1, 3, {self.size}, "
                f"{self.size}], got {arr.shape}"
            )
        frame = torch.from_numpy(np.ascontiguousarray(arr))
        idx = self.frames_seen
        sess = self.session
        new_ids: list[int] = []
        converted: list[tuple[int, str, Any]] = []
        for spec in prompts:  # validate everything before touching the session
            if spec.obj_id in new_ids:
                raise ValueError(
                    f"sam2_reference: two prompts for object {spec.obj_id} on frame {idx}; HF keeps only the last"
                )
            converted.append((spec.obj_id, *_prompt_tensors(spec, self.size, idx)))
            new_ids.append(spec.obj_id)
        for obj_id, kind, value in converted:
            obj_idx = sess.obj_id_to_idx(obj_id)  # first use registers the object (order = obj_idx)
            if kind == "mask":
                sess.add_mask_inputs(obj_idx, idx, value)
                sess.remove_point_inputs(obj_idx, idx)
            else:
                sess.add_point_inputs(obj_idx, idx, value)
                sess.remove_mask_inputs(obj_idx, idx)
        # the processor *assigns* obj_with_new_inputs per call; one call per object would drop earlier objects
        sess.obj_with_new_inputs = list(new_ids)
        self.frames_seen += 1
        if sess.get_obj_num() == 0:
            sess.add_new_frame(frame)
            self.last_step_s = 0.0
            return {}
        with torch.inference_mode(), torch_threads(self.threads):
            t0 = time.perf_counter()
            out = self.model(inference_session=sess, frame=frame)
            self.last_step_s = time.perf_counter() - t0
        if out.frame_idx != idx:
            raise RuntimeError(f"sam2_reference: HF processed frame index {out.frame_idx}, expected {idx}")
        masks = out.pred_masks.detach().to(torch.float32).numpy()
        scores = out.object_score_logits.detach().to(torch.float32).reshape(-1).numpy()
        return {
            int(oid): RefOut(logits=np.array(masks[k, 0], np.float32), score=float(scores[k]))
            for k, oid in enumerate(out.object_ids)
        }


def run_reference(
    model: Any,
    tensors: Sequence[np.ndarray],
    schedule: Mapping[int, Sequence[PromptSpec]],
    threads: int | None = 1,
) -> list[dict[int, RefOut]]:
    """Run HF's streaming tracker over ``tensors`` with the prompt ``schedule`` {frame: [PromptSpec]}.

    Returns one {obj_id: RefOut} per frame (empty before the first prompt). See ``ReferenceRunner``.
    """
    bad = [k for k in schedule if not 0 <= k < len(tensors)]
    if bad:
        raise ValueError(f"sam2_reference.run_reference: schedule frames {bad} outside 0..{len(tensors) - 1}")
    runner = ReferenceRunner(model, threads)
    return [runner.step(t, schedule.get(i, ())) for i, t in enumerate(tensors)]


def time_reference(
    model: Any,
    tensors: Sequence[np.ndarray],
    schedule: Mapping[int, Sequence[PromptSpec]],
    threads: int | None = 1,
) -> float:
    """Median wall time in ms per frame of HF ``forward`` over the tracking frames (frames with objects and no
    prompts), for benchmarks; ``threads`` torch threads (None: torch's current setting)."""
    runner = ReferenceRunner(model, threads)
    times: list[float] = []
    for i, t in enumerate(tensors):
        prompts = schedule.get(i, ())
        runner.step(t, prompts)
        if not prompts and runner.session.get_obj_num() > 0:
            times.append(runner.last_step_s * 1e3)
    if not times:
        raise ValueError(
            "sam2_reference.time_reference: no tracking frames (every frame had prompts or no objects)"
        )
    return float(statistics.median(times))


def default_schedule(size: int, box_for_second: bool = True) -> dict[int, list[PromptSpec]]:
    """The parity-test schedule on ``make_frames`` video of side ``size``.

    Frame 0: object 1 = the red disk, a positive click at its centre and a negative click on the background.
    Frame 12: a correction click (positive, inside the disk, off-centre) for object 1.
    Frame 20: object 2 = the blue rectangle, by its box (or a click at its centre when ``box_for_second`` is False).
    """
    cx, cy = shape_center(0, size, "disk")
    neg = (size * 0.08, size * 0.92)
    c12x, c12y = shape_center(12, size, "disk")
    r = size / 128.0 * 14.0
    schedule = {
        0: [PromptSpec(1, points=[(cx, cy), neg], labels=[1, 0])],
        12: [PromptSpec(1, points=[(c12x + 0.4 * r, c12y - 0.3 * r)], labels=[1])],
    }
    if box_for_second:
        schedule[20] = [PromptSpec(2, box=shape_box(20, size, "rect"))]
    else:
        schedule[20] = [PromptSpec(2, points=[shape_center(20, size, "rect")], labels=[1])]
    return schedule


# ----------------------------------------------------------------------------------------------------------------
# tiny models with the object-score fix
# ----------------------------------------------------------------------------------------------------------------

OBJ_SCORE_MODES: tuple[str, ...] = ("mixed", "present", "raw")

#: standard deviation of the values given to parameters that HF initialises to exact zeros
ZERO_PARAM_STD = 0.1
#: offset that keeps the LayerNorm'd object token positive through the head's ReLUs (|h_i| <= sqrt(127) < 12)
_LN_OFFSET = 12.0
#: the calibration maps the nearest clear / occluded calibration frame to +/- this score
_CAL_MARGIN = 2.0
#: a calibration is accepted when every calibration score is at least this far from 0 with the right sign
_CAL_ACCEPT = 1.5
_CAL_FRAMES = 14
_CAL_OCCLUDED = (4, 5, 6, 11)
_mixed_cache: dict[tuple[str, int, str], tuple[Any, float, float]] = {}


def _weights_digest(model: Any) -> str:
    """A short digest of all parameters except the object-score head (the calibration cache key)."""
    import hashlib

    h = hashlib.sha1()
    for name, p in model.named_parameters():
        if "pred_obj_score_head" not in name:
            h.update(name.encode())
            h.update(p.detach().to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _randomize_zero_params(model: Any, seed: int) -> list[str]:
    """Give every all-zero, non-bias parameter small seeded normal values; returns their names.

    HF zero-initialises ``no_memory_embedding``, ``no_memory_positional_encoding``,
    ``memory_temporal_positional_encoding``, ``no_object_pointer``, ``occlusion_spatial_embedding_parameter``,
    ``memory_encoder.memory_fuser.layers.*.scale`` and (Hiera) ``vision_encoder.backbone.pos_embed*``. At zero a
    parity test cannot notice a wrong temporal slot, a missing occlusion embedding or no-object pointer, or a skipped
    memory fuser; real checkpoints have non-zero values there.
    """
    import torch

    gen = torch.Generator().manual_seed(10_007 + seed)
    names: list[str] = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or p.numel() == 0 or not bool((p == 0).all()):
                continue
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype) * ZERO_PARAM_STD)
            names.append(name)
    return names


#: factor on the hypernetwork output layers: random mask logits ~1e-3 become ~1..5 (real SAM logits are ~±10)
MASK_LOGIT_SCALE = 4000.0
#: factor on the IoU head's output layer: random IoU predictions 0.5 +/- 5e-4 (argmax gaps ~2e-5) spread out
IOU_LOGIT_SCALE = 1000.0


def _scale_decoder_heads(model: Any) -> None:
    """Scale the mask hypernetworks' and the IoU head's last layers (weight and bias) of the mask decoder.

    With random weights the low-res mask logits are ~1e-3 and the IoU predictions 0.5 +/- 5e-4: then an absolute
    tolerance check on logits is almost vacuous, the memory encoder sees sigmoid(logit) ~ 0.5 everywhere (so a wrong
    mask plane would hardly change the memory), the stability fallback always fires, and the IoU argmax that picks
    the multimask plane has gaps of ~2e-5. Scaling makes these decisions content-driven and far from ties.
    """
    import torch

    dec = model.mask_decoder
    with torch.no_grad():
        for mlp in dec.output_hypernetworks_mlps:
            mlp.proj_out.weight.mul_(MASK_LOGIT_SCALE)
            mlp.proj_out.bias.mul_(MASK_LOGIT_SCALE)
        dec.iou_prediction_head.proj_out.weight.mul_(IOU_LOGIT_SCALE)
        dec.iou_prediction_head.proj_out.bias.mul_(IOU_LOGIT_SCALE)


def _score_head(model: Any) -> Any:
    head = model.mask_decoder.pred_obj_score_head
    if len(head.layers) != 1 or head.proj_in.in_features != head.proj_in.out_features or head.sigmoid_output:
        raise RuntimeError(
            f"sam2_reference: unexpected {type(head).__name__} layout (expected proj_in D->D, one hidden layer, "
            "proj_out D->1, no sigmoid)"
        )
    return head


def _set_present_head(model: Any) -> None:
    """Keep the random head but scale its output by 10 and add +2: scores ~ 2 +/- 0.1, always present."""
    import torch

    head = _score_head(model)
    with torch.no_grad():
        head.proj_out.weight.mul_(10.0)
        head.proj_out.bias.fill_(2.0)


def _set_linear_head(model: Any, u: Any, t: float, k: float) -> None:
    """Rewire the head to score = k * (u . h - t), h = the LayerNorm'd object token (ReLUs kept inactive)."""
    import torch

    head = _score_head(model)
    d = head.proj_in.in_features
    eye = torch.eye(d, dtype=head.proj_in.weight.dtype)
    with torch.no_grad():
        head.proj_in.weight.copy_(eye)
        head.proj_in.bias.fill_(_LN_OFFSET)  # h + 12 > 0, so the ReLUs pass it unchanged
        head.layers[0].weight.copy_(eye)
        head.layers[0].bias.zero_()
        head.proj_out.weight.copy_((k * u).reshape(1, d).to(head.proj_out.weight.dtype))
        head.proj_out.bias.fill_(-k * (_LN_OFFSET * float(u.sum()) + t))


def _calibration_run(model: Any, seed: int) -> tuple[Any, Any]:
    """Stream the calibration clip; returns (object tokens [R, D], bool [R] occluded) of every decoder call."""
    import torch

    family = family_of(model)
    size = image_size(model)
    mean, std = mean_std(family)
    tensors = [
        to_tensor(f, mean, std) for f in make_frames(_CAL_FRAMES, size, seed=seed + 1, occluded=_CAL_OCCLUDED)
    ]
    schedule = {
        0: [PromptSpec(1, points=[shape_center(0, size, "disk")], labels=[1])],
        8: [PromptSpec(2, points=[shape_center(8, size, "rect")], labels=[1])],
    }
    rows: list[Any] = []
    occluded: list[bool] = []
    current = [0]

    def grab(_module: Any, args: tuple[Any, ...]) -> None:
        h = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float32).clone()
        rows.append(h)
        occluded.extend([current[0] in _CAL_OCCLUDED] * h.shape[0])

    hook = _score_head(model).register_forward_pre_hook(grab)
    try:
        runner = ReferenceRunner(model)
        for i, t in enumerate(tensors):
            current[0] = i
            runner.step(t, schedule.get(i, ()))
    finally:
        hook.remove()
    return torch.cat(rows), torch.tensor(occluded)


def _calibrate_mixed(model: Any, family: str, seed: int) -> None:
    """Fit score = k (u . h - t) so that it is >= +2 on clear and <= -2 on curtain frames of a calibration clip.

    u is the normalised difference of the mean object token on clear and on occluded frames, t the midpoint of the
    gap between the two classes along u, k maps half the gap to ``_CAL_MARGIN``. The trajectory depends on the
    signs (absent objects store occlusion memories), so it is refitted on a run with the fitted head until a run
    confirms every calibration score is at least ``_CAL_ACCEPT`` from 0 with the right sign.
    """
    import torch

    key = (family, seed, _weights_digest(model))
    if key in _mixed_cache:
        u, t, k = _mixed_cache[key]
        _set_linear_head(model, u, t, k)
        return
    original = {n: p.detach().clone() for n, p in _score_head(model).named_parameters()}
    _set_present_head(model)  # first pass: everything present, close to the final trajectory on clear frames
    fitted: tuple[Any, float, float] | None = None
    for _ in range(4):
        h, occ = _calibration_run(model, seed)
        if fitted is not None:
            u, t, k = fitted
            s = k * (h @ u - t)
            if bool((s[~occ] >= _CAL_ACCEPT).all()) and bool((s[occ] <= -_CAL_ACCEPT).all()):
                _mixed_cache[key] = fitted
                return
        if bool(occ.all()) or not bool(occ.any()):
            raise RuntimeError("sam2_reference: calibration clip needs both clear and occluded decoder calls")
        u = h[~occ].mean(0) - h[occ].mean(0)
        u = u / u.norm()
        p = h @ u
        lo, hi = float(p[~occ].min()), float(p[occ].max())
        if lo <= hi:
            break
        fitted = (u, (lo + hi) / 2.0, _CAL_MARGIN / ((lo - hi) / 2.0))
        _set_linear_head(model, *fitted)
    with torch.no_grad():
        for n, p in _score_head(model).named_parameters():
            p.copy_(original[n])
    raise RuntimeError(
        f"sam2_reference: could not calibrate a 'mixed' object-score head for {family} seed {seed} (clear and "
        "occluded object tokens overlap); use make_tiny_model(..., obj_score='present')"
    )


def make_tiny_model(
    family: str,
    seed: int = 0,
    obj_score: str = "mixed",
    randomize_zeros: bool = True,
    scale_heads: bool = True,
) -> Any:
    """A tiny random eval-mode HF video model of ``family`` with the parity fixes applied.

    ``torch.manual_seed(seed)`` before construction; zero-initialised parameters get seeded random values
    (``randomize_zeros``, see ``_randomize_zero_params``); the mask and IoU heads' last layers are scaled
    (``scale_heads``, see ``_scale_decoder_heads``); then the object-score head (``mask_decoder.pred_obj_score_head``,
    random scores ~±0.003) is replaced according to ``obj_score``:

    - "mixed" (default): score = k (u . h - t) on the object token h, calibrated so that it is clearly positive on
      normal frames and clearly negative on frames where ``make_frames``' grey curtain hides the scene (the HF
      occlusion path: -1024 masks, no-object pointer, occlusion memory). |score| >= 1.5 on the calibration clip
      (14 frames, two objects; fitted in ~2 runs, cached per weights), >= ~1.5 on the default 32-frame video.
    - "present": the random head x10 + 2, so scores ~2 +/- 0.1 on every frame.
    - "raw": HF's random head untouched (knife-edge scores; for experiments only).
    """
    _check_family(family)
    if obj_score not in OBJ_SCORE_MODES:
        raise ValueError(
            f"sam2_reference.make_tiny_model: obj_score must be one of {OBJ_SCORE_MODES}, got {obj_score!r}"
        )
    import torch

    torch.manual_seed(seed)
    model = model_class(family)(tiny_config(family)).eval()
    if randomize_zeros:
        _randomize_zero_params(model, seed)
    if scale_heads:
        _scale_decoder_heads(model)
    if obj_score == "present":
        _set_present_head(model)
    elif obj_score == "mixed":
        _calibrate_mixed(model, family, seed)
    return model


def save_tiny(
    family: str,
    out_dir: str | Path,
    seed: int = 0,
    obj_score: str = "mixed",
    randomize_zeros: bool = True,
    scale_heads: bool = True,
) -> Path:
    """``save_pretrained`` (config.json + model.safetensors) the tiny model into ``out_dir``; returns the path.
    ``seed``, ``obj_score``, ``randomize_zeros``, ``scale_heads``: as in :func:`make_tiny_model` (all off with
    ``obj_score="raw"`` gives HF's own random initialisation).

    ``model_class(family).from_pretrained(out_dir)`` reloads identical weights (eval mode); ``load_tiny`` also
    makes the outputs bit-identical (see there).
    """
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    make_tiny_model(family, seed, obj_score, randomize_zeros, scale_heads).save_pretrained(path)
    if not (path / "model.safetensors").is_file():
        raise RuntimeError(f"sam2_reference.save_tiny: save_pretrained wrote no model.safetensors in {path}")
    return path


def load_tiny_at(family: str, path: str | Path, size: int) -> Any:
    """The model written by ``save_tiny``, rebuilt from ``tiny_config(family, size)`` with the same weights."""
    import torch

    saved = load_tiny(family, path)
    model = model_class(family)(tiny_config(family, size)).eval()
    model.load_state_dict(saved.state_dict(), strict=True)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.data = t.data.clone()
    return model


def load_tiny(family: str, path: str | Path) -> Any:
    """Reload a model written by ``save_tiny`` (eval mode, float32), bit-identical in its outputs to the original.

    ``from_pretrained`` leaves the tensors in the memory-mapped safetensors buffer at addresses that are not 64-byte
    aligned, and CPU matmul kernels then round differently (1 ulp, growing to ~1e-5 over 32 frames). Copying every
    parameter and buffer into a fresh allocation restores bit-identical outputs.
    """
    import torch

    model = model_class(family).from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            t.data = t.data.clone()
    return model
