"""A bounded queue with an explicit full-queue policy, whose waits never outlast a stop.

:class:`BoundedQueue` joins two pipeline threads.  It is bounded by an item count and, optionally, by bytes
(``max_bytes``, items sized by :func:`item_nbytes`): a queue of 4K frames holds fewer of them than a queue of 480p
frames, so memory per pipeline is bounded whatever the resolution.  A queue always admits one item, however large.  ``block``: :meth:`BoundedQueue.put` waits for room, in short
slices, and gives up when its ``abort`` callable says so or the consumer has gone (:meth:`close`).  ``latest``:
``put`` never waits; a full queue drops its oldest item (counted in :attr:`drops`).  :meth:`put_final` admits the
end-of-stream marker even to a full queue.  :meth:`wake` makes a waiting :meth:`get` return early (control messages).

Thread-safety: every method may be called from any thread; one condition variable guards the state.
"""

from __future__ import annotations

import logging
import operator
import threading
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar

from .errors import ConfigError
from .stage import BLOCK, LATEST, POLICIES

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long one slice of a blocking wait lasts (seconds): the latency of noticing a stop.
POLL_S = 0.05


class _Empty:
    """Returned by :meth:`BoundedQueue.get` when nothing arrived (timeout or :meth:`BoundedQueue.wake`)."""

    def __repr__(self) -> str:
        return "EMPTY"


EMPTY: Final = _Empty()


def item_nbytes(item: object) -> int:
    """The bytes an item holds, from its ``nbytes`` attribute (``Frame.nbytes``: image + tensor + masks); 0 for
    items without one (they are bounded by the item count only)."""
    n = getattr(item, "nbytes", None)
    if n is None or isinstance(n, bool):
        return 0
    try:
        size = operator.index(n)  # ints and NumPy integers; a bytes-like object's nbytes too
    except TypeError:
        return 0
    return size if size > 0 else 0


class BoundedQueue(Generic[T]):
    """A FIFO of at most ``capacity`` items and (when ``max_bytes`` is set) at most ``max_bytes`` bytes of items,
    except that an empty queue admits any one item; policy ``block`` or ``latest``; counts drops and its peak depth.
    """

    def __init__(
        self, capacity: int, policy: str = BLOCK, name: str = "queue", max_bytes: int | None = None
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"queue '{name}': capacity must be an integer >= 1, got {capacity!r}")
        if max_bytes is not None and (
            isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1
        ):
            raise ConfigError(f"queue '{name}': max_bytes must be an integer >= 1 or None, got {max_bytes!r}")
        if policy not in POLICIES:
            raise ConfigError(f"queue '{name}': unknown policy {policy!r}; use one of {', '.join(POLICIES)}")
        self.capacity = capacity
        self.policy = policy
        self.name = name
        self.max_bytes = max_bytes
        self._items: deque[T] = deque()
        self._sizes: deque[int] = deque()
        self.bytes = 0  # bytes of the queued items (as sized when they were put)
        self.peak_bytes = 0
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._wakeups = 0
        self.drops = 0
        self.discarded = 0
        self.max_depth = 0

    # -- producer side -------------------------------------------------------------------------------------------
    def put(self, item: T, abort: Callable[[], bool] | None = None, poll: float = POLL_S) -> bool:
        """Enqueue ``item``; return False if it was discarded instead (consumer gone, or ``abort()`` true).

        ``block``: waits for room in ``poll`` slices, checking ``abort`` between them.  ``latest``: never waits; a
        full queue drops its oldest item.
        """
        size = item_nbytes(item) if self.max_bytes is not None else 0
        with self._cond:
            while True:
                if self._closed:
                    self.discarded += 1
                    return False
                if self._has_room(size):
                    break
                if self.policy == LATEST:
                    while self._items and not self._has_room(size):
                        self._items.popleft()
                        self.bytes -= self._sizes.popleft()
                        self.drops += 1
                    break
                if abort is not None and abort():
                    self.discarded += 1
                    return False
                self._cond.wait(poll)
            self._append(item, size)
            return True

    def _has_room(self, size: int) -> bool:
        if len(self._items) >= self.capacity:
            return False
        return self.max_bytes is None or not self._items or self.bytes + size <= self.max_bytes

    def put_final(self, item: T) -> bool:
        """Enqueue the end-of-stream marker: never waits and never drops (may exceed capacity by one)."""
        with self._cond:
            if self._closed:
                return False
            self._append(item, 0)
            return True

    def _append(self, item: T, size: int) -> None:
        self._items.append(item)
        self._sizes.append(size)
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        n = min(len(self._items), self.capacity)  # the end marker may exceed capacity by one: not a depth
        self.max_depth = max(self.max_depth, n)
        self._cond.notify_all()

    # -- consumer side -------------------------------------------------------------------------------------------
    def get(self, timeout: float = POLL_S) -> T | _Empty:
        """The oldest item, or :data:`EMPTY` if none arrived within ``timeout`` or :meth:`wake` was called."""
        with self._cond:
            if not self._items and not self._wakeups:
                self._cond.wait(timeout)
            if self._wakeups:
                self._wakeups = 0
                if not self._items:
                    return EMPTY
            if not self._items:
                return EMPTY
            item = self._items.popleft()
            self.bytes -= self._sizes.popleft()
            self._cond.notify_all()  # room for a blocked producer
            return item

    def wake(self) -> None:
        """Make the consumer's pending (or next) :meth:`get` return :data:`EMPTY` if no item is queued."""
        with self._cond:
            self._wakeups += 1
            self._cond.notify_all()

    def clear(self) -> int:
        """Discard every queued item (cancel); return how many (also added to :attr:`discarded`)."""
        with self._cond:
            n = len(self._items)
            self._items.clear()
            self._sizes.clear()
            self.bytes = 0
            self.discarded += n
            self._cond.notify_all()
            return n

    def close(self) -> int:
        """The consumer has gone: discard queued items; later puts return False at once.  Idempotent."""
        with self._cond:
            self._closed = True
            n = len(self._items)
            self._items.clear()
            self._sizes.clear()
            self.bytes = 0
            self.discarded += n
            self._cond.notify_all()
            return n

    # -- introspection -------------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return (
            f"BoundedQueue({self.name!r}, {len(self._items)}/{self.capacity}, {self.policy}, "
            f"drops={self.drops})"
        )


__all__ = ["EMPTY", "POLL_S", "BoundedQueue", "item_nbytes"]
