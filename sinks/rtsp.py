"""The RTSP output sink: publishes the annotated stream (H.264, low latency) to an RTSP server, and keeps it alive.

``RtspSinkSpec("rtsp://host:8554/out")`` → :class:`RtspSink`, which pushes with RTSP ANNOUNCE/RECORD (PyAV's
``rtsp`` muxer) to a server that accepts publishers (MediaMTX, ``rtsp-simple-server``, an FFmpeg/PyAV listener
with ``rtsp_flags=listen``...).  ``docs/live.md`` describes the design; in short:

* :meth:`RtspSink.write` only draws the overlay and puts the picture in a one-slot mailbox (a picture not yet
  sent is replaced and counted in ``dropped``); a **publisher thread** encodes and sends.  The sink never blocks
  the pipeline (its edge uses the ``latest`` policy too).
* While pictures arrive, each one is sent once (one output frame per input frame).  When none has arrived for
  ``lost_after_s`` (the source is down, reconnecting), the publisher repeats the last picture, dimmed, with a
  "SOURCE LOST" banner, at ``fps``, so viewers stay connected; counted in ``stub_frames``.
* Timestamps come from the wall clock (90 kHz), so the output plays in real time across gaps.
* When the server goes away (a write fails), the publisher reconnects with backoff; pictures meanwhile are
  counted in ``dropped_offline``.  Each new connection starts with a new encoder (so with a keyframe).

Failure behaviour: a malformed URL or a missing encoder raises :class:`OutputError` at :meth:`RtspSink.open`;
a server that is down is *not* an error (the sink keeps retrying and says so in ``stats()`` and the log).
Thread-safety: ``write``/``close``/``stats`` from the sink's thread; the publisher thread is internal and joined
by :meth:`RtspSink.close` (idempotent).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

import av
import cv2
import numpy as np

from vostream.pipeline.errors import ConfigError, OutputError
from vostream.pipeline.reconnect import ReconnectPolicy, SourceSupervisor
from vostream.pipeline.stage import LATEST, Sink, SinkSpec
from vostream.pipeline.types import Frame

from .overlay import OverlayStyle, draw_overlay

if TYPE_CHECKING:
    from av.container import OutputContainer

logger = logging.getLogger(__name__)

#: RTP clock: the output's time base
TIME_BASE = Fraction(1, 90000)


@dataclass(frozen=True)
class RtspSinkSpec(SinkSpec[Frame]):
    """Settings of an RTSP output.  Inert and picklable; :meth:`build` makes the :class:`RtspSink`.

    ``transport``: ``tcp`` (default) or ``udp``.  ``fps``: rate of the stub frames while the input is down and the
    encoder's nominal rate (default 25).  ``bitrate`` (bits/s; ``None``: x264's CRF 23), ``gop`` (frames between
    keyframes; default ``fps``: a late joiner waits at most a second), ``preset``/``tune`` (x264; default
    ``ultrafast``/``zerolatency``).  ``lost_after_s``: no picture for this long shows the banner.  ``reconnect``:
    backoff when the server is away.  ``write_timeout``: a write to the server that has not completed after this
    many seconds means the server stopped reading (a paused relay): the connection is dropped and reconnected,
    and :meth:`RtspSink.close` never waits much longer than this for the publisher.  ``options``: extra encoder
    options.
    """

    url: str
    transport: str = "tcp"
    fps: float = 25.0
    bitrate: int | None = None
    gop: int | None = None
    preset: str = "ultrafast"
    tune: str = "zerolatency"
    codec: str = "libx264"
    lost_after_s: float = 1.0
    banner: str = "SOURCE LOST"
    open_timeout: float = 2.0
    write_timeout: float = 2.0
    reconnect: ReconnectPolicy = ReconnectPolicy(initial_s=0.5, max_s=5.0)
    alpha: float = 0.5
    contours: bool = True
    labels: bool = True
    options: dict[str, str] = field(default_factory=dict)
    name: str = "rtsp"
    policy: str | None = LATEST
    queue_size: int = 2

    def __post_init__(self) -> None:
        if not str(self.url).lower().startswith(("rtsp://", "rtsps://")):
            raise ConfigError(f"rtsp output {self.url!r}: expected rtsp://host:port/path")
        if self.transport not in ("tcp", "udp"):
            raise ConfigError(f"rtsp output {self.url}: transport must be tcp or udp, got {self.transport!r}")
        if not self.fps > 0:
            raise ConfigError(f"rtsp output {self.url}: fps must be positive, got {self.fps}")
        if self.bitrate is not None and self.bitrate <= 0:
            raise ConfigError(f"rtsp output {self.url}: bitrate must be positive bits/s, got {self.bitrate}")
        if self.gop is not None and self.gop < 1:
            raise ConfigError(f"rtsp output {self.url}: gop must be >= 1 frame, got {self.gop}")
        if not self.write_timeout > 0:
            raise ConfigError(
                f"rtsp output {self.url}: write_timeout must be positive seconds, got {self.write_timeout}"
            )
        if not self.lost_after_s > 0:
            raise ConfigError(
                f"rtsp output {self.url}: lost_after_s must be positive, got {self.lost_after_s}"
            )

    def build(self) -> RtspSink:
        return RtspSink(self)


def draw_banner(image: np.ndarray, text: str) -> np.ndarray:
    """A dimmed copy of ``image`` with a red bar across the top holding ``text`` in white (the stub frame)."""
    out = (image.astype(np.uint16) // 2).astype(np.uint8)
    h, w = out.shape[:2]
    bar = max(16, h // 8)
    out[:bar] = (200, 0, 0)
    scale = max(0.35, bar / 40)
    cv2.putText(
        out,
        text,
        (max(2, w // 40), int(bar * 0.72)),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        (255, 255, 255),
        max(1, int(scale * 2)),
        cv2.LINE_AA,
    )
    return out


def _server_sockets(host: str, port: int) -> dict[int, socket.socket]:
    """This process's TCP sockets connected to ``host:port``, as duplicates keyed by the socket's inode (Linux's
    ``/proc/self/fd``; elsewhere empty).  The caller closes the duplicates."""
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    found: dict[int, socket.socket] = {}
    for name in fds:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
            if not link.startswith("socket:["):
                continue
            dup = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            peer = dup.getpeername() if dup.type == socket.SOCK_STREAM else None
        except OSError:
            peer = None
        inode = int(link[8:-1])
        if peer and peer[0] in addrs and peer[1] == port and inode not in found:
            found[inode] = dup
        else:
            dup.close()
    return found


def rtsp_answers(url: str, timeout: float) -> str | None:
    """``None`` when the RTSP server at ``url`` answers an ``OPTIONS`` request within ``timeout`` seconds, else why
    not.  Plain sockets, so the GIL is released while waiting: checking a server that stopped reading costs the
    process nothing, where FFmpeg's handshake would freeze it for ``timeout``."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 554
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(f"OPTIONS {url} RTSP/1.0\r\nCSeq: 1\r\nUser-Agent: vostream\r\n\r\n".encode())
            reply = sock.recv(64)
    except TimeoutError:
        return f"the server did not answer within {timeout:g} s"
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    if not reply.startswith(b"RTSP/"):
        return f"the server did not answer as an RTSP server ({reply[:16]!r})"
    return None


