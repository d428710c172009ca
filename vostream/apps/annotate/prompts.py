"""The batch prompts file of ``vostream annotate``: JSON (per video, the ``track`` prompt schema) or CSV
(``video,frame,obj_id,x,y,label``, one point per row).  Schemas in ``docs/annotate.md``.

Every error is a :class:`PromptError` naming the file and the JSON entry or CSV line.  Pure functions; thread-safe.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vostream.apps.annotate.inputs import VideoEntry, match_video
from vostream.apps.prompts import read_prompts_text
from vostream.apps.userfiles import loads_json
from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Prompt

logger = logging.getLogger(__name__)

CSV_COLUMNS = ("video", "frame", "obj_id", "x", "y", "label")


@dataclass
class VideoPrompts:
    """The prompts of one video, with where each came from (``where[i]`` names ``prompts[i]``'s entry/lines)."""

    entry: VideoEntry
    prompts: list[Any] = field(default_factory=list)  # Prompt / RemoveObject
    where: list[str] = field(default_factory=list)
    #: CSV only: (x, y, line) of every point, so a bounds error names its line
    points: list[tuple[float, float, int]] = field(default_factory=list)


def load_batch_prompts(path: str | Path, entries: Sequence[VideoEntry]) -> dict[str, VideoPrompts]:
    """Parse the prompts file (``.csv`` → CSV, anything else → JSON) and map each video key to its prompts."""
    p = Path(path)
    text = read_prompts_text(p)
    if p.suffix.lower() == ".csv":
        return _parse_csv(p, text, entries)
    return _parse_json(p, text, entries)


def _resolve(name: Any, entries: Sequence[VideoEntry], where: str) -> VideoEntry:
    if not isinstance(name, str) or not name.strip():
        raise PromptError(f"{where}: 'video' must be a non-empty path string, got {name!r}")
    found = match_video(name.strip(), entries)
    if found is None:
        raise PromptError(
            f"{where}: video {name!r} is not among the {len(entries)} input video(s); name it by its "
            f"path relative to the input directory or by its file name"
        )
    if isinstance(found, list):
        raise PromptError(
            f"{where}: video {name!r} matches several inputs ({', '.join(e.key for e in found)}); "
            f"use the path relative to the input directory"
        )
    return found


def _parse_json(p: Path, text: str, entries: Sequence[VideoEntry]) -> dict[str, VideoPrompts]:
    from vostream.apps.prompts import prompts_from_dicts

    name = f"prompts file {str(p)!r}"
    data = loads_json(text, name, PromptError)
    if not isinstance(data, dict) or not isinstance(data.get("videos"), list) or set(data) - {"videos"}:
        raise PromptError(
            f'{name}: expected {{"videos": [{{"video": PATH, "prompts": [...]}}, ...]}} '
            f"(docs/annotate.md); for a spreadsheet use a .csv file"
        )
    out: dict[str, VideoPrompts] = {}
    for i, item in enumerate(data["videos"]):
        where = f"{name}, videos[{i}]"
        if not isinstance(item, dict):
            raise PromptError(f"{where}: expected an object with 'video' and 'prompts'")
        unknown = set(item) - {"video", "prompts"}
        if unknown:
            raise PromptError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: ['prompts', 'video']")
        entry = _resolve(item.get("video"), entries, where)
        where = f"{where} ({item['video']!r})"
        if entry.key in out:
            raise PromptError(
                f"{where}: video {entry.key!r} appears twice; give all its prompts in one entry"
            )
        items = item.get("prompts")
        if not isinstance(items, list) or not items:
            raise PromptError(
                f"{where}: 'prompts' must be a non-empty list of prompt entries (docs/prompts.md)"
            )
        prompts = prompts_from_dicts(items, where, p.parent)
        out[entry.key] = VideoPrompts(entry, prompts, [f"{where}, prompt {j}" for j in range(len(prompts))])
    return out


def _number(value: str, column: str, where: str, integer: bool = False) -> float:
    text = value.strip()
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or (integer and (v != int(v) or v < 0)):
        what = "a non-negative integer" if integer else "a number"
        raise PromptError(f"{where}: {column} {value!r} is not {what}")
    return v


def _parse_csv(p: Path, text: str, entries: Sequence[VideoEntry]) -> dict[str, VideoPrompts]:
    name = f"prompts file {str(p)!r}"
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if header is None:
            raise PromptError(f"{name}: empty CSV; expected the header {','.join(CSV_COLUMNS)}")
        cols = [h.strip().lower() for h in header]
        missing = [c for c in CSV_COLUMNS if c not in cols]
        if missing:
            raise PromptError(
                f"{name}, line 1: CSV header lacks column(s) {missing}; expected {','.join(CSV_COLUMNS)}"
            )
        index = {c: cols.index(c) for c in CSV_COLUMNS}
        groups: dict[tuple[str, int, int], list[tuple[float, float, int, int]]] = {}
        by_key: dict[str, VideoEntry] = {}
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            where = f"{name}, line {line}"
            if len(row) < len(cols):
                raise PromptError(f"{where}: {len(row)} fields, the header has {len(cols)}")
            entry = _resolve(row[index["video"]], entries, where)
            frame = int(_number(row[index["frame"]], "frame", where, integer=True))
            obj = int(_number(row[index["obj_id"]], "obj_id", where, integer=True))
            x = _number(row[index["x"]], "x", where)
            y = _number(row[index["y"]], "y", where)
            label_text = row[index["label"]].strip()
            if label_text not in ("", "0", "1"):
                raise PromptError(f"{where}: label {label_text!r} must be 1 (positive) or 0 (negative)")
            by_key[entry.key] = entry
            groups.setdefault((entry.key, obj, frame), []).append((x, y, 0 if label_text == "0" else 1, line))
    except csv.Error as exc:
        raise PromptError(f"{name}, line {reader.line_num}: invalid CSV: {exc}") from None
    out: dict[str, VideoPrompts] = {}
    for (key, obj, frame), pts in groups.items():
        lines = [ln for *_, ln in pts]
        vp = out.setdefault(key, VideoPrompts(by_key[key]))
        where = f"{name}, line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}"
        try:
            prompt = Prompt(
                obj,
                frame,
                np.asarray([(x, y) for x, y, _, _ in pts], np.float32),
                [lab for _, _, lab, _ in pts],
            )
        except PromptError as exc:
            raise PromptError(f"{where}: {exc}") from None
        vp.prompts.append(prompt)
        vp.where.append(where)
        vp.points += [(x, y, ln) for x, y, _, ln in pts]
    return out


def check_batch_prompts(
    path: str | Path, batch: dict[str, VideoPrompts], sizes: dict[str, tuple[int, int] | None]
) -> None:
    """Check every video's prompts against its frame size (``sizes[key] = (w, h)``; ``None``: not probed, bounds
    skipped) and the prompt-sequence rules.  Raises :class:`PromptError` naming the entry or line."""
    from vostream.apps.prompts import check_prompt_sequence

    name = f"prompts file {str(path)!r}"
    for key, vp in batch.items():
        size = sizes.get(key)
        if size is not None:
            w, h = size
            for x, y, line in vp.points:
                if not (0 <= x < w and 0 <= y < h):
                    raise PromptError(
                        f"{name}, line {line}: point ({x:g}, {y:g}) is outside video {key!r} "
                        f"({w}x{h}: x 0..{w - 1}, y 0..{h - 1})"
                    )
            for prompt, where in zip(vp.prompts, vp.where):
                if isinstance(prompt, Prompt):
                    try:
                        prompt.check_bounds(w, h, f"video {key!r}")
                    except PromptError as exc:
                        raise PromptError(f"{where}: {exc}") from None
        try:
            check_prompt_sequence(vp.prompts)
        except PromptError as exc:
            raise PromptError(f"{name}, video {key!r}: {exc}") from None


__all__ = ["CSV_COLUMNS", "VideoPrompts", "check_batch_prompts", "load_batch_prompts"]
