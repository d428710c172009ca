"""Benchmark the SAM-2-family ``onnx`` backend against the ``transformers`` reference, side by side in one run.

For each configuration (the three tiny test families, and ``--large``: the SAM 2.1 hiera-tiny architecture at 512 px
with random weights, 38.9M parameters) it exports the model, then runs the same frames and the same prompt through
HF's streaming tracker and through ``Sam2Session`` on ``OrtRuntime`` (CPU), alternating the two per round so that
machine noise hits both.  Reported per configuration:

- ms/frame (median over tracking frames from frame 8 on, once all 6 recent memory slots are filled) for HF
  and for ours, and the ratio ours / HF (target <= 0.7);
- ms per graph per frame (from the runtime's counters);
- bytes host->device and device->host per frame after warm-up, and the bank + pointer bytes per object that stay
  on the device;
- model load time: a fresh process from start to the first mask (``--load-time``).

Both sides use the same number of intra-op threads (``--threads``, default 1 and 2).

    python benchmarks/bench_sam2.py [--large] [--image-sizes 512 768 1024] [--frames 40] [--threads 1 2]
        [--families sam2 ...] [--json out.json]

``--image-sizes``: the hiera-tiny architecture at 1024 px exported with ``--image-size`` for each size; our
backend's ms/frame per size and per graph, and each size's time relative to the largest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakes import sam2_reference as ref  # noqa: E402

from vostream.apps.export import export_model  # noqa: E402
from vostream.apps.export.families import FAMILIES, resize_config  # noqa: E402
from vostream.pipeline.types import Frame, Prompt  # noqa: E402
from vostream.stages.trackers.sam2 import OnnxTracker  # noqa: E402

#: frames before timing starts: the prompted frame, then 7 tracking frames, after which all 6 recent memory slots
#: hold memories (steady state: memory attention binds only the slots holding memories, so it is cheaper before)
WARM = 8


def large_model() -> Any:
    """SAM 2.1 hiera-tiny architecture (HF's default ``Sam2VideoConfig``) at 512 px, random weights."""
    import torch
    from transformers import Sam2VideoConfig, Sam2VideoModel

    cfg = Sam2VideoConfig()
    resize_config(cfg, FAMILIES["sam2"], 512)
    torch.manual_seed(0)
    model = Sam2VideoModel(cfg).eval()
    ref._randomize_zero_params(model, 0)
    ref._set_present_head(model)
    return model


def run_ours(
    tracker: OnnxTracker,
    frames: list[np.ndarray],
    tensors: list[np.ndarray],
    click: tuple[float, float],
    warm: int,
) -> tuple[list[float], Any]:
    s = tracker.new_session()
    s.add_prompt(Prompt(1, 0, [click], [1]))
    times = []
    before = None
    for i, (img, x) in enumerate(zip(frames, tensors)):
        if i == warm:
            before = tracker.runtime.stats.snapshot()
        f = Frame(i, img)
        f.tensor = x
        t0 = time.perf_counter()
        s.step(f)
        times.append((time.perf_counter() - t0) * 1e3)
    assert before is not None
    delta = tracker.runtime.stats.minus(before)
    s.close()
    return times[1:], delta


def run_hf(model: Any, tensors: list[np.ndarray], click: tuple[float, float]) -> list[float]:
    runner = ref.ReferenceRunner(model)
    times = []
    for i, x in enumerate(tensors):
        runner.step(x, [ref.PromptSpec(1, points=[click], labels=[1])] if i == 0 else ())
        times.append(runner.last_step_s * 1e3)
    return times[1:]


def load_time(export: Path, size: int) -> float:
    """Seconds from a fresh interpreter's start to the first mask (import, load graphs, one step)."""
    code = (
        "import time, psutil, numpy as np\n"
        "from vostream.stages.trackers.sam2 import OnnxTracker\n"
        "from vostream.pipeline.types import Frame, Prompt\n"
        f"t = OnnxTracker({str(export)!r}); s = t.new_session(); s.add_prompt(Prompt(1, 0, [[8, 8]], [1]))\n"
        f"f = Frame(0, np.zeros(({size}, {size}, 3), np.uint8)); f.tensor = np.zeros((1, 3, {size}, {size}), "
        "np.float32)\n"
        "r = s.step(f)\n"
        "print(time.time() - psutil.Process().create_time())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def bench(
    name: str,
    model: Any,
    family: str,
    ckpt_or_none: Path | None,
    work: Path,
    n: int,
    threads: list[int],
    rounds: int,
) -> dict[str, Any]:
    import torch

    export = work / f"export_{name}"
    ckpt = ckpt_or_none or work / f"ckpt_{name}"
    if ckpt_or_none is None:
        model.save_pretrained(ckpt)
    t0 = time.perf_counter()
    manifest = export_model(str(ckpt), export, overwrite=True)
    export_s = time.perf_counter() - t0
    size = manifest.image_size
    mean, std = ref.mean_std(family)
    frames = ref.make_frames(n, size, occluded=())
    tensors = [ref.to_tensor(f, mean, std) for f in frames]
    click = ref.shape_center(0, size, "disk")
    res: dict[str, Any] = {
        "family": family,
        "image_size": size,
        "params": manifest.source.get("parameters"),
        "export_s": round(export_s, 1),
        "threads": {},
    }
    for th in threads:
        torch.set_num_threads(th)
        tracker = OnnxTracker(export, threads=th)
        hf_all: list[float] = []
        ours_all: list[float] = []
        whole_all: list[float] = []
        delta = whole = None
        for _ in range(rounds):  # alternate so drifts in machine load hit both sides
            hf_all += run_hf(model, tensors, click)[WARM - 1 :]
            times, delta = run_ours(tracker, frames, tensors, click, warm=WARM)
            ours_all += times[WARM - 1 :]
            # the same, binding the whole bank with its empty slots masked (what a static-shape runtime does)
            tracker.runtime.dynamic_shapes = False
            times, whole = run_ours(tracker, frames, tensors, click, warm=WARM)
            whole_all += times[WARM - 1 :]
            tracker.runtime.dynamic_shapes = True
        assert delta is not None and whole is not None
        frames_counted = n - WARM
        hf_ms, ours_ms = statistics.median(hf_all), statistics.median(ours_all)
        enc = []
        with torch.inference_mode():  # the image encoder alone in PyTorch, for the per-part comparison
            for x in tensors[:3]:
                t0 = time.perf_counter()
                model.get_image_features(torch.from_numpy(x))
                enc.append((time.perf_counter() - t0) * 1e3)
        res["threads"][th] = {
            "hf_ms": round(hf_ms, 2),
            "onnx_ms": round(ours_ms, 2),
            "ratio": round(ours_ms / hf_ms, 3),
            "graph_ms": {k: round(v * 1e3 / frames_counted, 2) for k, v in delta.run_s.items()},
            "h2d_bytes_per_frame": delta.h2d_bytes / frames_counted,
            "d2h_bytes_per_frame": delta.d2h_bytes / frames_counted,
            "d2d_bytes_per_frame": delta.d2d_bytes / frames_counted,
            "hf_image_encoder_ms": round(statistics.median(enc), 2),
            "onnx_whole_bank_ms": round(statistics.median(whole_all), 2),
            "memory_attention_whole_bank_ms": round(
                whole.run_s["memory_attention"] * 1e3 / frames_counted, 2
            ),
        }
        tracker.close()
        print(
            f"{name} threads={th}: HF {hf_ms:.1f} ms/frame, onnx {ours_ms:.1f} ms/frame, ratio "
            f"{ours_ms / hf_ms:.2f}; per graph {res['threads'][th]['graph_ms']} (HF image encoder alone "
            f"{statistics.median(enc):.1f} ms); binding the whole bank instead: "
            f"{res['threads'][th]['onnx_whole_bank_ms']:.1f} ms/frame, memory attention "
            f"{res['threads'][th]['memory_attention_whole_bank_ms']:.1f} ms",
            flush=True,
        )
    m = manifest
    res["bank_bytes_per_object"] = (m.cond_slots + m.recent_slots) * m.tokens_per_slot * m.mem_dim * 4
    res["pointer_bytes_per_object"] = m.pointer_slots * m.hidden_dim * 4
    res["load_to_first_mask_s"] = round(load_time(export, size), 2)
    print(
        f"{name}: bank {res['bank_bytes_per_object'] / 1024:.0f} KiB + pointers "
        f"{res['pointer_bytes_per_object'] / 1024:.1f} KiB per object stay on the device; H2D "
        f"{res['threads'][threads[0]]['h2d_bytes_per_frame'] / 1024:.1f} KiB/frame, D2H "
        f"{res['threads'][threads[0]]['d2h_bytes_per_frame'] / 1024:.1f} KiB/frame; load to first mask "
        f"{res['load_to_first_mask_s']} s",
        flush=True,
    )
    return res


def bench_image_sizes(work: Path, sizes: list[int], n: int, threads: list[int]) -> dict[str, Any]:
    """``export --image-size``: the SAM 2.1 hiera-tiny architecture (1024 px, random weights) exported at each size,
    ms/frame of our backend per size and per graph, sizes interleaved per thread count."""
    import torch
    from transformers import Sam2VideoConfig, Sam2VideoModel

    torch.manual_seed(0)
    model = Sam2VideoModel(Sam2VideoConfig()).eval()
    ref._randomize_zero_params(model, 0)
    ref._set_present_head(model)
    ckpt = work / "ckpt_sam2.1_tiny_arch_1024"
    model.save_pretrained(ckpt)
    del model
    res: dict[str, Any] = {}
    exports = {}
    for size in sizes:
        t0 = time.perf_counter()
        export_model(str(ckpt), work / f"export_{size}", image_size=size, overwrite=True)
        exports[size] = work / f"export_{size}"
        res[str(size)] = {"export_s": round(time.perf_counter() - t0, 1), "threads": {}}
        print(f"sizes: exported {size} px in {res[str(size)]['export_s']} s", flush=True)
    for th in threads:
        for size in sizes:
            frames = ref.make_frames(n, size, occluded=())
            tensors = [ref.to_tensor(f, *ref.mean_std("sam2")) for f in frames]
            tracker = OnnxTracker(exports[size], threads=th)
            times, delta = run_ours(tracker, frames, tensors, ref.shape_center(0, size, "disk"), warm=WARM)
            tracker.close()
            ms = statistics.median(times[WARM - 1 :])
            res[str(size)]["threads"][th] = {
                "onnx_ms": round(ms, 1),
                "graph_ms": {k: round(v * 1e3 / (n - WARM), 1) for k, v in delta.run_s.items()},
            }
            print(
                f"sizes: {size} px threads={th}: {ms:.0f} ms/frame; per graph "
                f"{res[str(size)]['threads'][th]['graph_ms']}",
                flush=True,
            )
        top = str(max(sizes))
        for size in sizes:
            r = res[str(size)]["threads"][th]["onnx_ms"] / res[top]["threads"][th]["onnx_ms"]
            res[str(size)]["threads"][th]["vs_largest"] = round(r, 3)
        print(
            f"sizes: threads={th}: time vs {top} px: "
            + ", ".join(f"{s} px {res[str(s)]['threads'][th]['vs_largest']:.2f}" for s in sizes),
            flush=True,
        )
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--families", nargs="*", default=list(ref.FAMILIES), help="tiny families (none: skip them)"
    )
    ap.add_argument("--large", action="store_true", help="also the hiera-tiny architecture at 512 px")
    ap.add_argument(
        "--image-sizes",
        type=int,
        nargs="+",
        metavar="PX",
        help="also the hiera-tiny architecture exported at each of these sizes (export --image-size)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for fam in args.families:
            ckpt = ref.save_tiny(fam, work / f"ckpt_{fam}", obj_score="present")
            model = ref.load_tiny(fam, ckpt)
            results[f"tiny_{fam}"] = bench(
                f"tiny_{fam}", model, fam, ckpt, work, args.frames, args.threads, args.rounds
            )
        if args.large:
            results["sam2.1_tiny_arch_512"] = bench(
                "sam2.1_tiny_arch_512", large_model(), "sam2", None, work, WARM + 6, args.threads, 1
            )
        if args.image_sizes:
            results["image_sizes"] = bench_image_sizes(work, sorted(args.image_sizes), WARM + 4, args.threads)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
