"""Prompts for live feeds: a prompts file whose entries fire on a wall-clock trigger (``after_s`` seconds after the
first frame, or at an epoch time ``at``) as well as on a frame index, and the :class:`PromptTimer` that sends them
into a running pipeline (``docs/live.md``)."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vostream.apps.prompts import prompts_from_dicts
from vostream.apps.userfiles import loads_json, read_user_file
from vostream.pipeline.errors import PromptError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimedPrompt:
    """A prompt (or removal) to send when a wall-clock trigger fires: ``after_s`` seconds after the first frame,
    or at epoch time ``at`` (``time.time()`` seconds)."""

    message: Any
    after_s: float | None = None
    at: float | None = None


def load_live_prompts(path: str | os.PathLike[str]) -> tuple[list[Any], list[TimedPrompt]]:
    """A prompts file (``docs/prompts.md``) whose entries may also carry a wall-clock trigger, ``"after_s": S``
    (seconds after the first frame) or ``"at": EPOCH_SECONDS``, instead of ``"frame"``.

    Returns ``(frame_prompts, timed_prompts)``.  Raises :class:`PromptError` (naming the file and entry)."""
    p = os.fspath(path)
    raw = read_user_file(
        p, "prompts file", PromptError
    )  # a bounded, regular file (not /dev/zero, not a FIFO)
    data = loads_json(raw, f"prompts file {p!r}", PromptError)
    entries = data.get("prompts") if isinstance(data, dict) else data
    if not isinstance(entries, list):
        raise PromptError(f'prompts file {p!r}: expected {{"prompts": [...]}}')
    base = os.path.dirname(os.path.abspath(p))
    plain: list[dict[str, Any]] = []
    timed: list[TimedPrompt] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not ({"after_s", "at"} & set(entry)):
            plain.append(entry)
            continue
        entry = dict(entry)
        after, at = entry.pop("after_s", None), entry.pop("at", None)
        where = f"prompts file {p!r}, entry {i}"
        if (after is None) == (at is None) or "frame" in entry:
            raise PromptError(f"{where}: give one trigger: 'frame', 'after_s' or 'at'")
        value = after if after is not None else at
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < math.inf):
            raise PromptError(f"{where}: the trigger must be a number of seconds >= 0, got {value!r}")
        for message in prompts_from_dicts([entry], where, Path(base)):
            timed.append(
                TimedPrompt(
                    message,
                    float(after) if after is not None else None,
                    float(at) if at is not None else None,
                )
            )
    return prompts_from_dicts(plain, f"prompts file {p!r}", Path(base)) if plain else [], timed


class PromptTimer:
    """Sends :class:`TimedPrompt` messages into a running pipeline when their trigger fires.

    ``after_s`` counts from the source's first frame (``source.first_frame_time``, its capture time), so the time
    spent connecting or loading the tracker does not eat into it; nothing is sent before the first frame.  ``at``
    is an epoch time (``clock()``); one already past fires with the first frame.  Prompts due at the same time are
    sent in trigger order (stable for equal times).  Each message's frame index is set to the next frame the source
    will deliver (``source.last_index + 1``), so the track stage applies it to the first frame after the trigger
    (a dropped frame: the next tracked one, counted as a late prompt).

    :meth:`poll` does the work for one instant and may be driven by hand with a manual clock (tests); :meth:`start`
    runs it on one daemon thread until every prompt is sent or :meth:`close` (idempotent; stops and joins the
    thread).  ``send`` is called from that thread; an exception from it is logged and the prompt counted in
    ``failed``.
    """

    def __init__(
        self,
        send: Callable[[Any], Any],
        source: Any,
        prompts: list[TimedPrompt],
        *,
        clock: Callable[[], float] = time.time,
        poll_s: float = 0.02,
    ) -> None:
        self.send = send
        self.source = source
        self.clock = clock
        self.poll_s = poll_s
        self.pending = list(prompts)
        self.sent = 0
        self.failed = 0
        self.started: float | None = None  # the first frame's time, once seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vostream-prompt-timer", daemon=True)

    def start(self) -> PromptTimer:
        self._thread.start()
        return self

    def due(self, item: TimedPrompt) -> float | None:
        """When ``item`` fires (``clock()`` seconds), or ``None`` while ``after_s`` waits for the first frame."""
        if item.at is not None:
            return item.at
        return None if self.started is None else self.started + (item.after_s or 0.0)

    def poll(self, now: float | None = None) -> float | None:
        """Send every prompt due at ``now`` (default ``clock()``); the next due time, ``None`` when none is left.
        Before the source's first frame nothing is due (the next due time is then ``now``: poll again soon)."""
        now = self.clock() if now is None else now
        if self.started is None:
            if getattr(self.source, "last_index", -1) < 0:
                return now if self.pending else None
            first = getattr(self.source, "first_frame_time", None)
            self.started = float(first) if first is not None else now
        timed = [(self.due(t), k, t) for k, t in enumerate(self.pending)]
        ready = sorted((d, k) for d, k, _ in timed if d is not None and d <= now)
        for _, k in ready:
            self._fire(self.pending[k])
        done = {k for _, k in ready}
        self.pending = [t for k, t in enumerate(self.pending) if k not in done]
        nxt = [self.due(t) for t in self.pending]
        return min((d for d in nxt if d is not None), default=None)

    def _fire(self, item: TimedPrompt) -> None:
        msg = item.message
        index = max(0, int(getattr(self.source, "last_index", -1)) + 1)
        try:
            msg = dataclasses.replace(msg, frame_index=index)
        except (TypeError, ValueError):  # not a dataclass with a frame index: keep it as it is
            logger.debug("could not re-index %r", msg)
        try:
            self.send(msg)
        except Exception:  # noqa: BLE001 - a failed send (pipeline gone) must not kill the timer thread
            self.failed += 1
            logger.exception("could not send a timed prompt (%s)", type(msg).__name__)
            return
        self.sent += 1
        logger.info("sent a timed prompt (%s) for frame %d", type(msg).__name__, index)

    def _run(self) -> None:
        while self.pending and not self._stop.is_set():
            nxt = self.poll()
            if nxt is None and not self.pending:
                break
            wait = self.poll_s if nxt is None or self.started is None else nxt - self.clock()
            self._stop.wait(min(0.5, max(0.005, wait)))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


__all__ = ["PromptTimer", "TimedPrompt", "load_live_prompts"]
