"""The ``classic`` tracker: OpenCV + NumPy, no weights (see ``docs/classic-tracker.md``)."""

from __future__ import annotations

import logging

from vostream.pipeline.errors import ConfigError

from ..base import InputSpec, Tracker
from .motion import PRESETS
from .session import ClassicParams, ClassicSession

logger = logging.getLogger(__name__)


class ClassicTracker(Tracker):
    """Weight-free tracker backend.  ``work_size`` (w, h): the box frames are fit into before tracking.

    Thread-safe to share (it holds only settings); each session is driven by one thread.
    """

    name = "classic"

    def __init__(self, work_size: tuple[int, int] | str = (480, 270), flow_preset: str = "medium",
                 params: ClassicParams | None = None) -> None:
        if isinstance(work_size, str):
            try:
                ws = tuple(int(v) for v in work_size.lower().split("x"))
            except ValueError:
                ws = ()
            if len(ws) != 2:
                raise ConfigError(f"classic tracker: work_size must look like 480x270, got {work_size!r}")
            work_size = (ws[0], ws[1])
        if len(work_size) != 2 or min(work_size) < 32:
            raise ConfigError(f"classic tracker: work_size {work_size!r} is too small; use at least 32x32 "
                              "(default 480x270)")
        if flow_preset not in PRESETS:
            raise ConfigError(f"classic tracker: unknown flow_preset {flow_preset!r}; choose one of: "
                              f"{', '.join(PRESETS)}")
        self.work_size = (int(work_size[0]), int(work_size[1]))
        self.flow_preset = flow_preset
        self.params = params or ClassicParams()

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        return InputSpec(self.work_size[0], self.work_size[1], resize="fit", dtype="uint8", layout="HWC")

    def new_session(self) -> ClassicSession:
        return ClassicSession(self.params, self.flow_preset)


__all__ = ["ClassicParams", "ClassicSession", "ClassicTracker"]