class _Publisher:
    """One connection to the server: container + H.264 stream.  Used by the publisher thread only, except
    :meth:`abort` (any thread), which shuts the connection's TCP sockets down so that a write blocked on a server
    that stopped reading fails at once (FFmpeg's RTSP muxer has no write timeout and PyAV no interrupt for
    writers)."""

    def __init__(self, spec: RtspSinkSpec, width: int, height: int) -> None:
        parts = urlsplit(spec.url)
        host, port = parts.hostname or "", parts.port or 554
        before = _server_sockets(host, port)
        for dup in before.values():
            dup.close()
        # PyAV runs the RTSP handshake (avformat_write_header, in start_encoding) holding the GIL, and PyAV's own
        # timeout does not reach it: a server that accepts the connection but never answers (a stopped relay)
        # froze every thread of the process, signal handling included, for good.  FFmpeg's socket I/O timeout
        # ("timeout", microseconds) bounds the handshake, and every later read or write, to open_timeout.
        self.container: OutputContainer = av.open(
            spec.url,
            "w",
            format="rtsp",
            options={"rtsp_transport": spec.transport, "timeout": str(round(spec.open_timeout * 1e6))},
            timeout=(spec.open_timeout, spec.open_timeout),
        )
        try:
            rate = Fraction(spec.fps).limit_denominator(1001000)
            stream = self.container.add_stream(spec.codec, rate=rate)
            if not isinstance(stream, av.VideoStream):
                raise ConfigError(f"rtsp output {spec.url!r}: {spec.codec!r} is not a video encoder")
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.time_base = TIME_BASE
            stream.codec_context.time_base = TIME_BASE
            gop = spec.gop or max(1, round(spec.fps))
            options: dict[str, object] = {"g": str(gop), "bf": "0"}
            if spec.codec == "libx264":
                options.update({"preset": spec.preset, "tune": spec.tune})
                if spec.bitrate is None:
                    options["crf"] = "23"
            options.update(spec.options)
            stream.options = options
            if spec.bitrate is not None:
                stream.bit_rate = int(spec.bitrate)
            self.stream = stream
            self.container.start_encoding()  # RTSP ANNOUNCE/SETUP/RECORD now, so a dead server fails here
        except BaseException:
            self.container.close()
            raise
        self.last_pts = -1
        # The connection's own sockets: those to the server that did not exist before it was opened.
        self._sockets = [dup for inode, dup in _server_sockets(host, port).items() if inode not in before]
        self._lock = threading.Lock()

    def abort(self) -> None:
        """Shut the connection's sockets down: a blocked write returns with an error.  Any thread."""
        with self._lock:
            for dup in self._sockets:
                try:
                    dup.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _release(self) -> None:
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for dup in sockets:
            dup.close()

    def send(self, image: np.ndarray, pts: int) -> None:
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = max(pts, self.last_pts + 1)
        frame.time_base = TIME_BASE
        self.last_pts = frame.pts
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self, flush: bool) -> None:
        try:
            if flush:
                for packet in self.stream.encode(None):
                    self.container.mux(packet)
        except (av.error.FFmpegError, OSError) as err:
            logger.debug("rtsp output: flushing failed: %s", err)
        try:
            self.container.close()
        except (av.error.FFmpegError, OSError) as err:
            logger.debug("rtsp output: closing failed: %s", err)
        self._release()


