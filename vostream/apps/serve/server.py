"""``vostream serve``: one port serves the viewer (``web/``) over HTTP and the viewer protocol over WebSocket.

Architecture, security and failure behaviour: ``docs/viewer.md``; the protocol: ``docs/protocol.md``.

- :class:`ServerConfig`: every setting (inert dataclass).
- :class:`ViewerServer`: the asyncio server.  HTTP GETs (static files, ``/healthz``, ``/metrics``, exports) are
  answered from ``process_request``; ``/ws`` becomes a WebSocket.  One task receives each client's messages and
  one sends to it: control replies first, then the newest frame when the client's in-flight window has room.
- :class:`ServerThread`: runs a server in a background thread (tests, benchmarks, notebooks).

Thread-safety: a :class:`ViewerServer` lives on one event loop; sessions call back into it only through
``loop.call_soon_threadsafe``.  :meth:`ServerThread.stop` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import mimetypes
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from vostream.apps.model_watch import ModelWatcher
from vostream.apps.prometheus import model_families, pipeline_families
from vostream.apps.serve.config import ServerConfig, is_loopback
from vostream.apps.serve.media import URL_FAILED, list_sources, resolve_source
from vostream.apps.serve.protocol import (
    EXPORT_FORMATS,
    MAX_INFLIGHT,
    MAX_POINTS,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Ack,
    Export,
    Hello,
    Open,
    Ping,
    PromptMsg,
    ProtocolError,
    Reload,
    Remove,
    Seek,
    Simple,
    View,
    Watch,
    encode,
    parse_client_message,
)
from vostream.apps.serve.session import Session, SessionOptions, TrackerCache
from vostream.pipeline.errors import ConfigError, VostreamError
from vostream.pipeline.version import package_version
from vostream.stages.trackers.reload import ReloadBusy, ReloadError, ReloadOutcome

logger = logging.getLogger(__name__)

_STATIC_SUFFIXES = (".html", ".js", ".css", ".png", ".svg", ".ico", ".txt", ".md")
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def _web_dir() -> Path:
    """The viewer's static files: the ``vostream.web`` package's folder (``web/`` in a checkout)."""
    import vostream.web as web_pkg

    return Path(list(web_pkg.__path__)[0])


@dataclass
class _Client:
    """One connection's state (event-loop thread only, except the slot)."""

    ws: Any
    cid: int
    slot: Any = None
    session: Session | None = None
    owner: bool = False
    hello: bool = False
    outbox: deque[bytes] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    tokens: float = 0.0
    last_refill: float = 0.0
    refused: int = 0
    last_refused_reply: float = 0.0
    closing: bool = False
    view: tuple[int, int] | None = None  # the client's display size (``view``); carried over to fresh slots


