"""vostream: click an object on the first frame, follow it through a video, a camera or an RTSP feed with masks.

``import vostream`` is the one import a user needs::

    import vostream

    # the `vostream track` job: overlay.mp4, masks/, annotations.json, mot.txt and summary.json under out/
    report = vostream.track("clip.mp4", point=(420, 240), out="out/run")

    # or the results in your own loop (files and live feeds alike)
    with vostream.open("clip.mp4", point=(420, 240)) as stream:
        for frame in stream:
            mask = frame.result.masks[0]          # bool (H, W) at the source's size; frame.result.present[0]

The names below are loaded on first use (PEP 562), so that importing a part of the package -- the engine
``vostream.pipeline`` above all -- does not pull in OpenCV, PyAV or the trackers.  Where each module lives:
``vostream/`` holds this facade (``facade.py``) and the applications (``apps/``); every other code folder of the
repository is ``vostream.<folder>`` (``docs/architecture.md``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from vostream.pipeline.version import package_version

if TYPE_CHECKING:  # what the lazy names are, for type checkers and editors
    from vostream.facade import Stream, build_pipeline, open, prompts_from, track
    from vostream.pipeline.engine import Pipeline, RunReport
    from vostream.pipeline.errors import (
        BackendError,
        ConfigError,
        OutputError,
        PromptError,
        SourceError,
        StageError,
        VostreamError,
    )
    from vostream.pipeline.stage import Sink, SinkSpec
    from vostream.pipeline.types import Frame, Prompt, RemoveObject, ResetTracker, TrackResult
    from vostream.stages.sources import probe
    from vostream.stages.trackers import load_tracker

__version__ = package_version()

#: public name -> the module that defines it
_LAZY: dict[str, str] = {
    **dict.fromkeys(("Stream", "build_pipeline", "open", "prompts_from", "track"), "vostream.facade"),
    **dict.fromkeys(("Sink", "SinkSpec"), "vostream.pipeline.stage"),
    "probe": "vostream.stages.sources",
    **dict.fromkeys(("Pipeline", "RunReport"), "vostream.pipeline.engine"),
    **dict.fromkeys(
        (
            "BackendError",
            "ConfigError",
            "OutputError",
            "PromptError",
            "SourceError",
            "StageError",
            "VostreamError",
        ),
        "vostream.pipeline.errors",
    ),
    **dict.fromkeys(
        ("Frame", "Prompt", "RemoveObject", "ResetTracker", "TrackResult"), "vostream.pipeline.types"
    ),
    "load_tracker": "vostream.stages.trackers",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'vostream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "BackendError",
    "ConfigError",
    "Frame",
    "OutputError",
    "Pipeline",
    "Prompt",
    "PromptError",
    "RemoveObject",
    "ResetTracker",
    "RunReport",
    "SourceError",
    "Sink",
    "SinkSpec",
    "StageError",
    "Stream",
    "TrackResult",
    "VostreamError",
    "__version__",
    "build_pipeline",
    "load_tracker",
    "open",
    "probe",
    "prompts_from",
    "track",
]
