"""Shared by the ONNX Runtime micro-benchmarks: a CPU session with a fixed thread count, and the median time of
repeated runs (after one untimed warm-up run)."""

from __future__ import annotations

import statistics
import time
from typing import Any


def cpu_session(model: Any, threads: int) -> Any:
    """An ONNX Runtime CPU session of ``model`` (a path or serialized bytes) on ``threads`` intra-op threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def median_ms(sess: Any, feed: dict[str, Any], repeats: int) -> tuple[float, list[Any]]:
    """(median ms of ``repeats`` timed runs, the outputs of the warm-up run)."""
    outs = sess.run(None, feed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, outs
