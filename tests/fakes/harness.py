"""The fault suite's harness: run the real ``vostream`` command line under ``timeout -k`` (the first SIGTERM means
"finish what is queued", so a hang is killed ``kill_after`` seconds later instead of stalling the suite), send
signals at chosen moments, and give a run a small, really full disk (a tmpfs of a few hundred KiB)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "vostream.apps.cli"]


def cli_command(args: Sequence[str], timeout: float = 60.0, kill_after: float = 5.0) -> list[str]:
    """``timeout -k KILL_AFTER TIMEOUT python -m vostream.apps.cli ARGS``."""
    return ["timeout", "-k", f"{kill_after:g}", f"{timeout:g}", *CLI, *map(str, args)]


def run_cli(
    args: Sequence[str], timeout: float = 60.0, kill_after: float = 5.0, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (bounded); exit 124/137 means it had to be stopped by ``timeout``."""
    return subprocess.run(
        cli_command(args, timeout, kill_after),
        capture_output=True,
        text=True,
        timeout=timeout + kill_after + 30,
        **kwargs,
    )  # type: ignore[call-overload]


def start_cli(
    args: Sequence[str], timeout: float = 60.0, kill_after: float = 5.0, **kwargs: object
) -> subprocess.Popen[str]:
    """Start the CLI (bounded by ``timeout -k``); signal the *python* child with :func:`signal_child`."""
    return subprocess.Popen(
        cli_command(args, timeout, kill_after),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )  # type: ignore[call-overload]


def signal_child(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the vostream process under ``timeout`` (not to ``timeout`` itself)."""
    for _ in range(100):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        pids = children.read_text().split() if children.exists() else []
        if pids:
            os.kill(int(pids[0]), sig)
            return
        time.sleep(0.05)
    raise AssertionError("the vostream process under timeout did not start")


def wait_for(predicate, timeout: float = 30.0, poll: float = 0.05) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(poll)
    return False


@contextlib.contextmanager
def small_disk(size_kib: int = 256) -> Iterator[Path]:
    """A directory on a tmpfs of ``size_kib`` KiB: writes past that fail with ENOSPC, as on a full disk."""
    root = Path(tempfile.mkdtemp(prefix="vostream-fulldisk-"))
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        root.rmdir()
        pytest.skip(f"needs root to mount a small tmpfs ({r.stderr.strip()})")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        with contextlib.suppress(OSError):
            root.rmdir()


def leftovers(
    directory: Path, patterns: Sequence[str] = ("*.tmp", ".*.tmp", "*.tmp.*", ".vostream-*")
) -> list[str]:
    """Temporary files or staging directories left anywhere under ``directory``."""
    found: set[str] = set()
    for pattern in patterns:
        found.update(str(p.relative_to(directory)) for p in directory.rglob(pattern))
    return sorted(found)
