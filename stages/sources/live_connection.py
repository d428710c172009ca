"""One connection to a live feed: which kind a URI is, the FFmpeg options it opens with, opening the container and
picking its video stream, and the one-line error (naming the feed, with a hint) when that fails.

:class:`~vostream.stages.sources.live.LiveSource` connects through :func:`connect` and delivers the frames; the
retries, the index rule and catching up are its part.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import av

from vostream.pipeline.errors import ConfigError, SourceError

if TYPE_CHECKING:
    from av.container import InputContainer
    from av.video.stream import VideoStream

logger = logging.getLogger(__name__)

TRANSPORTS = ("tcp", "udp")


# -- URIs and options ------------------------------------------------------------------------------------------

_SIZE = re.compile(r"^\d+x\d+$")


def live_kind(uri: str) -> str:
    """``"rtsp"``, ``"http"``, ``"v4l2"`` or ``"stream"`` (rtmp, udp, tcp, srt: opened with defaults)."""
    low = uri.lower()
    if low.startswith(("rtsp://", "rtsps://")):
        return "rtsp"
    if low.startswith(("http://", "https://")):
        return "http"
    if low.startswith("/dev/video") or uri.isdigit():
        return "v4l2"
    return "stream"


def camera_path(uri: str) -> str:
    """``"0"`` → ``"/dev/video0"``; a ``/dev/video*`` path unchanged."""
    return f"/dev/video{int(uri)}" if uri.isdigit() else uri


def v4l2_options(
    video_size: str | None = None,
    framerate: float | str | None = None,
    input_format: str | None = None,
    pixel_format: str | None = None,
) -> dict[str, str]:
    """FFmpeg ``v4l2`` demuxer options for a camera; checked here so that a typo fails before the device opens.

    ``video_size`` ``"1280x720"``; ``framerate`` a positive number; ``input_format`` a compressed format such as
    ``"mjpeg"`` or ``"h264"``; ``pixel_format`` a raw one such as ``"yuyv422"``.  Raises :class:`ConfigError`."""
    opts: dict[str, str] = {}
    if video_size is not None:
        if not _SIZE.match(str(video_size)) or min(int(v) for v in str(video_size).split("x")) <= 0:
            raise ConfigError(f"camera video_size must look like 1280x720, got {video_size!r}")
        opts["video_size"] = str(video_size)
    if framerate is not None:
        try:
            rate = float(framerate)
        except (TypeError, ValueError):
            rate = math.nan
        if not (rate > 0 and math.isfinite(rate)):
            raise ConfigError(f"camera framerate must be a positive number, got {framerate!r}")
        opts["framerate"] = f"{rate:g}"
    for key, value in (("input_format", input_format), ("pixel_format", pixel_format)):
        if value is not None:
            if not re.match(r"^[a-z0-9_]+$", str(value)):
                raise ConfigError(
                    f"camera {key} must be an FFmpeg format name such as mjpeg or yuyv422, got {value!r}"
                )
            opts[key] = str(value)
    return opts


def open_options(
    kind: str, *, transport: str = "tcp", read_timeout: float = 3.0, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The FFmpeg options for a live feed of ``kind``: low-latency probing plus socket I/O timeouts.

    RTSP: ``rtsp_transport`` (tcp | udp), ``timeout`` (µs, socket I/O), ``flags=low_delay``, a small
    ``probesize`` and ``analyzeduration=0`` (open as soon as the codec parameters are known).  ``fflags=nobuffer``
    is *not* set: it discards the packets read while probing, i.e. the first keyframe.  HTTP: ``timeout`` (µs)
    too.  ``extra`` overrides anything."""
    if transport not in TRANSPORTS:
        raise ConfigError(f"rtsp transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
    opts: dict[str, str] = {}
    if kind in ("rtsp", "http", "stream"):
        # fpsprobesize=0: do not hold the open back to count frames for a rate estimate (the stream's declared
        # rate, e.g. H.264 VUI timing, is used; else the fps option or 25): the open takes ~0.3 s instead of ~1 s.
        opts.update({"flags": "low_delay", "probesize": "32768", "analyzeduration": "0", "fpsprobesize": "0"})
    if kind == "rtsp":
        opts.update({"rtsp_transport": transport, "timeout": str(int(read_timeout * 1e6))})
    elif kind == "http":
        opts["timeout"] = str(int(read_timeout * 1e6))
    opts.update(extra or {})
    return opts


def one_line(err: BaseException) -> str:
    text = getattr(err, "strerror", None) or str(err)
    lines = str(text).strip().splitlines()
    return lines[0] if lines else type(err).__name__


def is_timeout(err: BaseException) -> bool:
    return (
        isinstance(err, (av.error.ExitError, TimeoutError)) or getattr(err, "errno", None) == errno.ETIMEDOUT
    )


@dataclass
@dataclass
class Connection:
    """One open container and what the index rule needs about it."""

    container: InputContainer
    stream: VideoStream
    packets: Iterator[av.Packet]
    pending: list[av.VideoFrame] = field(default_factory=list)  # decoded av frames not yet delivered
    base_index: int = 0  # index of the connection's first frame
    ref_pts: int | None = None  # first pts seen on this connection ...
    ref_index: int = 0  # ... and the index it got
    frames: int = 0
    min_offset: float | None = (
        None  # smallest (wall clock - media time) of a packet: the stream's clock origin
    )
    catching_up: bool = False  # packets are skipped (not decoded) until a keyframe that is not late
    rate: float | None = None  # the frame rate the stream declares (None: it does not say, or not plausibly)


def connect(
    uri: str,
    kind: str,
    *,
    options: dict[str, str],
    open_timeout: float,
    read_timeout: float,
    source_id: str,
    transport: str,
) -> Connection:
    """One attempt: open the container, pick the video stream.  Raises :class:`SourceError` (one line, see
    :func:`connect_message`)."""
    if kind == "v4l2":
        if not os.path.exists(uri):
            raise SourceError(
                f"no camera at {uri}: the device does not exist; check it is plugged in (ls /dev/video*)"
            )
    try:
        container = av.open(
            uri,
            format="v4l2" if kind == "v4l2" else None,
            options=options,
            timeout=(open_timeout, read_timeout),
        )
    except Exception as err:  # noqa: BLE001 - every PyAV/OS failure becomes one SourceError line
        raise SourceError(connect_message(err, uri, kind, source_id, open_timeout, transport)) from err
    try:
        if not container.streams.video:
            raise SourceError(f"{source_id} has no video stream; check the URL points at a video feed")
        stream = container.streams.video[0]
        stream.thread_type = "SLICE"  # frame threading would add a frame of latency per thread
        rate = stream.average_rate or stream.guessed_rate
        declared = float(rate) if rate and 1 <= float(rate) <= 240 else None  # else a time base, not a rate
        packets = container.demux(stream)
    except BaseException:
        container.close()
        raise
    return Connection(container, stream, packets, rate=declared)


def connect_message(
    err: BaseException, uri: str, kind: str, source_id: str, open_timeout: float, transport: str
) -> str:
    """Why connecting to ``uri`` failed, in one line, with what to check."""
    code = getattr(err, "errno", None)
    what = one_line(err)
    if kind == "v4l2":
        if code == errno.EBUSY:
            return f"camera {uri} is busy: another program is using it; close that program (fuser {uri})"
        if code in (errno.EACCES, errno.EPERM):
            return f"no permission to open camera {uri}; add your user to the 'video' group"
        if code == errno.ENOENT:
            return f"no camera at {uri}: the device does not exist; check it is plugged in (ls /dev/video*)"
        return (
            f"cannot open camera {uri}: {what}; check it is a V4L2 capture device and that "
            f"video_size/framerate/input_format are modes it supports (v4l2-ctl --list-formats-ext)"
        )
    if is_timeout(err):
        return (
            f"cannot connect to {source_id}: no answer within {open_timeout:g} s; check the host, "
            f"port and path, and that the camera/server is up"
        )
    hint = "check the host, port, path and credentials"
    if kind == "rtsp" and transport == "udp":
        hint += ", or try --rtsp-transport tcp (UDP is often blocked by firewalls)"
    return f"cannot connect to {source_id}: {what}; {hint}"


def close_quietly(container: InputContainer) -> None:
    try:
        container.close()
    except Exception as err:  # noqa: BLE001 - closing a dead connection may fail; nothing to do about it
        logger.debug("closing a live container failed: %s", err)


def redact(uri: str) -> str:
    """``uri`` without a password (``rtsp://user:pass@host`` → ``rtsp://user:***@host``), for logs and ids."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", uri)


__all__ = [
    "TRANSPORTS",
    "Connection",
    "camera_path",
    "close_quietly",
    "connect",
    "connect_message",
    "is_timeout",
    "live_kind",
    "one_line",
    "open_options",
    "redact",
    "v4l2_options",
]
