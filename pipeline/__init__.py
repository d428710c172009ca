"""vostream's dataflow engine: stages in threads joined by bounded queues.

Importing this package stays light (no OpenCV, PyAV or NumPy): the engine is pure Python.  Fakes for tests live in
:mod:`vostream.pipeline.testing`.
"""

from __future__ import annotations

from .engine import ControlReceipt, Pipeline, RunReport, handle_signals
from .metrics import MetricsSnapshot, NodeSnapshot
from .queues import BoundedQueue
from .stage import BLOCK, LATEST, Sink, SinkSpec, Source, Stage

__all__ = [
    "BLOCK",
    "LATEST",
    "BoundedQueue",
    "ControlReceipt",
    "MetricsSnapshot",
    "NodeSnapshot",
    "Pipeline",
    "RunReport",
    "Sink",
    "SinkSpec",
    "Source",
    "Stage",
    "handle_signals",
]
