"""One viewer client's WebSocket session: its protocol loop (``docs/protocol.md``).

:class:`ClientConnection` receives the client's messages in one task and sends to it from another (control replies
first, then the newest frame while the client's in-flight window has room).  It rate-limits the client, checks the
``hello``, and carries out each message: open or watch a session, prompts and playback controls, exports, reload.

Thread-safety: event-loop thread only; the slow calls (opening a source, exporting, closing) run in worker
threads through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vostream.apps.serve.config import ServerConfig
from vostream.apps.serve.media import URL_FAILED, list_sources, resolve_source
from vostream.apps.serve.protocol import (
    EXPORT_FORMATS,
    MAX_INFLIGHT,
    MAX_POINTS,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Ack,
    ClientMessage,
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
from vostream.apps.serve.session import Session, TrackerCache
from vostream.apps.serve.table import SessionTable
from vostream.pipeline.errors import VostreamError
from vostream.pipeline.version import package_version
from vostream.stages.trackers.reload import ReloadBusy, ReloadError, ReloadOutcome

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

#: the server's log lines keep one logger name, whichever part of it logs (``vostream serve`` shows it at INFO)
logger = logging.getLogger("vostream.apps.serve.server")


class ClientConnection:
    """One client, from its handshake to its disconnect.  ``await run()`` returns when the connection ends; the
    client is then out of the table and out of its session (an owner's session is closed)."""

    def __init__(
        self,
        ws: ServerConnection,
        *,
        config: ServerConfig,
        table: SessionTable,
        trackers: TrackerCache,
        media_root: Path,
        reload: Callable[[], Awaitable[ReloadOutcome]],
    ) -> None:
        self.config = config
        self.table = table
        self.trackers = trackers
        self.media_root = media_root
        self.reload = reload
        self.client = table.connect(ws, tokens=2 * config.max_rate, now=time.monotonic())

    async def run(self) -> None:
        from websockets.exceptions import ConnectionClosed

        client = self.client
        sender = asyncio.create_task(self._sender())
        try:
            async for data in client.ws:
                if not await self._on_message(data):
                    break
        except ConnectionClosed:
            pass
        finally:
            client.closing = True
            client.wake.set()
            sender.cancel()
            self.table.clients.pop(client.cid, None)
            await self.table.detach(client, reason="owner left")

    # -- sending ----------------------------------------------------------------------------------------------
    async def _sender(self) -> None:
        """Control messages first, then the newest frame while the in-flight window has room."""
        from websockets.exceptions import ConnectionClosed

        client = self.client
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

    def _error(self, code: str, message: str, ref: str | None = None) -> None:
        self.table.error(self.client, code, message, ref)

    async def _flush_and_close(self, code: int, reason: str) -> None:
        client = self.client
        while client.outbox:
            await client.ws.send(client.outbox.popleft())
        await client.ws.close(code, reason)

    async def _drain(self, timeout: float = 5.0) -> None:
        """Read and discard what a closing client still sends until its close frame arrives (at most ``timeout``).

        Closing a socket with unread input makes the kernel answer with a reset, and a reset can destroy what the
        client has not read yet -- here the error and the close frame that say why it was dropped.  Draining first
        lets the closing handshake finish and the TCP link end cleanly."""
        from websockets.exceptions import ConnectionClosed

        async def drain() -> None:
            async for _ in self.client.ws:
                pass

        try:
            await asyncio.wait_for(drain(), timeout)
        except (asyncio.TimeoutError, ConnectionClosed):
            pass

    # -- receiving --------------------------------------------------------------------------------------------
    def _rate_ok(self) -> bool:
        client = self.client
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

    async def _refuse(self) -> bool:
        """A message over the rate limit: an error at most every 0.5 s; a flood closes the connection (False)."""
        client = self.client
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
            await self._drain()
            await closing
            return False
        now = time.monotonic()
        if now - client.last_refused_reply > 0.5:
            client.last_refused_reply = now
            self._error("rate_limited", f"more than {self.config.max_rate:g} messages/s; slow down")
        return True

    async def _on_message(self, data: str | bytes) -> bool:
        """Handle one message; False ends the connection."""
        client = self.client
        self.table.counters["messages"] += 1
        if not self._rate_ok():
            return await self._refuse()
        if isinstance(data, str):
            self._error("bad_msgpack", "text frames are not accepted; send msgpack in binary frames")
            await client.ws.close(1003, "binary frames only")
            return False
        try:
            msg = parse_client_message(data)
            if not client.hello:
                if not isinstance(msg, Hello):
                    self._error("hello_first", "send 'hello' first")
                    await self._flush_and_close(1008, "hello first")
                    return False
                return await self._on_hello(msg)
            await self._dispatch(msg)
        except ProtocolError as exc:
            self._error(exc.code, str(exc), exc.ref)
        except VostreamError as exc:
            self._error("source_error", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return True

    async def _on_hello(self, msg: Hello) -> bool:
        client = self.client
        if msg.v not in SUPPORTED_VERSIONS:
            self._error(
                "version",
                f"protocol version {msg.v} is not supported; this server speaks "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}",
                "hello",
            )
            await self._flush_and_close(1002, "unsupported protocol version")
            return False
        client.hello = True
        inflight = min(msg.inflight or self.config.inflight, MAX_INFLIGHT)
        client.slot = self.table.new_slot(client, inflight)
        sources = await asyncio.to_thread(list_sources, self.media_root)
        cfg = self.config
        client.send(
            {
                "t": "hello",
                "v": PROTOCOL_VERSION,
                "server": f"vostream {package_version()}",
                "caps": {
                    "versions": list(SUPPORTED_VERSIONS),
                    "backend": cfg.session.backend,
                    "max_objects": cfg.session.max_objects,
                    "max_points": MAX_POINTS,
                    "max_message_bytes": cfg.max_message_bytes,
                    "max_rate": cfg.max_rate,
                    "inflight": inflight,
                    "export": list(EXPORT_FORMATS),
                    "jpeg_quality": cfg.session.jpeg_quality,
                    "reload": cfg.allow_reload,
                },
                "sources": sources,
                "default_source": cfg.default_source,
                "sessions": [{"session": s.id, "source": s.display} for s in self.table.sessions.values()],
            }
        )
        return True

    async def _dispatch(self, msg: ClientMessage) -> None:
        client = self.client
        if client.owner and client.session is not None and not isinstance(msg, (Ping, View)):
            client.session.last_active = time.monotonic()  # pings and resizes alone do not keep it alive
        if isinstance(msg, View):  # any time after hello, with or without a session
            client.view = (msg.w, msg.h)
            if client.slot is not None:
                client.slot.view = client.view
        elif isinstance(msg, Ack):
            if client.slot is not None:
                client.slot.ack(msg.seq, msg.draw_ms)
        elif isinstance(msg, Ping):
            client.send(
                {"t": "pong", "id": msg.id, "client_ms": msg.client_ms, "server_ms": time.time() * 1000}
            )
        elif isinstance(msg, Hello):
            raise ProtocolError("bad_message", "hello was already received", "hello")
        elif isinstance(msg, Open):
            await self._open(msg)
        elif isinstance(msg, Watch):
            await self._watch(msg)
        elif isinstance(msg, Reload):
            await self._reload()
        else:
            await self._control(msg)

    async def _control(self, msg: PromptMsg | Remove | Seek | Export | Simple) -> None:
        """A message for the client's own session: only its owner may send it."""
        client = self.client
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
            await self._export(session, msg)
            return
        elif msg.t == "close":
            await self.table.detach(client, reason="closed")
            client.send({"t": "closed", "reason": "closed"})
            return
        else:
            getattr(session, msg.t)()
        self.table.broadcast_state(session)

    async def _export(self, session: Session, msg: Export) -> None:
        path, frames = await asyncio.to_thread(session.export, msg.format)
        token = f"?token={self.config.token}" if self.config.token else ""
        self.client.send(
            {
                "t": "export",
                "format": msg.format,
                "frames": frames,
                "url": f"/export/{session.id}/{path.name}{token}",
            }
        )

    async def _reload(self) -> None:
        if not self.config.allow_reload:
            raise ProtocolError(
                "forbidden",
                "reload is off on this server: start vostream serve with --allow-reload, or send the server "
                "process SIGHUP",
                "reload",
            )
        try:
            outcome = await self.reload()
        except ReloadError as exc:
            code = "busy" if isinstance(exc, ReloadBusy) else "reload_failed"
            raise ProtocolError(code, str(exc), "reload") from exc
        self.client.send(
            {
                "t": "reloaded",
                "generation": outcome.generation,
                "load_ms": round(outcome.load_s * 1000.0, 3),
                "check_ms": round(outcome.check_s * 1000.0, 3),
                "model": outcome.model,
            }
        )

    # -- sessions ---------------------------------------------------------------------------------------------
    async def _open(self, msg: Open) -> None:
        if "://" not in msg.source:
            await self._open_source(msg)
            return
        started = time.monotonic()
        try:
            await self._open_source(msg)
        except ProtocolError as exc:
            if exc.code == "source_error":  # refused or unreachable: both answer after the same floor
                await asyncio.sleep(max(0.0, started + self.config.url_error_delay - time.monotonic()))
            raise

    async def _open_source(self, msg: Open) -> None:
        client, table, cfg = self.client, self.table, self.config
        path, display = resolve_source(self.media_root, msg.source, cfg.allow_urls, cfg.allow_exact_urls)
        # Check and reserve in one step (no await in between): simultaneous opens cannot all pass the check while
        # the slow opens are under way.  A client replacing its own session needs no new slot.
        replacing = client.owner and client.session is not None
        if not replacing:
            if table.running() + table.opening >= cfg.max_sessions:
                idle = cfg.idle_timeout
                raise ProtocolError(
                    "busy",
                    f"the server is busy: it runs at most {cfg.max_sessions} sessions and all are in "
                    f"use; try again later" + (f" (idle sessions close after {idle:g} s)" if idle else ""),
                    "open",
                )
            table.opening += 1
        try:
            await self._start_session(path, display, msg)
        finally:
            if not replacing:
                table.opening -= 1

    async def _start_session(self, path: str, display: str, msg: Open) -> None:
        client, table = self.client, self.table
        loop = table.loop
        assert loop is not None
        holder: dict[str, Session] = {}

        def notify(kind: str) -> None:
            if "s" in holder:
                try:
                    loop.call_soon_threadsafe(table.on_session_event, holder["s"], kind)
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
        await table.detach(client, reason="owner opened another source")  # only once the new one works
        table.sessions[session.id] = session
        table.attach(client, session, owner=True)
        logger.info("client %d opened %s as session %s", client.cid, display, session.id)

    async def _watch(self, msg: Watch) -> None:
        session = self.table.sessions.get(msg.session)
        if session is None or session.ended:
            raise ProtocolError("unknown_session", f"no running session {msg.session!r}", "watch")
        await self.table.detach(self.client, reason="")
        self.table.attach(self.client, session, owner=False)


__all__ = ["ClientConnection"]
