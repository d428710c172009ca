"""The classic tracker on real footage: the hand-held box and cup clips that Debian's ``opencv-doc`` ships.

Nothing is committed: the script downloads the Debian package with ``apt-get download opencv-doc`` (about 95 MB,
once, into ``--cache``), extracts ``box.mp4`` (640x480, 456 frames: a yellow printed box moved by hand over a
table) and ``cup.mp4`` (640x480, 217 frames: a dark cup turned in a hand against a white wall), then tracks each
from one click, through the real ``vostream track`` job.

There is no hand-made ground truth for these clips.  For ``box.mp4`` a *pseudo* ground truth is made by colour: the
largest saturated yellow/orange region, holes filled — it misses the box's shadowed side face in some frames and
sometimes takes in a thumb, so read its IoU as "agrees with a colour segmentation", not as accuracy.  ``cup.mp4``
has no usable colour truth (the hand splits the cup and the print is as dark as the shadows), so only its speed and
how often the object is reported present are measured; the contact sheets (``--sheets DIR``) are for eyeballing.

    python benchmarks/bench_real.py --json bench-out/real.json --sheets bench-out/
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

CLIPS = {
    "box": "usr/share/doc/opencv-doc/opencv4/html/box.mp4.gz",
    "cup": "usr/share/doc/opencv-doc/opencv4/html/cup.mp4.gz",
}


def fetch(cache: Path) -> dict[str, Path]:
    """The clips, downloading and extracting Debian's opencv-doc package once."""
    cache.mkdir(parents=True, exist_ok=True)
    out = {name: cache / f"{name}.mp4" for name in CLIPS}
    if all(p.exists() for p in out.values()):
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "opencv-doc"], cwd=tmp, check=True, capture_output=True)
        deb = next(Path(tmp).glob("opencv-doc_*.deb"))
        data = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", str(deb)], check=True, capture_output=True
        ).stdout
        tar_path = Path(tmp) / "data.tar"
        tar_path.write_bytes(data)
        with tarfile.open(tar_path) as tar:
            for name, member in CLIPS.items():
                f = tar.extractfile("./" + member)
                assert f is not None
                out[name].write_bytes(gzip.decompress(f.read()))
    return out


def _largest(mask: np.ndarray) -> np.ndarray:
    n, lab, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8))
    if n < 2:
        return np.zeros(mask.shape, bool)
    return lab == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))


def _fill(mask: np.ndarray) -> np.ndarray:
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    out = np.zeros(mask.shape, np.uint8)
    cv2.drawContours(out, contours, -1, 1, -1)
    return out > 0


def box_truth(rgb: np.ndarray) -> np.ndarray:
    """Pseudo ground truth of the yellow box: saturated yellow/orange, closed, largest region, holes filled."""
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    m = (hsv[..., 0] >= 8) & (hsv[..., 0] <= 35) & (hsv[..., 1] > 110) & (hsv[..., 2] > 120)
    m = cv2.morphologyEx(m.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((25, 25), np.uint8))
    return _fill(_largest(m))


def inner_point(mask: np.ndarray) -> tuple[int, int]:
    d = cv2.distanceTransform(np.pad(mask.astype(np.uint8), 1), cv2.DIST_L2, 5)[1:-1, 1:-1]
    y, x = np.unravel_index(int(np.argmax(d)), d.shape)
    return int(x), int(y)


def read_frames(path: Path) -> list[np.ndarray]:
    from vostream.stages.sources import VideoFileSource

    with VideoFileSource(path) as src:
        return [f.image for f in src]


def contact_sheet(frames: list[np.ndarray], masks: list[np.ndarray], path: Path, n: int = 6) -> None:
    idx = np.linspace(0, len(frames) - 1, n).astype(int)
    tiles = []
    for i in idx:
        im = frames[i].copy()
        m = masks[i]
        im[m] = (im[m] * 0.45 + np.array([255, 40, 200]) * 0.55).astype(np.uint8)
        cv2.putText(im, f"#{i}", (8, 28), cv2.FONT_HERSHEY_SIMPLEX, 0.9, (255, 255, 255), 2)
        tiles.append(cv2.resize(im, (320, 240), interpolation=cv2.INTER_AREA))
    rows = [np.concatenate(tiles[k : k + 3], 1) for k in range(0, len(tiles), 3)]
    Image.fromarray(np.concatenate(rows, 0)).save(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "vostream" / "real")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sheets", type=Path, help="write contact sheets (PNG) of the tracked masks here")
    args = ap.parse_args(argv)
    if shutil.which("apt-get") is None:
        print("bench_real needs apt-get (Debian) to fetch the opencv-doc package", file=sys.stderr)
        return 2
    from vostream.apps.config import TrackSettings
    from vostream.apps.track import run_track
    from vostream.pipeline.types import Prompt

    clips = fetch(args.cache)
    results = {}
    for name, path in clips.items():
        frames = read_frames(path)
        truth = [box_truth(f) for f in frames] if name == "box" else None
        if truth is not None:
            x, y = inner_point(truth[0])
        else:  # the cup: the darkest large region on frame 0 (the click a person would make on the cup)
            hsv = cv2.cvtColor(frames[0], cv2.COLOR_RGB2HSV)
            x, y = inner_point(_largest((hsv[..., 2] < 90) & (hsv[..., 1] < 90)))
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            report = run_track(
                TrackSettings(
                    source=str(path),
                    out=tmp,
                    save=("png",),
                    quiet=True,
                    prompts=[Prompt(1, 0, [[x, y]], [1])],
                )
            )
            wall = time.perf_counter() - t0
            masks = [
                np.asarray(Image.open(Path(tmp) / "masks" / f"{i:05d}.png")) == 1
                for i in range(report.frames)
            ]
        row = {
            "frames": report.frames,
            "size": f"{frames[0].shape[1]}x{frames[0].shape[0]}",
            "click": [x, y],
            "pipeline_fps": round(report.frames / wall, 1),
            "present_rate": round(float(np.mean([m.any() for m in masks])), 3),
        }
        if truth is not None:
            ious = []
            for m, g in zip(masks[1:], truth[1:]):
                union = np.count_nonzero(m | g)
                ious.append(1.0 if union == 0 else np.count_nonzero(m & g) / union)
            row["iou_vs_colour_truth"] = round(float(np.mean(ious)), 3)
            row["iou_p10"] = round(float(np.percentile(ious, 10)), 3)
        results[name] = row
        print(name, row)
        if args.sheets:
            args.sheets.mkdir(parents=True, exist_ok=True)
            contact_sheet(frames, masks, args.sheets / f"real_{name}.png")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
