"""Which sources a viewer may open: files and frames directories under ``--media-root`` and stream URLs allowed
by ``--allow-url`` prefixes.  Pure functions, safe from any thread.

Rules (``docs/viewer.md`` § Security): a relative path is joined to the media root; ``..`` components, NUL bytes
and absolute paths outside the root are refused; symlinks are resolved and the *resolved* path must still lie
inside the resolved root (no symlink escape).  A URL (``scheme://``) must match an ``--allow-url`` entry
(:func:`url_allowed`: parsed, not a string prefix: same scheme, host and port, and, when the entry has a path, a
path under it at a segment boundary) or equal the URL given as ``vostream serve``'s SOURCE.  A URL that is refused
gets the same one-line ``source_error`` as one that cannot be reached (:data:`URL_FAILED`), so that clients cannot
use the server to probe hosts and ports; the reason goes to the server's log only.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import SplitResult, unquote, urlsplit

from vostream.apps.serve.protocol import ProtocolError

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".ts", ".mpg", ".mpeg", ".h264", ".hevc")
_MAX_LISTED = 200

logger = logging.getLogger(__name__)

#: stream schemes a client may open (with an --allow-url entry); ``file://`` and the like never
STREAM_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "srt", "udp", "tcp")
_DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "rtmp": 1935, "rtmps": 443, "http": 80, "https": 443}
_HOST_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$")
#: what a client is told for a stream URL that is refused *or* cannot be opened (details: the server log)
URL_FAILED = (
    "cannot open stream {url}: it is not allowed by this server or cannot be reached; see the server log"
)


class _BadURL(ValueError):
    pass


def _parse_url(url: str) -> tuple[str, str, int | None, str]:
    """``(scheme, host, port, path)`` of ``url``, lower-case scheme and host (no brackets, no userinfo), the port
    explicit or the scheme's default (``None`` when it has none).  Raises :class:`_BadURL` for anything
    ambiguous: control characters, spaces, backslashes, non-ASCII, several ``@``, a bad port, an odd host."""
    if not url.isascii() or any(c <= " " or c in "\\\x7f" for c in url):
        raise _BadURL("control characters, spaces, backslashes or non-ASCII characters")
    parts: SplitResult = urlsplit(url)
    if parts.netloc.count("@") > 1:
        raise _BadURL("more than one '@' in the authority")
    try:
        port = parts.port
    except ValueError as exc:
        raise _BadURL(str(exc)) from exc
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if not host:
        raise _BadURL("no host")
    if ":" in host:  # IPv6 (the brackets are gone): compare the canonical form
        try:
            import ipaddress

            host = ipaddress.IPv6Address(host).compressed
        except ValueError as exc:
            raise _BadURL(f"bad IPv6 address {host!r}") from exc
    elif not _HOST_RE.match(host):
        raise _BadURL(f"bad host name {host!r}")
    if port is None:
        port = _DEFAULT_PORTS.get(scheme)
    return scheme, host, port, parts.path


def _path_under(path: str, prefix: str) -> bool:
    """``path`` equals ``prefix`` or lies under it at a segment boundary (``/live`` allows ``/live/a``, not
    ``/lively``).  A prefix of ``""`` or ``/`` allows every path."""
    base = prefix.rstrip("/")
    if not base:
        return True
    return path == base or path.startswith(base + "/")


def url_allowed(url: str, allow: tuple[str, ...] = (), exact: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Whether a client may open stream ``url``, and why not (for the server log).

    ``exact``: URLs allowed as given (string equality: ``vostream serve rtsp://...``).  ``allow``: ``--allow-url``
    entries, compared **parsed**: the scheme, the host (case-insensitive; userinfo removed; IPv6 in its canonical
    form) and the port (explicit or the scheme's default) must be equal; an entry with a path allows that path and
    what lies under it at a ``/`` boundary; the query string is not compared.  Only stream schemes
    (:data:`STREAM_SCHEMES`); ``.``/``..`` path segments (also percent-encoded) are refused."""
    if url in exact:
        return True, ""
    try:
        scheme, host, port, path = _parse_url(url)
    except _BadURL as exc:
        return False, f"unparsable URL ({exc})"
    if scheme not in STREAM_SCHEMES:
        return False, f"scheme {scheme!r} is not a stream scheme"
    if any(seg in (".", "..") for seg in unquote(path).split("/")):
        return False, "'.' or '..' path segments"
    for entry in allow:
        try:
            e_scheme, e_host, e_port, e_path = _parse_url(entry)
        except _BadURL:
            continue
        if (e_scheme, e_host, e_port) == (scheme, host, port) and _path_under(path, e_path):
            return True, ""
    return False, "no --allow-url entry matches its scheme, host, port and path"


