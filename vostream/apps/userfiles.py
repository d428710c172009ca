"""Files the user names that are read whole (prompts, config and list files): bounded, regular files only.

Its own module so that the readers of those files (:mod:`vostream.apps.config`, :mod:`vostream.apps.prompts`,
:mod:`vostream.apps.live_prompts`, the annotate inputs) share it without importing one another.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from vostream.pipeline.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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


#: The deepest nesting of arrays and tables accepted in a user's JSON or TOML file (a prompts file needs 4).
MAX_NESTING = 32


def check_nesting(data: object, where: str, error: type[ConfigError] = ConfigError) -> object:
    """``data`` (parsed JSON or TOML) if it nests at most :data:`MAX_NESTING` deep, else ``error``.  Iterative, so
    that a hostile file cannot exhaust the interpreter's stack in whoever walks it next."""
    stack: list[tuple[object, int]] = [(data, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_NESTING:
                    raise error(f"{where}: nested more than {MAX_NESTING} levels deep")
                stack.append((child, depth + 1))
    return data


def loads_json(text: str | bytes, where: str, error: type[ConfigError] = ConfigError) -> object:
    """JSON text parsed, or ``error`` naming ``where`` and the place of a syntax error; nesting bounded."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except RecursionError:  # deeper than the parser's stack
        raise error(f"{where}: nested more than {MAX_NESTING} levels deep") from None
    return check_nesting(data, where, error)


def loads_toml(text: str, where: str, error: type[ConfigError] = ConfigError) -> dict[str, object]:
    """TOML text parsed, or ``error`` naming ``where``; nesting bounded."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{where}: invalid TOML: {exc}") from None
    except RecursionError:
        raise error(f"{where}: nested more than {MAX_NESTING} levels deep") from None
    check_nesting(data, where, error)
    return data


__all__ = [
    "MAX_NESTING",
    "check_nesting",
    "loads_json",
    "loads_toml",
    "MAX_USER_FILE_BYTES",
    "read_user_file",
]
