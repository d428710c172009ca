"""YouTube-VIS-style JSON of per-frame COCO RLE masks, written atomically on close.

The schema is documented in ``docs/outputs.md``.  While running, the sink keeps only RLE strings, boxes, areas and
scores per object and frame (never full masks), so memory grows with the compressed size of the masks (~1 KB per
frame and object).  With ``roll_frames`` (set for live sources) it writes a part file every ``roll_frames`` frame
indices and forgets them, so memory stays flat however long the run.  Not thread-safe: one sink thread.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from vostream.pipeline.errors import ConfigError, OutputError
from vostream.pipeline.stage import Sink, SinkSpec
from vostream.pipeline.types import Frame, Rle

from .atomic import AtomicFile, ensure_dir

logger = logging.getLogger(__name__)

#: ``roll_frames`` of a live run's JSON: a part file every 18,000 frame indices (10 minutes at 30 fps), so the sink
#: holds at most ~18 MB per object however long the feed runs.
LIVE_JSON_ROLL_FRAMES = 18_000


@dataclass(frozen=True)
class VisJsonSinkSpec(SinkSpec[Frame]):
    """A YouTube-VIS JSON file.  ``video_name`` defaults to the frames' ``source_id``.  Inert and picklable."""

    path: str | os.PathLike[str]
    video_name: str | None = None
    category_id: int = 1
    category_name: str = "object"
    name: str = "json"
    policy: str | None = None
    queue_size: int = 8
    #: None: one document for the whole run, written on close.  N: a part file ``<stem>-<part:05d><suffix>``
    #: per N frame indices (frames ``part * N .. part * N + N - 1``), written as soon as a later frame arrives.
    roll_frames: int | None = None

    def __post_init__(self) -> None:
        n = self.roll_frames
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError(
                f"JSON sink {self.path}: roll_frames must be an integer >= 1 or None, got {n!r}"
            )

    def build(self) -> VisJsonSink:
        return VisJsonSink(self)


@dataclass
class _Track:
    """What the sink keeps for one object: frame index → compact per-frame entries."""

    rles: dict[int, str] = field(default_factory=dict)
    boxes: dict[int, list[float]] = field(default_factory=dict)
    areas: dict[int, int] = field(default_factory=dict)
    scores: dict[int, float] = field(default_factory=dict)