def display_url(url: str) -> str:
    """``url`` as shown to clients and logs: no query string, no password (``user:***@``)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url.split("?", 1)[0])


def resolve_source(
    root: Path, requested: str, allow_urls: tuple[str, ...] = (), exact_urls: tuple[str, ...] = ()
) -> tuple[str, str]:
    """``(path or URL to open, display name)`` for ``requested``, or :class:`ProtocolError` ``forbidden_path`` /
    ``source_error`` (missing).  A URL must be allowed by :func:`url_allowed`; a refused one is a ``source_error``
    with the generic :data:`URL_FAILED` message (the reason is logged), as for a URL that cannot be reached."""
    if "://" in requested:
        ok, why = url_allowed(requested, allow_urls, exact_urls)
        if ok:
            return requested, display_url(requested)
        logger.warning("refused stream URL %s: %s", display_url(requested), why)
        raise ProtocolError("source_error", URL_FAILED.format(url=display_url(requested)), "open")
    if "\x00" in requested or "\\" in requested:
        raise ProtocolError("forbidden_path", "the path contains a forbidden character", "open")
    parts = PurePosixPath(requested).parts
    if ".." in parts:
        raise ProtocolError(
            "forbidden_path",
            f"'..' is not allowed in source paths: {requested!r}; give a path relative to the media root",
            "open",
        )
    root_real = Path(os.path.realpath(root))
    candidate = Path(requested) if Path(requested).is_absolute() else root_real / requested
    real = Path(os.path.realpath(candidate))
    if real != root_real and root_real not in real.parents:
        raise ProtocolError(
            "forbidden_path",
            f"{requested!r} is outside the media root; the server only opens sources under --media-root",
            "open",
        )
    if not real.exists():
        raise ProtocolError(
            "source_error", f"no such file or directory under the media root: {requested!r}", "open"
        )
    display = str(real.relative_to(root_real)) if real != root_real else real.name
    return str(real), display


def list_sources(root: Path, depth: int = 2) -> list[str]:
    """Relative paths of video files and frames directories (directories holding JPEG/PNG files) under ``root``,
    at most ``depth`` levels down and 200 entries, in sorted order.  Symlinks leaving the root are skipped."""
    root_real = Path(os.path.realpath(root))
    out: list[str] = []

    def walk(d: Path, level: int) -> None:
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError:
            return
        has_images = False
        for e in entries:
            if len(out) >= _MAX_LISTED or e.name.startswith("."):
                continue
            real = Path(os.path.realpath(e.path))
            if real != root_real and root_real not in real.parents:
                continue
            if e.is_file():
                suffix = Path(e.name).suffix.lower()
                if suffix in VIDEO_EXTENSIONS:
                    out.append(str(Path(e.path).relative_to(root_real)))
                elif suffix in (".jpg", ".jpeg", ".png"):
                    has_images = True
            elif e.is_dir() and level < depth:
                walk(Path(e.path), level + 1)
        if has_images and d != root_real and len(out) < _MAX_LISTED:
            out.append(str(d.relative_to(root_real)) + "/")

    walk(root_real, 0)
    return sorted(out)[:_MAX_LISTED]


__all__ = [
    "STREAM_SCHEMES",
    "URL_FAILED",
    "VIDEO_EXTENSIONS",
    "display_url",
    "list_sources",
    "resolve_source",
    "url_allowed",
]