class ViewerServer:
    """The viewer server.  ``await start()``, then ``await serve_forever()`` or ``await stop()``."""

    def __init__(self, config: ServerConfig) -> None:
        config.check()
        self.config = config
        self.media_root = Path(os.path.realpath(config.media_root))
        self.web_dir = _web_dir()
        self.static = self._static_files()
        self.sessions: dict[str, Session] = {}
        #: one tracker (weights, graphs) for all sessions, loaded on the first open
        self.trackers = TrackerCache(config.session.backend, config.session.tracker_options)
        self.clients: dict[int, _Client] = {}
        self._session_clients: dict[str, set[int]] = {}
        self._next_cid = 0
        self._opening = 0  # opens under way: each holds a session slot (max_sessions) until it ends
        self._idle_task: asyncio.Task[None] | None = None
        self._watcher: ModelWatcher | None = None
        self._server: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.port = config.port
        self._stats_task: asyncio.Task[None] | None = None
        self.counters = {"messages": 0, "errors": 0, "refused_handshakes": 0}
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def _static_files(self) -> dict[str, Path]:
        files: dict[str, Path] = {}
        for path in self.web_dir.rglob("*"):
            if path.is_file() and not path.is_symlink() and path.suffix in _STATIC_SUFFIXES + (".js",):
                rel = path.relative_to(self.web_dir).as_posix()
                if not rel.startswith(("__", ".")) and "/__" not in rel:
                    files["/" + rel] = path
        files["/"] = self.web_dir / "index.html"
        return files

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        from websockets.asyncio.server import serve

        self.loop = asyncio.get_running_loop()
        try:
            self._server = await serve(
                self._handler,
                self.config.host,
                self.config.port,
                process_request=self._process_request,
                max_size=self.config.max_message_bytes,
                max_queue=16,
                compression=None,
                ping_interval=20,
                ping_timeout=20,
                # a client that never answers our close frame (a frozen tab, a stuck script) is cut after this
                # long instead of websockets' 10 s, so stop() stays bounded
                close_timeout=self.config.close_timeout,
                server_header="vostream",
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {self.config.host}:{self.config.port}: {exc.strerror or exc}; "
                f"choose another --port"
            ) from exc
        self.port = self._server.sockets[0].getsockname()[1]
        self._stats_task = asyncio.create_task(self._stats_loop())
        if self.config.idle_timeout > 0:
            self._idle_task = asyncio.create_task(self._idle_loop())
        if self.config.watch_model:
            self._watcher = ModelWatcher(
                self.config.session.tracker_options["model"], self._reload_quietly
            ).start()
        logger.info("viewer at %s", self.url)

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        query = f"?token={self.config.token}" if self.config.token else ""
        return f"http://{host}:{self.port}/{query}"

    async def serve_forever(self) -> None:
        assert self._server is not None
        try:
            await self._server.serve_forever()
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Close every connection and session.  Idempotent."""
        for task in (self._stats_task, self._idle_task):
            if task is not None:
                task.cancel()
        self._stats_task = self._idle_task = None
        if self._watcher is not None:
            await asyncio.to_thread(self._watcher.close)
            self._watcher = None
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        sessions, self.sessions = list(self.sessions.values()), {}
        for s in sessions:
            await asyncio.to_thread(s.close)
        await asyncio.to_thread(self.trackers.close)

    # -- HTTP -------------------------------------------------------------------------------------------------
    def _response(
        self,
        status: int,
        body: bytes | str,
        ctype: str = "text/plain; charset=utf-8",
        extra: list[tuple[str, str]] | None = None,
    ) -> Any:
        from websockets.datastructures import Headers
        from websockets.http11 import Response

        data = body.encode() if isinstance(body, str) else body
        headers = Headers(
            [
                ("Content-Type", ctype),
                ("Content-Length", str(len(data))),
                ("Cache-Control", "no-store"),
                ("X-Content-Type-Options", "nosniff"),
                ("Referrer-Policy", "no-referrer"),
                ("Connection", "close"),
            ]
            + (extra or [])
        )
        return Response(status, HTTPStatus(status).phrase, headers, data)

    def _token_ok(self, query: dict[str, list[str]]) -> bool:
        if not self.config.token:
            return True
        given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.config.token.encode())

    def _host_ok(self, host_header: str | None) -> bool:
        """Defends against DNS rebinding: the Host header must name this server."""
        if not host_header:
            return False
        host = urlsplit("//" + host_header).hostname or ""
        allowed = set(self.config.allow_hosts) | {self.config.host}
        if is_loopback(self.config.host) or self.config.host in ("0.0.0.0", "::"):
            allowed |= {"localhost", "127.0.0.1", "::1"}
        return host in allowed or (self.config.host in ("0.0.0.0", "::") and bool(self.config.token))

    def _origin_ok(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None:  # not a browser (browsers always send Origin on WebSocket handshakes)
            return True
        if origin in self.config.allow_origins:
            return True
        parts = urlsplit(origin)
        return (
            parts.scheme in ("http", "https")
            and parts.netloc == (host_header or "")
            and self._host_ok(parts.netloc)
        )

    def _process_request(self, connection: Any, request: Any) -> Any:
        url = urlsplit(request.path)
        query = parse_qs(url.query)
        host = request.headers.get("Host")
        if not self._host_ok(host):
            self.counters["refused_handshakes"] += 1
            return self._response(403, f"unexpected Host header {host!r}; use {self.url}\n")
        path = url.path
        if path == "/ws":
            if not self._token_ok(query):
                self.counters["refused_handshakes"] += 1
                return self._response(403, "missing or wrong token: open the URL vostream serve printed\n")
            if not self._origin_ok(request.headers.get("Origin"), host):
                self.counters["refused_handshakes"] += 1
                return self._response(
                    403, "cross-origin WebSocket refused (Origin does not match this server)\n"
                )
            if len(self.clients) >= self.config.max_clients:
                return self._response(503, "too many clients; try again later\n")
            return None  # proceed with the WebSocket handshake
        if path == "/healthz":
            health = self.health()
            return self._response(200 if health["ok"] else 503, json.dumps(health), "application/json")
        if path == "/metrics":
            if not self._token_ok(query):
                return self._response(403, "missing or wrong token\n")
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return self._response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if path.startswith("/export/"):
            if not self._token_ok(query):
                return self._response(403, "missing or wrong token\n")
            return self._export_response(path)
        file = self.static.get(path)
        if file is None:
            return self._response(404, "not found\n")
        ctype = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        csp = (
            "default-src 'self'; img-src 'self' blob: data:; connect-src 'self' ws: wss:; "
            "style-src 'self'; script-src 'self'; frame-ancestors 'none'"
        )
        return self._response(200, file.read_bytes(), ctype, [("Content-Security-Policy", csp)])

    def _export_response(self, path: str) -> Any:
        parts = path.split("/")
        if len(parts) != 4:
            return self._response(404, "not found\n")
        session = self.sessions.get(parts[2])
        names = {"annotations.json": "json", "masks.zip": "png"}
        fmt = names.get(parts[3])
        if session is None or fmt is None or fmt not in session.exports:
            return self._response(404, "no such export; send an 'export' message first\n")
        ctype = "application/json" if fmt == "json" else "application/zip"
        stem = Path(session.display).stem or "export"
        disp = f'attachment; filename="{stem}_{parts[3]}"'
        return self._response(200, session.exports[fmt].read_bytes(), ctype, [("Content-Disposition", disp)])

    # -- hot reload -------------------------------------------------------------------------------------------
    async def reload_model(self) -> ReloadOutcome:
        """Reload the model (docs/deploy.md §2) in a worker thread; sessions keep running and switch at their next
        frame.  Raises ``ReloadError`` (logged) when the new model is refused."""
        return await asyncio.to_thread(self.trackers.reload)

    def _reload_quietly(self) -> None:
        """The model watcher's and SIGHUP's reload: the outcome is logged, a refusal counted in the metrics."""
        try:
            self.trackers.reload()
        except ReloadError:
            pass

    async def _reload(self, client: _Client) -> None:
        if not self.config.allow_reload:
            raise ProtocolError(
                "forbidden",
                "reload is off on this server: start vostream serve with --allow-reload, or send the server "
                "process SIGHUP",
                "reload",
            )
        try:
            outcome = await self.reload_model()
        except ReloadError as exc:
            code = "busy" if isinstance(exc, ReloadBusy) else "reload_failed"
            raise ProtocolError(code, str(exc), "reload") from exc
        self._send(
            client,
            {
                "t": "reloaded",
                "generation": outcome.generation,
                "load_ms": round(outcome.load_s * 1000.0, 3),
                "check_ms": round(outcome.check_s * 1000.0, 3),
                "model": outcome.model,
            },
        )

    def health(self) -> dict[str, Any]:
        sessions = [
            {
                "session": s.id,
                "source": s.display,
                "alive": bool(s.pipeline and s.pipeline.running),
                "error": s.error,
            }
            for s in list(self.sessions.values())
        ]
        return {
            "ok": all(s["error"] is None for s in sessions),
            "clients": len(self.clients),
            "sessions": sessions,
            "tracker": self.config.session.backend,
            "model_generation": self.trackers.handle.generation if self.trackers.handle is not None else 0,
        }

    # -- WebSocket --------------------------------------------------------------------------------------------
    async def _handler(self, ws: Any) -> None:
        from websockets.exceptions import ConnectionClosed

        self._next_cid += 1
        client = _Client(ws, self._next_cid, tokens=2 * self.config.max_rate, last_refill=time.monotonic())
        self.clients[client.cid] = client
        sender = asyncio.create_task(self._sender(client))
        try:
            async for data in ws:
                if not await self._on_message(client, data):
                    break
        except ConnectionClosed:
            pass
        finally:
            client.closing = True
            client.wake.set()
            sender.cancel()
            self.clients.pop(client.cid, None)
            await self._detach(client, reason="owner left")

    def _send(self, client: _Client, message: dict[str, Any] | bytes) -> None:
        data = message if isinstance(message, bytes) else encode(message)
        if len(client.outbox) >= 256:  # a client that reads nothing at all: drop it, never grow
            client.closing = True
            asyncio.ensure_future(client.ws.close(1008, "client too slow"))
            return
        client.outbox.append(data)
        client.wake.set()

    def _error(self, client: _Client, code: str, message: str, ref: str | None = None) -> None:
        self.counters["errors"] += 1
        self._send(client, {"t": "error", "code": code, "message": message, "ref": ref})

    async def _sender(self, client: _Client) -> None:
        """Control messages first, then the newest frame while the in-flight window has room."""
        from websockets.exceptions import ConnectionClosed

        try:
            while not client.closing:
                await client.wake.wait()
                client.wake.clear()
                while client.outbox:
                    await client.ws.send(client.outbox.popleft())
                while client.slot is not None and (frame := client.slot.take()) is not None:
                    await client.ws.send(frame.finish(time.time() * 1000.0))
                    while client.outbox:
                        await client.ws.send(client.outbox.popleft())
        except ConnectionClosed:
            pass

    def _rate_ok(self, client: _Client) -> bool:
        now = time.monotonic()
        rate = self.config.max_rate
        client.tokens = min(2 * rate, client.tokens + (now - client.last_refill) * rate)
        client.last_refill = now
        if client.tokens >= 1:
            if client.tokens > rate:  # a second of quiet forgives earlier floods
                client.refused = 0
            client.tokens -= 1
            return True
        client.refused += 1
        return False

    @staticmethod
    async def _drain(client: _Client, timeout: float = 5.0) -> None:
        """Read and discard what a closing client still sends until its close frame arrives (at most ``timeout``).

        Closing a socket with unread input makes the kernel answer with a reset, and a reset can destroy what the
        client has not read yet -- here the error and the close frame that say why it was dropped.  Draining first
        lets the closing handshake finish and the TCP link end cleanly."""
        from websockets.exceptions import ConnectionClosed

        async def drain() -> None:
            async for _ in client.ws:
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except (asyncio.TimeoutError, ConnectionClosed):
            pass

    async def _on_message(self, client: _Client, data: Any) -> bool:
        """Handle one message; False ends the connection."""
        self.counters["messages"] += 1
        if not self._rate_ok(client):
            if client.refused > 2 * self.config.max_rate:
                client.closing = True
                await client.ws.send(
                    encode(
                        {
                            "t": "error",
                            "code": "rate_limited",
                            "ref": None,
                            "message": "flooding: closing the connection",
                        }
                    )
                )
                # close() sends the close frame and waits for the client's; the drain reads the rest of the
                # flood meanwhile, so the closing handshake can complete (see _drain)
                closing = asyncio.create_task(client.ws.close(1008, "rate limit exceeded"))
                await self._drain(client)
                await closing
                return False
            now = time.monotonic()
            if now - client.last_refused_reply > 0.5:
                client.last_refused_reply = now
                self._error(
                    client, "rate_limited", f"more than {self.config.max_rate:g} messages/s; slow down"
                )
            return True
        if isinstance(data, str):
            self._error(client, "bad_msgpack", "text frames are not accepted; send msgpack in binary frames")
            await client.ws.close(1003, "binary frames only")
            return False
        try:
            msg = parse_client_message(data)
            if not client.hello:
                if not isinstance(msg, Hello):
                    self._error(client, "hello_first", "send 'hello' first")
                    await self._flush_and_close(client, 1008, "hello first")
                    return False
                return await self._on_hello(client, msg)
            await self._dispatch(client, msg)
        except ProtocolError as exc:
            self._error(client, exc.code, str(exc), exc.ref)
        except VostreamError as exc:
            self._error(client, "source_error", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return True

    async def _flush_and_close(self, client: _Client, code: int, reason: str) -> None:
        while client.outbox:
            await client.ws.send(client.outbox.popleft())
        await client.ws.close(code, reason)

    async def _on_hello(self, client: _Client, msg: Hello) -> bool:
        if msg.v not in SUPPORTED_VERSIONS:
            self._error(
                client,
                "version",
                f"protocol version {msg.v} is not supported; this server speaks "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}",
                "hello",
            )
            await self._flush_and_close(client, 1002, "unsupported protocol version")
            return False
        from vostream.sinks.websocket import ClientSlot

        client.hello = True
        loop = self.loop
        assert loop is not None
        inflight = min(msg.inflight or self.config.inflight, MAX_INFLIGHT)
        client.slot = ClientSlot(inflight, wake=_waker(loop, client.wake))
        sources = await asyncio.to_thread(list_sources, self.media_root)
        self._send(
            client,
            {
                "t": "hello",
                "v": PROTOCOL_VERSION,
                "server": f"vostream {package_version()}",
                "caps": {
                    "versions": list(SUPPORTED_VERSIONS),
                    "backend": self.config.session.backend,
                    "max_objects": self.config.session.max_objects,
                    "max_points": MAX_POINTS,
                    "max_message_bytes": self.config.max_message_bytes,
                    "max_rate": self.config.max_rate,
                    "inflight": inflight,
                    "export": list(EXPORT_FORMATS),
                    "jpeg_quality": self.config.session.jpeg_quality,
                    "reload": self.config.allow_reload,
                },
                "sources": sources,
                "default_source": self.config.default_source,
                "sessions": [{"session": s.id, "source": s.display} for s in self.sessions.values()],
            },
        )
        return True

    async def _dispatch(self, client: _Client, msg: Any) -> None:
        if client.owner and client.session is not None and not isinstance(msg, (Ping, View)):
            client.session.last_active = time.monotonic()  # pings and resizes alone do not keep it alive
        if isinstance(msg, View):  # any time after hello, with or without a session
            client.view = (msg.w, msg.h)
            if client.slot is not None:
                client.slot.view = client.view
            return
        if isinstance(msg, Ack):
            if client.slot is not None:
                client.slot.ack(msg.seq, msg.draw_ms)
            return
        if isinstance(msg, Ping):
            self._send(
                client,
                {"t": "pong", "id": msg.id, "client_ms": msg.client_ms, "server_ms": time.time() * 1000},
            )
            return
        if isinstance(msg, Hello):
            raise ProtocolError("bad_message", "hello was already received", "hello")
        if isinstance(msg, Open):
            await self._open(client, msg)
            return
        if isinstance(msg, Watch):
            await self._watch(client, msg)
            return
        if isinstance(msg, Reload):
            await self._reload(client)
            return
        session = client.session
        t = msg.t if isinstance(msg, Simple) else type(msg).__name__.lower().replace("promptmsg", "prompt")
        if session is None:
            raise ProtocolError("no_session", f"{t}: open a source first", t)
        if not client.owner:
            raise ProtocolError("not_owner", f"{t}: this connection only watches session {session.id}", t)
        if isinstance(msg, PromptMsg):
            session.prompt(msg)
        elif isinstance(msg, Remove):
            session.remove(msg.obj)
        elif isinstance(msg, Seek):
            session.seek(msg.frame)
        elif isinstance(msg, Export):
            path, frames = await asyncio.to_thread(session.export, msg.format)
            token = f"?token={self.config.token}" if self.config.token else ""
            self._send(
                client,
                {
                    "t": "export",
                    "format": msg.format,
                    "frames": frames,
                    "url": f"/export/{session.id}/{path.name}{token}",
                },
            )
            return
        elif isinstance(msg, Simple):
            if msg.t == "close":
                await self._detach(client, reason="closed")
                self._send(client, {"t": "closed", "reason": "closed"})
                return
            getattr(session, msg.t)()
        self._broadcast_state(session)

    async def _open(self, client: _Client, msg: Open) -> None:
        if "://" not in msg.source:
            await self._open_source(client, msg)
            return
        started = time.monotonic()
        try:
            await self._open_source(client, msg)
        except ProtocolError as exc:
            if exc.code == "source_error":  # refused or unreachable: both answer after the same floor
                await asyncio.sleep(max(0.0, started + self.config.url_error_delay - time.monotonic()))
            raise

    async def _open_source(self, client: _Client, msg: Open) -> None:
        path, display = resolve_source(
            self.media_root, msg.source, self.config.allow_urls, self.config.allow_exact_urls
        )
        # Check and reserve in one step (no await in between): simultaneous opens cannot all pass the check while
        # the slow opens are under way.  A client replacing its own session needs no new slot.
        replacing = client.owner and client.session is not None
        if not replacing:
            running = sum(1 for s in self.sessions.values() if not s.ended)
            if running + self._opening >= self.config.max_sessions:
                idle = self.config.idle_timeout
                raise ProtocolError(
                    "busy",
                    f"the server is busy: it runs at most {self.config.max_sessions} sessions and all are in "
                    f"use; try again later" + (f" (idle sessions close after {idle:g} s)" if idle else ""),
                    "open",
                )
            self._opening += 1
        try:
            await self._start_session(client, path, display, msg)
        finally:
            if not replacing:
                self._opening -= 1

    async def _start_session(self, client: _Client, path: str, display: str, msg: Open) -> None:
        loop = self.loop
        assert loop is not None
        holder: dict[str, Session] = {}

        def notify(kind: str) -> None:
            if "s" in holder:
                try:
                    loop.call_soon_threadsafe(self._on_session_event, holder["s"], kind)
                except RuntimeError:  # the server's loop has closed (shutdown)
                    pass

        session = Session(path, display, self.config.session, notify, trackers=self.trackers)
        session.hub.view = client.view  # the first frame is encoded before the owner's slot joins the hub
        holder["s"] = session
        try:
            await asyncio.to_thread(session.open)
        except BaseException as exc:
            await asyncio.shield(asyncio.to_thread(session.close))
            if not isinstance(exc, VostreamError):
                raise
            if "://" in msg.source:  # the same answer as for a refused URL: no probing through the server
                logger.warning("cannot open stream %s: %s", display, exc)
                raise ProtocolError("source_error", URL_FAILED.format(url=display), "open") from exc
            raise ProtocolError("source_error", f"cannot open {display!r}: {exc}", "open") from exc
        await self._detach(client, reason="owner opened another source")  # only once the new one works
        self.sessions[session.id] = session
        self._attach(client, session, owner=True)
        logger.info("client %d opened %s as session %s", client.cid, display, session.id)

    async def _watch(self, client: _Client, msg: Watch) -> None:
        session = self.sessions.get(msg.session)
        if session is None or session.ended:
            raise ProtocolError("unknown_session", f"no running session {msg.session!r}", "watch")
        await self._detach(client, reason="")
        self._attach(client, session, owner=False)

    def _attach(self, client: _Client, session: Session, owner: bool) -> None:
        client.session, client.owner = session, owner
        self._session_clients.setdefault(session.id, set()).add(client.cid)
        self._send(client, session.opened(watcher=not owner))
        session.hub.add(client.slot)
        self._broadcast_state(session)

    async def _detach(self, client: _Client, reason: str) -> None:
        session = client.session
        if session is None:
            return
        client.session = None
        self._fresh_slot(client, session)
        members = self._session_clients.get(session.id, set())
        members.discard(client.cid)
        if client.owner:
            client.owner = False
            for cid in list(members):
                other = self.clients.get(cid)
                if other is not None:
                    other.session = None
                    self._fresh_slot(other, session)  # the watcher may open or watch another session
                    self._send(other, {"t": "closed", "reason": reason or "owner left"})
            self._session_clients.pop(session.id, None)
            self.sessions.pop(session.id, None)
            await asyncio.to_thread(session.close)
        else:
            self._broadcast_state(session)

    def _fresh_slot(self, client: _Client, session: Session) -> None:
        """Take ``client``'s slot out of ``session``'s hub (which closes it) and give the client a new, empty one:
        a closed slot takes no frames, so a client left with it would see nothing from its next session."""
        if client.slot is None:
            return
        from vostream.sinks.websocket import ClientSlot

        session.hub.remove(client.slot)
        loop = self.loop
        assert loop is not None
        client.slot = ClientSlot(client.slot.inflight_limit, wake=_waker(loop, client.wake))
        client.slot.view = client.view

    def _broadcast_state(self, session: Session) -> None:
        state = encode(session.state())
        for cid in self._session_clients.get(session.id, ()):
            client = self.clients.get(cid)
            if client is not None:
                self._send(client, state)

    def _on_session_event(self, session: Session, kind: str) -> None:
        if kind == "end" and session.error:
            for cid in self._session_clients.get(session.id, ()):
                client = self.clients.get(cid)
                if client is not None:
                    self._error(client, "source_error", f"session {session.id} stopped: {session.error}")
        self._broadcast_state(session)

    async def _idle_loop(self) -> None:
        """Close sessions whose owner has been silent (no control message, no ack) for ``idle_timeout`` s: a
        forgotten paused tab must not hold a session slot forever.  Their clients get ``closed`` saying why."""
        timeout = self.config.idle_timeout
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for session in list(self.sessions.values()):
                if now - session.last_active < timeout or self.sessions.get(session.id) is not session:
                    continue
                reason = f"idle: no activity for {timeout:g} s; open the source again"
                logger.info("closing idle session %s (%s)", session.id, session.display)
                owner = next(
                    (
                        c
                        for cid in self._session_clients.get(session.id, ())
                        if (c := self.clients.get(cid)) is not None and c.owner
                    ),
                    None,
                )
                if owner is not None:
                    await self._detach(owner, reason=reason)
                    self._send(owner, {"t": "closed", "reason": reason})
                else:  # no owner left (cannot normally happen): close it all the same
                    self.sessions.pop(session.id, None)
                    self._session_clients.pop(session.id, None)
                    await asyncio.to_thread(session.close)

    async def _stats_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for client in list(self.clients.values()):
                session = client.session
                if session is None or session.pipeline is None or client.slot is None:
                    continue
                snap = session.pipeline.metrics()
                cs = client.slot.stats()
                viewer = next((n for n in snap.nodes if n.name == "viewer"), None)
                self._send(
                    client,
                    {
                        "t": "stats",
                        "fps": {n.name: round(n.fps, 2) for n in snap.nodes},
                        "latency_ms": cs["latency_ms"],
                        "drops": cs["drops"],
                        "sent": cs["sent"],
                        "inflight": cs["inflight"],
                        "queues": {n.name: n.queue_depth for n in snap.nodes},
                        "server_ms": {
                            "p50": viewer.latency_ms_p50 if viewer else 0.0,
                            "p95": viewer.latency_ms_p95 if viewer else 0.0,
                        },
                        **({"source": session.source_stats()} if session.live else {}),
                    },
                )


def _waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Any:
    """A thread-safe ``event.set`` for pipeline threads; a no-op once the loop has closed."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:
            pass

    return wake


