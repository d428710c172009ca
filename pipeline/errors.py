"""The one error hierarchy of vostream.

Every error raised on purpose by vostream derives from :class:`VostreamError`.  Each subclass also inherits the
builtin that matches its meaning, so callers who only know Python's builtins still catch the right thing
(``except ValueError`` catches a bad prompt, ``except OSError`` a missing file).

Messages name the input or the stage and, where one exists, the fix.  Causes are chained with ``raise ... from``.
The CLI prints :func:`describe` (the message and its notes) on one line and exits non-zero; it never dumps a
traceback for these.
"""

from __future__ import annotations


class VostreamError(Exception):
    """Root of every error vostream raises on purpose."""

    #: process exit code the CLI uses for this kind of error
    exit_code: int = 1


class ConfigError(VostreamError, ValueError):
    """A bad option, config file or argument combination."""

    exit_code = 2


class PromptError(ConfigError):
    """A bad prompt: a point outside the frame, a malformed prompts file, an unknown object id."""


class SourceError(VostreamError, OSError):
    """An input that cannot be opened or read: missing file, not a video, no frames, unreachable stream."""

    exit_code = 3


class OutputError(VostreamError, OSError):
    """An output that cannot be written: unwritable directory, full disk, a sink that failed to open."""

    exit_code = 4


class BackendError(VostreamError, RuntimeError):
    """A tracker backend that cannot be loaded or run (missing model files, missing runtime, device error)."""

    exit_code = 5


class StageError(VostreamError, RuntimeError):
    """A pipeline stage failed; ``stage`` names it and ``__cause__`` is the original exception."""

    exit_code = 6

    def __init__(self, stage: str, message: str, frame_index: int | None = None) -> None:
        where = f"stage '{stage}'" + (f" at frame {frame_index}" if frame_index is not None else "")
        super().__init__(f"{where} failed: {message}")
        self.stage = stage
        self.frame_index = frame_index


class Interrupted(KeyboardInterrupt):
    """The run was stopped by Ctrl-C or SIGTERM; outputs were finalised.

    A :class:`KeyboardInterrupt` (a ``BaseException``), deliberately *not* a :class:`VostreamError`: an
    ``except Exception`` or ``except VostreamError`` meant for failures must not swallow a user's Ctrl-C."""

    exit_code = 130


def describe(exc: BaseException) -> str:
    """``str(exc)`` on one line, followed by its notes (the engine adds one naming the stage an error came from)."""
    parts = [str(exc), *(str(n) for n in getattr(exc, "__notes__", ()) or ())]
    return " ".join(" ".join(p.split()) for p in parts if p)


__all__ = [
    "BackendError",
    "ConfigError",
    "Interrupted",
    "OutputError",
    "PromptError",
    "SourceError",
    "StageError",
    "VostreamError",
    "describe",
]
