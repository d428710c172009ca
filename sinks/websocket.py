"""The viewer sink: each tracked frame becomes one msgpack ``frame`` message (JPEG + COCO RLE per object), packed
once and offered to every connected client's one-frame slot (``docs/protocol.md``, ``docs/viewer.md``).  The JPEG
is encoded at the largest display size the session's clients asked for (``view``; :meth:`FrameHub.image_size`),
never above the source's; masks stay at the source's size.

- :class:`ClientSlot`: one client's latest-wins slot and in-flight window (acks free it).  A newer frame replaces
  an unsent one (counted as a drop for that client only); nothing else is buffered, so memory per client is at
  most ``inflight`` frames in its socket plus one in the slot.
- :class:`FrameHub`: the set of slots of one session; :meth:`FrameHub.publish` never blocks.
- :class:`ViewerSinkSpec` / :class:`ViewerSink`: the pipeline sink (policy ``latest``, queue of 2 by default, so a
  slow JPEG encoder never stalls the file sinks or the tracker either).
- :class:`AnnotationRecord`: what the session keeps for "export" (RLE strings, boxes, scores per frame).

Thread-safety: ``ClientSlot``, ``FrameHub`` and ``AnnotationRecord`` are thread-safe (one lock each); the sink
runs in its pipeline thread and calls ``wake`` callbacks that must be thread-safe themselves (the server passes
``loop.call_soon_threadsafe``-based ones).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypedDict

import cv2
import msgpack
import numpy as np

from vostream.pipeline.errors import ConfigError
from vostream.pipeline.metrics import Ring
from vostream.pipeline.stage import LATEST, Sink, SinkSpec
from vostream.pipeline.types import Frame, Rle

logger = logging.getLogger(__name__)

#: wall clock minus monotonic clock, to turn ``frame.stamps`` (monotonic) into epoch milliseconds
_EPOCH_OFFSET = time.time() - time.monotonic()


@dataclass(frozen=True)
class PackedFrame:
    """A frame message packed once for every client, minus ``sent_ms`` which each client's sender appends.

    ``body`` holds the msgpack key/value pairs of ``count`` entries; :meth:`finish` prefixes a map header for
    ``count + 1`` entries and appends ``sent_ms``.  ``seq``/``index`` are kept for the sender's bookkeeping.
    ``held``: the frame was published before this client joined (a watcher's first frame, a session's frame on
    screen); :meth:`finish` then adds ``held: true`` and its ack is no glass-to-glass sample (its capture time
    may be long past).
    """

    seq: int
    index: int
    body: bytes
    count: int
    capture_ms: float
    held: bool = False

    @classmethod
    def pack(cls, fields: Mapping[str, object]) -> PackedFrame:
        """``fields`` (msgpack-able values; ``seq`` and ``index`` ints, ``capture_ms`` a number) as one frame."""
        seq, index, capture_ms = fields["seq"], fields["index"], fields.get("capture_ms", 0.0)
        if not (isinstance(seq, int) and isinstance(index, int) and isinstance(capture_ms, (int, float))):
            raise TypeError(f"a frame needs int seq and index and a numeric capture_ms, got {fields!r}")
        packer = msgpack.Packer(use_bin_type=True)
        body = b"".join(packer.pack(k) + packer.pack(v) for k, v in fields.items())
        return cls(seq, index, body, len(fields), float(capture_ms))

    def finish(self, sent_ms: float) -> bytes:
        n = self.count + 1 + self.held
        header = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
        tail = msgpack.packb("held") + msgpack.packb(True) if self.held else b""
        return header + self.body + msgpack.packb("sent_ms") + msgpack.packb(float(sent_ms)) + tail

    def __len__(self) -> int:
        return len(self.body) + 16


class LatencyStats(TypedDict):
    """Glass-to-glass latency of one client, in milliseconds (NaN before the first acknowledged frame)."""

    p50: float
    p95: float
    n: int


class SlotStats(TypedDict):
    """:meth:`ClientSlot.stats`."""

    drops: int
    sent: int
    acked: int
    inflight: int
    latency_ms: LatencyStats


class ClientSlot:
    """One client's latest-wins slot plus an in-flight window of ``inflight`` unacknowledged frames."""

    def __init__(self, inflight: int = 2, wake: Callable[[], None] | None = None) -> None:
        if inflight < 1:
            raise ConfigError(f"inflight must be >= 1, got {inflight}")
        self.inflight_limit = inflight
        self.wake = wake or (lambda: None)
        self._lock = threading.Lock()
        self._pending: PackedFrame | None = None
        self._unacked: deque[tuple[int, float]] = deque()  # (seq, capture_ms) sent, not yet acked
        self.drops = 0
        self.offered = 0
        self.sent = 0
        self.acked = 0
        self.glass_ms = Ring()
        self.closed = False
        #: the size (device pixels) at which this client shows frames (protocol ``view``), None: not told
        self.view: tuple[int, int] | None = None

    def offer(self, frame: PackedFrame) -> None:
        """Put ``frame`` in the slot, replacing (and counting as dropped) an unsent one.  Never blocks."""
        with self._lock:
            if self.closed:
                return
            if self._pending is not None:
                self.drops += 1
            self._pending = frame
            self.offered += 1
        self.wake()

    def take(self) -> PackedFrame | None:
        """The frame to send now, or ``None`` (slot empty or the in-flight window full)."""
        with self._lock:
            if self._pending is None or len(self._unacked) >= self.inflight_limit:
                return None
            frame, self._pending = self._pending, None
            # a held frame (published before this client joined) is no latency sample: capture time 0
            self._unacked.append((frame.seq, 0.0 if frame.held else frame.capture_ms))
            self.sent += 1
            return frame

    def ack(self, seq: int, draw_ms: float | None = None) -> bool:
        """Acknowledge every sent frame up to ``seq``; returns True if that freed room.  ``draw_ms`` (epoch ms,
        server clock) adds a glass-to-glass sample for frame ``seq`` -- only on its first ack (a repeated ack, a
        redraw, finds nothing unacked) and not for a ``held`` frame."""
        freed = False
        with self._lock:
            while self._unacked and self._unacked[0][0] <= seq:
                s, capture_ms = self._unacked.popleft()
                self.acked += 1
                freed = True
                if s == seq and draw_ms is not None and capture_ms > 0:
                    self.glass_ms.add(draw_ms - capture_ms)
            has_pending = self._pending is not None
        if freed and has_pending:
            self.wake()
        return freed

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._unacked)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._pending = None

    def stats(self) -> SlotStats:
        p50, p95 = self.glass_ms.percentiles(50, 95) if len(self.glass_ms) else (float("nan"),) * 2
        with self._lock:
            return {
                "drops": self.drops,
                "sent": self.sent,
                "acked": self.acked,
                "inflight": len(self._unacked),
                "latency_ms": {"p50": p50, "p95": p95, "n": len(self.glass_ms)},
            }


