"""The viewer server's HTTP side: every plain GET is answered here, from websockets' ``process_request``.

- ``/`` and the viewer's static files: an allow-list of ``web/``'s files built at start-up, so no path from the
  URL ever reaches the file system;
- ``/healthz`` (no token), ``/metrics`` and ``/export/<session>/<file>`` (token);
- ``/ws``: the handshake checks (Host, token, Origin, client limit) before the WebSocket opens.

Also the media root (the folder sources are opened under) and the Prometheus registry.  Thread-safety: event-loop
thread only, except :class:`MetricsCollector`, which only reads.
"""

from __future__ import annotations

import hmac
import json
import mimetypes
import os
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from vostream.apps.prometheus import model_families, pipeline_families
from vostream.apps.serve.config import ServerConfig, is_loopback
from vostream.apps.serve.session import TrackerCache
from vostream.apps.serve.table import SessionTable

if TYPE_CHECKING:
    from prometheus_client import Metric
    from websockets.asyncio.server import ServerConnection
    from websockets.http11 import Request, Response

_STATIC_SUFFIXES = (".html", ".js", ".css", ".png", ".svg", ".ico", ".txt", ".md")
_CSP = (
    "default-src 'self'; img-src 'self' blob: data:; connect-src 'self' ws: wss:; "
    "style-src 'self'; script-src 'self'; frame-ancestors 'none'"
)


def web_dir() -> Path:
    """The viewer's static files: the ``vostream.web`` package's folder (``web/`` in a checkout)."""
    import vostream.web as web_pkg

    return Path(list(web_pkg.__path__)[0])


def static_files(root: Path) -> dict[str, Path]:
    """URL path -> file, for every servable file under ``root`` (no links, no ``__``/``.`` names)."""
    files: dict[str, Path] = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.suffix in _STATIC_SUFFIXES + (".js",):
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(("__", ".")) and "/__" not in rel:
                files["/" + rel] = path
    files["/"] = root / "index.html"
    return files


def response(
    status: int,
    body: bytes | str,
    ctype: str = "text/plain; charset=utf-8",
    extra: list[tuple[str, str]] | None = None,
) -> Response:
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


