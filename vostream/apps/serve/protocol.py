"""The viewer protocol, version 1 (``docs/protocol.md``): parsing, validation and encoding, no I/O.

Every client message is one msgpack map with a ``t`` key.  :func:`parse_client_message` turns the raw bytes into
one of the typed messages below or raises :class:`ProtocolError` with an error code and a one-line message that
says what to fix.  Range checks that need the session (coordinates inside the frame, frame past the end) are done
by :func:`check_prompt_range` once the session is known.

Thread-safety: pure functions and frozen dataclasses; safe from any thread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import msgpack

from vostream.pipeline.errors import ConfigError
from vostream.pipeline.types import outside_frame
from vostream.stages.trackers.base import MAX_POINTS

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_OBJ_ID = 255
MAX_SOURCE_CHARS = 1024
MAX_INFLIGHT = 8
#: the largest ``view`` side a client may ask for (device pixels)
MAX_VIEW_SIDE = 16384
EXPORT_FORMATS = ("json", "png")


class ProtocolError(ConfigError):
    """A client message that cannot be accepted; ``code`` is the protocol's error code."""

    def __init__(self, code: str, message: str, ref: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.ref = ref


# -- typed client messages ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    v: int
    client: str = ""
    inflight: int | None = None


@dataclass(frozen=True)
class Open:
    source: str


@dataclass(frozen=True)
class Watch:
    session: str


@dataclass(frozen=True)
class PromptMsg:
    obj: int
    frame: int
    points: tuple[tuple[float, float], ...]
    labels: tuple[int, ...]
    box: tuple[float, float, float, float] | None = None


@dataclass(frozen=True)
class Remove:
    obj: int


@dataclass(frozen=True)
class Seek:
    frame: int


@dataclass(frozen=True)
class Export:
    format: str


@dataclass(frozen=True)
class Ack:
    seq: int
    recv_ms: float
    draw_ms: float


@dataclass(frozen=True)
class Ping:
    id: int
    client_ms: float


@dataclass(frozen=True)
class View:
    """The size (device pixels) at which the client shows frames; the server encodes images no larger."""

    w: int
    h: int


@dataclass(frozen=True)
class Reload:
    """``reload``: load the server's model again (a new export in its directory) and switch every session to it.
    An operator's message: refused unless the server was started with ``--allow-reload``."""


@dataclass(frozen=True)
class Simple:
    """``play``, ``pause``, ``step``, ``reset``, ``close``: no fields."""

    t: str


ClientMessage = (
    Hello | Open | Watch | PromptMsg | Remove | Seek | Export | Ack | Ping | View | Reload | Simple
)

_SIMPLE = ("play", "pause", "step", "reset", "close")
#: per type: required keys, optional keys
_KEYS: dict[str, tuple[set[str], set[str]]] = {
    "hello": ({"v"}, {"client", "inflight"}),
    "open": ({"source"}, set()),
    "watch": ({"session"}, set()),
    "prompt": ({"obj", "frame"}, {"points", "labels", "box"}),
    "remove": ({"obj"}, set()),
    "seek": ({"frame"}, set()),
    "export": ({"format"}, set()),
    "ack": ({"seq", "recv_ms", "draw_ms"}, set()),
    "ping": ({"id", "client_ms"}, set()),
    "view": ({"w", "h"}, set()),
    "reload": (set(), set()),
    **{name: (set(), set()) for name in _SIMPLE},
}
MESSAGE_TYPES = tuple(_KEYS)


def _int(msg: dict[str, object], key: str, t: str, lo: int, hi: int | None = None) -> int:
    v = msg[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ProtocolError("bad_message", f"{t}.{key} must be an integer, got {type(v).__name__}", t)
    if v < lo or (hi is not None and v > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ProtocolError("out_of_range", f"{t}.{key} = {v} is out of range ({rng})", t)
    return int(v)


def _num(v: object, what: str, t: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ProtocolError("bad_message", f"{what} must be a number, got {type(v).__name__}", t)
    f = float(v)
    if not math.isfinite(f):
        raise ProtocolError("out_of_range", f"{what} must be finite, got {v}", t)
    return f


def _str(msg: dict[str, object], key: str, t: str, limit: int) -> str:
    v = msg[key]
    if not isinstance(v, str):
        raise ProtocolError("bad_message", f"{t}.{key} must be a string, got {type(v).__name__}", t)
    if len(v) > limit:
        raise ProtocolError("out_of_range", f"{t}.{key} is longer than {limit} characters", t)
    return v


def decode(data: bytes | bytearray | memoryview | str) -> dict[str, object]:
    """The msgpack map in ``data`` (one binary frame).  Raises :class:`ProtocolError` ``bad_msgpack``."""
    if isinstance(data, str):
        raise ProtocolError("bad_msgpack", "text frames are not accepted; send msgpack in a binary frame")
    try:
        msg = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several unrelated types for bad input
        raise ProtocolError(
            "bad_msgpack",
            f"not a msgpack message ({type(exc).__name__}); send one msgpack map per binary frame",
        ) from exc
    if not isinstance(msg, dict):
        raise ProtocolError("bad_msgpack", f"a message must be a msgpack map, got {type(msg).__name__}")
    return msg


def parse_client_message(data: bytes | bytearray | memoryview | str) -> ClientMessage:
    """Validate one client message: keys, types and value ranges that need no session."""
    msg = decode(data)
    t = msg.get("t")
    if not isinstance(t, str):
        raise ProtocolError("bad_message", "every message needs a string field 't' (the message type)")
    if t not in _KEYS:
        raise ProtocolError(
            "unknown_type",
            f"unknown message type {t[:40]!r}; expected one of {', '.join(MESSAGE_TYPES)}",
            t[:40],
        )
    required, optional = _KEYS[t]
    present = {k for k, v in msg.items() if k != "t" and not (k in optional and v is None)}
    missing = required - present
    if missing:
        raise ProtocolError("bad_message", f"{t}: missing field(s) {', '.join(sorted(missing))}", t)
    unknown = present - required - optional
    if unknown:
        raise ProtocolError("bad_message", f"{t}: unknown field(s) {', '.join(sorted(map(str, unknown)))}", t)

    if t in _SIMPLE:
        return Simple(t)
    if t == "reload":
        return Reload()
    if t == "hello":
        inflight = _int(msg, "inflight", t, 1, MAX_INFLIGHT) if "inflight" in present else None
        client = _str(msg, "client", t, 64) if "client" in present else ""
        return Hello(_int(msg, "v", t, 0), client, inflight)
    if t == "open":
        source = _str(msg, "source", t, MAX_SOURCE_CHARS)
        if not source.strip() or "\x00" in source:
            raise ProtocolError("bad_message", "open.source must be a non-empty path or URL", t)
        return Open(source)
    if t == "watch":
        return Watch(_str(msg, "session", t, 64))
    if t == "remove":
        return Remove(_int(msg, "obj", t, 1, MAX_OBJ_ID))
    if t == "seek":
        return Seek(_int(msg, "frame", t, 0))
    if t == "export":
        fmt = _str(msg, "format", t, 16)
        if fmt not in EXPORT_FORMATS:
            raise ProtocolError(
                "out_of_range", f"export.format {fmt!r}: choose {' or '.join(EXPORT_FORMATS)}", t
            )
        return Export(fmt)
    if t == "ack":
        return Ack(
            _int(msg, "seq", t, 0),
            _num(msg["recv_ms"], "ack.recv_ms", t),
            _num(msg["draw_ms"], "ack.draw_ms", t),
        )
    if t == "ping":
        return Ping(_int(msg, "id", t, 0, 2**31), _num(msg["client_ms"], "ping.client_ms", t))
    if t == "view":
        return View(_int(msg, "w", t, 1, MAX_VIEW_SIDE), _int(msg, "h", t, 1, MAX_VIEW_SIDE))
    return _parse_prompt(msg, present)


def _parse_prompt(msg: dict[str, object], present: set[str]) -> PromptMsg:
    t = "prompt"
    obj = _int(msg, "obj", t, 1, MAX_OBJ_ID)
    frame = _int(msg, "frame", t, 0)
    points: list[tuple[float, float]] = []
    if "points" in present:
        raw = msg["points"]
        if not isinstance(raw, list):
            raise ProtocolError("bad_message", "prompt.points must be a list of [x, y] pairs", t)
        if len(raw) > MAX_POINTS:
            raise ProtocolError(
                "out_of_range", f"prompt.points has {len(raw)} points; at most {MAX_POINTS}", t
            )
        for i, p in enumerate(raw):
            if not isinstance(p, list) or len(p) != 2:
                raise ProtocolError("bad_message", f"prompt.points[{i}] must be an [x, y] pair", t)
            points.append((_num(p[0], f"prompt.points[{i}][0]", t), _num(p[1], f"prompt.points[{i}][1]", t)))
    labels: list[int] = [1] * len(points)
    if "labels" in present:
        raw = msg["labels"]
        if not isinstance(raw, list) or len(raw) != len(points):
            raise ProtocolError(
                "bad_message",
                f"prompt.labels must be a list of {len(points)} labels (0 or 1), one per point",
                t,
            )
        for i, lab in enumerate(raw):
            if isinstance(lab, bool) or lab not in (0, 1):
                raise ProtocolError(
                    "bad_message", f"prompt.labels[{i}] must be 0 (negative) or 1 (positive)", t
                )
        labels = [int(v) for v in raw]
    box = None
    if "box" in present:
        raw = msg["box"]
        if not isinstance(raw, list) or len(raw) != 4:
            raise ProtocolError("bad_message", "prompt.box must be [x0, y0, x1, y1]", t)
        x0, y0, x1, y1 = (_num(v, f"prompt.box[{i}]", t) for i, v in enumerate(raw))
        if not (x1 > x0 and y1 > y0):
            raise ProtocolError("out_of_range", "prompt.box needs x1 > x0 and y1 > y0", t)
        box = (x0, y0, x1, y1)
    if not points and box is None:
        raise ProtocolError("bad_message", "prompt needs at least one point or a box", t)
    return PromptMsg(obj, frame, tuple(points), tuple(labels), box)


def check_prompt_range(p: PromptMsg, width: int, height: int) -> None:
    """Raise ``out_of_range`` when a point or the box lies outside a ``width`` x ``height`` frame."""
    problem = outside_frame(p.points, p.box, width, height)
    if problem is not None:
        raise ProtocolError("out_of_range", f"prompt: {problem}", "prompt")


# -- encoding ------------------------------------------------------------------------------------------------------


def encode(message: dict[str, object]) -> bytes:
    """One msgpack map (binary frame) for ``message``."""
    return msgpack.packb(message, use_bin_type=True)


def error(code: str, message: str, ref: str | None = None) -> bytes:
    return encode({"t": "error", "code": code, "message": message, "ref": ref})


__all__ = [
    "Ack",
    "ClientMessage",
    "EXPORT_FORMATS",
    "Export",
    "Hello",
    "MAX_INFLIGHT",
    "MAX_OBJ_ID",
    "MAX_POINTS",
    "MAX_VIEW_SIDE",
    "MESSAGE_TYPES",
    "Open",
    "PROTOCOL_VERSION",
    "Ping",
    "PromptMsg",
    "ProtocolError",
    "Reload",
    "Remove",
    "SUPPORTED_VERSIONS",
    "Seek",
    "Simple",
    "View",
    "Watch",
    "check_prompt_range",
    "decode",
    "encode",
    "error",
    "parse_client_message",
]
