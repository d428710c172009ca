"""Per-family facts for the exporter: which transformers class loads a checkpoint, and the defaults it lacks.

No torch import here, so ``vostream export`` can give a clear error for an unsupported checkpoint before it needs
torch to load anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from vostream.pipeline.errors import ConfigError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Family:
    name: str                       # manifest family
    model_class: str                # transformers class that streams
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    cond_slots: int                 # default C
    batch_binarize: bool            # HF binarizes every object's memory when any object got input this frame
    bank_bf16: bool                 # HF stores the spatial memory in bfloat16
    perceiver: bool = False         # EdgeTAM: the memory encoder ends in the spatial perceiver


FAMILIES: dict[str, Family] = {
    "sam2": Family("sam2", "Sam2VideoModel", IMAGENET_MEAN, IMAGENET_STD, cond_slots=2, batch_binarize=True,
                   bank_bf16=True),
    "edgetam": Family("edgetam", "EdgeTamVideoModel", IMAGENET_MEAN, IMAGENET_STD, cond_slots=2,
                      batch_binarize=False, bank_bf16=False, perceiver=True),
    "sam3_tracker": Family("sam3_tracker", "Sam3TrackerVideoModel", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), cond_slots=4,
                           batch_binarize=True, bank_bf16=True),
}

#: config ``model_type`` -> family.  Hub checkpoints such as ``facebook/sam2.1-hiera-tiny`` carry the image-model
#: type (``sam2``) but load as the video model; ``facebook/sam3`` is a ``sam3_video`` config with a tracker inside.
MODEL_TYPES: dict[str, str] = {
    "sam2_video": "sam2", "sam2": "sam2",
    "edgetam_video": "edgetam", "edgetam": "edgetam",
    "sam3_tracker_video": "sam3_tracker", "sam3_tracker": "sam3_tracker", "sam3_video": "sam3_tracker",
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
            "Sam3TrackerVideoModel (sam3_tracker_video / sam3_video)") from None


__all__ = ["FAMILIES", "IMAGENET_MEAN", "IMAGENET_STD", "MODEL_TYPES", "Family", "family_for"]