class RtspSink(Sink[Frame]):
    """Owns the publisher thread and the connection.  See the module docstring for the behaviour."""

    def __init__(self, spec: RtspSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.style = OverlayStyle(alpha=spec.alpha, contours=spec.contours, labels=spec.labels)
        self.supervisor = SourceSupervisor(spec.reconnect, name=f"rtsp output {spec.url}")
        self._cond = threading.Condition()
        self._slot: np.ndarray | None = None  # the next picture to send (guarded by _cond)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        self._watch_stop = threading.Event()
        self._pub: _Publisher | None = None  # the publisher thread's connection, for the watchdog
        self._busy_since: float | None = None  # monotonic start of the write in progress (publisher thread)
        self._stuck: str | None = None  # set by the watchdog: the server stopped reading
        # the server holds connections without answering (a stall, a handshake timeout): probe before reconnecting
        self._unresponsive = False
        self._size: tuple[int, int] | None = None
        self._closed = False
        self._opened = False
        # counters (written by their one thread, read by stats())
        self.received = 0
        self.dropped = 0
        self.sent = 0
        self.stub_frames = 0
        self.dropped_offline = 0
        self.encode_cpu_s = 0.0
        self.encoded = 0
        self.error: str | None = None
        self.last_stall: str | None = None

    def open(self) -> None:
        """Check the encoder and start the publisher thread.  Raises :class:`OutputError`."""
        if self._opened:
            return
        try:
            av.codec.Codec(self.spec.codec, "w")
        except Exception as err:  # noqa: BLE001 - UnknownCodecError is not an FFmpegError
            raise OutputError(
                f"rtsp output {self.spec.url}: encoder {self.spec.codec!r} is not available in this "
                f"PyAV build"
            ) from err
        self._opened = True
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"vostream-rtsp-out-{self.spec.name}", daemon=True
        )
        self._thread.start()
        self._watch_stop.clear()
        self._watchdog = threading.Thread(
            target=self._watch, name=f"vostream-rtsp-watchdog-{self.spec.name}", daemon=True
        )
        self._watchdog.start()

    def _watch(self) -> None:
        """A write that has not completed for ``write_timeout``: the server stopped reading.  Say so and shut the
        connection down, so that the publisher's write fails and it reconnects."""
        timeout = self.spec.write_timeout
        while not self._watch_stop.wait(min(0.25, timeout / 4)):
            since, pub = self._busy_since, self._pub
            if since is None or pub is None or self._stuck is not None:
                continue
            if time.monotonic() - since >= timeout:
                self._stuck = f"the server stopped reading: a write did not complete in {timeout:g} s"
                self.error = self.last_stall = self._stuck
                logger.warning("rtsp output %s: %s; dropping the connection", self.spec.url, self._stuck)
                pub.abort()

    def write(self, frame: Frame) -> None:
        """Draw the overlay and hand the picture to the publisher (never blocks on the network)."""
        if self._closed:
            raise OutputError(f"rtsp output {self.spec.url}: write after close")
        if not self._opened:
            self.open()
        h, w = frame.height - frame.height % 2, frame.width - frame.width % 2
        if self._size is None:
            self._size = (w, h)
        elif (w, h) != self._size:
            raise OutputError(
                f"rtsp output {self.spec.url}: frame {frame.index} is {frame.width}x{frame.height} "
                f"but the stream is {self._size[0]}x{self._size[1]}; the source changed size"
            )
        image = np.ascontiguousarray(draw_overlay(frame.image, frame.result, self.style)[:h, :w])
        with self._cond:
            if self._slot is not None:
                self.dropped += 1
            self._slot = image
            self.received += 1
            self._cond.notify()

    # -- publisher thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        spec = self.spec
        period = 1.0 / spec.fps
        pub: _Publisher | None = None
        t0 = time.monotonic()
        last: np.ndarray | None = None
        last_input = 0.0
        last_sent = 0.0
        next_attempt = 0.0
        try:
            while True:
                with self._cond:
                    if self._slot is None and not self._stop:
                        self._cond.wait(period)
                    image, self._slot = self._slot, None
                    stop = self._stop
                now = time.monotonic()
                if image is not None:
                    last, last_input, stub = image, now, False
                elif stop:
                    break
                elif (
                    last is not None
                    and now - last_input >= spec.lost_after_s
                    and now - last_sent >= period * 0.9
                ):
                    lost_for = now - last_input
                    image, stub = draw_banner(last, f"{spec.banner} ({lost_for:.0f} s)"), True
                else:
                    continue
                if pub is None:
                    if now < next_attempt:
                        self.dropped_offline += 0 if stub else 1
                        continue
                    pub = self._pub = self._connect(image.shape[1], image.shape[0])
                    if pub is None:
                        delay = self.supervisor.lost(self.error or "cannot connect", failed_attempt=True)
                        next_attempt = now + (delay if delay is not None else spec.reconnect.max_s)
                        self.dropped_offline += 0 if stub else 1
                        continue
                cpu = time.thread_time()
                try:
                    self._busy_since = time.monotonic()
                    pub.send(image, round((now - t0) / TIME_BASE))
                except (av.error.FFmpegError, OSError) as err:
                    stuck, self._stuck = self._stuck, None
                    self.error = stuck or f"{type(err).__name__}: {err}"
                    self._unresponsive = stuck is not None
                    if not stuck:
                        logger.warning(
                            "rtsp output %s: the server went away (%s); reconnecting", spec.url, err
                        )
                    self._pub = None
                    pub.close(flush=False)
                    pub = None
                    delay = self.supervisor.lost(self.error, stalled=stuck is not None)
                    next_attempt = time.monotonic() + (delay if delay is not None else spec.reconnect.max_s)
                    self.dropped_offline += 0 if stub else 1
                    continue
                finally:
                    self._busy_since = None
                self.encode_cpu_s += time.thread_time() - cpu
                self.encoded += 1
                last_sent = now
                if stub:
                    self.stub_frames += 1
                else:
                    self.sent += 1
        except Exception as err:  # noqa: BLE001 - never kill the pipeline from this thread; report in stats
            self.error = f"{type(err).__name__}: {err}"
            logger.exception("rtsp output %s: publisher failed", spec.url)
        finally:
            self._busy_since = None
            if pub is not None:
                self._busy_since = time.monotonic()  # the flush may block too: the watchdog covers it
                pub.close(flush=True)
                self._busy_since = None
            self._pub = None
            self.supervisor.end("closed")

    def _connect(self, width: int, height: int) -> _Publisher | None:
        self.supervisor.connecting()
        if self._unresponsive:
            # The server accepts connections but does not answer (it stopped reading): ask it first, without
            # FFmpeg, whose handshake would freeze the process for open_timeout (see rtsp_answers).  Only then: a
            # one-shot receiver (ffmpeg -rtsp_flags listen) accepts a single connection, which a probe would use.
            why = rtsp_answers(self.spec.url, self.spec.open_timeout)
            if why is not None:
                self.error = why
                self._unresponsive = why.startswith("the server did not answer")
                logger.warning("rtsp output %s: cannot connect (%s)", self.spec.url, why)
                return None
        started = time.monotonic()
        try:
            # Note: PyAV holds the GIL during the RTSP handshake (avformat_write_header), so a server that accepts
            # the TCP connection but never answers freezes the process's Python threads for up to open_timeout.
            # (No TCP probe first: it would use up a one-shot listener's single accept.)
            pub = _Publisher(self.spec, width, height)
        except Exception as err:  # noqa: BLE001 - a server that is down is retried, not fatal
            self.error = f"{type(err).__name__}: {err}"
            # failed only when the I/O timeout ran out: the server took the connection and never answered
            self._unresponsive = time.monotonic() - started >= 0.9 * self.spec.open_timeout
            logger.warning("rtsp output %s: cannot connect (%s)", self.spec.url, err)
            return None
        self.supervisor.connected()
        return pub

    def close(self) -> None:
        """Stop the publisher: send what is pending, flush the encoder, tear the session down.  Idempotent.

        Bounded: a server that stopped reading is cut off by the watchdog after ``write_timeout``; should the
        publisher still not stop, it is abandoned (a daemon thread) and ``stats()["error"]`` says so."""
        if self._closed:
            return
        self._closed = True
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(self.spec.write_timeout + 1.0)
            if self._thread.is_alive():
                pub = self._pub
                if pub is not None:
                    pub.abort()
                self._thread.join(2.0)
            if self._thread.is_alive():
                self.error = (
                    f"the publisher did not stop within {self.spec.write_timeout + 3.0:g} s; abandoned"
                )
                logger.error("rtsp output %s: %s", self.spec.url, self.error)
            self._thread = None
        self._watch_stop.set()
        if self._watchdog is not None:
            self._watchdog.join()
            self._watchdog = None

    def stats(self) -> dict[str, object]:
        """``received``, ``sent`` (input pictures published), ``stub_frames`` (banner frames), ``dropped``
        (replaced before sending), ``dropped_offline`` (server away), ``reconnects``, ``state``,
        ``stalls`` (the server stopped reading for ``write_timeout``),
        ``encode_cpu_ms`` (mean CPU time per encoded frame, this thread), ``error`` (the last one)."""
        snap = self.supervisor.snapshot()
        return {
            "state": "stalled" if self._stuck is not None else snap["state"],
            "stalls": snap["stalls"],
            "received": self.received,
            "sent": self.sent,
            "stub_frames": self.stub_frames,
            "dropped": self.dropped,
            "dropped_offline": self.dropped_offline,
            "reconnects": snap["reconnects"],
            "connect_attempts": snap["attempts"],
            "encode_cpu_ms": round(1e3 * self.encode_cpu_s / self.encoded, 3) if self.encoded else None,
            "error": self.error,
            "last_stall": self.last_stall,
        }


class RtspOutSettings(Protocol):
    """The settings :func:`rtsp_out_spec` reads (``vostream.apps.config.TrackSettings`` has them)."""

    rtsp_out: str | None
    rtsp_out_bitrate: int | None
    rtsp_out_gop: int | None


def rtsp_out_spec(settings: RtspOutSettings, fps: float | None) -> RtspSinkSpec:
    """The RTSP output of a ``vostream track`` run (``--rtsp-out`` and the ``rtsp_out_*`` settings)."""
    if settings.rtsp_out is None:
        raise ConfigError("rtsp_out_spec needs settings.rtsp_out, an rtsp:// URL to publish to")
    return RtspSinkSpec(
        settings.rtsp_out,
        fps=fps if fps and fps > 0 else 25.0,
        bitrate=settings.rtsp_out_bitrate,
        gop=settings.rtsp_out_gop,
    )


__all__ = ["RtspSink", "RtspSinkSpec", "TIME_BASE", "draw_banner", "rtsp_answers", "rtsp_out_spec"]
