"""DAVIS-style palette PNG masks: one ``{frame.index:05d}.png`` per frame, pixel value = object id.

Each file is written atomically (temporary file + ``os.replace``).  Not thread-safe: one sink thread.
"""

from __future__ import annotations

import io
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from vostream.pipeline.errors import OutputError
from vostream.pipeline.stage import Sink, SinkSpec
from vostream.pipeline.types import Frame

from .atomic import atomic_write_bytes, ensure_dir
from .overlay import DAVIS_PALETTE

logger = logging.getLogger(__name__)

_PALETTE_BYTES = DAVIS_PALETTE.tobytes()


def label_png_bytes(labels: np.ndarray) -> bytes:
    """PNG bytes of a (H, W) uint8 label map as a mode-'P' image with the DAVIS palette."""
    labels = np.ascontiguousarray(labels, dtype=np.uint8)
    image = Image.frombytes("P", (labels.shape[1], labels.shape[0]), labels.tobytes())
    image.putpalette(_PALETTE_BYTES)
    buf = io.BytesIO()
    image.save(buf, format="PNG", optimize=False, compress_level=1)
    return buf.getvalue()


@dataclass(frozen=True)
class PngSinkSpec(SinkSpec[Frame]):
    """A directory of DAVIS palette PNGs.  Inert and picklable."""

    dir: str | os.PathLike[str]
    name: str = "png"
    policy: str | None = None
    queue_size: int = 8

    def build(self) -> PngSink:
        return PngSink(self)


class PngSink(Sink[Frame]):
    """Writes one label PNG per frame.  Raises :class:`OutputError` for ids outside 1..255 (naming the frame)."""

    def __init__(self, spec: PngSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.dir = Path(spec.dir)
        self._written = 0
        self._opened = False

    def open(self) -> None:
        ensure_dir(self.dir, "PNG mask")
        self._opened = True

    def write(self, frame: Frame) -> None:
        if not self._opened:
            self.open()
        result = frame.result
        labels = np.zeros((frame.height, frame.width), np.uint8)
        if result is not None and len(result):
            if result.masks is None:
                raise OutputError(
                    f"PNG sink {self.dir}: frame {frame.index} has no full-size masks; "
                    f"run the postprocess stage before the sinks"
                )
            ids = result.obj_ids[result.present]
            bad = ids[(ids < 1) | (ids > 255)]
            if len(bad):
                raise OutputError(
                    f"PNG sink {self.dir}: object id {int(bad[0])} at frame {frame.index} does not "
                    f"fit a palette PNG (ids 1..255); use the JSON output for such ids"
                )
            for oid, mask, present in zip(result.obj_ids, result.masks, result.present):
                if present:
                    labels[mask] = oid
        atomic_write_bytes(self.dir / f"{frame.index:05d}.png", label_png_bytes(labels))
        self._written += 1

    def close(self) -> None:
        """Nothing is buffered: each PNG is complete when :meth:`write` returns.  Idempotent."""
        if self._opened:
            logger.info("%s: wrote %d mask PNGs", self.dir, self._written)
        self._opened = False

    def stats(self) -> dict[str, object]:
        return {"frames": self._written}


__all__ = ["PngSink", "PngSinkSpec", "label_png_bytes"]
