"""Video files decoded with PyAV: upright RGB ``uint8`` :class:`~vostream.pipeline.types.Frame` objects, ``None``
at end of stream.  See ``docs/sources.md`` for the failure behaviour.

Threading: one thread calls ``open``/``read``/``close``; :meth:`interrupt` may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, NamedTuple

import av
import cv2
import numpy as np

from vostream.pipeline.errors import ConfigError, SourceError
from vostream.pipeline.stage import Source
from vostream.pipeline.types import Frame

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.stream import VideoStream

logger = logging.getLogger(__name__)

_ROTATE = {1: cv2.ROTATE_90_COUNTERCLOCKWISE, 2: cv2.ROTATE_180, 3: cv2.ROTATE_90_CLOCKWISE}


class VideoInfo(NamedTuple):
    """What :func:`probe` found.  ``width``/``height`` are the upright size (swapped for 90°/270°)."""

    width: int
    height: int
    fps: float
    frames: int | None
    codec: str
    rotation: int


def _one_line(err: BaseException) -> str:
    strerror = getattr(err, "strerror", None)
    if isinstance(err, av.error.FFmpegError) and strerror:
        return str(strerror)
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def _quarter_turns(rotation: float | int | None) -> int:
    """Counter-clockwise quarter turns for a display-matrix rotation in degrees (nearest multiple of 90)."""
    if not rotation:
        return 0
    return int(round(float(rotation) / 90.0)) % 4


def _upright(image: np.ndarray, turns: int) -> np.ndarray:
    return image if turns == 0 else cv2.rotate(image, _ROTATE[turns])


def _open_container(path: str, timeout: float | tuple[float, float] | None) -> InputContainer:
    """``av.open`` with every PyAV failure mapped to a one-line :class:`SourceError` naming ``path``."""
    if not os.path.exists(path):
        raise SourceError(f"no such file or directory: {path!r}")
    if os.path.isdir(path):
        raise SourceError(
            f"{path!r} is a directory, not a video file; use FrameDirSource for a frames directory"
        )
    try:
        container = av.open(path, timeout=timeout)
    except av.error.EOFError as err:
        raise SourceError(f"{path!r} contains no frames (empty or truncated file)") from err
    except av.error.InvalidDataError as err:
        raise SourceError(
            f"{path!r} is not a video file FFmpeg can read ({_one_line(err)}); "
            f"check the file is complete and not corrupt"
        ) from err
    except (av.error.FFmpegError, OSError) as err:
        raise SourceError(f"cannot open {path!r}: {_one_line(err)}") from err
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams})
        container.close()
        what = f"only {', '.join(kinds)} streams" if kinds else "no streams"
        raise SourceError(f"{path!r} has no video stream ({what}); give a video file")
    return container


def _estimate_frames(stream: VideoStream) -> int | None:
    if stream.frames:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate
    if stream.duration and stream.time_base and rate:
        return max(0, round(float(stream.duration * stream.time_base * rate)))
    container = stream.container
    if isinstance(container, av.container.InputContainer) and container.duration and rate:
        return max(0, round(container.duration / 1_000_000 * float(rate)))
    return None


# Colour spaces whose YUV->RGB matrix is BT.601 as OpenCV's I420 conversion assumes (unspecified, BT.470BG,
# SMPTE 170M), and limited ("MPEG", or unspecified) range.
_BT601 = {2, 5, 6}
_LIMITED = {0, 1}


def to_rgb(frame: av.VideoFrame) -> np.ndarray:
    """RGB uint8 (H, W, 3) of a decoded ``av.VideoFrame``.

    The common case, 4:2:0 limited-range BT.601 video with even sizes, is converted by OpenCV (SIMD, several
    threads): about 7x faster than swscale's ``rgb24`` path here, within +-3 levels of it.  Everything else goes
    through ``to_ndarray(format="rgb24")``.
    """
    if (
        frame.format.name == "yuv420p"
        and not frame.width % 2
        and not frame.height % 2
        and int(frame.colorspace) in _BT601
        and int(frame.color_range) in _LIMITED
    ):
        planes = frame.to_ndarray()  # (H * 3/2, W): Y plane, then U, then V
        if planes.shape == (frame.height * 3 // 2, frame.width):
            return cv2.cvtColor(planes, cv2.COLOR_YUV2RGB_I420)
    return frame.to_ndarray(format="rgb24")


class VideoFileSource(Source[Frame]):
    """Decodes the first video stream of a file with PyAV (threaded decoding), upright RGB frames.

    ``threads``: ``"AUTO"`` (FFmpeg picks) or a thread count.  ``start`` frames are decoded and dropped;
    ``max_frames`` caps the output (frame indices ``0 .. max_frames - 1``).  Corrupt packets/frames in the middle
    are skipped and counted in ``stats()["corrupt_frames"]``; a skipped frame keeps its index (the next frame's
    ``index`` jumps over it, see :meth:`_true_index`); a file cut short ends the stream early
    (``stats()["truncated"]``).
    Raises :class:`SourceError` (one line, naming the file) for a missing file, a non-video file, a file without
    frames or without any decodable frame.  Not thread-safe except :meth:`interrupt`.
    """

    live = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        threads: str | int = "AUTO",
        start: int = 0,
        max_frames: int | None = None,
        timeout: float | tuple[float, float] | None = (10.0, 10.0),
        source_id: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise SourceError(f"no such file or directory: {self.path!r}")
        if not (
            threads == "AUTO" or (isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1)
        ):
            raise ConfigError(f"threads must be 'AUTO' or a positive integer, got {threads!r}")
        if start < 0:
            raise ConfigError(f"start must be >= 0, got {start}")
        if max_frames is not None and max_frames < 0:
            raise ConfigError(f"max_frames must be >= 0 or None, got {max_frames}")
        self.threads = threads
        self.start = int(start)
        self.max_frames = max_frames
        self.timeout = timeout
        self.source_id = source_id or os.path.basename(self.path)
        self.name = f"source:{self.source_id}"
        self.length: int | None = None
        self.codec = ""  # the decoder's name, once open
        self.width = 0
        self.height = 0
        self.fps = 0.0
        self.rotation = 0
        self._container: InputContainer | None = None
        self._stream: VideoStream | None = None
        self._frames: Iterator[av.VideoFrame] | None = None
        self._pending: av.VideoFrame | None = None  # the first frame, decoded eagerly by open()
        self._stop = threading.Event()
        self._delivered = 0
        self._skipped = 0
        self._corrupt = 0
        self._corrupt_seen = 0  # corrupt frames already turned into index gaps ("owed" = _corrupt - this)
        self._last_index = -1
        self._base: tuple[int, int] | None = None  # (pts, index) of the first delivered frame
        self._cfr = False  # constant frame rate: indices follow the timestamps
        self._rate: Fraction | None = None
        self._ended = False
        self._truncated = False
        self._warned_angle = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Open the container and decode the first frame (so that an empty file fails here, not mid-run)."""
        if self._container is not None:
            return
        self._closed = False
        container = _open_container(self.path, self.timeout)
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        if self.threads != "AUTO":
            stream.codec_context.thread_count = int(self.threads)
        self._container = container
        self._stream = stream
        self.codec = stream.codec_context.name
        self.fps = float(stream.average_rate or stream.guessed_rate or 0.0)
        rate = stream.average_rate or stream.guessed_rate
        self._rate = Fraction(rate) if rate else None
        self._cfr = (
            rate is not None
            and bool(rate)
            and stream.base_rate is not None
            and Fraction(stream.base_rate) == Fraction(rate)
        )
        total = _estimate_frames(stream)
        if total is not None:
            total = max(0, total - self.start)
            if self.max_frames is not None:
                total = min(total, self.max_frames)
        self.length = total
        self._frames = self._decode(container, stream)
        first = self._next_av_frame()
        if first is None:
            self.close()
            if self._corrupt:
                raise SourceError(
                    f"no decodable frames in {self.path!r} ({self._corrupt} corrupt); the file is damaged"
                )
            if self.start:
                raise SourceError(f"{self.path!r} has fewer than start={self.start} frames")
            raise SourceError(f"{self.path!r} contains no frames")
        self._pending = first
        if self.start:  # corrupt frames among the ``start`` dropped ones leave no gap
            self._corrupt_seen = self._corrupt
        self.rotation = int(getattr(first, "rotation", 0) or 0)
        w, h = first.width, first.height
        self.width, self.height = (h, w) if _quarter_turns(self.rotation) % 2 else (w, h)

    def _decode(self, container: InputContainer, stream: VideoStream) -> Iterator[av.VideoFrame]:
        """Decoded av.VideoFrames; decoder errors on single packets are counted and skipped."""
        demux = container.demux(stream)
        while True:
            try:
                packet = next(demux)
            except StopIteration:
                return
            except av.error.EOFError:
                return
            except (av.error.FFmpegError, OSError) as err:
                # The demuxer gave up (file cut short or damaged index): end the stream with what we have.
                self._truncated = True
                logger.warning(
                    "%s: stopped reading after %d frames: %s", self.path, self._delivered, _one_line(err)
                )
                return
            try:
                frames = packet.decode()
            except av.error.EOFError:
                return
            except av.error.FFmpegError as err:
                # InvalidDataError mostly; decoders also report damaged data as EPERM, "undefined" or "bug".
                if packet.size:
                    self._corrupt += 1
                    logger.warning(
                        "%s: skipped a corrupt packet (pts %s): %s", self.path, packet.pts, _one_line(err)
                    )
                continue
            for frame in frames:
                if frame.is_corrupt:
                    self._corrupt += 1
                    logger.warning(
                        "%s: skipped a frame the decoder flagged corrupt (pts %s)", self.path, frame.pts
                    )
                    continue
                yield frame

    def _next_av_frame(self) -> av.VideoFrame | None:
        assert self._frames is not None
        while True:
            try:
                frame = next(self._frames)
            except StopIteration:
                self._check_complete()
                return None
            except av.error.FFmpegError as err:
                # An error from the decoder while flushing: treat as the end of a damaged file.
                self._truncated = True
                logger.warning("%s: decoding stopped: %s", self.path, _one_line(err))
                return None
            if self._skipped < self.start:
                self._skipped += 1
                continue
            return frame

    def _check_complete(self) -> None:
        """At end of stream: flag a file that ended well short of the frame count its header promised."""
        if self.length is None or self._truncated or self.max_frames is not None:
            return
        got = self._delivered + (self._pending is not None) + self._corrupt
        if got < self.length - 1:
            self._truncated = True
            logger.warning(
                "%s: stream ended after %d of ~%d frames; the file looks truncated",
                self.path,
                got,
                self.length,
            )

    def _true_index(self, av_frame: av.VideoFrame) -> int:
        """The frame's position in the stream (0 = the first frame after ``start``), not a count of delivered
        frames: a frame skipped as corrupt leaves a gap, so outputs and prompts stay on the source's frames.

        Constant-frame-rate streams (average rate = base rate): from the timestamp,
        ``round((pts - first pts) * time_base * rate)``.  Otherwise (variable rate, no timestamps) the previous
        index + 1, plus the corrupt frames not yet accounted for, placed where the timestamps jump (decoders with
        B-frames report a damaged packet before the frames that precede it in display order).  Always increasing.
        """
        owed = self._corrupt - self._corrupt_seen
        lowest = self._last_index + 1
        index = lowest + owed
        pts, tb, rate = av_frame.pts, av_frame.time_base, self._rate
        if self._base is None:
            self._base = (pts, index) if pts is not None else None
        elif pts is not None and tb is not None and rate:
            base_pts, base_index = self._base
            by_pts = base_index + round((pts - base_pts) * Fraction(tb) * rate)
            index = max(lowest, by_pts) if self._cfr else min(max(lowest, by_pts), lowest + owed)
        self._corrupt_seen = min(self._corrupt, self._corrupt_seen + (index - lowest))
        self._last_index = index
        return index

    def read(self) -> Frame | None:
        """The next upright RGB frame, or ``None`` at end of stream, after ``max_frames`` or after interrupt."""
        if self._stop.is_set() or self._closed or self._ended:
            return None
        if self._container is None:
            self.open()
        if self.max_frames is not None and self._last_index + 1 >= self.max_frames:
            return None
        av_frame = self._pending if self._pending is not None else self._next_av_frame()
        self._pending = None
        if av_frame is None:
            return None
        index = self._true_index(av_frame)
        if self.max_frames is not None and index >= self.max_frames:
            self._ended = True
            return None
        image = to_rgb(av_frame)
        rotation = getattr(av_frame, "rotation", 0) or 0
        turns = _quarter_turns(rotation)
        if rotation and turns * 90 % 360 != float(rotation) % 360 and not self._warned_angle:
            self._warned_angle = True
            logger.warning(
                "%s: rotation %s° is not a multiple of 90°; using %d°", self.path, rotation, turns * 90
            )
        image = _upright(image, turns)
        frame = Frame(
            index=index,
            image=image,
            pts=av_frame.pts,
            time_base=Fraction(av_frame.time_base) if av_frame.time_base is not None else None,
            capture_time=time.time(),
            source_id=self.source_id,
        )
        self._delivered += 1
        return frame

    def interrupt(self) -> None:
        """Make the next (or a pending) :meth:`read` return ``None``.  Safe from any thread."""
        self._stop.set()

    def close(self) -> None:
        """Close the container.  Idempotent."""
        self._closed = True
        self._pending = None
        self._frames = None
        if self._container is not None:
            container, self._container = self._container, None
            try:
                container.close()
            except av.error.FFmpegError as err:  # pragma: no cover - closing a reader rarely fails
                logger.debug("%s: error while closing: %s", self.path, err)

    def stats(self) -> dict[str, object]:
        return {"frames": self._delivered, "corrupt_frames": self._corrupt, "truncated": self._truncated}

    # -- conveniences ------------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.read()) is not None:
            yield frame

    def __enter__(self) -> VideoFileSource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["VideoFileSource", "VideoInfo", "to_rgb"]
