"""Resize and normalise frames into the tracker's input layout, into preallocated buffers.

:class:`Preprocessor` does the arithmetic for one :class:`~vostream.stages.trackers.base.InputSpec`;
:class:`PreprocessStage` runs it in the pipeline.  Output buffers come from a ring allocated once per source size,
so steady state allocates nothing per frame.  The ring is longer than the number of frames that can be in flight
between this stage and the tracker (queue capacity + the frames held by the two threads), so a buffer is never
overwritten while the tracker still reads it.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

from vostream.pipeline.stage import Stage
from vostream.pipeline.types import Frame

from .trackers.base import InputSpec

_DTYPES = {"uint8": np.uint8, "float32": np.float32, "float16": np.float16}


class Preprocessor:
    """Resize + normalise RGB ``uint8`` images per ``spec`` into a ring of ``ring`` preallocated buffers."""

    def __init__(self, spec: InputSpec, ring: int = 4) -> None:
        if spec.dtype not in _DTYPES:
            raise ValueError(f"unsupported tensor dtype {spec.dtype!r}")
        if spec.layout not in ("HWC", "CHW", "NCHW"):
            raise ValueError(f"unsupported tensor layout {spec.layout!r}")
        self.spec = spec
        self.ring = max(1, ring)
        self._src_size: tuple[int, int] | None = None
        self._size: tuple[int, int] = (0, 0)
        self._resized: np.ndarray | None = None
        self._buffers: list[np.ndarray] = []
        self._next = 0
        mean = np.asarray(spec.mean, np.float32)
        std = np.asarray(spec.std, np.float32)
        # (x / 255 - mean) / std == x * scale + offset
        self._scale = (1.0 / (255.0 * std)).astype(np.float32)
        self._offset = (-mean / std).astype(np.float32)

    def _allocate(self, src_w: int, src_h: int) -> None:
        w, h = self.spec.output_size(src_w, src_h)
        self._src_size, self._size = (src_w, src_h), (w, h)
        self._resized = np.empty((h, w, 3), np.uint8)
        shape = {"HWC": (h, w, 3), "CHW": (3, h, w), "NCHW": (1, 3, h, w)}[self.spec.layout]
        self._buffers = [np.empty(shape, _DTYPES[self.spec.dtype]) for _ in range(self.ring)]
        self._work = np.empty((h, w, 3), np.float32) if self.spec.dtype != "uint8" else None

    @property
    def size(self) -> tuple[int, int]:
        """(w, h) of the last output."""
        return self._size

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """The preprocessed tensor for an RGB ``uint8`` (H, W, 3) image (a view of a ring buffer)."""
        src_h, src_w = image.shape[:2]
        if self._src_size != (src_w, src_h):
            self._allocate(src_w, src_h)
        w, h = self._size
        out = self._buffers[self._next]
        self._next = (self._next + 1) % self.ring
        direct = self.spec.dtype == "uint8" and self.spec.layout == "HWC"
        if (w, h) == (src_w, src_h):
            resized = image
        else:
            interp = cv2.INTER_AREA if w < src_w else cv2.INTER_LINEAR
            # uint8 HWC (the classic tracker's input): resized straight into the ring buffer, no second copy
            resized = cv2.resize(image, (w, h), dst=out if direct else self._resized, interpolation=interp)
        if self.spec.dtype == "uint8":
            if self.spec.layout == "HWC":
                if resized is not out:
                    np.copyto(out, resized)
            else:
                np.copyto(out.reshape(3, h, w), resized.transpose(2, 0, 1))
            return out
        work = self._work
        assert work is not None
        np.multiply(resized, self._scale, out=work, casting="unsafe")
        np.add(work, self._offset, out=work)
        if self.spec.layout == "HWC":
            np.copyto(out, work, casting="same_kind")
        else:
            np.copyto(out.reshape(3, h, w), work.transpose(2, 0, 1), casting="same_kind")
        return out


#: Ring buffers beyond the output edge's capacity: the one the tracker steps on, the one being filled, and two
#: spare (a tracker may keep the previous frame's tensor for its motion estimate).
RING_SPARE = 4


class PreprocessStage(Stage[Frame, Frame]):
    """Sets ``frame.tensor`` for the tracker, into a ring of reused buffers.  The ring holds at least ``ring``
    buffers and, once the pipeline has said how many frames its output edge holds (:meth:`bind_output`), that many
    plus :data:`RING_SPARE`, so a tensor is never overwritten while a frame carrying it is still in flight."""

    name = "preprocess"

    def __init__(self, spec_for: Callable[[int, int], InputSpec], ring: int = 16) -> None:
        self._spec_for = spec_for
        self._ring = ring
        self._pre: Preprocessor | None = None
        self._src: tuple[int, int] | None = None

    def bind_output(self, capacity: int) -> None:
        self._ring = max(self._ring, capacity + RING_SPARE)
        self._pre = None  # a ring already made is remade at the new length

    def process(self, frame: Frame) -> Frame:
        src = (frame.width, frame.height)
        if self._pre is None or self._src != src:
            self._pre = Preprocessor(self._spec_for(*src), ring=self._ring)
            self._src = src
        frame.tensor = self._pre(frame.image)
        return frame


__all__ = ["RING_SPARE", "PreprocessStage", "Preprocessor"]
