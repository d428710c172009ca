"""Progress of a batch: an overall tqdm bar (frames, videos, ETA) and one bar per worker slot on a TTY; a plain
INFO log line every ``interval`` seconds otherwise; nothing with ``quiet``.

Driven from one thread (the batch's dispatch loop); not thread-safe.  Terminal errors (the terminal went away:
SIGHUP, EIO) switch the bars off instead of failing the batch.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tqdm has no type information (pyproject: ignore_missing_imports)
    from tqdm import tqdm

logger = logging.getLogger(__name__)


def _fmt_eta(seconds: float) -> str:
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class _SlotState:
    key: str | None = None
    frames: int = 0
    expected: int | None = None
    bar: tqdm | None = None


@dataclass
class BatchProgress:
    """``videos``/``frames``: totals of the videos to run (``frames`` may be 0 when unknown)."""

    videos: int
    frames: int
    slots: int
    quiet: bool = False
    interval: float = 10.0
    tty: bool | None = None
    done_videos: int = 0
    failed_videos: int = 0
    done_frames: int = 0
    _slots: dict[int, _SlotState] = field(default_factory=dict)
    _bar: tqdm | None = None
    _start: float = field(default_factory=time.monotonic)
    _last_log: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        tty = sys.stderr.isatty() if self.tty is None else self.tty
        if not self.quiet and tty:
            try:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=self.frames or None,
                    unit="frame",
                    desc="annotate",
                    dynamic_ncols=True,
                    position=0,
                    leave=True,
                )
                for i in range(self.slots):
                    self._slots[i] = _SlotState(
                        bar=tqdm(
                            total=None,
                            unit="frame",
                            desc=f"  worker {i}",
                            dynamic_ncols=True,
                            position=i + 1,
                            leave=False,
                        )
                    )
            except OSError:
                self._bar = None
        self._postfix()

    # -- events ------------------------------------------------------------------------------------------------
    def start_video(self, slot: int, key: str, expected: int | None) -> None:
        st = self._slots.setdefault(slot, _SlotState())
        st.key, st.frames, st.expected = key, 0, expected
        self._guard(
            lambda: (
                st.bar is not None
                and (st.bar.reset(total=expected), st.bar.set_description(f"  worker {slot}: {key}"))
            )
        )
        self.update()

    def video_frames(self, slot: int, frames: int) -> None:
        st = self._slots.setdefault(slot, _SlotState())
        st.frames = frames
        self._guard(lambda: st.bar is not None and st.bar.update(frames - st.bar.n))
        self.update()

    def end_video(
        self,
        slot: int,
        key: str,
        status: str,
        frames: int,
        expected: int | None,
        final: bool,
        detail: str = "",
    ) -> None:
        """A video attempt ended; ``final`` when no retry follows."""
        st = self._slots.setdefault(slot, _SlotState())
        st.key, st.frames = None, 0
        self._guard(
            lambda: (
                st.bar is not None and (st.bar.reset(total=None), st.bar.set_description(f"  worker {slot}"))
            )
        )
        if status == "done":
            self.done_videos += 1
            self.done_frames += frames
            if expected and self.frames:  # the real count replaces the estimate
                self.frames += frames - expected
            self._write(f"done {key}: {detail}")
        elif final:
            self.failed_videos += 1
            if expected and self.frames:
                self.frames -= expected
            self._write(f"FAILED {key}: {detail}", logging.WARNING)
        else:
            self._write(f"retrying {key}: {detail}", logging.WARNING)
        self._postfix()
        self.update()

    # -- display -----------------------------------------------------------------------------------------------
    @property
    def frames_now(self) -> int:
        return self.done_frames + sum(s.frames for s in self._slots.values() if s.key is not None)

    def _postfix(self) -> None:
        def apply() -> None:
            if self._bar is not None:
                self._bar.total = self.frames or None
                self._bar.set_postfix_str(
                    f"videos {self.done_videos}/{self.videos}"
                    + (f", {self.failed_videos} failed" if self.failed_videos else "")
                )

        self._guard(apply)

    def update(self) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            n = self.frames_now
            self._guard(lambda: self._bar is not None and self._bar.update(n - self._bar.n))
            return
        now = time.monotonic()
        if now - self._last_log >= self.interval:
            self._last_log = now
            logger.info("annotate: %s", self.line())

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        n = self.frames_now
        fps = n / elapsed
        eta = f", ETA {_fmt_eta((self.frames - n) / fps)}" if self.frames and fps > 0 and n else ""
        return (
            f"{self.done_videos}/{self.videos} videos, {n}/{self.frames or '?'} frames, {fps:.1f} fps{eta}, "
            f"{self.failed_videos} failed"
        )

    def _write(self, text: str, level: int = logging.INFO) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            from tqdm import tqdm

            self._guard(
                lambda: tqdm.write(("warning: " if level >= logging.WARNING else "") + text, file=sys.stderr)
            )
        else:
            logger.log(level, "%s", text)

    def _guard(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except OSError:  # the terminal went away: go quiet, keep working
            self._bar = None
            self.quiet = True
            for st in self._slots.values():
                st.bar = None

    def close(self) -> None:
        def shut() -> None:
            for st in self._slots.values():
                if st.bar is not None:
                    st.bar.close()
            if self._bar is not None:
                self._bar.update(self.frames_now - self._bar.n)
                self._bar.close()

        self._guard(shut)


__all__ = ["BatchProgress"]
