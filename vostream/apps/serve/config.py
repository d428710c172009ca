"""The settings of ``vostream serve``: :class:`ServerConfig` (an inert dataclass, checked once by
:meth:`ServerConfig.check`) and :func:`is_loopback`."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from vostream.apps.serve.protocol import MAX_INFLIGHT
from vostream.apps.serve.session import SessionOptions
from vostream.pipeline.errors import ConfigError


def is_loopback(host: str) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerConfig:
    """Settings of ``vostream serve``.  ``port`` 0 picks a free port.  A non-loopback ``host`` needs ``token``."""

    host: str = "127.0.0.1"
    port: int = 8765
    media_root: str = "."
    default_source: str | None = None
    token: str | None = None
    allow_origins: tuple[str, ...] = ()
    allow_hosts: tuple[str, ...] = ()
    allow_urls: tuple[str, ...] = ()
    allow_exact_urls: tuple[
        str, ...
    ] = ()  # `vostream serve rtsp://...`: exactly that URL (and no other) may open
    max_message_bytes: int = 64 * 1024
    max_rate: float = 100.0  # client messages per second (burst: 2 s worth)
    inflight: int = 2
    max_sessions: int = 8
    #: seconds a client has to answer the server's close frame before its connection is aborted
    close_timeout: float = 1.0
    #: a session whose owner sent nothing (no control, no ack) for this long is closed (0: never)
    idle_timeout: float = 300.0
    #: a stream URL that is refused or cannot be opened is answered no sooner than this (seconds after the open),
    #: so that the answer's timing does not tell an allow-list refusal from a refused connection
    url_error_delay: float = 0.5
    max_clients: int = 32
    #: accept the ``reload`` message (an operator's action: it swaps the model under every session); SIGHUP always
    allow_reload: bool = False
    #: reload when the model directory (``--model``) holds a new export
    watch_model: bool = False
    session: SessionOptions = field(default_factory=SessionOptions)

    def check(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise ConfigError(
                f"binding to {self.host!r} (not loopback) requires --token: anyone who can reach the "
                f"port could open files under the media root and watch sessions"
            )
        if self.token is not None and len(self.token) < 8:
            raise ConfigError("--token must be at least 8 characters")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        if not os.path.isdir(self.media_root):
            raise ConfigError(f"--media-root {self.media_root!r} is not a directory")
        if not (self.idle_timeout >= 0 and self.idle_timeout < float("inf")):
            raise ConfigError(f"--idle-timeout must be >= 0 seconds (0: never), got {self.idle_timeout}")
        if self.max_sessions < 1:
            raise ConfigError(f"max sessions must be >= 1, got {self.max_sessions}")
        if not 1 <= self.inflight <= MAX_INFLIGHT:
            raise ConfigError(f"inflight must be 1..{MAX_INFLIGHT}, got {self.inflight}")
        if self.watch_model and not self.session.tracker_options.get("model"):
            raise ConfigError("--watch-model needs --model DIR (the export directory to watch)")


__all__ = ["ServerConfig", "is_loopback"]
