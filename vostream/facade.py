"""The facade's implementation: :func:`track`, :func:`open`, :class:`Stream` and :func:`prompts_from`.  Import
them from ``vostream`` itself (``vostream/__init__.py`` loads this module on first use)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vostream.apps.assemble import assemble_track
from vostream.apps.config import DEFAULT_SAVE, TrackSettings
from vostream.apps.track import run_track
from vostream.pipeline.engine import Pipeline, RunReport
from vostream.pipeline.errors import (
    PromptError,
    VostreamError,
)
from vostream.pipeline.stage import BLOCK, Sink, SinkSpec
from vostream.pipeline.types import Control, Frame, Prompt
from vostream.stages.sources import open_source
from vostream.stages.trackers import Tracker, load_tracker


def prompts_from(
    point: tuple[float, float] | Sequence[tuple[float, float]] | None = None,
    box: tuple[float, float, float, float] | None = None,
    mask: np.ndarray | None = None,
    prompts: Iterable[Control] = (),
    obj_id: int = 1,
) -> list[Control]:
    """``prompts`` plus one first-frame prompt for object ``obj_id`` made of a click (or several positive clicks),
    a box ``(x0, y0, x1, y1)`` and/or a boolean mask, in source pixels.  Raises :class:`PromptError` when there is
    nothing to track."""
    out = list(prompts)
    if point is not None or box is not None or mask is not None:
        points: list[list[float]] = []
        if point is not None:
            pts = np.asarray(point, dtype=np.float64).reshape(-1, 2)  # one (x, y) or several
            points = [[float(x), float(y)] for x, y in pts]
        out.append(
            Prompt(
                obj_id=obj_id,
                frame_index=0,
                points=points,
                labels=[1] * len(points),
                box=None if box is None else [float(v) for v in box],
                mask=mask,
            )
        )
    if not out:
        raise PromptError(
            "nothing to track: give point=(x, y), box=(x0, y0, x1, y1), mask=... or prompts=[...]"
        )
    return out


def track(
    source: str | Path,
    *,
    point: Any = None,
    box: Any = None,
    mask: np.ndarray | None = None,
    prompts: Iterable[Control] = (),
    out: str | Path = "out/track",
    save: Sequence[str] = DEFAULT_SAVE,
    backend: str = "classic",
    quiet: bool = True,
    **tracker_options: Any,
) -> RunReport:
    """Run the ``vostream track`` job on ``source`` (a file, a frames directory, ``rtsp://...``, ``/dev/video0``)
    and write ``save`` (``video``, ``png``, ``json``, ``mot``) plus ``summary.json`` under ``out``.

    ``tracker_options`` go to the backend (``model=DIR`` for ``onnx``/``acl``).  Returns the run's
    :class:`RunReport`; raises a :class:`VostreamError` subclass naming the input or stage at fault."""
    settings = TrackSettings(
        source=str(source),
        out=str(out),
        save=tuple(save),
        backend=backend,
        prompts=prompts_from(point, box, mask, prompts),
        quiet=quiet,
        tracker=dict(tracker_options),
    )
    return run_track(settings)


class Stream:
    """A running track pipeline whose frames come back to the caller: iterate it for :class:`Frame` objects with
    ``frame.result`` set (masks at source size).  Made by :func:`open`.

    Backpressure: the results wait in a queue of ``queue_size`` frames; a caller that stops reading holds the
    pipeline (lossless) for files, while a live source drops its oldest frames instead.  :meth:`send` adds
    prompts while running; :meth:`close` (or leaving ``with``) stops the pipeline and releases the tracker.
    Iterate from one thread."""

    def __init__(self, pipeline: Pipeline, results: queue.Queue[Any], tracker: Tracker | None) -> None:
        self.pipeline = pipeline
        self._results = results
        self._tracker = tracker  # owned: released at close
        self._closed = False

    def __iter__(self) -> Iterator[Frame]:
        while True:
            item = self._results.get()
            if item is _END:
                self.pipeline.wait()  # raises the stage's error, if one stopped the pipeline
                return
            yield item

    def send(self, message: Control) -> None:
        """A prompt, :class:`RemoveObject` or :class:`ResetTracker` for the frame it names (or the next one)."""
        self.pipeline.send_control(message)

    def close(self) -> None:
        """Stop the pipeline (frames not yet read are dropped) and release the tracker.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.pipeline.cancel()
        while True:  # unblock the sink if it waits for room
            try:
                self._results.get_nowait()
            except queue.Empty:
                break
        try:
            self.pipeline.wait()
        except VostreamError:
            pass  # the caller stopped reading; an error after that is not theirs to handle
        finally:
            if self._tracker is not None:
                self._tracker.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_END = object()


class _QueueSink(Sink[Frame]):
    name = "results"

    def __init__(self, results: queue.Queue[Any], stop: threading.Event) -> None:
        self._results = results
        self._stop = stop

    def write(self, item: Frame) -> None:
        while not self._stop.is_set():
            try:
                self._results.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        self._stop.set()
        try:
            self._results.put_nowait(_END)
        except queue.Full:  # the reader is gone (closed) or will drain first: make room for the end marker
            try:
                self._results.get_nowait()
            except queue.Empty:
                pass
            self._results.put_nowait(_END)


class _QueueSinkSpec(SinkSpec[Frame]):
    name = "results"
    policy = BLOCK

    def __init__(self, results: queue.Queue[Any]) -> None:
        self.results = results
        self.stop = threading.Event()

    def build(self) -> Sink[Frame]:
        return _QueueSink(self.results, self.stop)


def build_pipeline(
    source: str | Path,
    tracker: Tracker,
    sinks: Sequence[SinkSpec[Any]],
    *,
    prompts: Iterable[Control] = (),
    queue_size: int = 8,
    name: str | None = None,
) -> Pipeline:
    """The track pipeline of ``source`` (source -> preprocess -> track -> postprocess) into your own ``sinks``, with
    ``tracker`` (yours to close).  Nothing runs until :meth:`Pipeline.start`; add prompts while it runs with
    :meth:`Pipeline.send_control`.  The same assembly as the command line's, so buffer rings and queue bounds
    agree."""
    return assemble_track(
        open_source(str(source)),
        tracker,
        sinks,
        prompts=prompts,
        queue_size=queue_size,
        name=name or Path(str(source)).name or "stream",
    )


def open(
    source: str | Path,
    *,
    point: Any = None,
    box: Any = None,
    mask: np.ndarray | None = None,  # noqa: A001
    prompts: Iterable[Control] = (),
    backend: str = "classic",
    tracker: Tracker | None = None,
    queue_size: int = 8,
    **tracker_options: Any,
) -> Stream:
    """Start tracking ``source`` and return a :class:`Stream` of its frames with results.

    ``tracker``: an already loaded tracker to share (it is not closed with the stream); otherwise ``backend`` is
    loaded with ``tracker_options``.  Prompts may be empty here and sent later with :meth:`Stream.send`."""
    items = list(prompts)
    if point is not None or box is not None or mask is not None:
        items = prompts_from(point, box, mask, items)
    owned = tracker is None
    loaded = load_tracker(backend, **tracker_options) if tracker is None else tracker
    try:
        src = open_source(str(source))
        results: queue.Queue[Any] = queue.Queue(maxsize=max(1, queue_size))
        pipe = assemble_track(
            src,
            loaded,
            [_QueueSinkSpec(results)],
            prompts=items,
            queue_size=queue_size,
            name=Path(str(source)).name or "stream",
        )
        pipe.start()
    except BaseException:
        if owned:
            loaded.close()
        raise
    return Stream(pipe, results, loaded if owned else None)


__all__ = ["Stream", "build_pipeline", "open", "prompts_from", "track"]
