"""Reconnect policy and supervision shared by everything that holds a live connection: the live source
(``vostream.stages.sources.live``) and the RTSP output (``vostream.sinks.rtsp``).

A :class:`SourceSupervisor` is a small state machine with no I/O of its own: its owner reports ``connecting``,
``connected``, ``lost`` and ``end``; it answers how long to wait before the next attempt (:class:`ReconnectPolicy`:
exponential backoff with jitter, unlimited attempts by default), keeps the last events and calls listeners.
States: ``connecting`` → ``running`` → (``stalled`` →) ``reconnecting`` → ``running`` … → ``ended``.
Thread-safe: the owner's thread reports, any thread may read ``snapshot()``/``events``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from vostream.pipeline.errors import ConfigError

logger = logging.getLogger(__name__)

# -- states and events -----------------------------------------------------------------------------------------

CONNECTING = "connecting"
RUNNING = "running"
STALLED = "stalled"
RECONNECTING = "reconnecting"
ENDED = "ended"
STATES = (CONNECTING, RUNNING, STALLED, RECONNECTING, ENDED)

#: state → states it may move to (``ended`` is final)
TRANSITIONS: dict[str, tuple[str, ...]] = {
    CONNECTING: (RUNNING, RECONNECTING, ENDED),
    RUNNING: (STALLED, RECONNECTING, ENDED),
    STALLED: (RECONNECTING, ENDED),
    RECONNECTING: (CONNECTING, ENDED),
    ENDED: (),
}


@dataclass(frozen=True)
class StateEvent:
    """One state change of a live source: ``state`` entered at wall-clock ``time`` (``time.time()``).

    ``attempt`` is the connection attempt number (1 = the first connection); ``reason`` says why (``"end of
    stream"``, ``"no packets for 2.0 s"``, an error text, ``"stopped"``); ``delay_s`` the backoff before the next
    attempt when entering ``reconnecting``."""

    state: str
    time: float
    attempt: int = 0
    reason: str = ""
    delay_s: float = 0.0


@dataclass(frozen=True)
class ReconnectPolicy:
    """Exponential backoff with jitter between reconnect attempts.

    Attempt ``k`` (1 = the first retry after a loss) waits ``base = min(max_s, initial_s * factor**(k-1))`` scaled
    by a random factor in ``[1 - jitter, 1 + jitter]``, never more than ``max_s``: ``max_s`` is a hard cap, so a
    server that comes back is retried within ``max_s`` (live sources: 1 s by default, :data:`LIVE_RECONNECT`).  ``max_attempts``: failed attempts in a row before giving up
    (``None``: never give up).  Raises :class:`ConfigError` for values out of range.
    """

    initial_s: float = 0.5
    max_s: float = 10.0
    factor: float = 2.0
    jitter: float = 0.25
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not (self.initial_s >= 0 and math.isfinite(self.initial_s)):
            raise ConfigError(f"reconnect: initial delay must be >= 0 s, got {self.initial_s}")
        if not self.max_s >= self.initial_s:
            raise ConfigError(
                f"reconnect: max delay {self.max_s} s must be >= the initial delay {self.initial_s} s"
            )
        if not self.factor >= 1.0:
            raise ConfigError(f"reconnect: backoff factor must be >= 1, got {self.factor}")
        if not 0.0 <= self.jitter < 1.0:
            raise ConfigError(f"reconnect: jitter must be within [0, 1), got {self.jitter}")
        if self.max_attempts is not None and (isinstance(self.max_attempts, bool) or self.max_attempts < 1):
            raise ConfigError(
                f"reconnect: max attempts must be >= 1 or None (unlimited), got {self.max_attempts}"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt - 1))
        if self.jitter:
            lo, hi = base * (1.0 - self.jitter), min(self.max_s, base * (1.0 + self.jitter))
            base = (rng or random).uniform(lo, hi)
        return max(0.0, base)


#: The default backoff of live sources: 0.5 s, 1 s, then every 1 s (× jitter down to 0.75 s): a camera or server
#: that returns after an outage of any length is picked up within about a second plus the connect time.
LIVE_RECONNECT = ReconnectPolicy(initial_s=0.5, max_s=1.0)


class SourceSupervisor:
    """The state machine of one live source: states, events, counters, backoff.  No I/O, no threads.

    The source calls :meth:`connecting`, :meth:`connected`, :meth:`lost` and :meth:`end`; the supervisor checks
    every transition against :data:`TRANSITIONS` (a wrong one is a bug: ``RuntimeError``), records a
    :class:`StateEvent` (the last ``keep_events``), calls ``on_event`` listeners, and tells the source how long to
    wait before the next attempt or that it must give up.  Thread-safe: any thread may read :meth:`snapshot`,
    :attr:`events` and :attr:`state`.
    """

    def __init__(
        self,
        policy: ReconnectPolicy = ReconnectPolicy(),
        *,
        name: str = "live",
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        keep_events: int = 256,
    ) -> None:
        self.policy = policy
        self.name = name
        self.clock = clock
        self.rng = rng or random.Random()
        self._lock = threading.Lock()
        self._events: deque[StateEvent] = deque(maxlen=keep_events)
        self._listeners: list[Callable[[StateEvent], None]] = []
        self.state = ""  # before the first connect
        self.attempt = 0  # connection attempts so far
        self.failed_in_row = 0
        self.reconnects = 0  # successful connections after the first
        self.disconnects = 0
        self.stalls = 0
        self.connected_once = False
        self.last_loss: float | None = None  # wall clock of the last loss
        self.last_reconnect_s: float | None = None  # loss → running again

    def add_listener(self, callback: Callable[[StateEvent], None]) -> None:
        """``callback(event)`` on every state change, from the source's thread; exceptions are logged."""
        with self._lock:
            self._listeners.append(callback)

    @property
    def events(self) -> list[StateEvent]:
        with self._lock:
            return list(self._events)

    def _enter(self, state: str, reason: str = "", delay_s: float = 0.0) -> StateEvent:
        with self._lock:
            if self.state and state not in TRANSITIONS[self.state]:
                raise RuntimeError(f"live source {self.name}: bad transition {self.state} -> {state}")
            self.state = state
            event = StateEvent(state, self.clock(), self.attempt, reason, delay_s)
            self._events.append(event)
            listeners = list(self._listeners)
        level = logging.WARNING if state in (STALLED, RECONNECTING) else logging.INFO
        logger.log(level, "%s: %s%s", self.name, state, f" ({reason})" if reason else "")
        for callback in listeners:
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a listener must not break the source
                logger.exception("%s: state listener failed", self.name)
        return event

    def connecting(self) -> None:
        """A connection attempt starts."""
        self.attempt += 1
        self._enter(CONNECTING, f"attempt {self.attempt}")

    def connected(self) -> None:
        """The attempt succeeded: frames flow."""
        now = self.clock()
        if self.connected_once:
            self.reconnects += 1
            if self.last_loss is not None:
                self.last_reconnect_s = now - self.last_loss
        self.connected_once = True
        self.failed_in_row = 0
        self._enter(RUNNING)

    def lost(self, reason: str, *, stalled: bool = False, failed_attempt: bool = False) -> float | None:
        """The feed went away (``stalled``: no packets within the read timeout) or an attempt failed.

        Returns the backoff delay before the next attempt, or ``None`` when the policy says give up (the state is
        then ``ended``)."""
        if stalled:
            self.stalls += 1
            self._enter(STALLED, reason)
        if failed_attempt:
            self.failed_in_row += 1
        else:
            self.disconnects += 1
            self.last_loss = self.clock()
        limit = self.policy.max_attempts
        if limit is not None and self.failed_in_row >= limit:
            self._enter(ENDED, f"gave up after {self.failed_in_row} failed attempt(s): {reason}")
            return None
        delay = self.policy.delay(self.failed_in_row + 1, self.rng)
        self._enter(RECONNECTING, reason, delay)
        return delay

    def end(self, reason: str) -> None:
        """Final state (stopped, closed, gave up).  Idempotent."""
        if self.state != ENDED:
            self._enter(ENDED, reason)

    def snapshot(self) -> dict[str, object]:
        """Counters for ``stats()``: state, attempts, reconnects, disconnects, stalls, last reconnect time."""
        with self._lock:
            return {
                "state": self.state,
                "attempts": self.attempt,
                "reconnects": self.reconnects,
                "disconnects": self.disconnects,
                "stalls": self.stalls,
                "last_reconnect_s": None
                if self.last_reconnect_s is None
                else round(self.last_reconnect_s, 3),
            }


__all__ = [
    "CONNECTING",
    "RUNNING",
    "STALLED",
    "RECONNECTING",
    "ENDED",
    "STATES",
    "TRANSITIONS",
    "StateEvent",
    "LIVE_RECONNECT",
    "ReconnectPolicy",
    "SourceSupervisor",
]