class VisJsonSink(Sink[Frame]):
    """Collects RLEs per object; :meth:`close` writes the JSON (also after an error: frames so far)."""

    def __init__(self, spec: VisJsonSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.path = Path(spec.path)
        self._tracks: dict[int, _Track] = {}
        self._size: tuple[int, int] = (0, 0)  # (h, w)
        self._length = 0
        self._video_name = spec.video_name
        self._first = 0  # the first frame index of the current part (0 without rolling)
        self._part = 0
        self.parts: list[Path] = []  # part files written so far (rolling only)
        self._frames = 0
        self._opened = False
        self._closed = False

    def open(self) -> None:
        ensure_dir(self.path.parent, "JSON output")
        self._opened = True

    def write(self, frame: Frame) -> None:
        if self._closed:
            raise OutputError(f"JSON sink {self.path}: write after close")
        if not self._opened:
            self.open()
        if self._video_name is None:
            self._video_name = frame.source_id or self.path.stem
        roll = self.spec.roll_frames
        if roll is not None and frame.index >= self._first + roll:
            if self._length > self._first:
                self._write_part()
            self._part = frame.index // roll
            self._first = self._part * roll
            self._tracks.clear()
            self._length = self._first
        self._size = (frame.height, frame.width)
        self._length = max(self._length, frame.index + 1)
        self._frames += 1
        result = frame.result
        if result is None or not len(result):
            return
        if result.masks is None and result.rles is None:
            raise OutputError(
                f"JSON sink {self.path}: frame {frame.index} has no full-size masks; "
                f"run the postprocess stage before the sinks"
            )
        rles = result.to_rles()
        areas = result.masks.sum(axis=(1, 2)) if result.masks is not None else None
        for row, oid in enumerate(result.obj_ids.tolist()):
            track = self._tracks.setdefault(int(oid), _Track())
            if not result.present[row]:
                continue
            x0, y0, x1, y1 = (float(v) for v in result.boxes[row])
            track.rles[frame.index] = rles[row]["counts"]
            track.boxes[frame.index] = [x0, y0, x1 - x0, y1 - y0]
            track.areas[frame.index] = int(areas[row]) if areas is not None else _rle_area(rles[row])
            track.scores[frame.index] = float(result.scores[row])

    def part_path(self, part: int) -> Path:
        """The file of part ``part`` when rolling: ``annotations-00003.json`` for ``annotations.json``."""
        return self.path.with_name(f"{self.path.stem}-{part:05d}{self.path.suffix}")

    def _write_part(self) -> None:
        path = self.part_path(self._part)
        with AtomicFile(path, "w") as f:
            json.dump(self.document(), f.file, separators=(",", ":"))
        self.parts.append(path)
        logger.info("%s: wrote frames %d..%d", path, self._first, self._length - 1)

    def document(self) -> dict[str, object]:
        """The JSON document for the frames written so far (of the current part, when rolling: its lists start at
        frame ``videos[0]["first_frame"]``)."""
        h, w = self._size
        first = self._first
        n = self._length - first
        frames = range(first, self._length)
        name = self._video_name or self.path.stem
        stem = Path(name).stem
        annotations = []
        for oid, track in sorted(self._tracks.items()):
            scores = [track.scores.get(i) for i in frames]
            present = [s for s in scores if s is not None]
            annotations.append(
                {
                    "id": oid,
                    "video_id": 1,
                    "category_id": self.spec.category_id,
                    "iscrowd": 0,
                    "width": w,
                    "height": h,
                    "length": n,
                    "segmentations": [
                        {"size": [h, w], "counts": track.rles[i]} if i in track.rles else None for i in frames
                    ],
                    "bboxes": [track.boxes.get(i) for i in frames],
                    "areas": [track.areas.get(i) for i in frames],
                    "scores": scores,
                    "score": sum(present) / len(present) if present else 0.0,
                }
            )
        video: dict[str, object] = {
            "id": 1,
            "file_name": name,
            "file_names": [f"{stem}/{i:05d}.jpg" for i in frames],
            "width": w,
            "height": h,
            "length": n,
        }
        if self.spec.roll_frames is not None:
            video["first_frame"] = first
        return {
            "info": {"description": "vostream tracking results", "format": "youtube-vis", "version": 1},
            "videos": [video],
            "categories": [
                {
                    "id": self.spec.category_id,
                    "name": self.spec.category_name,
                    "supercategory": self.spec.category_name,
                }
            ],
            "annotations": annotations,
        }

    def close(self) -> None:
        """Write the complete JSON atomically.  Idempotent.  Raises :class:`OutputError` if writing fails."""
        if self._closed:
            return
        self._closed = True
        if not self._opened:
            return
        if self.spec.roll_frames is not None:
            if self._length > self._first or not self.parts:
                self._write_part()
            return
        with AtomicFile(self.path, "w") as f:
            json.dump(self.document(), f, separators=(",", ":"))  # f.write: errors name the file
        logger.info("%s: wrote %d objects over %d frames", self.path, len(self._tracks), self._length)

    def stats(self) -> dict[str, object]:
        return {"frames": self._frames, "objects": len(self._tracks)}


def _rle_area(rle: Rle) -> int:
    from pycocotools import mask as mask_utils

    return int(mask_utils.area({"size": rle["size"], "counts": rle["counts"].encode("ascii")}))


__all__ = ["LIVE_JSON_ROLL_FRAMES", "VisJsonSink", "VisJsonSinkSpec"]