class _Collector:
    """Prometheus collector: every session's pipeline metrics plus the viewer's per-client figures."""

    def __init__(self, server: ViewerServer) -> None:
        self.server = server

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from pipeline_families(
            ({"session": s.id}, s.pipeline)
            for s in list(self.server.sessions.values())
            if s.pipeline is not None
        )
        clients = GaugeMetricFamily("vostream_viewer_clients", "connected viewer clients")
        clients.add_metric([], len(self.server.clients))
        yield clients
        sessions = GaugeMetricFamily("vostream_viewer_sessions", "open viewer sessions")
        sessions.add_metric([], len(self.server.sessions))
        yield sessions
        drops = CounterMetricFamily(
            "vostream_viewer_client_drops", "frames a client skipped (latest-wins)", labels=["client"]
        )
        glass = GaugeMetricFamily(
            "vostream_viewer_glass_to_glass_ms",
            "capture to drawn in the browser",
            labels=["client", "quantile"],
        )
        for client in list(self.server.clients.values()):
            if client.slot is None:
                continue
            st = client.slot.stats()
            drops.add_metric([str(client.cid)], st["drops"])
            for q in ("p50", "p95"):
                v = st["latency_ms"][q]
                if v == v:  # not NaN
                    glass.add_metric([str(client.cid), q], v)
        yield drops
        yield glass
        yield from model_families(self.server.trackers.handle, "session")


