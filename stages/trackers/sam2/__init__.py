"""SAM-2-family trackers (SAM 2.1, EdgeTAM, the SAM 3 tracker) on ONNX Runtime (``onnx``) and AscendCL (``acl``).

See ``docs/sam2-backend.md``.  Nothing here imports torch; ``onnxruntime`` and ``acl`` are imported lazily.
"""

from __future__ import annotations

from .session import Sam2Session
from .tracker import AclTracker, OnnxTracker, Sam2Tracker

__all__ = ["AclTracker", "OnnxTracker", "Sam2Session", "Sam2Tracker"]
