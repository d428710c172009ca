"""Live sources (RTSP, HTTP, V4L2 cameras) that survive disconnects, and the supervisor that keeps them alive.

:class:`LiveSource` decodes a live feed with PyAV using low-latency options and connect/read timeouts.  A
:class:`SourceSupervisor` (a small state machine with no I/O of its own) decides what happens when the feed goes
quiet or away: an end of stream, an error or a read timeout on a live feed is a *disconnect*, followed by a
reconnect after an exponential backoff with jitter (:class:`ReconnectPolicy`; unlimited attempts by default).
States: ``connecting`` → ``running`` → (``stalled`` →) ``reconnecting`` → ``running`` … → ``ended``.

Stalled vs blocked: the stall timer (PyAV's read timeout) only runs while the source waits for packets inside
:meth:`LiveSource.read`.  Time the pipeline spends elsewhere (a full downstream queue under the ``block`` policy)
is *blocked* time, counted in ``stats()["blocked_s"]`` and never a reason to reconnect.

Frame indices stay honest across drops and reconnects (``docs/live.md``): within a connection the index follows
media time (``pts`` × fps); after a reconnect it advances by the wall-clock gap × fps, so a tracker sees how far
the scene moved while the feed was down.

Connecting (URIs, FFmpeg options, opening the container, the one-line errors) is
:mod:`~vostream.stages.sources.live_connection`'s part; this module delivers the frames.

Threading: one thread calls ``open``/``read``/``close``; :meth:`LiveSource.interrupt` may be called from any
thread and makes a blocked ``read`` return ``None`` within the read timeout (a backoff wait ends at once).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from fractions import Fraction

import av

from vostream.pipeline.errors import ConfigError, SourceError
from vostream.pipeline.reconnect import (
    LIVE_RECONNECT,
    ReconnectPolicy,
    SourceSupervisor,
)
from vostream.pipeline.stage import Source
from vostream.pipeline.types import Frame
from vostream.stages.sources.file import to_rgb
from vostream.stages.sources.live_connection import (
    TRANSPORTS,
    Connection,
    camera_path,
    close_quietly,
    connect,
    is_timeout,
    live_kind,
    one_line,
    open_options,
    redact,
    v4l2_options,
)

logger = logging.getLogger(__name__)


class LiveSource(Source[Frame]):
    """A live feed (``rtsp://``, ``http(s)://``, ``/dev/videoN`` or a camera index, other FFmpeg URLs) that
    reconnects by itself.

    Options: ``transport`` (RTSP: ``"tcp"`` default or ``"udp"``); ``open_timeout``/``read_timeout`` seconds
    (connect; no packet for this long = stalled); ``reconnect`` (:class:`ReconnectPolicy`); ``wait_first``
    (retry the *first* connection too instead of failing at :meth:`open`); ``fps`` (nominal rate when the stream
    does not say; else read from the stream, else 25); ``max_lag`` (seconds behind the stream's own clock after
    which packets are skipped, not decoded, up to a keyframe that is on time again; ``None``: never skip; frame
    ages are measured on the stream's clock either way); ``max_frames``; camera options ``video_size``,
    ``framerate``, ``input_format``, ``pixel_format``; ``options`` extra FFmpeg options; ``source_id``.

    ``live = True``: the pipeline uses the ``latest`` policy on every edge.  ``read()`` returns ``None`` only after
    :meth:`interrupt`, after ``max_frames``, or when the reconnect policy gives up (then it raises
    :class:`SourceError`).  :meth:`open` raises :class:`SourceError` (one line, naming the URL, with a hint) when
    the first connection fails, unless ``wait_first``.  Not thread-safe except :meth:`interrupt`, :meth:`stats`
    and :attr:`supervisor` (thread-safe itself).
    """

    live = True
    length = None

    def __init__(
        self,
        uri: str,
        *,
        transport: str = "tcp",
        open_timeout: float = 10.0,
        read_timeout: float = 3.0,
        reconnect: ReconnectPolicy | None = None,
        wait_first: bool | float = False,
        fps: float | None = None,
        max_frames: int | None = None,
        video_size: str | None = None,
        framerate: float | str | None = None,
        input_format: str | None = None,
        pixel_format: str | None = None,
        options: dict[str, str] | None = None,
        source_id: str | None = None,
        max_lag: float | None = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not (open_timeout > 0 and read_timeout > 0):
            raise ConfigError(
                f"{uri}: open and read timeouts must be positive seconds, got {open_timeout} / {read_timeout}"
            )
        if fps is not None and not fps > 0:
            raise ConfigError(f"{uri}: fps must be positive, got {fps}")
        if max_lag is not None and not (max_lag > 0 and math.isfinite(max_lag)):
            raise ConfigError(f"{uri}: max_lag must be positive seconds or None, got {max_lag}")
        if max_frames is not None and (isinstance(max_frames, bool) or max_frames < 0):
            raise ConfigError(f"{uri}: max_frames must be >= 0 or None, got {max_frames}")
        self.kind = live_kind(uri)
        self.uri = camera_path(uri) if self.kind == "v4l2" else uri
        camera = v4l2_options(video_size, framerate, input_format, pixel_format)
        if camera and self.kind != "v4l2":
            raise ConfigError(f"{uri}: camera options {sorted(camera)} only apply to /dev/videoN cameras")
        self.transport = transport
        self.options = open_options(
            self.kind, transport=transport, read_timeout=read_timeout, extra={**camera, **(options or {})}
        )
        self.open_timeout = float(open_timeout)
        self.read_timeout = float(read_timeout)
        if not isinstance(wait_first, bool) and not (wait_first >= 0 and math.isfinite(wait_first)):
            raise ConfigError(f"{uri}: wait_first must be True/False or seconds >= 0, got {wait_first}")
        self.wait_first = wait_first
        self.max_frames = max_frames
        self.nominal_fps = float(fps) if fps else None
        self.fps = self.nominal_fps or 0.0
        self.source_id = source_id or redact(self.uri)
        self.name = f"source:{self.source_id}"
        self.width = 0
        self.height = 0
        self.clock = clock
        self.supervisor = SourceSupervisor(reconnect or LIVE_RECONNECT, name=redact(self.uri), clock=clock)
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self._first: Frame | None = None  # decoded by open(), delivered by the first read()
        self._delivered = 0
        self._corrupt = 0
        self._next_index = 0  # lower bound for the next frame's index
        self.last_index = -1
        self._last_frame_time: float | None = None  # wall clock of the last frame delivered
        self.first_frame_time: float | None = None  # capture time of frame 0 (live prompts count from it)
        self._index_skipped = 0  # indices skipped by the time rule (gaps, reconnects)
        self._returned_at: float | None = None  # monotonic time read() last returned
        self._blocked_s = 0.0
        self.max_lag = max_lag
        self._lags: deque[float] = deque(maxlen=1024)  # seconds behind the stream's clock, per packet
        self._lag_max = 0.0
        self._skipped_catchup = 0  # video packets not decoded while catching up
        self._catchups = 0
        self._opened = False
        self._closed = False

    def _connect(self) -> Connection:
        """One attempt (:func:`~.live_connection.connect`); the stream's declared rate becomes ``fps`` unless one
        was given.  Raises :class:`SourceError`."""
        conn = connect(
            self.uri,
            self.kind,
            options=self.options,
            open_timeout=self.open_timeout,
            read_timeout=self.read_timeout,
            source_id=self.source_id,
            transport=self.transport,
        )
        if self.nominal_fps is None and conn.rate is not None:
            self.fps = conn.rate
        return conn

    def _connect_with_retries(self, first: bool) -> bool:
        """Connect, retrying with backoff (unless it is the first connection and not ``wait_first``).  False when
        interrupted; raises :class:`SourceError` when the policy gives up (or on a failed first attempt).

        ``wait_first`` a number: the first connection is retried for that many seconds (and within the policy's
        ``max_attempts``), then the last attempt's error is raised."""
        started = time.monotonic()
        while not self._stop.is_set():
            self.supervisor.connecting()
            try:
                conn = self._connect()
                try:
                    frame = self._next_frame(conn, first_of_connection=True)
                except _Lost:  # interrupted while waiting for the first frame
                    close_quietly(conn.container)
                    return False
            except SourceError as err:
                if first and not self.wait_first:
                    self.supervisor.end(str(err))
                    raise
                waited = time.monotonic() - started
                if first and not isinstance(self.wait_first, bool) and waited >= self.wait_first:
                    self.supervisor.end(str(err))
                    raise SourceError(f"{err} (still not reachable after waiting {waited:.0f} s)") from err
                delay = self.supervisor.lost(str(err), failed_attempt=True)
                if delay is None:
                    raise SourceError(
                        f"{self.source_id}: gave up after {self.supervisor.failed_in_row} failed "
                        f"reconnect attempt(s): {err}"
                    ) from err
                if self._stop.wait(delay):
                    return False
                continue
            self._conn = conn
            self._first = frame
            self.supervisor.connected()
            return True
        return False

    # -- decoding ----------------------------------------------------------------------------------------------
    def _next_frame(self, conn: Connection, first_of_connection: bool = False) -> Frame:
        """The next decoded frame of ``conn``.  Raises :class:`_Lost` (or :class:`SourceError` for the first
        frame of a connection) when the feed ends, errors or stalls."""
        while not conn.pending:
            try:
                packet = next(conn.packets)
            except StopIteration:
                raise self._lost(
                    conn, "end of stream (the server closed the connection)", first_of_connection
                ) from None
            except Exception as err:  # noqa: BLE001 - ExitError (read timeout), OSError, FFmpegError
                if self._stop.is_set():
                    raise _Lost("stopped") from err
                if is_timeout(err):
                    raise self._lost(
                        conn, f"no packets for {self.read_timeout:g} s", first_of_connection, stalled=True
                    ) from err
                raise self._lost(conn, f"read error: {one_line(err)}", first_of_connection) from err
            lag = self._lag_of(conn, packet)
            if self.max_lag is not None and not first_of_connection and conn.frames:
                if not conn.catching_up and lag > self.max_lag:
                    conn.catching_up = True
                    self._catchups += 1
                    logger.warning(
                        "%s: %.1f s behind the live stream (decoding is slower than the feed); skipping to a "
                        "recent keyframe",
                        self.source_id,
                        lag,
                    )
                if conn.catching_up:
                    if not (packet.is_keyframe and lag <= self.max_lag / 2):
                        if packet.size:
                            self._skipped_catchup += 1
                        continue
                    conn.catching_up = False
            try:
                conn.pending.extend(packet.decode())
            except av.error.FFmpegError as err:
                if packet.size:
                    self._corrupt += 1
                    logger.debug("%s: skipped a corrupt packet: %s", self.source_id, one_line(err))
        av_frame = conn.pending.pop(0)
        return self._make_frame(conn, av_frame)

    def _lag_of(self, conn: Connection, packet: av.Packet) -> float:
        """How far behind the stream's own clock ``packet`` is read: (wall clock − media time) minus the smallest
        such offset on this connection (the least delayed packet sets the clock's origin).  A decoder or a reader
        slower than the feed makes it grow, whatever the frame ages downstream of the decoder say."""
        if packet.pts is None or packet.time_base is None or not packet.size:
            return 0.0
        offset = self.clock() - float(packet.pts * packet.time_base)
        if conn.min_offset is None or offset < conn.min_offset:
            conn.min_offset = offset
        lag = offset - conn.min_offset
        self._lags.append(lag)
        self._lag_max = max(self._lag_max, lag)
        return lag

    def _lost(
        self, conn: Connection, reason: str, first_of_connection: bool, stalled: bool = False
    ) -> Exception:
        if first_of_connection:
            close_quietly(conn.container)
            return SourceError(f"{self.source_id}: connected but got no frame ({reason})")
        return _Lost(reason, stalled)

    def _make_frame(self, conn: Connection, av_frame: av.VideoFrame) -> Frame:
        now = self.clock()
        fps = self.fps or 25.0
        if conn.frames == 0:
            # First frame of a connection: advance by the time the feed was away (>= 1).
            if self._last_frame_time is None:
                index = 0
                self.first_frame_time = now
            else:
                gap = max(0.0, now - self._last_frame_time)
                index = max(self._next_index, self.last_index + max(1, round(gap * fps)))
            conn.base_index = index
        elif av_frame.pts is not None and av_frame.time_base is not None and conn.ref_pts is not None:
            media = float((av_frame.pts - conn.ref_pts) * av_frame.time_base)
            index = max(self._next_index, conn.ref_index + round(media * fps))
        else:
            index = self._next_index
        if conn.ref_pts is None and av_frame.pts is not None and av_frame.time_base is not None:
            conn.ref_pts, conn.ref_index = av_frame.pts, index
        if self.last_index >= 0:
            self._index_skipped += max(0, index - self.last_index - 1)
        conn.frames += 1
        capture = now
        if conn.min_offset is not None and av_frame.pts is not None and av_frame.time_base is not None:
            # the frame's time on the stream's clock: frame ages then include any lag before the decoder
            capture = min(now, conn.min_offset + float(av_frame.pts * av_frame.time_base))
        image = to_rgb(av_frame)
        if not self.width:
            self.height, self.width = image.shape[:2]
        frame = Frame(
            index=index,
            image=image,
            pts=av_frame.pts,
            time_base=Fraction(av_frame.time_base) if av_frame.time_base is not None else None,
            capture_time=capture,
            source_id=self.source_id,
        )
        self.last_index = index
        self._next_index = index + 1
        self._last_frame_time = now
        return frame

    # -- Source API --------------------------------------------------------------------------------------------
    def open(self) -> None:
        """Connect and decode the first frame (so that ``width``/``height``/``fps`` are known).  Idempotent.

        Raises :class:`SourceError` when the first connection fails (unless ``wait_first``)."""
        if self._opened:
            return
        self._closed = False
        self._opened = True
        try:
            self._connect_with_retries(first=True)
        except BaseException:
            self._opened = False
            raise

    def read(self) -> Frame | None:
        """The next frame; reconnects (with backoff) on end of stream, errors and stalls.  ``None`` after
        :meth:`interrupt` or ``max_frames``."""
        entered = time.monotonic()
        if self._returned_at is not None:
            self._blocked_s += entered - self._returned_at  # time spent downstream, never a stall
        try:
            return self._read()
        finally:
            self._returned_at = time.monotonic()

    def _read(self) -> Frame | None:
        if self._closed:
            return None
        if not self._opened:
            self.open()
        if self.max_frames is not None and self._delivered >= self.max_frames:
            return None
        while not self._stop.is_set():
            if self._first is not None:
                frame, self._first = self._first, None
                self._delivered += 1
                return frame
            if self._conn is None:
                if not self._connect_with_retries(first=False):
                    break
                continue
            try:
                frame = self._next_frame(self._conn)
            except _Lost as lost:
                close_quietly(self._conn.container)
                self._conn = None
                if self._stop.is_set():
                    break
                delay = self.supervisor.lost(lost.reason, stalled=lost.stalled)
                if delay is None:
                    raise SourceError(f"{self.source_id}: gave up reconnecting: {lost.reason}") from None
                if self._stop.wait(delay):
                    break
                continue
            self._delivered += 1
            return frame
        self.supervisor.end("stopped")
        return None

    def interrupt(self) -> None:
        """Make a pending or the next :meth:`read` return ``None`` (within the read timeout).  Any thread."""
        self._stop.set()

    def close(self) -> None:
        """Close the connection; the state becomes ``ended``.  Idempotent."""
        self._closed = True
        self._first = None
        if self._conn is not None:
            close_quietly(self._conn.container)
            self._conn = None
        if self.supervisor.state:
            self.supervisor.end("closed")

    def stats(self) -> dict[str, object]:
        """Supervisor counters plus ``frames``, ``corrupt_frames``, ``index_skipped`` (index gaps from the
        time rule), ``blocked_s`` (time the pipeline did not ask for frames), ``fps``, ``last_index``,
        ``stream_lag_s_p50``/``_p95``/``_max`` (how far behind the stream's clock packets were read),
        ``catchups`` and ``skipped_catchup`` (packets not decoded to catch up, see ``max_lag``)."""
        out = self.supervisor.snapshot()
        lags = sorted(self._lags)
        if lags:
            out.update(
                {
                    "stream_lag_s_p50": round(lags[len(lags) // 2], 3),
                    "stream_lag_s_p95": round(lags[min(len(lags) - 1, int(0.95 * len(lags)))], 3),
                    "stream_lag_s_max": round(self._lag_max, 3),
                }
            )
        out.update({"catchups": self._catchups, "skipped_catchup": self._skipped_catchup})
        out.update(
            {
                "frames": self._delivered,
                "corrupt_frames": self._corrupt,
                "index_skipped": self._index_skipped,
                "blocked_s": round(self._blocked_s, 3),
                "fps": round(self.fps, 3),
                "last_index": self.last_index,
            }
        )
        return out

    def __iter__(self) -> Iterator[Frame]:
        while (frame := self.read()) is not None:
            yield frame

    def __enter__(self) -> LiveSource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lost(Exception):
    """Internal: the connection is gone (``stalled``: by the read timeout)."""

    def __init__(self, reason: str, stalled: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.stalled = stalled


#: ``open_live(uri, ...)`` is :class:`LiveSource`'s constructor: its options are explicit keyword-only
#: parameters, so an unknown one is a ``TypeError`` at the call (and a mypy error); a bad value is a
#: :class:`ConfigError` naming the feed.
open_live = LiveSource


__all__ = [
    "TRANSPORTS",
    "LiveSource",
    "camera_path",
    "live_kind",
    "open_live",
    "open_options",
    "v4l2_options",
]