class HttpRoutes:
    """Answers the server's HTTP requests.  ``url()`` is the server's printed URL (named in a refusal)."""

    def __init__(
        self, config: ServerConfig, table: SessionTable, trackers: TrackerCache, url: Callable[[], str]
    ) -> None:
        from prometheus_client import CollectorRegistry

        self.config = config
        self.table = table
        self.trackers = trackers
        self.url = url
        self.media_root = Path(os.path.realpath(config.media_root))
        self.web_dir = web_dir()
        self.static = static_files(self.web_dir)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MetricsCollector(table, trackers))

    # -- checks -----------------------------------------------------------------------------------------------
    def token_ok(self, query: dict[str, list[str]]) -> bool:
        if not self.config.token:
            return True
        given = (query.get("token") or [""])[0]
        return hmac.compare_digest(given.encode(), self.config.token.encode())

    def host_ok(self, host_header: str | None) -> bool:
        """Defends against DNS rebinding: the Host header must name this server."""
        if not host_header:
            return False
        host = urlsplit("//" + host_header).hostname or ""
        allowed = set(self.config.allow_hosts) | {self.config.host}
        if is_loopback(self.config.host) or self.config.host in ("0.0.0.0", "::"):
            allowed |= {"localhost", "127.0.0.1", "::1"}
        return host in allowed or (self.config.host in ("0.0.0.0", "::") and bool(self.config.token))

    def origin_ok(self, origin: str | None, host_header: str | None) -> bool:
        if origin is None:  # not a browser (browsers always send Origin on WebSocket handshakes)
            return True
        if origin in self.config.allow_origins:
            return True
        parts = urlsplit(origin)
        return (
            parts.scheme in ("http", "https")
            and parts.netloc == (host_header or "")
            and self.host_ok(parts.netloc)
        )

    # -- routes -----------------------------------------------------------------------------------------------
    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """websockets' ``process_request``: a response, or ``None`` to go on with the WebSocket handshake."""
        url = urlsplit(request.path)
        query = parse_qs(url.query)
        host = request.headers.get("Host")
        if not self.host_ok(host):
            self.table.counters["refused_handshakes"] += 1
            return response(403, f"unexpected Host header {host!r}; use {self.url()}\n")
        path = url.path
        if path == "/ws":
            return self._websocket_check(query, request.headers.get("Origin"), host)
        if path == "/healthz":
            health = self.health()
            return response(200 if health["ok"] else 503, json.dumps(health), "application/json")
        if path == "/metrics":
            if not self.token_ok(query):
                return response(403, "missing or wrong token\n")
            from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

            return response(200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        if path.startswith("/export/"):
            if not self.token_ok(query):
                return response(403, "missing or wrong token\n")
            return self._export_response(path)
        return self._static_response(path)

    def _websocket_check(
        self, query: dict[str, list[str]], origin: str | None, host: str | None
    ) -> Response | None:
        if not self.token_ok(query):
            self.table.counters["refused_handshakes"] += 1
            return response(403, "missing or wrong token: open the URL vostream serve printed\n")
        if not self.origin_ok(origin, host):
            self.table.counters["refused_handshakes"] += 1
            return response(403, "cross-origin WebSocket refused (Origin does not match this server)\n")
        if len(self.table.clients) >= self.config.max_clients:
            return response(503, "too many clients; try again later\n")
        return None  # proceed with the WebSocket handshake

    def _static_response(self, path: str) -> Response:
        file = self.static.get(path)
        if file is None:
            return response(404, "not found\n")
        ctype = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        return response(200, file.read_bytes(), ctype, [("Content-Security-Policy", _CSP)])

    def _export_response(self, path: str) -> Response:
        parts = path.split("/")
        if len(parts) != 4:
            return response(404, "not found\n")
        session = self.table.sessions.get(parts[2])
        names = {"annotations.json": "json", "masks.zip": "png"}
        fmt = names.get(parts[3])
        if session is None or fmt is None or fmt not in session.exports:
            return response(404, "no such export; send an 'export' message first\n")
        ctype = "application/json" if fmt == "json" else "application/zip"
        stem = Path(session.display).stem or "export"
        disp = f'attachment; filename="{stem}_{parts[3]}"'
        return response(200, session.exports[fmt].read_bytes(), ctype, [("Content-Disposition", disp)])

    def health(self) -> dict[str, object]:
        """``/healthz``: ok unless a session failed; the clients, the sessions, the tracker and its generation."""
        sessions = [
            {
                "session": s.id,
                "source": s.display,
                "alive": bool(s.pipeline and s.pipeline.running),
                "error": s.error,
            }
            for s in list(self.table.sessions.values())
        ]
        return {
            "ok": all(s["error"] is None for s in sessions),
            "clients": len(self.table.clients),
            "sessions": sessions,
            "tracker": self.config.session.backend,
            "model_generation": self.trackers.handle.generation if self.trackers.handle is not None else 0,
        }


class MetricsCollector:
    """Prometheus collector: every session's pipeline metrics plus the viewer's per-client figures."""

    def __init__(self, table: SessionTable, trackers: TrackerCache) -> None:
        self.table = table
        self.trackers = trackers

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from pipeline_families(
            ({"session": s.id}, s.pipeline)
            for s in list(self.table.sessions.values())
            if s.pipeline is not None
        )
        clients = GaugeMetricFamily("vostream_viewer_clients", "connected viewer clients")
        clients.add_metric([], len(self.table.clients))
        yield clients
        sessions = GaugeMetricFamily("vostream_viewer_sessions", "open viewer sessions")
        sessions.add_metric([], len(self.table.sessions))
        yield sessions
        drops = CounterMetricFamily(
            "vostream_viewer_client_drops", "frames a client skipped (latest-wins)", labels=["client"]
        )
        glass = GaugeMetricFamily(
            "vostream_viewer_glass_to_glass_ms",
            "capture to drawn in the browser",
            labels=["client", "quantile"],
        )
        for client in list(self.table.clients.values()):
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
        yield from model_families(self.trackers.handle, "session")


__all__ = ["HttpRoutes", "MetricsCollector", "response", "static_files", "web_dir"]
