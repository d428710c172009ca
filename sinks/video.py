"""The annotated-video sink: an H.264 MP4 (by default) of the frames with masks, contours and ids drawn.

Written with PyAV to ``NAME.<random>.tmp`` and moved into place on :meth:`VideoSink.close`, which flushes the
encoder, so a run stopped by an error or Ctrl-C still leaves a valid, playable MP4 of the frames written so far.
See ``docs/outputs.md`` for timing and size rules.  Not thread-safe: one sink thread.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import av
import numpy as np

from vostream.pipeline.errors import ConfigError, OutputError
from vostream.pipeline.stage import Sink, SinkSpec
from vostream.pipeline.types import Frame

from .atomic import commit, discard, ensure_dir, temp_path_for
from .overlay import OverlayStyle, draw_overlay

if TYPE_CHECKING:
    from av.container import OutputContainer
    from av.video.stream import VideoStream

logger = logging.getLogger(__name__)

_FORMAT_FOR_EXT = {
    ".mp4": "mp4",
    ".m4v": "mp4",
    ".mov": "mov",
    ".mkv": "matroska",
    ".webm": "webm",
    ".avi": "avi",
}
DEFAULT_FPS = 25
#: time base of videos written on the capture clock (clock="capture")
CAPTURE_TIME_BASE = Fraction(1, 90000)


@dataclass(frozen=True)
class VideoSinkSpec(SinkSpec[Frame]):
    """Settings of an annotated video file.  Inert and picklable; :meth:`build` makes the :class:`VideoSink`.

    ``fps=None`` keeps the frames' own timestamps; a number forces a constant rate.  ``clock="capture"`` (live
    sources) takes each frame's time from its capture clock (``Frame.capture_time``, wall seconds) on a 90 kHz
    time base instead, so the video plays in real time: dropped frames and outages stay gaps, and ``fps`` is then
    only the nominal rate.  ``crf``/``preset`` apply to libx264; ``options`` are extra encoder options.
    """

    path: str | os.PathLike[str]
    fps: float | None = None
    codec: str = "libx264"
    crf: int = 23
    preset: str = "veryfast"
    pix_fmt: str = "yuv420p"
    alpha: float = 0.5
    contours: bool = True
    labels: bool = True
    options: dict[str, str] = field(default_factory=dict)
    clock: str = "source"
    name: str = "video"
    policy: str | None = None
    queue_size: int = 8

    def __post_init__(self) -> None:
        if self.fps is not None and not self.fps > 0:
            raise ConfigError(f"video sink {self.path}: fps must be positive, got {self.fps}")
        if self.clock not in ("source", "capture"):
            raise ConfigError(
                f"video sink {self.path}: clock must be 'source' or 'capture', got {self.clock!r}"
            )
        if Path(self.path).suffix.lower() not in _FORMAT_FOR_EXT:
            raise ConfigError(
                f"video sink {self.path}: unknown container; use one of {', '.join(sorted(_FORMAT_FOR_EXT))}"
            )

    def build(self) -> VideoSink:
        return VideoSink(self)


class VideoSink(Sink[Frame]):
    """Owns the encoder and the temporary file.  ``close()`` is idempotent and always finalises."""

    def __init__(self, spec: VideoSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.path = Path(spec.path)
        self.style = OverlayStyle(alpha=spec.alpha, contours=spec.contours, labels=spec.labels)
        self._tmp: Path | None = None
        self._container: OutputContainer | None = None
        self._stream: VideoStream | None = None
        self._size: tuple[int, int] | None = None  # encoded (w, h)
        self._time_base: Fraction | None = None
        self._use_source_pts = spec.fps is None
        self._last_pts: int | None = None
        self._capture_clock = spec.clock == "capture"
        self._t0: float | None = None  # capture time of the first frame (clock="capture")
        self._written = 0
        self._closed = False
        #: a write to the container failed: FFmpeg's muxer state is then undefined, and muxing into it again
        #: (the encoder flush in close) crashed the process (SIGSEGV); only ``container.close()`` is still safe.
        self._broken = False

    def open(self) -> None:
        """Check the directory and the encoder, open the temporary container.  Raises :class:`OutputError`."""
        if self._container is not None:
            return
        ensure_dir(self.path.parent, "video output")
        try:
            av.codec.Codec(self.spec.codec, "w")
        except Exception as err:  # av raises UnknownCodecError (not an FFmpegError) for a missing encoder
            raise OutputError(
                f"video sink {self.path}: encoder {self.spec.codec!r} is not available in this "
                f"PyAV build; try codec='mpeg4'"
            ) from err
        self._tmp = temp_path_for(self.path)
        fmt = _FORMAT_FOR_EXT[self.path.suffix.lower()]
        try:
            self._container = av.open(str(self._tmp), "w", format=fmt)
        except (av.error.FFmpegError, OSError) as err:
            discard(self._tmp)
            raise OutputError(f"cannot write {str(self.path)!r}: {err}") from err
        self._closed = False

    def _add_stream(self, container: OutputContainer, frame: Frame) -> VideoStream:
        h, w = frame.height - frame.height % 2, frame.width - frame.width % 2
        if w == 0 or h == 0:
            raise OutputError(
                f"video sink {self.path}: frame {frame.index} is {frame.width}x{frame.height}, "
                f"too small to encode"
            )
        if (w, h) != (frame.width, frame.height):
            logger.info(
                "%s: cropping %dx%d to %dx%d (the encoder needs even sizes)",
                self.path,
                frame.width,
                frame.height,
                w,
                h,
            )
        if self._use_source_pts and (frame.pts is None or frame.time_base is None):
            self._use_source_pts = False
        rate = Fraction(self.spec.fps or DEFAULT_FPS).limit_denominator(1001000)
        stream = container.add_stream(self.spec.codec, rate=rate)
        if not isinstance(stream, av.VideoStream):
            raise OutputError(f"video sink {self.path}: {self.spec.codec!r} is not a video encoder")
        stream.width, stream.height, stream.pix_fmt = w, h, self.spec.pix_fmt
        if self._capture_clock:
            self._time_base = CAPTURE_TIME_BASE
        elif self._use_source_pts:
            self._time_base = Fraction(frame.time_base)  # type: ignore[arg-type]
        else:
            self._time_base = 1 / rate
        stream.time_base = self._time_base
        stream.codec_context.time_base = self._time_base
        options: dict[str, object] = dict(self.spec.options)
        if self.spec.codec == "libx264":
            options = {"crf": str(self.spec.crf), "preset": self.spec.preset, **options}
        if options:
            stream.options = options
        self._stream, self._size = stream, (w, h)
        return stream

    def write(self, frame: Frame) -> None:
        """Draw ``frame.result`` on a copy of the frame and encode it."""
        if self._closed:
            raise OutputError(f"video sink {self.path}: write after close")
        if self._container is None:
            self.open()
        container = self._container
        assert container is not None  # open() made it or raised
        stream = self._stream if self._stream is not None else self._add_stream(container, frame)
        assert self._size is not None
        w, h = self._size
        if frame.width < w or frame.height < h:
            raise OutputError(
                f"video sink {self.path}: frame {frame.index} is {frame.width}x{frame.height} "
                f"but the video is {w}x{h}; the source changed size mid-stream"
            )
        image = draw_overlay(frame.image, frame.result, self.style)[:h, :w]
        av_frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
        av_frame.pts = self._next_pts(frame)
        av_frame.time_base = self._time_base
        if self._broken:
            raise OutputError(f"video sink {self.path}: write after a failed write")
        try:
            for packet in stream.encode(av_frame):
                container.mux(packet)
        except (av.error.FFmpegError, OSError) as err:
            self._broken = True
            raise OutputError(
                f"cannot write {str(self.path)!r} (frame {frame.index}): {_reason(err)}"
            ) from err
        self._written += 1

    def _next_pts(self, frame: Frame) -> int:
        if self._capture_clock:
            if self._t0 is None:
                self._t0 = frame.capture_time
            pts = round((frame.capture_time - self._t0) / CAPTURE_TIME_BASE)
        elif self._use_source_pts and frame.pts is not None and frame.time_base == self._time_base:
            pts = int(frame.pts)
        elif (
            self._use_source_pts
            and frame.pts is not None
            and frame.time_base is not None
            and self._time_base is not None
        ):
            pts = round(frame.pts * frame.time_base / self._time_base)
        else:
            pts = self._written
        if self._last_pts is not None and pts <= self._last_pts:
            pts = self._last_pts + 1
        self._last_pts = pts
        return pts

    def close(self) -> None:
        """Flush the encoder, close the container and move the file into place.  Idempotent.

        With no frame written nothing is created.  Raises :class:`OutputError` if finalising fails (the
        temporary file is removed).  After a failed write (a full disk; :meth:`write` raised the error) nothing is
        muxed into the container again: it is only closed and the temporary file removed.
        """
        if self._closed:
            return
        self._closed = True
        container, self._container = self._container, None
        if container is None:
            return
        tmp = self._tmp
        assert tmp is not None
        failed_before = self._broken  # write() already raised the OutputError for that
        error: BaseException | None = None
        if not failed_before:
            try:
                if self._stream is not None:
                    for packet in self._stream.encode(None):
                        container.mux(packet)
            except (av.error.FFmpegError, OSError) as err:
                self._broken, error = True, err
        try:  # always: it releases the file (and its disk space), also after a failed write
            container.close()
        except (av.error.FFmpegError, OSError) as err:
            error = error or err
        if failed_before or error is not None:
            discard(tmp)
        if failed_before:
            logger.warning("%s: not written (a write failed); the temporary file was removed", self.path)
            return
        if error is not None:
            raise OutputError(
                f"cannot write {str(self.path)!r}: finalising the video failed: {_reason(error)}"
            ) from error
        if self._written == 0:
            discard(tmp)
            logger.warning("%s: no frames were written; no video created", self.path)
            return
        commit(tmp, self.path)
        logger.info("%s: wrote %d frames", self.path, self._written)

    def stats(self) -> dict[str, object]:
        return {"frames": self._written}


def _reason(err: BaseException) -> str:
    """``No space left on device`` rather than FFmpeg's repr with the temporary file's name."""
    strerror = getattr(err, "strerror", None)
    return str(strerror) if strerror else str(err)


__all__ = ["VideoSink", "VideoSinkSpec"]
