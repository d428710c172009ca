"""The per-video "done" record of ``vostream annotate``: ``<video dir>/manifest.json``.

Written atomically after every output of the video is complete, with the SHA-256 of each output file and a
fingerprint of everything that determines the outputs (``docs/annotate.md``).  A video is done only when its
manifest verifies against the files on disk.  Functions here are thread-safe for different video folders; one
folder must have one writer (the batch gives each video to one worker at a time).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict, cast

import numpy as np

from vostream.pipeline.errors import OutputError
from vostream.pipeline.types import Control, Prompt

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
#: every name a track job writes into its folder (docs/outputs.md); only these are ever deleted
OUTPUT_FILES = ("overlay.mp4", "annotations.json", "mot.txt")
OUTPUT_DIRS = ("masks",)
_CHUNK = 1 << 20


class VideoStats(TypedDict, total=False):
    """What a finished video's run did, kept in its manifest (a manifest read back may lack keys)."""

    frames: int
    objects: int
    wall_s: float
    fps: float
    warnings: list[str]


class Manifest(TypedDict):
    """``manifest.json``: the video, the fingerprint of what determines its outputs, each output's SHA-256."""

    version: int
    video: str
    fingerprint: str
    files: dict[str, str]
    stats: VideoStats


def _canonical_prompt(msg: Control) -> dict[str, object]:
    if isinstance(msg, Prompt):
        mask = None
        if msg.mask is not None:
            m = np.ascontiguousarray(msg.mask, dtype=bool)
            mask = hashlib.sha256(repr(m.shape).encode() + np.packbits(m).tobytes()).hexdigest()
        return {
            "obj": int(msg.obj_id),
            "frame": int(msg.frame_index),
            "points": [[float(x), float(y)] for x, y in msg.points.tolist()],
            "labels": [int(v) for v in msg.labels.tolist()],
            "box": list(msg.box) if msg.box is not None else None,
            "mask": mask,
        }
    return {
        "control": type(msg).__name__,
        "obj": getattr(msg, "obj_id", None),  # ResetTracker has none
        "frame": int(msg.frame_index),
    }


def fingerprint(key: str, source: str, prompts: Sequence[Control], settings: dict[str, object]) -> str:
    """SHA-256 over the video key, the source's size, the prompts and the output-determining ``settings``."""
    try:
        size = os.path.getsize(source)
    except OSError:
        size = -1
    doc = {
        "version": MANIFEST_VERSION,
        "video": key,
        "source_size": size,
        "prompts": [_canonical_prompt(p) for p in prompts],
        "settings": settings,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def output_files(video_dir: str | os.PathLike[str]) -> list[str]:
    """The output files present in ``video_dir`` (relative POSIX paths, sorted), temporary files excluded."""
    d = Path(video_dir)
    out = [name for name in OUTPUT_FILES if (d / name).is_file()]
    for sub in OUTPUT_DIRS:
        if (d / sub).is_dir():
            out += [
                f"{sub}/{p.name}" for p in (d / sub).iterdir() if p.is_file() and not p.name.endswith(".tmp")
            ]
    return sorted(out)


def write_manifest(video_dir: str | os.PathLike[str], key: str, fp: str, stats: VideoStats) -> Manifest:
    """Checksum every output in ``video_dir`` and write ``manifest.json`` atomically (last).  Raises
    :class:`OutputError` when nothing was written or the manifest cannot be written."""
    from vostream.sinks.atomic import atomic_write_text

    d = Path(video_dir)
    files = output_files(d)
    if not files:
        raise OutputError(f"{d}: the run wrote no output files; nothing to record")
    manifest: Manifest = {
        "version": MANIFEST_VERSION,
        "video": key,
        "fingerprint": fp,
        "files": {name: sha256_file(d / name) for name in files},
        "stats": stats,
    }
    atomic_write_text(d / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True))
    return manifest


def read_manifest(video_dir: str | os.PathLike[str]) -> Manifest | None:
    """``manifest.json`` of ``video_dir`` when it parses as a JSON object (its keys are checked by
    :func:`verify_manifest`), else None."""
    try:
        data = json.loads((Path(video_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cast(Manifest, data) if isinstance(data, dict) else None  # its keys: verify_manifest


def verify_manifest(video_dir: str | os.PathLike[str], fp: str) -> Manifest | None:
    """The manifest when the video is done: it parses, ``fingerprint == fp``, every listed file exists with its
    SHA-256, and no unlisted output file is present.  ``None`` otherwise (the reason is logged at INFO)."""
    d = Path(video_dir)
    m = read_manifest(d)
    if m is None:
        if (d / MANIFEST_NAME).exists():
            logger.info("%s: unreadable manifest; redoing", d)
        return None
    files = m.get("files")
    if m.get("version") != MANIFEST_VERSION or m.get("fingerprint") != fp or not isinstance(files, dict):
        logger.info("%s: prompts, options or source changed since it was done; redoing", d)
        return None
    if sorted(files) != output_files(d):
        logger.info("%s: output files differ from the manifest; redoing", d)
        return None
    for name, digest in files.items():
        try:
            if sha256_file(d / name) != digest:
                logger.info("%s: %s does not match its checksum; redoing", d, name)
                return None
        except OSError:
            return None
    return m


def clean_outputs(video_dir: str | os.PathLike[str]) -> None:
    """Delete the manifest (first), then every known output and leftover ``*.tmp`` in ``video_dir``.  Other files
    are left alone.  Raises :class:`OutputError` when something cannot be deleted."""
    d = Path(video_dir)
    if not d.exists():
        return
    try:
        (d / MANIFEST_NAME).unlink(missing_ok=True)
        for name in OUTPUT_FILES:
            (d / name).unlink(missing_ok=True)
        for sub in OUTPUT_DIRS:
            if (d / sub).is_dir():
                shutil.rmtree(d / sub)
        for tmp in d.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot remove stale outputs in {str(d)!r}: {exc}; check permissions") from exc


__all__ = [
    "MANIFEST_NAME",
    "Manifest",
    "OUTPUT_DIRS",
    "OUTPUT_FILES",
    "VideoStats",
    "clean_outputs",
    "fingerprint",
    "output_files",
    "read_manifest",
    "sha256_file",
    "verify_manifest",
    "write_manifest",
]
