"""Example: track a synthetic scene from Python and score it against its ground truth.

    python samples/examples/track_scene.py [--scene occlusion] [--out out/example]

Renders a scene with exact ground truth, writes it as an MP4, tracks it from one click per object with the
default (weight-free) tracker, and prints the mean IoU per object.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

import vostream
from vostream.samples.scenes import SCENES, render_scene, score_sequence, write_scene


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scene", default="translate", choices=sorted(SCENES))
    ap.add_argument("--size", default="854x480")
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))

    scene = render_scene(args.scene, w, h)
    out = Path(args.out or tempfile.mkdtemp(prefix="vostream-example-"))
    video = write_scene(scene, out / f"{scene.name}.mp4")
    prompts = [
        vostream.Prompt(oid, 0, [scene.click(oid)], [1]) for oid in scene.obj_ids
    ]  # one click per object
    report = vostream.track(video, prompts=prompts, out=out / "result", save=("png", "json"))

    labels = [np.asarray(Image.open(out / "result" / "masks" / f"{i:05d}.png")) for i in range(report.frames)]
    score = score_sequence(labels, scene)
    print(f"{scene.name}: {report.frames} frames at {report.fps:.1f} fps, mean IoU {score.mean:.3f}")
    for oid, value in score.per_object.items():
        print(f"  object {oid}: IoU {value:.3f}")
    print(f"outputs in {out / 'result'}")


if __name__ == "__main__":
    main()
