"""Which sources a viewer may open: files and frames directories under ``--media-root`` and stream URLs allowed
by ``--allow-url`` prefixes.  Pure functions, safe from any thread.

Rules (``docs/viewer.md`` § Security): a relative path is joined to the media root; ``..`` components, NUL bytes
and absolute paths outside the root are refused; symlinks are resolved and the *resolved* path must still lie
inside the resolved root (no symlink escape).  A URL (``scheme://``) must start with one of the allowed prefixes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from vostream.pipeline.apps.serve.protocol import ProtocolError

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".ts", ".mpg", ".mpeg", ".h264", ".hevc")
_MAX_LISTED = 200


def display_url(url: str) -> str:
    """``url`` as shown to clients and logs: no query string, no password (``user:***@``)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url.split("?", 1)[0])


def resolve_source(
    root: Path, requested: str, allow_urls: tuple[str, ...] = (), exact_urls: tuple[str, ...] = ()
) -> tuple[str, str]:
    """``(path or URL to open, display name)`` for ``requested``, or :class:`ProtocolError` ``forbidden_path`` /
    ``source_error`` (missing).  A URL must start with one of ``allow_urls`` or equal one of ``exact_urls``."""
    if "://" in requested:
        if requested in exact_urls or any(requested.startswith(prefix) for prefix in allow_urls):
            return requested, display_url(requested)
        raise ProtocolError(
            "forbidden_path",
            "stream URLs are not allowed by this server; start it with --allow-url PREFIX to permit them",
            "open",
        )
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


__all__ = ["VIDEO_EXTENSIONS", "display_url", "list_sources", "resolve_source"]
