"""Atomic file output: write to ``NAME.<random>.tmp`` in the target directory, ``os.replace`` when complete.

A reader therefore sees either no file / the previous file, or the complete new one, never a half-written file
under the final name.  Only a hard kill (SIGKILL, power loss) can leave a ``*.tmp`` behind.

Not thread-safe: one :class:`AtomicFile` belongs to one sink thread.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from pathlib import Path
from typing import IO, Any

from vostream.pipeline.errors import OutputError

logger = logging.getLogger(__name__)

TMP_SUFFIX = ".tmp"
_TMP_NAME = re.compile(r".+\.[0-9a-f]{8}\.tmp")  # temp_path_for: NAME.<8 hex>.tmp


def ensure_dir(directory: str | os.PathLike[str], what: str = "output") -> Path:
    """Create ``directory`` (with parents) and prove it writable by creating and removing a file in it.

    Raises :class:`OutputError` naming the directory.  (``os.access`` is not used: it lies for root and on
    some network filesystems.)
    """
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(
            f"cannot create the {what} directory {str(path)!r}: {err.strerror or err}; "
            f"choose a writable location"
        ) from err
    probe = path / f".vostream-write-test.{secrets.token_hex(4)}{TMP_SUFFIX}"
    try:
        with open(probe, "wb"):
            pass
        probe.unlink()
    except OSError as err:
        raise OutputError(
            f"the {what} directory {str(path)!r} is not writable: {err.strerror or err}; "
            f"choose a writable location"
        ) from err
    return path


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """A fresh temporary path next to ``path``: ``NAME.<random>.tmp``."""
    path = Path(path)
    return path.with_name(f"{path.name}.{secrets.token_hex(4)}{TMP_SUFFIX}")


def commit(tmp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Move the finished ``tmp`` onto ``path`` atomically (same directory).  Raises :class:`OutputError`."""
    try:
        os.replace(tmp, path)
    except OSError as err:
        discard(tmp)
        raise OutputError(f"cannot write {str(path)!r}: {err.strerror or err}") from err


def discard(tmp: str | os.PathLike[str]) -> None:
    """Remove a temporary file if it exists; never raises."""
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    except OSError as err:  # pragma: no cover - a vanished directory
        logger.warning("could not remove temporary file %s: %s", tmp, err)


def _close_quietly(file: IO[Any]) -> None:
    """Close ``file`` after a failure: a flush that fails again (a full disk) must not hide the first error.
    (CPython closes the descriptor even when the final flush fails.)"""
    try:
        file.close()
    except OSError:
        pass


def remove_temp_files(directory: str | os.PathLike[str]) -> int:
    """Remove the ``NAME.<random>.tmp`` files left under ``directory`` (recursively) by a writer that was killed
    (e.g. a batch worker terminated on a second Ctrl-C).  Only names made by :func:`temp_path_for`.  Returns how
    many were removed; never raises."""
    count = 0
    try:
        candidates = list(Path(directory).rglob(f"*{TMP_SUFFIX}"))
    except OSError:
        return 0
    for p in candidates:
        if _TMP_NAME.fullmatch(p.name) and p.is_file():
            discard(p)
            count += 1
    return count


class AtomicFile:
    """A file object that appears at ``path`` only on :meth:`commit`.

    ``with AtomicFile(p, "w") as f: ...`` commits when the block succeeds and discards on an exception.  Outside
    ``with``: :meth:`commit` or :meth:`discard` (both idempotent; the first one wins).
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "wb", encoding: str | None = None) -> None:
        if "r" in mode or not any(c in mode for c in "wax"):
            raise ValueError(f"AtomicFile is for writing, got mode {mode!r}")
        self.path = Path(path)
        self.tmp = temp_path_for(self.path)
        if "b" not in mode and encoding is None:
            encoding = "utf-8"
        try:
            self.file: IO[Any] = open(self.tmp, mode.replace("a", "w").replace("x", "w"), encoding=encoding)
        except OSError as err:
            raise OutputError(
                f"cannot write {str(self.path)!r}: {err.strerror or err}; "
                f"check the directory exists and is writable"
            ) from err
        self._done = False
        self._failed: OSError | None = None

    def write(self, data: Any) -> int:
        """Write ``data``.  An error raises :class:`OutputError` naming ``path``, and the file can then only be
        discarded: :meth:`commit` removes the temporary file and raises (part of the data may be missing)."""
        try:
            return self.file.write(data)
        except OSError as err:
            self._failed = err
            raise OutputError(f"cannot write {str(self.path)!r}: {err.strerror or err}") from err

    def commit(self, fsync: bool = False) -> None:
        """Flush, close and move into place.  On any failure the temporary file is removed and the error is an
        :class:`OutputError` naming ``path`` (a full disk often fails only here, when the buffer is flushed)."""
        if self._done:
            return
        self._done = True
        try:
            if self._failed is not None:
                raise self._failed
            self.file.flush()
            if fsync:
                os.fsync(self.file.fileno())
            self.file.close()
        except BaseException as err:
            _close_quietly(self.file)
            discard(self.tmp)
            if isinstance(err, OSError):
                raise OutputError(f"cannot write {str(self.path)!r}: {err.strerror or err}") from err
            raise
        commit(self.tmp, self.path)

    def discard(self) -> None:
        """Close and delete the temporary file; ``path`` is left untouched.  Never raises ``OSError``."""
        if self._done:
            return
        self._done = True
        try:
            _close_quietly(self.file)
        finally:
            discard(self.tmp)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.discard()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with AtomicFile(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    with AtomicFile(path, "w") as f:
        f.write(text)


__all__ = [
    "AtomicFile",
    "TMP_SUFFIX",
    "atomic_write_bytes",
    "atomic_write_text",
    "commit",
    "discard",
    "ensure_dir",
    "remove_temp_files",
    "temp_path_for",
]
