"""Sources: where frames enter the pipeline, decoded to upright RGB.

``file`` decodes video files with PyAV, ``frames`` reads directories of numbered images, ``live`` follows RTSP,
HTTP and camera feeds and reconnects when they drop.  :func:`open_source` picks one for a URI; :func:`probe` reads
a file's size, rate and rotation cheaply.  Every source yields :class:`~vostream.pipeline.types.Frame` objects and
returns ``None`` at end of stream (``docs/sources.md``).
"""

from __future__ import annotations

import os

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
            source.codec,
            source.rotation,
        )
    finally:
        source.close()


def is_live_uri(uri: str | os.PathLike[str]) -> bool:
    """True for network streams and cameras (``rtsp://``, ``http(s)://``, ``/dev/video0``, a camera index)."""
    text = os.fspath(uri)
    return text.lower().startswith(_LIVE_PREFIXES) or text.isdigit()


#: ``open_live_source(uri, ...)`` is :class:`~vostream.stages.sources.live.LiveSource`'s constructor (a live feed:
#: RTSP, HTTP, cameras; ``live = True``: reconnects by itself; ``docs/live.md``).  Its options are explicit
#: keyword-only parameters: an unknown one is a ``TypeError`` at the call (and a mypy error), a bad value a
#: :class:`ConfigError`.
open_live_source = open_live


def open_source(
    uri: str | os.PathLike[str],
    *,
    start: int = 0,
    max_frames: int | None = None,
    fps: float | None = None,
    threads: str | int | None = None,
    source_id: str | None = None,
) -> Source[Frame]:
    """The source for ``uri``: a directory → :class:`FrameDirSource`, a file → :class:`VideoFileSource`,
    a live URI → :func:`open_live_source` (which takes the live-only options: transport, reconnect policy, ...).

    ``start``: frames to skip (files and directories); ``max_frames``: the most frames to deliver;
    ``fps``: the frame rate of a directory of images (or a live feed's nominal rate; a file's comes from its
    stream); ``threads``: a file's decoder threads (``"AUTO"`` when None); ``source_id``: the name in outputs.
    Options of one kind only (a file's ``timeout``, a live feed's ``transport``) go to that source's constructor.

    Raises :class:`SourceError` when ``uri`` does not exist and :class:`ConfigError` for an option the kind of
    source found does not take (e.g. ``fps`` for a video file) or a bad value.  An unknown option is a
    ``TypeError`` at the call.
    """
    text = os.fspath(uri)
    if text.startswith("file://"):
        text = text[len("file://") :]

    def refuse(kind: str, **given: object) -> None:
        names = [name for name, value in given.items() if value is not None]
        if names:
            raise ConfigError(f"{' and '.join(names)}: not an option of {kind} ({text!r})")

    if is_live_uri(text):
        refuse("a live source", start=start or None, threads=threads)
        return open_live_source(text, fps=fps, max_frames=max_frames, source_id=source_id)
    if os.path.isdir(text):
        refuse("a frames directory", threads=threads)
        return FrameDirSource(text, start=start, max_frames=max_frames, fps=fps, source_id=source_id)
    if os.path.exists(text):
        refuse("a video file (its rate comes from the stream)", fps=fps)
        return VideoFileSource(
            text,
            threads="AUTO" if threads is None else threads,
            start=start,
            max_frames=max_frames,
            source_id=source_id,
        )
    raise SourceError(f"no such file or directory: {text!r}")


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
