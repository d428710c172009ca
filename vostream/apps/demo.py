"""``vostream demo``: render a bundled synthetic scene (with exact ground truth), track it from its prompts with the
ordinary track job, and print the mean IoU against the ground truth (``docs/scenes.md``)."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

from vostream.apps.config import SAVE_FORMATS, TrackSettings
from vostream.apps.track import run_track
from vostream.pipeline.engine import RunReport
from vostream.pipeline.errors import OutputError
from vostream.samples.scenes import iou, render_scene, write_scene
from vostream.sinks.atomic import atomic_write_text

logger = logging.getLogger(__name__)


def default_samples_dir() -> Path:
    """Where ``vostream demo`` keeps generated media: ``samples/media`` beside the installed ``vostream.samples``
    package when writable (a source checkout), else ``~/.cache/vostream/samples``."""
    import vostream.samples as samples_pkg

    pkg_dir = Path(list(samples_pkg.__path__)[0])
    if os.access(pkg_dir, os.W_OK):
        return pkg_dir / "media"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vostream" / "samples"


def ensure_demo_media(scene_name: str, samples_dir: Path) -> tuple[Path, Path, Path]:
    """Render scene ``scene_name`` into ``samples_dir`` unless already there: ``(video, prompts, gt_dir)``."""
    video = samples_dir / f"{scene_name}.mp4"
    prompts = samples_dir / f"{scene_name}.prompts.json"
    gt_dir = samples_dir / f"{scene_name}_gt"
    if video.exists() and prompts.exists() and gt_dir.is_dir():
        return video, prompts, gt_dir
    logger.info("generating sample scene %r into %s", scene_name, samples_dir)
    scene = render_scene(scene_name)
    tmp = video.with_name(video.stem + ".partial.mp4")
    write_scene(scene, tmp, gt_dir=gt_dir)
    os.replace(tmp, video)
    entries = [
        {"obj": oid, "frame": 0, "points": [list(map(round, scene.click(oid)))], "labels": [1]}
        for oid in scene.obj_ids
    ]
    atomic_write_text(prompts, json.dumps({"prompts": entries}, indent=1))
    return video, prompts, gt_dir


def score_against_gt(masks_dir: Path, gt_dir: Path) -> float | None:
    """Mean IoU (frame 0 excluded; empty vs empty = 1) of DAVIS PNG outputs against ground-truth PNGs."""
    import numpy as np
    from PIL import Image

    scores = []
    gts = sorted(gt_dir.glob("*.png"))
    for gt_path in gts[1:]:
        pred_path = masks_dir / gt_path.name
        if not pred_path.exists():
            return None
        gt = np.asarray(Image.open(gt_path))
        pred = np.asarray(Image.open(pred_path))
        for oid in np.unique(gt[gt > 0]).tolist() or [1]:
            scores.append(iou(pred == oid, gt == oid))
    return float(np.mean(scores)) if scores else None


def run_demo(
    out: str = "out/demo", scene: str = "crossing", samples_dir: str | None = None, quiet: bool = False
) -> RunReport:
    """``vostream demo``: make the sample (once), track it from one click per object, write every output."""
    media = Path(samples_dir) if samples_dir else default_samples_dir()
    try:
        media.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"samples directory {str(media)!r} cannot be created: {exc.strerror}") from exc
    video, prompts, gt_dir = ensure_demo_media(scene, media)
    settings = TrackSettings(
        source=str(video), out=out, save=SAVE_FORMATS, prompts_file=str(prompts), quiet=quiet
    )
    report = run_track(settings)
    if not report.interrupted:
        score = score_against_gt(Path(out) / "masks", gt_dir)
        if not quiet:
            print(f"sample video: {video} (try: vostream serve {video})", file=sys.stderr)
            if score is not None:
                print(f"mean IoU against the scene's ground truth: {score:.3f}", file=sys.stderr)
    return report


__all__ = ["default_samples_dir", "ensure_demo_media", "run_demo", "score_against_gt"]
