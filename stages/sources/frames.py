"""Directories of numbered JPEG/PNG frames (the DAVIS layout), read in natural order.

Threading: one thread calls ``open``/``read``/``close``; :meth:`interrupt` may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from vostream.pipeline.errors import ConfigError, SourceError
from vostream.pipeline.stage import Source
from vostream.pipeline.types import Frame
from vostream.stages.sources.file import _one_line

logger = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")


def natural_key(name: str) -> list[tuple[int, int, str]]:
    """Sort key where digit runs compare as numbers: ``2.png`` < ``10.png``."""
    return [
        (0, int(part), part) if part.isdigit() else (1, 0, part.lower())
        for part in re.split(r"(\d+)", name)
        if part
    ]


def list_images(directory: str | os.PathLike[str]) -> list[Path]:
    """The JPEG/PNG files of ``directory`` in natural order."""
    files = [p for p in Path(directory).iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS]
    return sorted(files, key=lambda p: natural_key(p.name))


def _read_image(path: Path) -> np.ndarray | None:
    data = np.fromfile(str(path), dtype=np.uint8)
    if not len(data):
        return None
    image = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if image is None:
        return None
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


class FrameDirSource(Source[Frame]):
    """A directory of numbered JPEG/PNG frames (DAVIS layout), natural order, all of one size.

    Raises :class:`SourceError` for a missing path, a path that is not a directory, a directory without images
    and an image whose size differs from the first (naming it).  Unreadable images are skipped and counted in
    ``stats()["corrupt_frames"]``; a frame's ``index`` is its file's position in the sorted list (after
    ``start``), so a skipped image leaves a gap in the indices instead of shifting every later frame.  Not thread-safe except :meth:`interrupt`.
    """

    live = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        start: int = 0,
        max_frames: int | None = None,
        fps: float | None = None,
        source_id: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise SourceError(f"no such file or directory: {self.path!r}")
        if not os.path.isdir(self.path):
            raise SourceError(f"{self.path!r} is not a directory of frames")
        if start < 0:
            raise ConfigError(f"start must be >= 0, got {start}")
        if fps is not None and not fps > 0:
            raise ConfigError(f"fps must be positive, got {fps}")
        self.start = int(start)
        self.max_frames = max_frames
        self.fps = float(fps) if fps else 0.0
        self.source_id = source_id or os.path.basename(os.path.normpath(self.path))
        self.name = f"source:{self.source_id}"
        self.files: list[Path] = []
        self.width = 0
        self.height = 0
        self.length: int | None = None
        self._pos = 0
        self._delivered = 0
        self._corrupt = 0
        self._opened = False
        self._stop = threading.Event()

    def open(self) -> None:
        if self._opened:
            return
        try:
            files = list_images(self.path)
        except OSError as err:
            raise SourceError(f"cannot list {self.path!r}: {_one_line(err)}") from err
        if not files:
            raise SourceError(
                f"no images in {self.path} (expected numbered frames such as 00000.jpg or 00000.png)"
            )
        files = files[self.start :]
        if self.max_frames is not None:
            files = files[: self.max_frames]
        if not files:
            raise SourceError(f"{self.path!r} has fewer than start={self.start} images")
        self.files = files
        self.length = len(files)
        for path in files:  # the size of the first readable image fixes the frame size
            image = _read_image(path)
            if image is not None:
                self.height, self.width = image.shape[:2]
                break
        else:
            raise SourceError(f"no readable images in {self.path!r} ({len(files)} unreadable files)")
        self._opened = True

    def read(self) -> Frame | None:
        if self._stop.is_set():
            return None
        if not self._opened:
            self.open()
        while self._pos < len(self.files):
            path = self.files[self._pos]
            index = self._pos  # the file's position (after ``start``): a skipped file leaves a gap
            pts = self._pos + self.start
            self._pos += 1
            image = _read_image(path)
            if image is None:
                self._corrupt += 1
                logger.warning("%s: skipped unreadable image", path)
                continue
            if image.shape[:2] != (self.height, self.width):
                raise SourceError(
                    f"{path} is {image.shape[1]}x{image.shape[0]} but the frames of {self.path} are "
                    f"{self.width}x{self.height}; every frame must have the same size"
                )
            frame = Frame(
                index=index,
                image=image,
                pts=pts,
                time_base=Fraction(1) / Fraction(self.fps).limit_denominator(1001000) if self.fps else None,
                capture_time=time.time(),
                source_id=self.source_id,
            )
            self._delivered += 1
            return frame
        return None

    def interrupt(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._pos = len(self.files)

    def stats(self) -> dict[str, object]:
        return {"frames": self._delivered, "corrupt_frames": self._corrupt}

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.read()) is not None:
            yield frame

    def __enter__(self) -> FrameDirSource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FrameDirSource", "IMAGE_EXTENSIONS", "list_images", "natural_key"]
