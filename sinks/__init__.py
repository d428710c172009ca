"""File sinks (annotated MP4, DAVIS PNG masks, YouTube-VIS JSON, MOT text) and the overlay drawing they share.

Each output is an inert, picklable ``*SinkSpec``; ``spec.build()`` returns the sink that owns the files.  All
files are written atomically.  :func:`build_file_sinks` gives the conventional layout of an output directory
(``docs/outputs.md``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from vostream.pipeline.errors import ConfigError
from vostream.pipeline.stage import SinkSpec
from vostream.pipeline.types import Frame

from .mot import MotSink, MotSinkSpec
from .overlay import DAVIS_PALETTE, OverlayStyle, color_for, draw_overlay
from .png import PngSink, PngSinkSpec
from .video import VideoSink, VideoSinkSpec
from .vis_json import VisJsonSink, VisJsonSinkSpec

logger = logging.getLogger(__name__)

#: format name → file or directory name inside the output directory
FILE_FORMATS: dict[str, str] = {
    "video": "overlay.mp4",
    "png": "masks",
    "json": "annotations.json",
    "mot": "mot.txt",
}


def build_file_sinks(
    out_dir: str | os.PathLike[str],
    formats: Iterable[str] = ("video", "png", "json", "mot"),
    fps: float | None = None,
    source_name: str | None = None,
    *,
    clock: str = "source",
    options: dict[str, str] | None = None,
) -> list[SinkSpec[Frame]]:
    """Sink specs for ``formats`` under ``out_dir``: ``overlay.mp4``, ``masks/00000.png``..., ``annotations.json``,
    ``mot.txt``.

    ``fps`` (a positive number) makes the video constant-rate; ``None``/0 keeps the frames' timestamps.
    ``source_name`` names the video in the JSON.  ``clock`` and ``options`` (extra encoder options) go to
    :class:`VideoSinkSpec` (``clock="capture"`` for live feeds); other video settings: build a ``VideoSinkSpec``.  Raises
    :class:`ConfigError` for an unknown format.  Nothing is created until a sink is opened.
    """
    out = Path(out_dir)
    specs: list[SinkSpec[Frame]] = []
    seen: set[str] = set()
    for fmt in formats:
        key = str(fmt).strip().lower()
        if key not in FILE_FORMATS:
            raise ConfigError(f"unknown output format {fmt!r}; choose from {', '.join(FILE_FORMATS)}")
        if key in seen:
            continue
        seen.add(key)
        target = out / FILE_FORMATS[key]
        if key == "video":
            specs.append(
                VideoSinkSpec(
                    target, fps=fps if fps and fps > 0 else None, clock=clock, options=dict(options or {})
                )
            )
        elif key == "png":
            specs.append(PngSinkSpec(target))
        elif key == "json":
            specs.append(VisJsonSinkSpec(target, video_name=source_name))
        else:
            specs.append(MotSinkSpec(target))
    return specs


__all__ = [
    "DAVIS_PALETTE",
    "FILE_FORMATS",
    "MotSink",
    "MotSinkSpec",
    "OverlayStyle",
    "PngSink",
    "PngSinkSpec",
    "VideoSink",
    "VideoSinkSpec",
    "VisJsonSink",
    "VisJsonSinkSpec",
    "build_file_sinks",
    "color_for",
    "draw_overlay",
]
