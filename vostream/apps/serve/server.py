"""``vostream serve``: one port serves the viewer (``web/``) over HTTP and the viewer protocol over WebSocket.

Architecture, security and failure behaviour: ``docs/viewer.md``; the protocol: ``docs/protocol.md``.

- :class:`ServerConfig` (``config``): every setting (inert dataclass).
- :class:`ViewerServer`: the asyncio server, composed of four parts, each in its own module:
  :class:`~vostream.apps.serve.routes.HttpRoutes` (static files, ``/healthz``, ``/metrics``, exports, the
  handshake checks, the media root), :class:`~vostream.apps.serve.connection.ClientConnection` (one client's
  protocol loop: one task receives its messages and one sends to it, control replies first, then the newest
  frame when the client's in-flight window has room), :class:`~vostream.apps.serve.table.SessionTable` (the
  sessions, the clients and who owns or watches what) and :class:`~vostream.apps.serve.lifecycle.Lifecycle`
  (listening, background tasks, reload, shutdown).
- :class:`ServerThread`: runs a server in a background thread (tests, benchmarks, notebooks).

Thread-safety: a :class:`ViewerServer` lives on one event loop; sessions call back into it only through
``loop.call_soon_threadsafe``.  :meth:`ServerThread.stop` may be called from any thread.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from vostream.apps.serve.config import ServerConfig, is_loopback
from vostream.apps.serve.connection import ClientConnection
from vostream.apps.serve.lifecycle import Lifecycle, install_signals
from vostream.apps.serve.routes import HttpRoutes
from vostream.apps.serve.session import Session, SessionOptions, TrackerCache
from vostream.apps.serve.table import Client, SessionTable
from vostream.pipeline.errors import ConfigError
from vostream.stages.trackers.reload import ReloadOutcome

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from websockets.asyncio.server import ServerConnection

#: the server's log lines (``connection`` and ``lifecycle`` log under this name too; ``vostream serve`` shows INFO)
logger = logging.getLogger(__name__)

T = TypeVar("T")


class ViewerServer:
    """The viewer server.  ``await start()``, then ``await serve_forever()`` or ``await stop()``.

    Its parts: ``table`` (sessions and clients), ``http`` (the HTTP routes), ``lifecycle`` (start, tasks, reload,
    stop); each WebSocket connection is served by a :class:`ClientConnection`."""

    def __init__(self, config: ServerConfig) -> None:
        config.check()
        self.config = config
        #: one tracker (weights, graphs) for all sessions, loaded on the first open
        self.trackers = TrackerCache(config.session.backend, config.session.tracker_options)
        self.table = SessionTable()
        self.lifecycle = Lifecycle(config, self.table, self.trackers)
        self.http = HttpRoutes(config, self.table, self.trackers, url=lambda: self.url)

    # -- the parts' state, for tests and tools (event-loop thread) -------------------------------------------
    @property
    def sessions(self) -> dict[str, Session]:
        return self.table.sessions

    @property
    def clients(self) -> dict[int, Client]:
        return self.table.clients

    @property
    def counters(self) -> dict[str, int]:
        return self.table.counters

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self.table.loop

    @property
    def media_root(self) -> Path:
        return self.http.media_root

    @property
    def web_dir(self) -> Path:
        return self.http.web_dir

    @property
    def static(self) -> dict[str, Path]:
        return self.http.static

    @property
    def registry(self) -> CollectorRegistry:
        return self.http.registry

    @property
    def port(self) -> int:
        return self.lifecycle.port

    @property
    def url(self) -> str:
        return self.lifecycle.url

    # -- lifecycle -----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.lifecycle.start(self._handler, self.http.process_request)

    async def serve_forever(self) -> None:
        await self.lifecycle.serve_forever()

    async def stop(self) -> None:
        """Close every connection and session.  Idempotent."""
        await self.lifecycle.stop()

    async def reload_model(self) -> ReloadOutcome:
        """Reload the model (docs/deploy.md §2) in a worker thread; sessions keep running and switch at their next
        frame.  Raises ``ReloadError`` (logged) when the new model is refused."""
        return await self.lifecycle.reload_model()

    def reload_quietly(self) -> None:
        """The model watcher's and SIGHUP's reload: the outcome is logged, a refusal counted in the metrics."""
        self.lifecycle.reload_quietly()

    def health(self) -> dict[str, object]:
        return self.http.health()

    async def _handler(self, ws: ServerConnection) -> None:
        connection = ClientConnection(
            ws,
            config=self.config,
            table=self.table,
            trackers=self.trackers,
            media_root=self.http.media_root,
            reload=self.reload_model,
        )
        await connection.run()


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

    def call(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn()`` on the server's loop and return its result (inspect state from tests)."""

        async def run() -> T:
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
    import sys

    async def main() -> None:
        server = ViewerServer(config)
        await server.start()
        print(f"vostream viewer: open {server.url}", file=sys.stderr, flush=True)
        stop = asyncio.Event()
        install_signals(asyncio.get_running_loop(), stop.set, server.reload_quietly)
        serving = asyncio.create_task(server.serve_forever())
        await stop.wait()
        serving.cancel()
        await server.stop()

    asyncio.run(main())
    return 0


def add_serve_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_common: Callable[[argparse.ArgumentParser], None],
) -> None:
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


def cmd_serve(args: argparse.Namespace) -> int:
    logging.getLogger("vostream.apps.serve.server").setLevel(logging.INFO)
    logging.getLogger("vostream.stages.trackers.reload").setLevel(logging.INFO)
    return run_server(serve_config(args))


def serve_config(args: argparse.Namespace) -> ServerConfig:
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
    options: dict[str, object] = {}
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
