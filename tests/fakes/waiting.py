"""Polling helper shared by test modules that wait for a background thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 20.0) -> bool:
    """True as soon as ``predicate()`` is truthy (polled every 10 ms), False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False
