"""Batch inputs for ``vostream annotate``: files, directories (recursive) and list files → :class:`VideoEntry`.

Each video gets a *key* (how the prompts file names it) and an output folder name, unique in the batch and
deterministic (``docs/annotate.md``).  Pure functions over the filesystem; thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vostream.apps.userfiles import read_user_file
from vostream.pipeline.errors import ConfigError

logger = logging.getLogger(__name__)

#: extensions picked up when searching a directory (case-insensitive)
VIDEO_EXTENSIONS = (".mp4", ".mov", ".mkv", ".avi", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")
#: a file input with one of these suffixes is a list of video paths
LIST_EXTENSIONS = (".txt", ".lst", ".list")


@dataclass(frozen=True)
class VideoEntry:
    """One input video: ``path`` (absolute), ``key`` (relative path as the prompts file names it, POSIX),
    ``name`` (its output folder under ``--out``)."""

    path: str
    key: str
    name: str = ""

    @property
    def file_name(self) -> str:
        return Path(self.path).name


def _walk(directory: Path) -> Iterable[Path]:
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in sorted(files):
            if not f.startswith(".") and f.lower().endswith(VIDEO_EXTENSIONS):
                yield Path(root) / f


def _read_list(path: Path) -> list[tuple[Path, str]]:
    raw = read_user_file(path, "list file")  # a regular file of at most 16 MiB
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"list file {str(path)!r} cannot be read: {exc}") from exc
    out = []
    for lineno, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        p = Path(text)
        full = p if p.is_absolute() else path.parent / p
        if not full.is_file():
            raise ConfigError(f"list file {str(path)!r}, line {lineno}: no such video file {text!r}")
        out.append((full, Path(text).as_posix()))
    return out


def discover_videos(inputs: Sequence[str]) -> list[VideoEntry]:
    """Expand INPUTS into videos with keys and unique output names.  Raises :class:`ConfigError` for a missing
    input or when nothing is found."""
    found: list[tuple[Path, str]] = []
    for raw in inputs:
        text = str(raw)
        if text.startswith("@"):
            found += _read_list(Path(text[1:]))
            continue
        p = Path(text)
        if p.is_dir():
            videos = [(f, f.relative_to(p).as_posix()) for f in _walk(p)]
            if not videos:
                logger.warning("input directory %s holds no video files (%s)", p, " ".join(VIDEO_EXTENSIONS))
            found += videos
        elif p.is_file():
            if p.suffix.lower() in LIST_EXTENSIONS:
                found += _read_list(p)
            else:
                found.append((p, p.as_posix()))
        else:
            raise ConfigError(f"input {text!r}: no such file or directory")
    entries: list[VideoEntry] = []
    seen: set[str] = set()
    for path, key in found:
        real = os.path.realpath(path)
        if real in seen:
            continue
        seen.add(real)
        entries.append(VideoEntry(str(Path(path).resolve()), key))
    if not entries:
        raise ConfigError(
            f"no videos found in {', '.join(map(str, inputs))}; give video files, directories "
            f"holding {', '.join(VIDEO_EXTENSIONS)} files, or a list file"
        )
    return assign_names(entries)


def assign_names(entries: Sequence[VideoEntry]) -> list[VideoEntry]:
    """Output folder names: the stem, or ``<stem>-<8 hex of sha256(key)>`` for every video whose stem is shared."""
    stems: dict[str, int] = {}
    for e in entries:
        stem = _safe(Path(e.key).stem)
        stems[stem] = stems.get(stem, 0) + 1
    out = []
    names: set[str] = set()
    for e in entries:
        stem = _safe(Path(e.key).stem)
        name = stem if stems[stem] == 1 else f"{stem}-{hashlib.sha256(e.key.encode()).hexdigest()[:8]}"
        if name in names:  # two inputs with the same key (e.g. clip.mp4 from two input directories)
            name = f"{stem}-{hashlib.sha256(e.path.encode()).hexdigest()[:8]}"
        names.add(name)
        out.append(VideoEntry(e.path, e.key, name))
    return out


def _safe(stem: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in stem).strip(".")
    return cleaned or "video"


def match_video(name: str, entries: Sequence[VideoEntry]) -> VideoEntry | None | list[VideoEntry]:
    """The entry the prompts file means by ``name``: exact key, then absolute path, then a unique file name.
    Returns ``None`` when nothing matches, a list when the file name is ambiguous."""
    posix = Path(name).as_posix()
    exact = [e for e in entries if e.key == posix]
    if exact:
        return exact[0] if len(exact) == 1 else exact
    if Path(name).is_absolute():
        for e in entries:
            if e.path == str(Path(name).resolve()):
                return e
    by_name = [e for e in entries if e.file_name == Path(name).name and "/" not in posix]
    if len(by_name) == 1:
        return by_name[0]
    return by_name or None


__all__ = [
    "LIST_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "VideoEntry",
    "assign_names",
    "discover_videos",
    "match_video",
]
