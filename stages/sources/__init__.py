"""Sources: where frames enter the pipeline, decoded to upright RGB.

``file`` decodes video files with PyAV, ``frames`` reads directories of numbered images, ``live`` follows RTSP,
HTTP and camera feeds and reconnects when they drop.  :func:`open_source` picks one for a URI; :func:`probe` reads
a file's size, rate and rotation cheaply.  Every source yields :class:`~vostream.pipeline.types.Frame` objects and
returns ``None`` at end of stream (``docs/sources.md``).
"""

from __future__ import annotations

import os
from typing import Any

from vostream.pipeline.errors import ConfigError, SourceError
from vostream.pipeline.stage import Source
from vostream.pipeline.types import Frame
from vostream.stages.sources.file import VideoFileSource, VideoInfo, to_rgb
from vostream.stages.sources.frames import IMAGE_EXTENSIONS, FrameDirSource, list_images, natural_key
from vostream.stages.sources.live import LiveSource, open_live

_LIVE_PREFIXES = (
    "rtsp://",
    "rtsps://",
    "rtmp://",
    "rtmps://",
    "http://",
    "https://",
    "udp://",
    "tcp://",
    "srt://",
    "/dev/video",
)


def probe(
    path: str | os.PathLike[str], timeout: float | tuple[float, float] | None = (10.0, 10.0)
) -> VideoInfo:
    """Size (upright), frame rate, frame-count estimate, codec name and rotation of a video file.

    Decodes only the first frame (needed for the rotation).  A frames directory gives its first image's size,
    ``fps`` 0.0, the image count and codec ``"images"``.  Raises :class:`SourceError` like the sources.
    """
    if os.path.isdir(path):
        frames = FrameDirSource(path)
        frames.open()
        return VideoInfo(frames.width, frames.height, 0.0, frames.length, "images", 0)
    source = VideoFileSource(path, timeout=timeout, threads=1)
    try:
        source.open()
        return VideoInfo(
            source.width,
            source.height,
            source.fps,
            source.length,
            source._stream.codec_context.name,
            source.rotation,
        )
    finally:
        source.close()


def is_live_uri(uri: str | os.PathLike[str]) -> bool:
    """True for network streams and cameras (``rtsp://``, ``http(s)://``, ``/dev/video0``, a camera index)."""
    text = os.fspath(uri)
    return text.lower().startswith(_LIVE_PREFIXES) or text.isdigit()


def open_live_source(uri: str, **options: Any) -> Source[Frame]:
    """The source for a live feed (RTSP, HTTP, cameras): a :class:`~vostream.stages.sources.live.LiveSource`
    (``live = True``: reconnects by itself; ``docs/live.md``).  Raises :class:`ConfigError` for bad options."""
    return open_live(uri, **options)


def open_source(uri: str | os.PathLike[str], **options: Any) -> Source[Frame]:
    """The source for ``uri``: a directory → :class:`FrameDirSource`, a file → :class:`VideoFileSource`,
    a live URI → :func:`open_live_source`.  ``options`` go to the source's constructor.

    Raises :class:`SourceError` when ``uri`` does not exist and :class:`ConfigError` for options the source does
    not take.
    """
    text = os.fspath(uri)
    if text.startswith("file://"):
        text = text[len("file://") :]
    if is_live_uri(text):
        return open_live_source(text, **options)
    if os.path.isdir(text):
        cls: type[Source[Frame]] = FrameDirSource
    elif os.path.exists(text):
        cls = VideoFileSource
    else:
        raise SourceError(f"no such file or directory: {text!r}")
    try:
        return cls(text, **options)  # type: ignore[call-arg]
    except TypeError as err:
        raise ConfigError(f"bad option for {cls.__name__} ({text!r}): {err}") from err


__all__ = [
    "FrameDirSource",
    "IMAGE_EXTENSIONS",
    "LiveSource",
    "VideoFileSource",
    "VideoInfo",
    "is_live_uri",
    "list_images",
    "natural_key",
    "open_live_source",
    "open_source",
    "probe",
    "to_rgb",
]