class FrameHub:
    """The clients of one session.  :meth:`publish` offers a packed frame to every slot without blocking."""

    def __init__(self, view: tuple[int, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._slots: list[ClientSlot] = []
        self.published = 0
        self.last: PackedFrame | None = None
        #: the display size of the client that opened the session, used until a client has joined (the first
        #: frame is encoded while the session opens, before its owner's slot is added)
        self.view = view

    def add(self, slot: ClientSlot) -> None:
        with self._lock:
            self._slots.append(slot)
            last = self.last
        if last is not None:  # a watcher joining a paused session sees the current frame at once
            slot.offer(replace(last, held=True))

    def remove(self, slot: ClientSlot) -> None:
        with self._lock:
            if slot in self._slots:
                self._slots.remove(slot)
        slot.close()

    def publish(self, frame: PackedFrame) -> None:
        with self._lock:
            slots = list(self._slots)
            self.published += 1
            self.last = frame
        for slot in slots:
            slot.offer(frame)

    def clear(self) -> None:
        """Remove (and close) every slot and forget the last frame (the session ended)."""
        with self._lock:
            slots, self._slots = self._slots, []
            self.last = None
        for slot in slots:
            slot.close()

    def __len__(self) -> int:
        with self._lock:
            return len(self._slots)

    def image_size(self, width: int, height: int) -> tuple[int, int]:
        """The size to encode a ``width`` x ``height`` frame at: fitted in the largest display box among the
        clients (their ``view``; before any client joined, the opener's), never larger than the frame, the frame's
        aspect kept.  The frame's own size when a client has not said (an older client, a script), or when the
        clients show it at more than :data:`FULL_SIZE_ABOVE` of its size (scaling would cost more than it
        saves)."""
        with self._lock:
            views = [slot.view for slot in self._slots] or [self.view]
        if any(v is None for v in views):
            return width, height
        scale = max(min(v[0] / width, v[1] / height) for v in views if v is not None)
        if scale > FULL_SIZE_ABOVE:
            return width, height
        return max(MIN_IMAGE_SIDE, round(width * scale)), max(MIN_IMAGE_SIDE, round(height * scale))


#: a frame is sent at its own size when the largest display shows it at more than this fraction of it
FULL_SIZE_ABOVE = 0.9
#: images are never scaled below this many pixels a side
MIN_IMAGE_SIDE = 16


def scale_image(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` (H, W, C) shrunk to ``width`` x ``height`` for display: halvings by pixel averaging (exact and
    fast in OpenCV) while the target is at most half the size, then bilinear.  OpenCV's area interpolation at a
    fractional ratio would cost several times the JPEG encoding it saves at 720p."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    while w >= 2 * width and h >= 2 * height:
        w, h = w // 2, h // 2
        image = cv2.resize(image, (w, h), interpolation=cv2.INTER_AREA)
    if (w, h) == (width, height):
        return image
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


class ViewerObject(TypedDict):
    """One object of a frame message (``docs/viewer.md``): id, score, present, box ``[x0, y0, x1, y1]`` and its
    COCO RLE (None when absent)."""

    id: int
    score: float
    present: bool
    box: list[float]
    rle: Rle | None


@dataclass
class _FrameRecord:
    height: int
    width: int
    rows: list[tuple[int, float, bool, list[float], str | None]]  # id, score, present, box, rle counts


class AnnotationRecord:
    """Compact per-frame results of a file session (RLE strings, not masks) for export; the latest result for a
    frame index wins (a correction on a paused frame replaces it).  Memory grows with the compressed masks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._frames: dict[int, _FrameRecord] = {}

    def add(self, index: int, height: int, width: int, objs: list[ViewerObject]) -> None:
        rows = [
            (o["id"], o["score"], o["present"], o["box"], o["rle"]["counts"] if o["rle"] else None)
            for o in objs
        ]
        with self._lock:
            self._frames[index] = _FrameRecord(height, width, rows)

    def items(self) -> list[tuple[int, _FrameRecord]]:
        with self._lock:
            return sorted(self._frames.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)


def frame_objects(frame: Frame) -> list[ViewerObject]:
    """The ``objs`` list of a frame message: id, score, present, box and COCO RLE (None when absent)."""
    result = frame.result
    if result is None or not len(result):
        return []
    rles = result.to_rles()
    objs: list[ViewerObject] = []
    for row, oid in enumerate(result.obj_ids.tolist()):
        present = bool(result.present[row])
        objs.append(
            {
                "id": int(oid),
                "score": round(float(result.scores[row]), 4),
                "present": present,
                "box": [float(v) for v in result.boxes[row]],
                "rle": rles[row] if present else None,
            }
        )
    return objs


@dataclass(frozen=True)
class ViewerSinkSpec(SinkSpec[Frame]):
    """The viewer sink of one session.  Not picklable (it points at the in-process ``hub``).

    ``policy`` ``latest`` and ``queue_size`` 2: when JPEG encoding falls behind, the viewer skips frames and the
    rest of the pipeline does not wait.
    """

    hub: FrameHub
    session: str = ""
    jpeg_quality: int = 80
    record: AnnotationRecord | None = None
    name: str = "viewer"
    policy: str | None = LATEST
    queue_size: int = 2
    on_frame: Callable[[Frame], None] | None = field(default=None, compare=False)

    def build(self) -> ViewerSink:
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"jpeg_quality must be 1..100, got {self.jpeg_quality}")
        return ViewerSink(self)


class ViewerSink(Sink[Frame]):
    """Encodes each frame (JPEG, RLE, msgpack) once and publishes it to the hub.  One pipeline thread."""

    def __init__(self, spec: ViewerSinkSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self._seq = 0
        self._encode_ms = Ring()
        self._bytes = 0

    def write(self, frame: Frame) -> None:
        t0 = time.perf_counter()
        iw, ih = self.spec.hub.image_size(frame.width, frame.height)
        bgr = cv2.cvtColor(scale_image(frame.image, iw, ih), cv2.COLOR_RGB2BGR)
        ok, jpeg = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, self.spec.jpeg_quality])
        if not ok:  # pragma: no cover - OpenCV fails only on empty images
            raise ConfigError(f"viewer sink: JPEG encoding of frame {frame.index} failed")
        objs = frame_objects(frame)
        if self.spec.record is not None:
            self.spec.record.add(frame.index, frame.height, frame.width, objs)
        tracked = frame.stamps.get("track")
        self._seq += 1
        packed = PackedFrame.pack(
            {
                "t": "frame",
                "seq": self._seq,
                "session": self.spec.session,
                "index": int(frame.index),
                "w": frame.width,
                "h": frame.height,
                "iw": iw,
                "ih": ih,
                "jpeg": jpeg.tobytes(),
                "objs": objs,
                "capture_ms": frame.capture_time * 1000.0 if frame.capture_time else 0.0,
                "tracked_ms": (tracked + _EPOCH_OFFSET) * 1000.0 if tracked else 0.0,
            }
        )
        self._bytes += len(packed.body)
        self._encode_ms.add((time.perf_counter() - t0) * 1000.0)
        self.spec.hub.publish(packed)
        if self.spec.on_frame is not None:
            self.spec.on_frame(frame)

    def close(self) -> None:
        """Nothing to flush: frames are published as they come.  Idempotent."""

    def stats(self) -> dict[str, object]:
        p50, p95 = self._encode_ms.percentiles(50, 95) if len(self._encode_ms) else (float("nan"),) * 2
        return {
            "published": self._seq,
            "encode_ms_p50": p50,
            "encode_ms_p95": p95,
            "bytes_per_frame": self._bytes / self._seq if self._seq else 0.0,
        }


def decode_rle_counts(counts: str, height: int, width: int) -> np.ndarray:
    """Boolean (H, W) mask of a compressed COCO RLE string (pycocotools), for exports and tests."""
    from pycocotools import mask as mask_utils

    return mask_utils.decode({"size": [height, width], "counts": counts.encode("ascii")}).astype(bool)


__all__ = [
    "AnnotationRecord",
    "ClientSlot",
    "FrameHub",
    "PackedFrame",
    "ViewerSink",
    "scale_image",
    "ViewerSinkSpec",
    "decode_rle_counts",
    "frame_objects",
]
