"""Watch a model directory for a new export and ask for a reload when one has landed (``docs/deploy.md`` §2).

:class:`ModelWatcher` polls the directory's *signature*: the directory's own inode and, for every file in it, its
name, size, modification time and inode.  A change is acted on only once the signature has stayed the same over
one whole poll interval, and never while the directory is missing:

- ``vostream export --force`` writes the new export into a hidden sibling directory and renames it into place
  (the old one is removed just before): the watched path is either the old export, missing, or the complete new
  one; the watcher sees the rename and reloads once.
- A directory filled file by file (``cp``, ``rsync``) is acted on after it went quiet for an interval; a state
  that is still incomplete then fails the reload's check (missing or truncated graph) and is refused, and the
  next change of the directory is tried again.

So a half-written export is never installed: the reload itself loads and checks every graph before any stream
switches.  Thread-safety: one polling thread; :meth:`close` is idempotent and may be called from any thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

Signature = tuple[int, int, tuple[tuple[str, int, int, int], ...]]


def directory_signature(path: str | os.PathLike[str]) -> Signature | None:
    """What identifies the directory's current contents, or None when it does not exist (being replaced)."""
    try:
        top = os.stat(path)
        entries = []
        with os.scandir(path) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                st = entry.stat(follow_symlinks=True)
                entries.append((entry.name, st.st_size, st.st_mtime_ns, st.st_ino))
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.debug("cannot read model directory %s: %s", path, exc)
        return None
    return top.st_dev, top.st_ino, tuple(sorted(entries))


class ModelWatcher:
    """Calls ``on_change()`` (in the watcher's thread) when the directory ``path`` has changed and then stayed the
    same for ``interval`` seconds.  The contents when it is made count as loaded.  :meth:`poll` is one look (what
    the thread does every ``interval``; tests call it directly)."""

    def __init__(
        self, path: str | os.PathLike[str], on_change: Callable[[], object], interval: float = 1.0
    ) -> None:
        self.path = Path(path)
        self.on_change = on_change
        self.interval = interval
        self.changes = 0  # reloads asked for
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loaded = directory_signature(self.path)
        self._candidate: Signature | None = None

    def start(self) -> ModelWatcher:
        self._thread = threading.Thread(target=self._run, name="vostream-model-watch", daemon=True)
        self._thread.start()
        logger.info("watching %s for a new export (every %.1f s)", self.path, self.interval)
        return self

    def poll(self) -> bool:
        """Look at the directory once; True when this look asked for a reload (a change that held still since the
        previous look)."""
        sig = directory_signature(self.path)
        if sig is None or sig == self._loaded:
            self._candidate = None
            return False
        if sig != self._candidate:  # changed since the last look: wait until it holds still
            self._candidate = sig
            return False
        self._loaded, self._candidate = sig, None
        self.changes += 1
        logger.info("%s changed: reloading the model", self.path)
        try:
            self.on_change()
        except Exception as exc:  # noqa: BLE001 - the reload logs its own refusal; keep watching
            logger.debug("reload after a change of %s: %s", self.path, exc)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)


__all__ = ["ModelWatcher", "directory_signature"]
