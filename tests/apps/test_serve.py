"""``vostream serve`` without a browser: protocol round trips, malformed input, slow clients, security, HTTP."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
from fakes.waiting import wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from vostream.apps.serve.media import resolve_source
from vostream.apps.serve.protocol import ProtocolError, parse_client_message
from vostream.apps.serve.server import ServerConfig, ServerThread
from vostream.apps.serve.session import SessionOptions
from vostream.pipeline.errors import ConfigError
from vostream.samples.scenes import render_scene, write_scene
from vostream.sinks.websocket import FULL_SIZE_ABOVE, ClientSlot, FrameHub, PackedFrame, scale_image

W, H = 160, 120


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    write_scene(render_scene("translate", width=W, height=H, frames=30), root / "clip.mp4")
    (root / "sub").mkdir()
    (root.parent / "secret.mp4").write_bytes(b"not for you")
    os.symlink(root.parent / "secret.mp4", root / "escape.mp4")
    return root


@pytest.fixture()
def server(media: Path, tmp_path: Path):
    cfg = ServerConfig(
        port=0,
        media_root=str(media),
        max_rate=40.0,
        session=SessionOptions(out_dir=str(tmp_path / "out"), save=("json",)),
    )
    with ServerThread(cfg) as st:
        yield st


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def recv(ws, t: str | None = None, timeout: float = 10.0) -> dict:
    """The next message (of type ``t``), skipping stats/state unless asked for."""
    deadline = time.monotonic() + timeout
    while True:
        m = msgpack.unpackb(ws.recv(timeout=max(0.01, deadline - time.monotonic())), raw=False)
        if t is None or m["t"] == t:
            return m


def hello(ws, **kw) -> dict:
    ws.send(pack({"t": "hello", "v": 1, **kw}))
    return recv(ws, "hello")


def opened(port: int, **kw):
    ws = connect(f"ws://127.0.0.1:{port}/ws", max_size=2**24)
    hello(ws, **kw)
    ws.send(pack({"t": "open", "source": "clip.mp4"}))
    info = recv(ws, "opened")
    return ws, info


def ack(ws, m: dict) -> None:
    ws.send(pack({"t": "ack", "seq": m["seq"], "recv_ms": time.time() * 1000, "draw_ms": time.time() * 1000}))


# -- sans-I/O parsing ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "msg, code",
    [
        (b"\xc1\xc1", "bad_msgpack"),
        (pack([1, 2]), "bad_msgpack"),
        (pack({"x": 1}), "bad_message"),
        (pack({"t": "fly"}), "unknown_type"),
        (pack({"t": "prompt", "obj": "1", "frame": 0, "points": [[1, 2]]}), "bad_message"),
        (pack({"t": "prompt", "obj": 0, "frame": 0, "points": [[1, 2]]}), "out_of_range"),
        (pack({"t": "prompt", "obj": 1, "frame": -1, "points": [[1, 2]]}), "out_of_range"),
        (pack({"t": "prompt", "obj": 1, "frame": 0}), "bad_message"),
        (pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[1, 2]], "labels": [2]}), "bad_message"),
        (pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[1, 2]] * 65}), "out_of_range"),
        (pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[float("nan"), 2]]}), "out_of_range"),
        (pack({"t": "prompt", "obj": 1, "frame": 0, "box": [5, 5, 2, 9]}), "out_of_range"),
        (pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[1, 2]], "colour": 3}), "bad_message"),
        (pack({"t": "seek", "frame": True}), "bad_message"),
        (pack({"t": "export", "format": "xml"}), "out_of_range"),
        (pack({"t": "hello", "v": 1, "inflight": 99}), "out_of_range"),
        (pack({"t": "view", "w": 0, "h": 360}), "out_of_range"),
        (pack({"t": "view", "w": 640, "h": 20000}), "out_of_range"),
        (pack({"t": "view", "w": 640.5, "h": 360}), "bad_message"),
        (pack({"t": "view", "w": 640}), "bad_message"),
        (pack({"t": "view", "w": 640, "h": 360, "dpr": 2}), "bad_message"),
    ],
)
def test_parse_rejects(msg: bytes, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(msg)
    assert info.value.code == code
    assert "\n" not in str(info.value)


def test_parse_accepts_every_client_type() -> None:
    msgs = [
        {"t": "hello", "v": 1, "inflight": 3},
        {"t": "open", "source": "a.mp4"},
        {"t": "watch", "session": "x"},
        {"t": "prompt", "obj": 2, "frame": 3, "points": [[1.5, 2]], "labels": [0], "box": [0, 0, 4, 4]},
        {"t": "remove", "obj": 2},
        {"t": "seek", "frame": 4},
        {"t": "export", "format": "png"},
        {"t": "ack", "seq": 1, "recv_ms": 1.0, "draw_ms": 2.0},
        {"t": "ping", "id": 1, "client_ms": 3.0},
        {"t": "view", "w": 640, "h": 360},
    ]
    msgs += [{"t": t} for t in ("play", "pause", "step", "reset", "close")]
    for m in msgs:
        parsed = parse_client_message(pack(m))
        assert type(parsed).__name__.lower().startswith(m["t"]) or getattr(parsed, "t", None) == m["t"]
    p = parse_client_message(pack(msgs[3]))
    assert p.points == ((1.5, 2.0),) and p.labels == (0,) and p.box == (0, 0, 4, 4)


def test_client_slot_latest_wins_and_inflight() -> None:
    slot = ClientSlot(inflight=2)
    frames = [PackedFrame.pack({"t": "frame", "seq": i, "index": i, "capture_ms": 1.0}) for i in range(1, 7)]
    slot.offer(frames[0])
    assert slot.take().seq == 1
    slot.offer(frames[1])
    assert slot.take().seq == 2
    slot.offer(frames[2])
    assert slot.take() is None, "window full: nothing more until an ack"
    slot.offer(frames[3])
    slot.offer(frames[4])
    assert slot.drops == 2
    slot.ack(2, draw_ms=11.0)
    assert slot.take().seq == 5, "the newest frame wins"
    assert slot.stats()["latency_ms"]["n"] == 1
    m = msgpack.unpackb(frames[5].finish(123.0))
    assert m["seq"] == 6 and m["sent_ms"] == 123.0


def test_image_size_follows_the_largest_display_never_upscaled() -> None:
    hub = FrameHub()
    assert hub.image_size(1280, 720) == (1280, 720), "no client: the frame's own size"
    assert FrameHub(view=(640, 640)).image_size(1280, 720) == (640, 360), "no client yet: the opener's view"
    a, b = ClientSlot(), ClientSlot()
    hub.add(a)
    assert hub.image_size(1280, 720) == (1280, 720), "a client that did not say its size gets the full frame"
    a.view = (640, 360)
    assert hub.image_size(1280, 720) == (640, 360)
    a.view = (640, 600)  # a window of another shape: the frame's aspect is kept, fitted inside
    assert hub.image_size(1280, 720) == (640, 360)
    hub.add(b)
    assert hub.image_size(1280, 720) == (1280, 720), "the second client has not said: full size"
    b.view = (320, 180)
    assert hub.image_size(1280, 720) == (640, 360), "the largest display wins"
    b.view = (2560, 1440)
    assert hub.image_size(1280, 720) == (1280, 720), "never upscaled"
    b.view = (int(1280 * FULL_SIZE_ABOVE) + 8, 720)
    assert hub.image_size(1280, 720) == (1280, 720), "almost full size: not worth scaling"
    hub.remove(b)
    a.view = (1, 1)
    assert hub.image_size(1280, 720) == (16, 16), "a floor on tiny views"


@pytest.mark.parametrize("size", [(640, 360), (1010, 568), (300, 169), (1280, 720)])
@pytest.mark.slow
def test_scale_image_is_close_to_area_averaging(size: tuple[int, int]) -> None:
    import cv2

    scene = render_scene("translate", width=1280, height=720, frames=2)
    img = np.ascontiguousarray(scene.frames[1])
    out = scale_image(img, *size)
    assert out.shape == (size[1], size[0], 3) and out.dtype == np.uint8
    if size == (1280, 720):
        assert out is img, "no copy at full size"
        return
    ref = cv2.resize(img, size, interpolation=cv2.INTER_AREA)
    assert np.abs(out.astype(int) - ref).mean() < 4.0


# -- over the wire ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_round_trip_of_every_message(server: ServerThread) -> None:
    ws, info = opened(server.port)
    with ws:
        assert (info["width"], info["height"], info["frames"], info["seekable"]) == (W, H, 30, True)
        first = recv(ws, "frame")
        assert first["index"] == 0 and first["objs"] == [] and first["jpeg"][:2] == b"\xff\xd8"
        assert first["capture_ms"] <= first["sent_ms"]
        ack(ws, first)
        ws.send(pack({"t": "ping", "id": 7, "client_ms": 5.0}))
        assert recv(ws, "pong")["id"] == 7
        ws.send(pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[60, 60]]}))
        m = recv(ws, "frame")
        assert m["index"] == 0 and m["objs"][0]["id"] == 1 and m["objs"][0]["rle"]["size"] == [H, W]
        ack(ws, m)
        ws.send(pack({"t": "step"}))
        m = recv(ws, "frame")
        assert m["index"] == 1
        ack(ws, m)
        ws.send(pack({"t": "seek", "frame": 20}))
        m = recv(ws, "frame")
        assert m["index"] == 20 and m["objs"] == [], "a seek resets the tracker"
        ack(ws, m)
        ws.send(pack({"t": "prompt", "obj": 3, "frame": 20, "box": [10, 10, 60, 60]}))
        m = recv(ws, "frame")
        assert [o["id"] for o in m["objs"]] == [3]
        ack(ws, m)
        ws.send(pack({"t": "remove", "obj": 3}))
        m = recv(ws, "frame")
        assert m["objs"] == []
        ack(ws, m)
        ws.send(pack({"t": "play"}))
        while (m := recv(ws, "frame"))["index"] < 29:
            ack(ws, m)
        ack(ws, m)
        st = recv(ws, "state")
        while not st["ended"]:
            st = recv(ws, "state")
        ws.send(pack({"t": "pause"}))
        ws.send(pack({"t": "reset"}))
        ws.send(pack({"t": "export", "format": "json"}))
        exp = recv(ws, "export")
        doc = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{server.port}{exp['url']}").read())
        assert doc["videos"][0]["length"] == 30
        ws.send(pack({"t": "export", "format": "png"}))
        exp = recv(ws, "export")
        assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}{exp['url']}").read()[:2] == b"PK"
        stats = recv(ws, "stats")
        assert {"fps", "latency_ms", "drops", "queues", "server_ms"} <= set(stats)
        ws.send(pack({"t": "close"}))
        assert recv(ws, "closed")["reason"] == "closed"
        ws.send(pack({"t": "play"}))
        assert recv(ws, "error")["code"] == "no_session"


def _jpeg_size(m: dict) -> tuple[int, int]:
    import cv2

    img = cv2.imdecode(np.frombuffer(m["jpeg"], np.uint8), cv2.IMREAD_COLOR)
    return img.shape[1], img.shape[0]


def test_view_sets_the_image_size_masks_stay_at_source_size(server: ServerThread) -> None:
    """``view``: frames are encoded at the largest display size of the session's clients (never more than the
    source); masks, boxes and coordinates stay in source pixels; a client that says nothing gets full frames."""
    ws = connect(f"ws://127.0.0.1:{server.port}/ws", max_size=2**24)
    with ws:
        hello(ws)
        ws.send(pack({"t": "view", "w": 80, "h": 80}))  # before open: kept for the session to come
        ws.send(pack({"t": "open", "source": "clip.mp4"}))
        info = recv(ws, "opened")
        m = recv(ws, "frame")
        assert (m["w"], m["h"], m["iw"], m["ih"]) == (W, H, 80, 60) and _jpeg_size(m) == (80, 60)
        ack(ws, m)
        ws.send(pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[60, 60]]}))
        m = recv(ws, "frame")
        assert m["objs"][0]["rle"]["size"] == [H, W], "masks stay at the source size"
        assert _jpeg_size(m) == (80, 60)
        ack(ws, m)

        watcher = connect(f"ws://127.0.0.1:{server.port}/ws", max_size=2**24)
        with watcher:
            hello(watcher)
            watcher.send(pack({"t": "watch", "session": info["session"]}))
            recv(watcher, "opened")
            ack(watcher, recv(watcher, "frame"))  # the held frame
            ws.send(pack({"t": "step"}))
            m = recv(ws, "frame")
            assert (m["iw"], m["ih"]) == (W, H) and _jpeg_size(m) == (W, H), (
                "a client without view: full size"
            )
            ack(ws, m)
            ack(watcher, recv(watcher, "frame"))
            watcher.send(pack({"t": "view", "w": 40, "h": 30}))
            watcher.send(pack({"t": "ping", "id": 1, "client_ms": 0.0}))
            recv(watcher, "pong")  # the view was taken
            ws.send(pack({"t": "step"}))
            m = recv(ws, "frame")
            assert _jpeg_size(m) == (80, 60), "the larger of the two displays"
            ack(ws, m)
            ack(watcher, recv(watcher, "frame"))
        ws.send(pack({"t": "view", "w": 4000, "h": 3000}))
        ws.send(pack({"t": "step"}))
        m = recv(ws, "frame")
        assert (m["iw"], m["ih"]) == (W, H) and _jpeg_size(m) == (W, H), "never upscaled"


@pytest.mark.slow
def test_bad_messages_get_errors_and_server_stays_up(server: ServerThread) -> None:
    ws, info = opened(server.port)
    with ws:
        recv(ws, "frame")
        cases = [
            (b"\x93\x01", "bad_msgpack"),
            (pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[W + 5, 3]]}), "out_of_range"),
            (
                pack({"t": "prompt", "obj": 1, "frame": 0, "points": [[3, 3]], "labels": [0]}),
                "unknown_object",
            ),
            (pack({"t": "remove", "obj": 9}), "unknown_object"),
            (pack({"t": "seek", "frame": 10_000}), "out_of_range"),
            (pack({"t": "watch", "session": "nope"}), "unknown_session"),
            (pack({"t": "open", "source": "../secret.mp4"}), "forbidden_path"),
            (pack({"t": "open", "source": "escape.mp4"}), "forbidden_path"),
            (pack({"t": "open", "source": "/etc/passwd"}), "forbidden_path"),
            (pack({"t": "open", "source": "rtsp://10.0.0.1/x"}), "source_error"),  # generic: no probing
            (pack({"t": "open", "source": "missing.mp4"}), "source_error"),
            (pack({"t": "open", "source": "sub"}), "source_error"),
        ]
        for data, code in cases:
            ws.send(data)
            err = recv(ws, "error")
            assert err["code"] == code, (code, err)
            assert err["message"] and "\n" not in err["message"]
        # too many objects
        for oid in range(1, 9):
            ws.send(pack({"t": "prompt", "obj": oid, "frame": 0, "points": [[5 + oid, 5]]}))
        ws.send(pack({"t": "prompt", "obj": 9, "frame": 0, "points": [[5, 5]]}))
        assert recv(ws, "error")["code"] == "too_many_objects"
    # oversized message: closed by the library with 1009, server still answers others
    with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        hello(ws)
        ws.send(pack({"t": "open", "source": "x" * 100_000}))
        with pytest.raises(ConnectionClosed) as info:
            recv(ws)
        assert info.value.rcvd.code == 1009
    # hello first, version check
    with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        ws.send(pack({"t": "play"}))
        assert recv(ws, "error")["code"] == "hello_first"
        with pytest.raises(ConnectionClosed):
            recv(ws)
    with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        ws.send(pack({"t": "hello", "v": 99}))
        assert recv(ws, "error")["code"] == "version"
    # a flood: rate_limited replies, then a close with a reason
    with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
        hello(ws)
        codes, reason = [], None
        try:
            for i in range(400):
                ws.send(pack({"t": "ping", "id": i, "client_ms": 0.0}))
        except ConnectionClosed:
            pass  # the server may close before the whole flood is sent; what it said is still readable
        try:
            while True:
                m = recv(ws, timeout=5)
                if m["t"] == "error":
                    codes.append(m["code"])
        except ConnectionClosed as exc:
            reason = exc.rcvd.reason if exc.rcvd else None
        assert "rate_limited" in codes and reason == "rate limit exceeded"
    ws, _ = opened(server.port)
    with ws:
        assert recv(ws, "frame")["index"] == 0, "the server still serves new clients"


def test_watcher_and_not_owner(server: ServerThread) -> None:
    ws, info = opened(server.port)
    with ws, connect(f"ws://127.0.0.1:{server.port}/ws") as watcher:
        recv(ws, "frame")
        hello(watcher)
        watcher.send(pack({"t": "watch", "session": info["session"]}))
        assert recv(watcher, "opened")["watcher"] is True
        assert recv(watcher, "frame")["index"] == 0, "a watcher sees the current frame at once"
        watcher.send(pack({"t": "play"}))
        assert recv(watcher, "error")["code"] == "not_owner"
        ws.send(pack({"t": "close"}))
        assert recv(watcher, "closed")["reason"]


def test_stalled_client_does_not_slow_others_or_file_sink(server: ServerThread, tmp_path: Path) -> None:
    stalled, info = opened(server.port, inflight=1)  # never acks, never reads after this
    fast, _ = opened(server.port)
    rss0 = _rss()
    with stalled, fast:
        t0 = time.monotonic()
        stalled.send(pack({"t": "play"}))
        fast.send(pack({"t": "play"}))
        indices = []
        while True:
            m = recv(fast, "frame", timeout=10)
            indices.append(m["index"])
            ack(fast, m)
            if m["index"] >= 29:
                break
        elapsed = time.monotonic() - t0
        assert elapsed < 3.0, f"30 frames at 30 fps took {elapsed:.1f} s for the fast client"
        assert len(indices) >= 25, "the acking client got (nearly) every frame"
        sessions = server.call(lambda: list(server.server.sessions.values()))
        stalled_session = next(s for s in sessions if s.id == info["session"])
        assert wait_until(lambda: stalled_session.control.ended, 5), (
            "the stalled client's own pipeline stalled"
        )
        slot = server.call(
            lambda: next(c.slot for c in server.server.clients.values() if c.session is stalled_session)
        )
        assert slot.sent <= 2 and slot.drops >= 20, slot.stats()
        assert _rss() - rss0 < 100 * 2**20
        stalled_session.control.finish()  # end the stream: the file sink closes and writes its JSON
        out = tmp_path / "out" / info["session"] / "annotations.json"
        assert wait_until(out.exists, 5), "file sink was not finalised"
        assert json.loads(out.read_text())["videos"][0]["length"] == 30, "the file sink lost no frame"


# -- security and HTTP ----------------------------------------------------------------------------------------------


def test_non_loopback_bind_requires_token(media: Path) -> None:
    with pytest.raises(ConfigError, match="--token"):
        ServerThread(ServerConfig(host="0.0.0.0", port=0, media_root=str(media)))


def test_token_and_origin_checks(media: Path) -> None:
    cfg = ServerConfig(port=0, media_root=str(media), token="s3cret-token")
    with ServerThread(cfg) as st:
        base = f"ws://127.0.0.1:{st.port}/ws"
        for url in (base, base + "?token=wrong"):
            with pytest.raises(InvalidStatus) as info:
                connect(url)
            assert info.value.response.status_code == 403
        with connect(base + "?token=s3cret-token") as ws:
            assert hello(ws)["v"] == 1
        with pytest.raises(InvalidStatus):
            connect(base + "?token=s3cret-token", origin="http://evil.example")
        with connect(base + "?token=s3cret-token", origin=f"http://127.0.0.1:{st.port}") as ws:
            assert hello(ws)["v"] == 1
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{st.port}/metrics")
        assert info.value.code == 403
        assert (
            b"vostream_viewer_clients"
            in urllib.request.urlopen(f"http://127.0.0.1:{st.port}/metrics?token=s3cret-token").read()
        )
        req = urllib.request.Request(f"http://127.0.0.1:{st.port}/", headers={"Host": "evil.example:80"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req)
        assert info.value.code == 403, "DNS-rebinding Host refused"


def test_static_files_only_from_web(server: ServerThread) -> None:
    base = f"http://127.0.0.1:{server.port}"
    page = urllib.request.urlopen(base + "/").read()
    assert b"viewer.js" in page
    assert b"MessagePack" in urllib.request.urlopen(base + "/vendor/msgpack.min.js").read()
    for bad in (
        "/../pyproject.toml",
        "/%2e%2e/pyproject.toml",
        "/__init__.py",
        "/etc/passwd",
        "/export/x/y.json",
    ):
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(base + bad)
        assert info.value.code == 404, bad
    health = json.loads(urllib.request.urlopen(base + "/healthz").read())
    assert health["ok"] is True and health["tracker"] == "classic"


def test_resolve_source_rules(media: Path) -> None:
    path, display = resolve_source(media, "clip.mp4")
    assert Path(path) == (media / "clip.mp4").resolve() and display == "clip.mp4"
    for bad in ("../secret.mp4", "sub/../../secret.mp4", "escape.mp4", str(media.parent / "secret.mp4")):
        with pytest.raises(ProtocolError) as info:
            resolve_source(media, bad)
        assert info.value.code == "forbidden_path", bad
    assert resolve_source(media, "rtsp://cam/1", ("rtsp://cam/",))[0] == "rtsp://cam/1"


def test_metrics_expose_pipeline(server: ServerThread) -> None:
    ws, info = opened(server.port)
    with ws:
        recv(ws, "frame")
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics").read().decode()
        assert f'session="{info["session"]}"' in text
        assert "vostream_node_frames_out_total" in text and "vostream_viewer_sessions 1.0" in text


def test_cli_serve_parser() -> None:
    from vostream.apps.cli import build_parser

    args = build_parser().parse_args(["serve", "clip.mp4", "--port", "0", "--host", "127.0.0.1"])
    assert args.command == "serve" and args.source == "clip.mp4" and args.port == 0
    from vostream.apps.cli import main

    assert main(["serve", "--host", "0.0.0.0", "--port", "0"]) == 2  # no --token: refused, one line


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--max-objects", "0", "max objects must be 1..255"),
        ("--max-objects", "256", "max objects must be 1..255"),
        ("--fps", "0", "fps must be > 0"),
    ],
)
def test_cli_serve_rejects_bad_session_options(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Session options are validated where they are built: the server never starts with them."""
    from vostream.apps.cli import main

    assert main(["serve", "--port", "0", option, value]) == 2
    assert message in capsys.readouterr().err


