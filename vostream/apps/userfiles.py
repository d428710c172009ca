"""Files the user names that are read whole (prompts, config and list files): bounded, regular files only.

Its own module so that the readers of those files (:mod:`vostream.apps.config`, :mod:`vostream.apps.prompts`,
:mod:`vostream.apps.live_prompts`, the annotate inputs) share it without importing one another.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from vostream.pipeline.errors import ConfigError

#: the largest prompts, config or list file read (they are read whole; real ones are a few KiB)
MAX_USER_FILE_BYTES = 16 * 1024 * 1024


def read_user_file(
    path: str | Path, what: str, error: type[ConfigError] = ConfigError, limit: int = MAX_USER_FILE_BYTES
) -> bytes:
    """The bytes of a user-given file that is read whole (prompts, config, list files): a regular file of at most
    ``limit`` bytes, else ``error`` (exit 2) naming it.  A device (``/dev/zero``: unbounded) or a FIFO (blocks until
    a writer comes) is refused without reading it: the file is opened non-blocking and checked with ``fstat``."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error(f"{where}: no such file") from None
    except OSError as exc:
        raise error(f"{where}: cannot be read ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next(
                (name for test, name in _FILE_KINDS if test(st.st_mode)),
                "special file",
            )
            raise error(f"{where}: not a regular file (a {kind}); give a file of at most {limit >> 20} MiB")
        too_big = f"{where}: larger than the {limit >> 20} MiB limit; is it the right file?"
        if st.st_size > limit:
            raise error(too_big)
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise error(f"{where}: cannot be read ({exc.strerror or exc})") from exc
    if len(data) > limit:  # it grew while we read
        raise error(too_big)
    return data


_FILE_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
)


__all__ = ["MAX_USER_FILE_BYTES", "read_user_file"]
