"""Per-family facts for the exporter: which transformers class loads a checkpoint, and the defaults it lacks.

No torch import here, so ``vostream export`` can give a clear error for an unsupported checkpoint before it needs
torch to load anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PretrainedConfig

from vostream.pipeline.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Family:
    name: str  # manifest family
    model_class: str  # transformers class that streams
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    cond_slots: int  # default C
    batch_binarize: bool  # HF binarizes every object's memory when any object got input this frame
    bank_bf16: bool  # HF stores the spatial memory in bfloat16
    perceiver: bool = False  # EdgeTAM: the memory encoder ends in the spatial perceiver


FAMILIES: dict[str, Family] = {
    "sam2": Family(
        "sam2",
        "Sam2VideoModel",
        IMAGENET_MEAN,
        IMAGENET_STD,
        cond_slots=2,
        batch_binarize=True,
        bank_bf16=True,
    ),
    "edgetam": Family(
        "edgetam",
        "EdgeTamVideoModel",
        IMAGENET_MEAN,
        IMAGENET_STD,
        cond_slots=2,
        batch_binarize=False,
        bank_bf16=False,
        perceiver=True,
    ),
    "sam3_tracker": Family(
        "sam3_tracker",
        "Sam3TrackerVideoModel",
        (0.5, 0.5, 0.5),
        (0.5, 0.5, 0.5),
        cond_slots=4,
        batch_binarize=True,
        bank_bf16=True,
    ),
}

#: config ``model_type`` -> family.  Hub checkpoints such as ``facebook/sam2.1-hiera-tiny`` carry the image-model
#: type (``sam2``) but load as the video model; ``facebook/sam3`` is a ``sam3_video`` config with a tracker inside.
MODEL_TYPES: dict[str, str] = {
    "sam2_video": "sam2",
    "sam2": "sam2",
    "edgetam_video": "edgetam",
    "edgetam": "edgetam",
    "sam3_tracker_video": "sam3_tracker",
    "sam3_tracker": "sam3_tracker",
    "sam3_video": "sam3_tracker",
    "sam3": "sam3_tracker",
}


def family_for(model_type: str | None, where: str) -> Family:
    """The family of a checkpoint whose config says ``model_type``; :class:`ConfigError` if unsupported."""
    try:
        return FAMILIES[MODEL_TYPES[str(model_type)]]
    except KeyError:
        raise ConfigError(
            f"{where}: model_type {model_type!r} is not a supported SAM-2-family video model; supported: "
            "Sam2VideoModel (sam2_video / sam2), EdgeTamVideoModel (edgetam_video / edgetam), "
            "Sam3TrackerVideoModel (sam3_tracker_video / sam3_video)"
        ) from None


def image_size_step(config: PretrainedConfig, family: Family) -> int:
    """Input sizes the checkpoint's networks accept are multiples of this (from the config, not hard-coded):

    * the top feature grid's stride (16 for Hiera and RepViT, 14 for the SAM 3 ViT);
    * Hiera: its deepest stage's stride (4 * 2**3 = 32) and the tiling of its window position embedding
      (4 * window, 32 for real checkpoints);
    * timm backbones (EdgeTAM's RepViT): 32;
    * EdgeTAM: the spatial perceiver pools the top grid into sqrt(num_latents_2d) windows a side (16 for the real
      checkpoint, so multiples of 256 px).
    The SAM 3 ViT pads its attention windows and tiles its position embedding, so any multiple of 14 runs."""
    patch = int(config.prompt_encoder_config.patch_size)
    step = patch
    backbone = config.vision_config.backbone_config
    if hasattr(backbone, "window_size_per_stage"):  # Hiera
        strides = int(backbone.patch_stride[0]) * int(backbone.query_stride[0]) ** (
            len(backbone.blocks_per_stage) - 1
        )
        step = lcm(step, strides, int(backbone.patch_stride[0]) * int(backbone.window_size_per_stage[0]))
    elif "timm" in str(getattr(backbone, "model_type", "")):
        step = lcm(step, 32)
    if family.perceiver:
        side = int(round(int(config.perceiver_resampler_num_latents_2d) ** 0.5))
        step = lcm(step, patch * side)
    return step


def resize_config(config: PretrainedConfig, family: Family, size: int) -> None:
    """Set a video-model config (in place) to run at ``size`` x ``size`` pixels: the image size everywhere it is
    kept, the three backbone feature grids (4g, 2g, g for the top grid g) and the memory attention's RoPE grid.
    :class:`ConfigError` when the networks cannot take that size."""
    step = image_size_step(config, family)
    trained = int(config.image_size)
    if size < 2 * step or size % step:
        ok = ", ".join(
            str(v) for v in sorted({max(2, round(trained * f / step)) * step for f in (0.5, 0.75, 1.0)})
        )
        raise ConfigError(
            f"--image-size {size}: this {family.model_class} checkpoint takes multiples of {step} px "
            f"of at least {2 * step} (e.g. {ok}); it was trained at {trained}"
        )
    patch = int(config.prompt_encoder_config.patch_size)
    g = size // patch
    config.image_size = (
        size  # the SAM 3 tracker's setter also sets the prompt encoder's, the ViT's and the grids
    )
    if family.name != "sam3_tracker":
        config.prompt_encoder_config.image_size = size
        backbone = config.vision_config.backbone_config
        if hasattr(backbone, "image_size"):
            backbone.image_size = [size, size] if isinstance(backbone.image_size, (list, tuple)) else size
        config.vision_config.backbone_feature_sizes = [[4 * g] * 2, [2 * g] * 2, [g] * 2]
        config.memory_attention_rope_feat_sizes = [g, g]
    got = (
        int(config.image_size),
        [list(map(int, v)) for v in config.vision_config.backbone_feature_sizes],
        list(map(int, config.memory_attention_rope_feat_sizes)),
    )
    if got != (size, [[4 * g] * 2, [2 * g] * 2, [g] * 2], [g, g]):
        raise ConfigError(
            f"--image-size {size}: could not set the {family.model_class} config consistently "
            f"(image size, feature grids, RoPE grid = {got}); this transformers version may keep "
            "them elsewhere"
        )


__all__ = [
    "FAMILIES",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MODEL_TYPES",
    "Family",
    "family_for",
    "image_size_step",
    "resize_config",
]
