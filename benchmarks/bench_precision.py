"""fp32 vs fp16 vs INT8 exports of one checkpoint, side by side in one run (docs/deploy.md §3).

For each configuration (``tiny``: the tiny random SAM 2 of the tests; ``large``: the SAM 2.1 hiera-tiny
architecture at 512 px with random weights, 38.9M parameters, as in ``bench_sam2.py``) it exports the checkpoint three times
(``vostream export``, ``--fp16``, ``--int8 CALIB``), the INT8 one calibrated on one synthetic scene (``crossing``,
seed 1) and compared on another (``crossing``, seed 0: same kind of footage, other frames), both real H.264 clips
with a click on every object.  Then ``compare_exports`` runs the three exports over the comparison clip in
interleaved rounds, per thread count, and prints per precision: mask IoU mean / min (``logits > 0`` on the low-res
masks, every object and frame), max |Δ logit| where both see the object, frames where presence differs, the graph
bytes and their ratio to fp32, ms per frame (median over rounds of the mean ``session.step`` time) and its ratio to
fp32.  On random weights the mask figures only say that the graphs are still faithful.

    python benchmarks/bench_precision.py [--configs tiny large] [--frames 24] [--threads 1 2] [--rounds 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fakes import sam2_reference as ref  # noqa: E402

from vostream.apps.export import export_model  # noqa: E402
from vostream.apps.export.precision import compare_exports, graph_bytes, read_clip  # noqa: E402
from vostream.pipeline.types import Prompt  # noqa: E402
from vostream.samples.scenes import render_scene, write_scene  # noqa: E402
from vostream.stages.trackers.sam2.manifest import load_manifest  # noqa: E402


def scene_clip(work: Path, seed: int, frames: int, size: tuple[int, int]) -> tuple[Path, list[Prompt]]:
    scene = render_scene("crossing", size[0], size[1], frames=frames, seed=seed)
    path = write_scene(scene, work / f"crossing-{seed}.mp4")
    return path, [Prompt(oid, 0, [scene.click(oid)], [1]) for oid in scene.obj_ids]


def bench(
    name: str, ckpt: Path, work: Path, frames: int, threads: list[int], rounds: int, size: tuple[int, int]
) -> dict[str, Any]:
    calib, calib_prompts = scene_clip(work, 1, frames, size)
    clip, prompts = scene_clip(work, 0, frames, size)
    dirs: dict[str, Path] = {}
    export_s: dict[str, float] = {}
    for label, opts in (
        ("float32", {}),
        ("float16-mixed", {"fp16": True}),
        ("int8-qdq", {"int8": calib, "prompts": calib_prompts, "calib_frames": frames}),
    ):
        t0 = time.perf_counter()
        dirs[label] = work / f"{name}-{label}"
        export_model(str(ckpt), dirs[label], overwrite=True, progress=lambda s: None, **opts)  # type: ignore[arg-type]
        export_s[label] = round(time.perf_counter() - t0, 1)
        print(f"[{name}] exported {label} in {export_s[label]} s", file=sys.stderr, flush=True)
    m = load_manifest(dirs["float32"])
    clip_frames = read_clip(clip, frames, "--compare")
    out: dict[str, Any] = {
        "image_size": m.image_size,
        "parameters": m.source.get("parameters"),
        "export_s": export_s,
        "fp32_bytes": graph_bytes(dirs["float32"], m),
        "int8_check": {g: load_manifest(dirs["int8-qdq"]).verify[g]["int8"]["rel_rms"] for g in m.graphs},
        "runs": {},
    }
    for t in threads:
        reports = compare_exports(
            dirs["float32"],
            {"float16-mixed": dirs["float16-mixed"], "int8-qdq": dirs["int8-qdq"]},
            clip,
            clip_frames,
            prompts,
            threads=t,
            rounds=rounds,
        )
        out["runs"][str(t)] = reports
        print(
            f"\n{name} ({m.image_size} px), {len(clip_frames)} frames, {len(prompts)} objects, {t} thread(s):"
        )
        print(
            f"  {'precision':<14} {'IoU mean':>8} {'IoU min':>8} {'max|Δ|':>8} {'flips':>5} {'MB':>7} {'size':>5}"
            f" {'ms/frame':>9} {'time':>5}"
        )
        first = next(iter(reports.values()))
        print(
            f"  {'float32':<14} {1:>8.4f} {1:>8.4f} {0:>8.3g} {0:>5} {first['fp32_bytes'] / 1e6:>7.1f} {1:>5.2f}"
            f" {first['fp32_ms_per_frame']:>9.1f} {1:>5.2f}"
        )
        for label, r in reports.items():
            print(
                f"  {label:<14} {r['iou_mean']:>8.4f} {r['iou_min']:>8.4f} {r['max_abs_logit_diff']:>8.3g} "
                f"{r['presence_flips']:>5} {r['bytes'] / 1e6:>7.1f} {r['size_ratio']:>5.2f} "
                f"{r['ms_per_frame']:>9.1f} {r['time_ratio']:>5.2f}"
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--configs",
        nargs="+",
        choices=("tiny", "large"),
        default=["tiny"],
        help="tiny: the tests' tiny SAM 2 (128 px); large: the hiera-tiny architecture at 512 px (default: tiny)",
    )
    ap.add_argument("--frames", type=int, default=24, help="frames of each clip (default 24)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-precision-") as tmp:
        work = Path(tmp)
        if "tiny" in args.configs:
            ckpt = ref.save_tiny("sam2", work / "tiny-ckpt")
            results["tiny"] = bench("tiny", ckpt, work, args.frames, args.threads, args.rounds, (320, 240))
        if "large" in args.configs:
            from bench_sam2 import large_model

            large = work / "large-ckpt"
            large_model().save_pretrained(large)
            results["large"] = bench("large", large, work, args.frames, args.threads, args.rounds, (854, 480))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
