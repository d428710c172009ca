"""The viewer server's lifecycle: listening, its background tasks, model reloads, signals and shutdown.

:class:`Lifecycle` starts websockets' server on the configured port, then the per-second ``stats`` task, the idle
timeout's task and the model watcher; :meth:`Lifecycle.stop` ends them in a fixed order: tasks, watcher, listener
and connections, sessions, the shared tracker.  :func:`install_signals` wires SIGINT/SIGTERM (stop) and SIGHUP
(reload) for ``vostream serve``.

Thread-safety: event-loop thread only, except :meth:`Lifecycle.reload_quietly` (any thread: the model watcher's
and SIGHUP's worker thread).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from vostream.apps.model_watch import ModelWatcher
from vostream.apps.serve.config import ServerConfig
from vostream.apps.serve.session import TrackerCache
from vostream.apps.serve.table import SessionTable
from vostream.pipeline.errors import ConfigError
from vostream.stages.trackers.reload import ReloadError, ReloadOutcome

if TYPE_CHECKING:
    from websockets.asyncio.server import Server, ServerConnection
    from websockets.http11 import Request, Response

#: the server's log lines keep one logger name, whichever part of it logs (``vostream serve`` shows it at INFO)
logger = logging.getLogger("vostream.apps.serve.server")

Handler = Callable[["ServerConnection"], Awaitable[None]]
ProcessRequest = Callable[["ServerConnection", "Request"], "Response | None"]


class Lifecycle:
    """Start, background tasks, reload and stop of one viewer server."""

    def __init__(self, config: ServerConfig, table: SessionTable, trackers: TrackerCache) -> None:
        self.config = config
        self.table = table
        self.trackers = trackers
        self.port = config.port
        self._server: Server | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._watcher: ModelWatcher | None = None

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        query = f"?token={self.config.token}" if self.config.token else ""
        return f"http://{host}:{self.port}/{query}"

    async def start(self, handler: Handler, process_request: ProcessRequest) -> None:
        """Listen (a busy port raises :class:`ConfigError`), then start the background tasks."""
        from websockets.asyncio.server import serve

        self.table.loop = asyncio.get_running_loop()
        try:
            self._server = await serve(
                handler,
                self.config.host,
                self.config.port,
                process_request=process_request,
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
            model = str(self.config.session.tracker_options["model"])  # check() made sure it is set
            self._watcher = ModelWatcher(model, self.reload_quietly).start()
        logger.info("viewer at %s", self.url)

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
        await self.table.close_all()
        await asyncio.to_thread(self.trackers.close)

    # -- hot reload -------------------------------------------------------------------------------------------
    async def reload_model(self) -> ReloadOutcome:
        """Reload the model (docs/deploy.md §2) in a worker thread; sessions keep running and switch at their next
        frame.  Raises ``ReloadError`` (logged) when the new model is refused."""
        return await asyncio.to_thread(self.trackers.reload)

    def reload_quietly(self) -> None:
        """The model watcher's and SIGHUP's reload: the outcome is logged, a refusal counted in the metrics."""
        try:
            self.trackers.reload()
        except ReloadError:
            pass

    # -- background tasks -------------------------------------------------------------------------------------
    async def _idle_loop(self) -> None:
        """Close sessions whose owner has been silent (no control message, no ack) for ``idle_timeout`` s: a
        forgotten paused tab must not hold a session slot forever.  Their clients get ``closed`` saying why."""
        timeout = self.config.idle_timeout
        table = self.table
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for session in list(table.sessions.values()):
                if now - session.last_active < timeout or table.sessions.get(session.id) is not session:
                    continue
                reason = f"idle: no activity for {timeout:g} s; open the source again"
                logger.info("closing idle session %s (%s)", session.id, session.display)
                owner = table.owner_of(session)
                if owner is not None:
                    await table.detach(owner, reason=reason)
                    owner.send({"t": "closed", "reason": reason})
                else:  # no owner left (cannot normally happen): close it all the same
                    await table.drop(session)

    async def _stats_loop(self) -> None:
        """Every second, each client with a running session gets ``stats``: rates, latencies, drops, queues."""
        while True:
            await asyncio.sleep(1.0)
            for client in list(self.table.clients.values()):
                session = client.session
                if session is None or session.pipeline is None or client.slot is None:
                    continue
                snap = session.pipeline.metrics()
                cs = client.slot.stats()
                viewer = next((n for n in snap.nodes if n.name == "viewer"), None)
                client.send(
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
                    }
                )


def install_signals(
    loop: asyncio.AbstractEventLoop, stop: Callable[[], None], reload: Callable[[], None]
) -> None:
    """SIGINT and SIGTERM call ``stop`` on the loop; SIGHUP runs ``reload`` in a worker thread (docs/deploy.md §2;
    the outcome is logged).  Where signals cannot be handled (not the main thread, Windows) nothing is installed."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError):  # pragma: no cover - non-main thread / Windows
            pass
    hup = getattr(signal, "SIGHUP", None)
    if hup is not None:
        try:
            loop.add_signal_handler(hup, lambda: loop.run_in_executor(None, reload))
        except (NotImplementedError, RuntimeError):  # pragma: no cover
            pass


__all__ = ["Lifecycle", "install_signals"]
