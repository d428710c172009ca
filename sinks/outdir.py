"""An output directory owned by one run: an exclusive lock (``flock`` on ``DIR/.vostream.lock``) and the removal
of a previous run's outputs.

``vostream track`` and ``vostream annotate`` hold the lock while they write into ``--out``: a second run on the same
directory fails at once with :class:`OutputError` naming the directory and the run holding it (pid, command,
start time), instead of both writing a mix of files.  The lock file is removed when the run ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from vostream.pipeline.errors import OutputError

logger = logging.getLogger(__name__)

LOCK_NAME = ".vostream.lock"

#: what ``vostream track`` writes into ``--out`` (``sinks.build_file_sinks`` and ``summary.json``)
TRACK_OUTPUT_FILES = ("overlay.mp4", "annotations.json", "mot.txt", "summary.json")
TRACK_MASKS_DIR = "masks"
_MASK_NAME = re.compile(r"\d{5,}\.png")
_TMP_OF = r"\.[0-9a-f]{8}\.tmp"  # sinks.atomic.temp_path_for: NAME.<8 hex>.tmp


def _describe_holder(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1024).strip()
    except OSError:
        text = ""
    return text or "another vostream run"


@contextlib.contextmanager
def lock_output_dir(directory: str | os.PathLike[str], what: str = "vostream") -> Iterator[Path]:
    """Hold ``DIR/.vostream.lock`` for the ``with`` block; :class:`OutputError` at once if another run holds it.

    The lock file records who holds it (``what``, pid, command line, start time) for the other run's error
    message, and is removed on exit.  (Removing it is safe: a run that opened the old file re-checks after locking
    that it locked the file now at the path.)  On a system without ``fcntl`` no lock is taken.
    """
    out = Path(directory)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield out
        return
    path = out / LOCK_NAME
    fh: IO[Any] | None = None
    for _ in range(100):
        try:
            fh = open(path, "a+", encoding="utf-8")
        except OSError as exc:
            raise OutputError(
                f"cannot create the lock file {str(path)!r}: {exc.strerror or exc}; choose a writable --out"
            ) from exc
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            raise OutputError(
                f"the output directory {str(out)!r} is in use by {_describe_holder(path)}; "
                f"wait for it to finish or use another --out"
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        fh.close()  # the holder removed the file after we opened it: lock the new one
        fh = None
    if fh is None:  # pragma: no cover - 100 lost races
        raise OutputError(f"cannot lock the output directory {str(out)!r}; try again")
    try:
        try:
            fh.truncate(0)
            args = shlex.join(sys.argv[1:])[:300]
            started = time.strftime("%Y-%m-%d %H:%M:%S")
            fh.write(f"{what} (pid {os.getpid()}, started {started}, arguments: {args})\n")
            fh.flush()
        except OSError:  # a full disk: the lock holds all the same, only the description is missing
            pass
        yield out
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        # on a full disk the holder's description is still in the file's buffer and closing retries the write:
        # the lock itself is released either way, and the run reports its own error, not this one
        with contextlib.suppress(OSError):
            fh.close()


def previous_track_outputs(directory: str | os.PathLike[str]) -> list[Path]:
    """The files a previous ``vostream track`` left in ``directory``: ``overlay.mp4``, ``annotations.json``,
    ``mot.txt``, ``summary.json``, ``masks/NNNNN.png`` and temporary files of those (``NAME.<hex>.tmp``, from a
    killed run).  Nothing else: a user's own files are never listed."""
    out = Path(directory)
    names = "|".join(re.escape(n) for n in TRACK_OUTPUT_FILES)
    ours = re.compile(rf"(?:{names})(?:{_TMP_OF})?")
    found: list[Path] = []
    with contextlib.suppress(OSError):
        found += [p for p in out.iterdir() if ours.fullmatch(p.name) and p.is_file()]
    masks = out / TRACK_MASKS_DIR
    mask_name = re.compile(rf"{_MASK_NAME.pattern}(?:{_TMP_OF})?")
    if masks.is_dir():
        with contextlib.suppress(OSError):
            found += [p for p in masks.iterdir() if mask_name.fullmatch(p.name) and p.is_file()]
    return sorted(found)


def remove_files(paths: Iterable[Path], directory: str | os.PathLike[str]) -> int:
    """Remove ``paths`` (then ``DIR/masks`` if that left it empty).  :class:`OutputError` naming a file that
    cannot be removed.  Returns how many were removed."""
    count, masks_touched = 0, False
    for p in paths:
        try:
            p.unlink()
            count += 1
            masks_touched = masks_touched or p.parent.name == TRACK_MASKS_DIR
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise OutputError(
                f"cannot remove the previous run's {str(p)!r}: {exc.strerror or exc}; "
                f"remove it yourself or use another --out"
            ) from exc
    if masks_touched:
        with contextlib.suppress(OSError):
            (Path(directory) / TRACK_MASKS_DIR).rmdir()  # only when empty: a user's own files stay
    return count


__all__ = ["LOCK_NAME", "TRACK_OUTPUT_FILES", "lock_output_dir", "previous_track_outputs", "remove_files"]