def test_masks_match_rle(server: ServerThread) -> None:
    ws, _ = opened(server.port)
    with ws:
        recv(ws, "frame")
        ws.send(pack({"t": "prompt", "obj": 1, "frame": 0, "box": [20, 20, 80, 80]}))
        m = recv(ws, "frame")
        from vostream.sinks.websocket import decode_rle_counts

        o = m["objs"][0]
        mask = decode_rle_counts(o["rle"]["counts"], H, W)
        ys, xs = np.nonzero(mask)
        assert mask.any() and o["box"] == [
            float(xs.min()),
            float(ys.min()),
            float(xs.max() + 1),
            float(ys.max() + 1),
        ]


def test_sessions_share_one_loaded_tracker_closed_with_the_server(media: Path) -> None:
    """Weights / graphs load once per server, not per browser session; the server's stop releases them."""
    cfg = ServerConfig(host="127.0.0.1", port=0, media_root=str(media))
    with ServerThread(cfg) as st:
        first, _ = opened(st.port)
        second, _ = opened(st.port)
        with first, second:
            recv(first, "frame")
            recv(second, "frame")
            cache = st.call(lambda: st.server.trackers)
            tracker = st.call(lambda: cache.handle.tracker)
            assert tracker is not None
            sessions = st.call(lambda: list(st.server.sessions.values()))
            assert len(sessions) == 2 and all(s.trackers is cache for s in sessions)
            first.send(pack({"t": "close"}))
            recv(first, "closed")
            assert st.call(lambda: cache.handle.tracker) is tracker, (
                "closing one session must not close the shared one"
            )
    assert cache._closed and cache.handle is None
