"""MOTChallenge text output: ``frame,id,x,y,w,h,score,-1,-1,-1`` with 1-based frame numbers.

Lines are streamed to a temporary file and moved into place on close (also after an error: the frames so far).
Not thread-safe: one sink thread.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from vostream.pipeline.errors import OutputError
from vostream.pipeline.stage import Sink, SinkSpec
from vostream.pipeline.types import Frame

from .atomic import AtomicFile, ensure_dir

logger = logging.getLogger(__name__)


def mot_lines(frame: Frame) -> list[str]:
    """The MOT lines of one frame: one per present object, frame numbers 1-based."""
    result = frame.result
    if result is None:
        return []
    lines = []
    for oid, (x0, y0, x1, y1), score, present in zip(
        result.obj_ids.tolist(), result.boxes.tolist(), result.scores.tolist(), result.present.tolist()
    ):
        if present and x1 > x0 and y1 > y0:
            lines.append(
                f"{frame.index + 1},{oid},{x0:.2f},{y0:.2f},{x1 - x0:.2f},{y1 - y0:.2f},{score:.4f},-1,-1,-1"
            )
    return lines


@dataclass(frozen=True)
class MotSinkSpec(SinkSpec[Frame]):
    """A MOTChallenge text file.  Inert and picklable."""

    path: str | os.PathLike[str]
    name: str = "mot"
    policy: str | None = None
    queue_size: int = 8

    def build(self) -> MotSink:
        return MotSink(self)


class MotSink(Sink[Frame]):
    """Streams MOT lines into a temporary file; ``close()`` moves it into place.  Idempotent close."""

    def __init__(self, spec: MotSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.path = Path(spec.path)
        self._file: AtomicFile | None = None
        self._lines = 0
        self._closed = False

    def open(self) -> None:
        if self._file is not None:
            return
        ensure_dir(self.path.parent, "MOT output")
        self._file = AtomicFile(self.path, "w")
        self._closed = False

    def write(self, frame: Frame) -> None:
        if self._closed:
            raise OutputError(f"MOT sink {self.path}: write after close")
        if self._file is None:
            self.open()
        assert self._file is not None
        lines = mot_lines(frame)
        if lines:
            self._file.write("\n".join(lines) + "\n")
            self._lines += len(lines)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        file, self._file = self._file, None
        if file is not None:
            file.commit()
            logger.info("%s: wrote %d lines", self.path, self._lines)

    def stats(self) -> dict[str, object]:
        return {"lines": self._lines}


__all__ = ["MotSink", "MotSinkSpec", "mot_lines"]
