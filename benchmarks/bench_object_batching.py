"""Would batching objects through memory attention pay?  One batch-B run vs. B batch-1 runs, in one process.

Memory attention is the graph that runs once per object per frame and dominates at real sizes.  This exports HF's
``Sam2VideoModel.memory_attention`` (SAM 2.1 hiera-tiny architecture, random weights, at ``--size`` px, one full
bank: 8 slots + 64 pointer tokens) at batch 1, 2 and 4 and times each in ONNX Runtime (CPU) at 1 and 2 threads.
A ratio below 1 means batching B objects beats running them one after the other.

    python benchmarks/bench_object_batching.py [--size 512] [--repeats 4]
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

from ort_timing import cpu_session, median_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=4)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import torch
    from transformers import Sam2VideoConfig, Sam2VideoModel

    from vostream.apps.export.families import FAMILIES, resize_config

    s, g = args.size, args.size // 16
    cfg = Sam2VideoConfig()
    resize_config(cfg, FAMILIES["sam2"], s)
    torch.manual_seed(0)
    model = Sam2VideoModel(cfg).eval()

    class MemoryAttention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = model.memory_attention

        def forward(
            self, feat: torch.Tensor, mem: torch.Tensor, fpos: torch.Tensor, mpos: torch.Tensor
        ) -> torch.Tensor:
            return self.m(
                current_vision_features=feat,
                memory=mem,
                current_vision_position_embeddings=fpos,
                memory_posision_embeddings=mpos,
                num_object_pointer_tokens=64,
            )

    tokens, keys = g * g, 8 * g * g + 64
    names = ["feat", "memory", "feat_pos", "memory_pos"]
    single: dict[int, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for b in (1, 2, 4):
            shapes = [(tokens, b, 256), (keys, b, 64), (tokens, b, 256), (keys, b, 64)]
            feeds = [torch.randn(*sh) for sh in shapes]
            paths[b] = (Path(tmp) / f"ma_b{b}.onnx", {n: t.numpy() for n, t in zip(names, feeds)})
            with torch.no_grad():
                torch.onnx.export(
                    MemoryAttention(),
                    tuple(feeds),
                    str(paths[b][0]),
                    input_names=names,
                    output_names=["out"],
                    opset_version=17,
                    dynamo=False,
                )
        print(f"memory attention, SAM 2.1 hiera-tiny architecture at {s} px: {tokens} queries x {keys} keys")
        for threads in (1, 2):
            for b in (1, 2, 4):
                ms, _ = median_ms(cpu_session(str(paths[b][0]), threads), paths[b][1], args.repeats)
                if b == 1:
                    single[threads] = ms
                ratio = ms / (b * single[threads])
                print(
                    f"threads={threads} objects={b}: {ms:.0f} ms ({ms / b:.0f} ms per object); "
                    f"batched / one at a time = {ratio:.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
