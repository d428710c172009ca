"""Where one graph of a ``vostream export`` spends its time, by ONNX operator type (ONNX Runtime's profiler, CPU).

Inputs are random (validity masks all ones), at the manifest's static shapes (dynamic axes: 1).

    python benchmarks/profile_graph.py EXPORT_DIR memory_attention [--threads 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("graph", choices=["image_encoder", "memory_attention", "decoder", "memory_encoder"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import onnxruntime as ort

    manifest = json.loads((args.export / "manifest.json").read_text())
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = os.path.join(tmp, "profile")
        sess = ort.InferenceSession(
            str(args.export / manifest["graphs"][args.graph]["file"]), so, providers=["CPUExecutionProvider"]
        )
        rng = np.random.default_rng(0)
        feed = {}
        for i in sess.get_inputs():
            shape = [d if isinstance(d, int) else 1 for d in i.shape]
            if "int" in i.type:
                feed[i.name] = np.zeros(shape, np.int64 if "int64" in i.type else np.int32)
            elif "valid" in i.name:
                feed[i.name] = np.ones(shape, np.float32)
            else:
                feed[i.name] = rng.standard_normal(shape).astype(np.float32)
        sess.run(None, feed)  # warm-up: profiled too, left out below
        for _ in range(args.runs):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    first_end = runs[0]["ts"] + runs[0]["dur"] if runs else 0
    per_op: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= first_end:
            per_op[e["args"]["op_name"]] += e["dur"]
    total = sum(per_op.values())
    print(
        f"{args.graph}: {total / args.runs / 1e3:.1f} ms of kernels per run ({args.threads} threads), by operator:"
    )
    for op, us in per_op.most_common(12):
        print(f"  {op:24s} {us / args.runs / 1e3:8.1f} ms  {100 * us / total:5.1f} %")


if __name__ == "__main__":
    main()
