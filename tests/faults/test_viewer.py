"""Fault tests of ``vostream serve`` (issue 12, "viewer"): the ``--allow-url`` matcher (no SSRF through string
prefixes), watchers after their owner leaves, the session limit under simultaneous opens, the idle timeout,
deterministic session teardown (threads, memory) and a bounded ``stop()``.  Real server, real WebSocket clients,
loopback only."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import msgpack
import pytest
from fakes import harness, media
from websockets.sync.client import connect

from vostream.apps.serve import media as serve_media
from vostream.apps.serve.server import ServerConfig, ServerThread


def pack(msg: dict) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


def recv(ws, types: tuple[str, ...] | str | None = None, timeout: float = 10.0) -> dict:
    """The next message whose ``t`` is in ``types`` (all when None)."""
    if isinstance(types, str):
        types = (types,)
    deadline = time.monotonic() + timeout
    while True:
        m = msgpack.unpackb(ws.recv(timeout=max(0.01, deadline - time.monotonic())), raw=False)
        if types is None or m["t"] in types:
            return m


def hello(ws, **kw) -> dict:
    ws.send(pack({"t": "hello", "v": 1, **kw}))
    return recv(ws, "hello")


def client(port: int):
    ws = connect(f"ws://127.0.0.1:{port}/ws", max_size=2**24, open_timeout=10)
    hello(ws)
    return ws


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("viewer-media")
    media.copy_to(media.moving_square_clip(count=12, width=64, height=48), d, "clip.mp4")
    media.copy_to(media.moving_square_clip(count=8, width=48, height=32), d, "other.mp4")
    return d


# -- 1. --allow-url is parsed, not a string prefix --------------------------------------------------------------


@pytest.mark.parametrize(
    "url, allow",
    [
        ("rtsp://127.0.0.1@127.0.0.2:8554/x", "rtsp://127.0.0.1"),  # userinfo, then the real host
        ("rtsp://127.0.0.1:8554@127.0.0.2:8554/x", "rtsp://127.0.0.1:8554"),
        ("rtsp://cam.local.attacker.net/live", "rtsp://cam.local"),  # host prefix
        ("rtsp://cam.localhost/live", "rtsp://cam.local"),
        ("rtsp://cam.local:8554/live", "rtsp://cam.local"),  # another port than the default 554
        ("rtsp://cam.local:5540/live", "rtsp://cam.local:554"),  # port prefix
        ("rtsps://cam.local/live", "rtsp://cam.local"),  # another scheme
        ("http://cam.local/live", "rtsp://cam.local"),
        ("rtsp://cam.local/lively", "rtsp://cam.local/live"),  # path prefix, not at a segment boundary
        ("rtsp://cam.local/other", "rtsp://cam.local/live"),
        ("rtsp://cam.local/live/../admin", "rtsp://cam.local/live"),
        ("rtsp://cam.local/live/%2e%2e/admin", "rtsp://cam.local/live"),
        ("rtsp://a@b@cam.local/live", "rtsp://cam.local"),  # ambiguous authority
        ("rtsp://evil\\@cam.local/live", "rtsp://cam.local"),
        ("rtsp://cam.local /live", "rtsp://cam.local"),
        ("rtsp://cam.local:99999/live", "rtsp://cam.local"),
        ("rtsp://[::2]:554/x", "rtsp://[::1]"),
        ("file:///etc/passwd", "file:///"),  # never a file through the URL door
        ("rtsp:///live", "rtsp://cam.local"),
    ],
)
def test_allow_url_refuses(url: str, allow: str) -> None:
    ok, why = serve_media.url_allowed(url, (allow,))
    assert not ok and why, (url, allow)


@pytest.mark.parametrize(
    "url, allow",
    [
        ("rtsp://127.0.0.1/x", "rtsp://127.0.0.1"),
        ("rtsp://127.0.0.1:554/x", "rtsp://127.0.0.1"),  # the scheme's default port, explicit
        ("rtsp://user:pw@CAM.local/live?tcp", "rtsp://cam.local"),  # userinfo and case, query not compared
        ("rtsp://cam.local/live", "rtsp://cam.local/live"),
        ("rtsp://cam.local/live/sub", "rtsp://cam.local/live/"),
        ("rtsp://cam.local:8554/live", "rtsp://cam.local:8554/"),
        ("rtsp://[::1]:554/x", "rtsp://[0:0::1]"),
        ("http://cam.local/mjpeg", "http://cam.local:80"),
    ],
)
def test_allow_url_allows(url: str, allow: str) -> None:
    assert serve_media.url_allowed(url, (allow,)) == (True, "")


def test_allow_url_exact_is_string_equality() -> None:
    url = "rtsp://127.0.0.1:8554/cam"
    assert serve_media.url_allowed(url, exact=(url,))[0]
    assert not serve_media.url_allowed(url + "2", exact=(url,))[0]
    assert not serve_media.url_allowed("rtsp://127.0.0.1:8554@127.0.0.2:8554/cam", exact=(url,))[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_refused_and_unreachable_urls_look_the_same(root: Path) -> None:
    """Over the WebSocket: the probe's bypass is refused, and a refused URL and an allowed URL that cannot be
    reached get the same code and the same message shape (no connect detail), after the same minimum delay."""
    port = _closed_port()
    cfg = ServerConfig(
        port=0, media_root=str(root), allow_urls=(f"rtsp://127.0.0.1:{port}",), url_error_delay=0.3
    )
    with ServerThread(cfg) as st, client(st.port) as ws:
        answers = {}
        for name, url in (
            ("bypass", f"rtsp://127.0.0.1:{port}@127.0.0.2:{port}/x"),
            ("refused", f"rtsp://127.0.0.1:{port + 1}/x"),
            ("unreachable", f"rtsp://127.0.0.1:{port}/x"),
        ):
            t0 = time.monotonic()
            ws.send(pack({"t": "open", "source": url}))
            m = recv(ws, ("error", "opened"), timeout=30)
            answers[name] = (m, time.monotonic() - t0)
        for name, (m, took) in answers.items():
            assert m["t"] == "error" and m["code"] == "source_error", (name, m)
            assert "not allowed by this server or cannot be reached" in m["message"], (name, m)
            assert "refused" not in m["message"].lower() and "connect" not in m["message"], (name, m)
            assert took >= 0.29, (name, took)
        assert st.call(lambda: len(st.server.sessions)) == 0


# -- 2. a watcher whose owner left can open a source and sees its frames ---------------------------------------


def test_watcher_sees_frames_after_its_owner_left(root: Path) -> None:
    with ServerThread(ServerConfig(port=0, media_root=str(root))) as st:
        owner = client(st.port)
        owner.send(pack({"t": "open", "source": "clip.mp4"}))
        session = recv(owner, "opened")["session"]
        with client(st.port) as watcher:
            watcher.send(pack({"t": "watch", "session": session}))
            assert recv(watcher, "opened")["watcher"] is True
            assert recv(watcher, "frame")["session"] == session
            owner.close()  # the owner leaves: its session ends
            assert recv(watcher, "closed")["reason"] == "owner left"
            watcher.send(pack({"t": "open", "source": "other.mp4"}))
            info = recv(watcher, ("opened", "error"))
            assert info["t"] == "opened" and not info["watcher"], info
            frame = recv(watcher, "frame", timeout=10)
            assert frame["session"] == info["session"] and (frame["w"], frame["h"]) == (48, 32)


# -- 3. the session limit holds for simultaneous opens; idle sessions close ------------------------------------


def test_simultaneous_opens_respect_the_session_limit(root: Path) -> None:
    cfg = ServerConfig(port=0, media_root=str(root), max_sessions=4, max_rate=1000.0)
    with ServerThread(cfg) as st:
        sockets = [client(st.port) for _ in range(20)]
        try:
            for ws in sockets:  # all 20 opens are in flight before any has finished
                ws.send(pack({"t": "open", "source": "clip.mp4"}))
            answers = [recv(ws, ("opened", "error"), timeout=30) for ws in sockets]
            opened = [m for m in answers if m["t"] == "opened"]
            busy = [m for m in answers if m["t"] == "error"]
            assert len(opened) == 4, [m.get("code") for m in answers]
            assert len(busy) == 16 and all(m["code"] == "busy" for m in busy), busy
            assert "at most 4 sessions" in busy[0]["message"] and "\n" not in busy[0]["message"]
            assert st.call(lambda: len(st.server.sessions)) == 4
        finally:
            for ws in sockets:
                ws.close()


@pytest.mark.realtime
def test_idle_session_is_closed_and_its_clients_told(root: Path) -> None:
    cfg = ServerConfig(port=0, media_root=str(root), idle_timeout=1.0)
    with ServerThread(cfg) as st, client(st.port) as owner, client(st.port) as watcher:
        owner.send(pack({"t": "open", "source": "clip.mp4"}))
        session = recv(owner, "opened")["session"]
        watcher.send(pack({"t": "watch", "session": session}))
        recv(watcher, "opened")
        t0 = time.monotonic()
        for _ in range(6):  # pings are not activity: the paused, untouched session still times out
            owner.send(pack({"t": "ping", "id": 1, "client_ms": time.time() * 1000}))
            time.sleep(0.1)
        closed = recv(owner, "closed", timeout=10)
        assert closed["reason"].startswith("idle") and 0.9 < time.monotonic() - t0 < 5, closed
        assert recv(watcher, "closed", timeout=5)["reason"].startswith("idle")
        assert st.call(lambda: len(st.server.sessions)) == 0
        owner.send(pack({"t": "open", "source": "clip.mp4"}))  # the owner may open again
        assert recv(owner, ("opened", "error"))["t"] == "opened"


def test_activity_keeps_a_session_open(root: Path) -> None:
    cfg = ServerConfig(port=0, media_root=str(root), idle_timeout=1.0)
    with ServerThread(cfg) as st, client(st.port) as owner:
        owner.send(pack({"t": "open", "source": "clip.mp4"}))
        recv(owner, "opened")
        for _ in range(8):  # 2 s of steps, one every 0.25 s: never idle for 1 s
            owner.send(pack({"t": "step"}))
            time.sleep(0.25)
        assert st.call(lambda: len(st.server.sessions)) == 1


# -- 4. closed sessions release their threads and memory at once -----------------------------------------------


def _threads() -> int:
    """This process's threads, native ones included (FFmpeg's decoder threads), less asyncio's executor workers
    (a pool that grows on demand and stays)."""
    import threading

    import psutil

    workers = sum(1 for t in threading.enumerate() if t.name.startswith("asyncio_"))
    return psutil.Process().num_threads() - workers


@pytest.mark.slow
def test_open_close_cycles_return_threads_and_memory(root: Path) -> None:
    import psutil

    proc = psutil.Process()
    with ServerThread(ServerConfig(port=0, media_root=str(root))) as st, client(st.port) as ws:
        baseline = rss_first = 0
        for cycle in range(100):
            ws.send(pack({"t": "open", "source": "clip.mp4"}))
            assert recv(ws, ("opened", "error"))["t"] == "opened"
            recv(ws, "frame")
            ws.send(pack({"t": "close"}))
            recv(ws, "closed")
            if cycle == 0:  # after one cycle: the tracker is loaded, the libraries' pools are up
                assert harness.wait_for(lambda: st.call(lambda: len(st.server.sessions)) == 0, timeout=5)
                baseline, rss_first = _threads(), proc.memory_info().rss
        assert st.call(lambda: len(st.server.sessions)) == 0
        # closing must not wait for the garbage collector: the threads are back at once
        assert harness.wait_for(lambda: _threads() <= baseline, timeout=3), (_threads(), baseline)
        rss = proc.memory_info().rss
        assert rss <= 1.2 * rss_first, (rss_first, rss)


# -- 5. stop() does not wait long for a client that never answers the close ------------------------------------


def test_stop_is_bounded_with_a_client_that_never_closes(root: Path) -> None:
    st = ServerThread(ServerConfig(port=0, media_root=str(root))).start()
    stuck = socket.create_connection(("127.0.0.1", st.port), timeout=5)
    try:
        key = "dGhlIHNhbXBsZSBub25jZQ=="
        stuck.sendall(
            (
                f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{st.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        assert stuck.recv(4096).startswith(b"HTTP/1.1 101"), "the WebSocket handshake completed"
        assert harness.wait_for(lambda: st.call(lambda: len(st.server.clients)) == 1, timeout=5)
        t0 = time.monotonic()
        st.stop()  # the client never reads, never answers the close frame
        took = time.monotonic() - t0
        assert took < 3.0, f"stop() took {took:.1f} s"
        assert not st._thread.is_alive()
    finally:
        stuck.close()


def test_held_and_repeated_frames_are_no_latency_samples() -> None:
    """Server side of the viewer's figures: a watcher's first frame (published before it joined, maybe long ago)
    and a repeated ack (a redraw) add no glass-to-glass sample; a fresh frame does."""
    from vostream.sinks.websocket import ClientSlot, FrameHub, PackedFrame

    hub = FrameHub()
    old = PackedFrame.pack({"t": "frame", "seq": 1, "index": 0, "capture_ms": 1000.0})
    hub.publish(old)
    slot = ClientSlot(inflight=2)
    hub.add(slot)  # joins 10 s after the frame was captured
    frame = slot.take()
    assert frame is not None and msgpack.unpackb(frame.finish(11_000.0))["held"] is True
    slot.ack(1, draw_ms=11_000.0)
    assert slot.stats()["latency_ms"]["n"] == 0, "a held frame is no latency sample"
    hub.publish(PackedFrame.pack({"t": "frame", "seq": 2, "index": 1, "capture_ms": 11_000.0}))
    fresh = slot.take()
    assert fresh is not None and "held" not in msgpack.unpackb(fresh.finish(11_020.0))
    slot.ack(2, draw_ms=11_050.0)
    slot.ack(2, draw_ms=20_000.0)  # the same frame acked again (a redraw): nothing more
    lat = slot.stats()["latency_ms"]
    assert lat["n"] == 1 and lat["p50"] == 50.0, lat