class ServerThread:
    """A :class:`ViewerServer` on its own event loop in a daemon thread.  ``start()`` returns once it listens
    (or raises its start-up error); ``stop()`` closes everything.  Used by tests and benchmarks."""

    def __init__(self, config: ServerConfig) -> None:
        self.server = ViewerServer(config)
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="vostream-serve")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self.server.stop())
        self._loop.close()

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def call(self, fn: Any, timeout: float = 10.0) -> Any:
        """Run ``fn()`` on the server's loop and return its result (inspect state from tests)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(15)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_server(config: ServerConfig) -> int:
    """``vostream serve``: serve until Ctrl-C / SIGTERM; returns the exit code."""
    import signal
    import sys

    async def main() -> None:
        server = ViewerServer(config)
        await server.start()
        print(f"vostream viewer: open {server.url}", file=sys.stderr, flush=True)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread / Windows
                pass
        hup = getattr(signal, "SIGHUP", None)
        if hup is not None:  # reload the model (docs/deploy.md §2); the outcome is logged
            try:
                loop.add_signal_handler(hup, lambda: loop.run_in_executor(None, server._reload_quietly))
            except (NotImplementedError, RuntimeError):  # pragma: no cover
                pass
        serving = asyncio.create_task(server.serve_forever())
        await stop.wait()
        serving.cancel()
        await server.stop()

    asyncio.run(main())
    return 0


def add_serve_parser(sub: Any, add_common: Any) -> None:
    """The ``serve`` subcommand (called by :func:`vostream.apps.cli.build_parser`)."""
    p = sub.add_parser(
        "serve",
        help="browser viewer: click an object, watch it tracked live",
        description="Serves the viewer (web/) and its WebSocket on one port; open the printed URL. "
        "docs/viewer.md has the details.",
    )
    p.add_argument(
        "source",
        nargs="?",
        help="video file or frames directory opened when the page loads "
        "(must lie under --media-root; default root: its folder), or a "
        "stream URL (rtsp://, http(s)://: that URL is allowed)",
    )
    p.add_argument("--backend", default="classic", help="tracker backend (default classic)")
    p.add_argument("--model", metavar="DIR", help="model directory for neural backends")
    p.add_argument(
        "--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need --token)"
    )
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--media-root",
        metavar="DIR",
        help="only sources under DIR may be opened (default: the "
        "SOURCE's folder, else the current directory)",
    )
    p.add_argument("--token", help="secret required on the WebSocket, /metrics and exports (?token=...)")
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="extra allowed Origin for the WebSocket (repeatable)",
    )
    p.add_argument(
        "--allow-url",
        action="append",
        default=[],
        metavar="URL",
        help="stream URLs on URL's scheme, host and port (and under its path, if it has one) may be "
        "opened (repeatable; none by default)",
    )
    p.add_argument("--out", metavar="DIR", help="also write each session's outputs under DIR/<session>/")
    p.add_argument("--max-objects", type=int, default=8, help="objects per session (default 8)")
    p.add_argument(
        "--max-sessions", type=int, default=8, help="sessions (opened sources) at once (default 8)"
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="close a session whose owner sent nothing (no click, no ack) for S seconds (default 300; 0: never)",
    )
    p.add_argument("--fps", type=float, default=25.0, help="playback rate of frames directories (default 25)")
    p.add_argument(
        "--allow-reload",
        action="store_true",
        help="accept the 'reload' message (swap the model under every session; docs/protocol.md); "
        "SIGHUP reloads in any case",
    )
    p.add_argument(
        "--watch-model",
        action="store_true",
        help="reload when --model's directory holds a new export (docs/deploy.md section 2)",
    )
    add_common(p)


def cmd_serve(args: Any) -> int:
    logging.getLogger("vostream.apps.serve.server").setLevel(logging.INFO)
    logging.getLogger("vostream.stages.trackers.reload").setLevel(logging.INFO)
    return run_server(serve_config(args))


def serve_config(args: Any) -> ServerConfig:
    """The :class:`ServerConfig` of ``vostream serve`` arguments.  A stream URL as SOURCE (``rtsp://...``) is
    allowed exactly (``allow_exact_urls``), without allowing other URLs; a file or directory must exist and lie
    under ``--media-root``.  Raises :class:`ConfigError`."""
    source = args.source
    root = args.media_root
    exact: tuple[str, ...] = ()
    if source is not None and "://" in source:
        exact = (source,)
    elif source is not None:
        if not os.path.exists(source):
            raise ConfigError(f"no such file or directory: {source!r}")
        src_real = os.path.realpath(source)
        root = root or (os.path.dirname(src_real) if os.path.isfile(src_real) else os.path.dirname(src_real))
        root_real = os.path.realpath(root)
        if os.path.commonpath([root_real, src_real]) != root_real:
            raise ConfigError(f"{source!r} is not under --media-root {root!r}")
        source = os.path.relpath(src_real, root_real)
    options: dict[str, Any] = {}
    if args.model:
        options["model"] = args.model
    return ServerConfig(
        host=args.host,
        port=args.port,
        media_root=root or ".",
        default_source=source,
        token=args.token,
        allow_origins=tuple(args.allow_origin),
        allow_urls=tuple(args.allow_url),
        allow_exact_urls=exact,
        max_sessions=args.max_sessions,
        idle_timeout=args.idle_timeout,
        allow_reload=bool(getattr(args, "allow_reload", False)),
        watch_model=bool(getattr(args, "watch_model", False)),
        session=SessionOptions(
            backend=args.backend,
            tracker_options=options,
            max_objects=args.max_objects,
            fps=args.fps,
            out_dir=args.out,
        ),
    )


__all__ = [
    "ServerConfig",
    "ServerThread",
    "ViewerServer",
    "add_serve_parser",
    "cmd_serve",
    "is_loopback",
    "run_server",
    "serve_config",
]
