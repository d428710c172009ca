"""The ``classic`` tracker: OpenCV + NumPy, no weights (see ``docs/classic-tracker.md``)."""

from __future__ import annotations

import logging

from vostream.pipeline.errors import ConfigError

from ..base import InputSpec, Tracker
from .motion import PRESETS
from .params import ClassicParams
from .session import ClassicSession

logger = logging.getLogger(__name__)


#: a source whose long side is shorter than this is enlarged to it for tracking (see ``input_spec``)
MIN_WORK_SIDE = 320
#: the smallest work size accepted (each side, px): a few DIS patches
MIN_WORK_SIZE = 32


class ClassicTracker(Tracker):
    """Weight-free tracker backend.  ``work_size`` (w, h): the box frames are fit into before tracking.

    Thread-safe to share (it holds only settings); each session is driven by one thread.
    """

    name = "classic"

    def __init__(
        self,
        work_size: tuple[int, int] | str = (480, 270),
        flow_preset: str = "medium",
        params: ClassicParams | None = None,
    ) -> None:
        if isinstance(work_size, str):
            try:
                ws = tuple(int(v) for v in work_size.lower().split("x"))
            except ValueError:
                ws = ()
            if len(ws) != 2:
                raise ConfigError(f"classic tracker: work_size must look like 480x270, got {work_size!r}")
            work_size = (ws[0], ws[1])
        if len(work_size) != 2 or min(work_size) < MIN_WORK_SIZE:
            raise ConfigError(
                f"classic tracker: work_size {work_size!r} is too small; use at least "
                f"{MIN_WORK_SIZE}x{MIN_WORK_SIZE} (default 480x270)"
            )
        if flow_preset not in PRESETS:
            raise ConfigError(
                f"classic tracker: unknown flow_preset {flow_preset!r}; choose one of: {', '.join(PRESETS)}"
            )
        self.work_size = (int(work_size[0]), int(work_size[1]))
        self.flow_preset = flow_preset
        self.params = params or ClassicParams()

    def input_spec(self, src_w: int, src_h: int) -> InputSpec:
        """The source fit into ``work_size``; a small source (long side under :data:`MIN_WORK_SIDE`) is enlarged
        to that long side instead: optical flow needs a few pixels of texture per patch, and a small object that
        moves several pixels a frame is lost at thumbnail sizes."""
        long_side = max(src_w, src_h)
        if 0 < long_side < MIN_WORK_SIDE:
            k = MIN_WORK_SIDE / long_side
            return InputSpec(
                max(1, round(src_w * k)),
                max(1, round(src_h * k)),
                resize="stretch",
                dtype="uint8",
                layout="HWC",
            )
        return InputSpec(self.work_size[0], self.work_size[1], resize="fit", dtype="uint8", layout="HWC")

    def new_session(self) -> ClassicSession:
        return ClassicSession(self.params, self.flow_preset)


__all__ = ["ClassicParams", "ClassicSession", "ClassicTracker"]
