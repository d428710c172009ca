"""The one place a track pipeline is put together: source → preprocess → track → postprocess → sinks.

``vostream track`` (:mod:`vostream.apps.track`), batch annotation (its jobs call ``track``'s builder) and
every viewer session (:mod:`vostream.apps.serve.session`) call :func:`assemble_track`; they differ only in
the source, the sinks, the queue size and the policy they pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vostream.pipeline.engine import DEFAULT_MAX_QUEUE_BYTES, Pipeline
from vostream.pipeline.stage import SinkSpec, Source
from vostream.pipeline.types import Control, Frame
from vostream.stages.postprocess import PostprocessStage
from vostream.stages.preprocess import PreprocessStage
from vostream.stages.track import TrackStage
from vostream.stages.trackers import Tracker


def assemble_track(
    source: Source[Frame],
    tracker: Tracker,
    sinks: Sequence[SinkSpec[Frame]],
    *,
    prompts: Iterable[Control] = (),
    queue_size: int = 8,
    policy: str | None = None,
    name: str = "track",
    fill_holes: bool = False,
    min_area: int = 0,
    max_queue_bytes: int | None = DEFAULT_MAX_QUEUE_BYTES,
) -> Pipeline:
    """The pipeline tracking ``source`` with ``tracker`` (one new :class:`TrackerSession`) into ``sinks``.

    ``prompts`` are applied at the frames they name; more can be sent while running with
    :meth:`Pipeline.send_control`.  ``policy`` is the queues' backpressure policy (``None``: ``block`` for files,
    ``latest`` for a live source).  Nothing starts until :meth:`Pipeline.start`/``run``."""
    stages = [
        PreprocessStage(tracker.input_spec),  # its ring follows the edge it feeds (bind_output)
        TrackStage(tracker, prompts),
        PostprocessStage(fill_holes=fill_holes, min_area=min_area),
    ]
    return Pipeline(
        source,
        stages,
        list(sinks),
        policy=policy,
        queue_size=queue_size,
        name=name,
        max_queue_bytes=max_queue_bytes,
    )


__all__ = ["assemble_track"]
