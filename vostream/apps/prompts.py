"""Prompts from files and command lines: parsing and validation.

The prompts file (JSON) schema, documented in ``docs/prompts.md``::

    {"prompts": [
        {"obj": 1, "frame": 0, "points": [[320, 240], [300, 250]], "labels": [1, 0]},
        {"obj": 2, "frame": 0, "box": [10, 20, 110, 140]},
        {"obj": 3, "frame": 12, "mask": "obj3.png"},
        {"obj": 1, "frame": 40, "points": [[330, 200]], "labels": [1]},
        {"obj": 2, "frame": 90, "remove": true}
    ]}

A bare list of entries is accepted too.  Coordinates are source pixels; ``labels`` default to all-positive;
``mask`` is a PNG path (relative to the prompts file) whose non-zero pixels are the object.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vostream.apps.userfiles import loads_json, read_user_file
from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import MAX_OBJECTS, Prompt, check_obj_id
from vostream.stages.trackers.prompting import starts_object

_ENTRY_KEYS = {"obj", "frame", "points", "labels", "box", "mask", "remove"}


def parse_xy(text: str, option: str = "--point") -> tuple[float, float]:
    """``"X,Y"`` -> (x, y)."""
    return tuple(_numbers(text, 2, option))  # type: ignore[return-value]


def parse_box(text: str, option: str = "--box") -> tuple[float, float, float, float]:
    """``"X0,Y0,X1,Y1"`` -> box."""
    return tuple(_numbers(text, 4, option))  # type: ignore[return-value]


def _numbers(text: str, n: int, option: str) -> list[float]:
    parts = [p.strip() for p in str(text).split(",")]
    try:
        vals = [float(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) != n or not all(math.isfinite(v) for v in vals):
        shape = "X,Y" if n == 2 else "X0,Y0,X1,Y1"
        raise PromptError(f"{option} {text!r}: expected {n} comma-separated numbers ({shape})")
    return vals


#: The largest mask image read (an 8K frame is 33 megapixels): a small PNG can declare billions of pixels.
MAX_MASK_PIXELS = 64_000_000


def load_mask_png(path: str | Path) -> np.ndarray:
    """A boolean mask from a PNG (non-zero pixels, any mode)."""
    from PIL import Image, UnidentifiedImageError

    p = Path(path)
    try:
        with warnings.catch_warnings():  # Pillow's warning for a large image: our own check below says it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            im = Image.open(p)  # reads the header only: the size is known before any pixel is decoded
        with im:
            w, h = im.size
            if w * h > MAX_MASK_PIXELS:
                raise PromptError(
                    f"mask prompt {str(p)!r}: {w}x{h} is larger than any video frame (at most "
                    f"{MAX_MASK_PIXELS // 1_000_000} megapixels); give a mask the size of the frame"
                )
            arr = np.asarray(im.convert("L") if im.mode not in ("L", "P", "1", "I", "I;16") else im)
    except FileNotFoundError:
        raise PromptError(f"mask prompt {str(p)!r}: no such file") from None
    except Image.DecompressionBombError:  # Pillow's own limit, checked when the header is read
        raise PromptError(
            f"mask prompt {str(p)!r}: larger than any video frame (at most {MAX_MASK_PIXELS // 1_000_000} "
            "megapixels); give a mask the size of the frame"
        ) from None
    except (UnidentifiedImageError, OSError) as exc:
        raise PromptError(f"mask prompt {str(p)!r}: not a readable image ({exc})") from exc
    mask: np.ndarray = np.asarray(arr.any(axis=2) if arr.ndim == 3 else arr != 0, dtype=bool)
    if not mask.any():
        raise PromptError(f"mask prompt {str(p)!r} is empty (no non-zero pixels)")
    return mask


def _entry_prompt(entry: Any, where: str, base: Path) -> Prompt | Any:
    from vostream.pipeline.types import RemoveObject

    if not isinstance(entry, dict):
        raise PromptError(
            f"{where}: each prompt must be an object with 'obj' and 'frame', got {type(entry).__name__}"
        )
    unknown = set(entry) - _ENTRY_KEYS
    if unknown:
        raise PromptError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(_ENTRY_KEYS)}")
    try:
        obj = check_obj_id(entry.get("obj"), "'obj'")
    except PromptError as exc:
        raise PromptError(f"{where}: {exc}") from None
    frame = entry.get("frame", 0)
    if isinstance(frame, bool) or not isinstance(frame, int) or frame < 0:
        raise PromptError(f"{where}: 'frame' must be a non-negative integer, got {frame!r}")
    if entry.get("remove"):
        if set(entry) - {"obj", "frame", "remove"}:
            raise PromptError(f"{where}: a 'remove' entry takes only 'obj' and 'frame'")
        return RemoveObject(obj, frame)
    points = entry.get("points", [])
    if not isinstance(points, list) or not all(
        isinstance(p, (list, tuple)) and len(p) == 2 and all(_is_num(v) for v in p) for p in points
    ):
        raise PromptError(f"{where}: 'points' must be a list of [x, y] number pairs")
    labels = entry.get("labels", [1] * len(points))
    if not isinstance(labels, list) or len(labels) != len(points) or not all(lab in (0, 1) for lab in labels):
        raise PromptError(f"{where}: 'labels' must be a list of 0/1, one per point ({len(points)})")
    box = entry.get("box")
    if box is not None and (
        not isinstance(box, (list, tuple)) or len(box) != 4 or not all(_is_num(v) for v in box)
    ):
        raise PromptError(f"{where}: 'box' must be [x0, y0, x1, y1]")
    mask = None
    if entry.get("mask") is not None:
        if not isinstance(entry["mask"], str):
            raise PromptError(f"{where}: 'mask' must be a PNG file path")
        try:
            mask = load_mask_png(base / entry["mask"])
        except PromptError as exc:
            raise PromptError(f"{where}: {exc}") from None
    try:
        return Prompt(obj, frame, np.asarray(points, np.float32).reshape(-1, 2), labels, box, mask)
    except PromptError as exc:
        raise PromptError(f"{where}: {exc}") from None


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_prompts_text(path: str | Path) -> str:
    """The text of a prompts file (UTF-8, a BOM tolerated: spreadsheets write one), or a one-line PromptError."""
    p = Path(path)
    raw = read_user_file(p, "prompts file", PromptError)  # a regular file of at most 16 MiB
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PromptError(f"prompts file {str(p)!r}: cannot be read ({exc})") from exc


def load_prompts_file(path: str | Path) -> list[Any]:
    """Parse a prompts JSON file into prompts and remove messages, validated (see the module docstring)."""
    p = Path(path)
    text = read_prompts_text(p)
    data = loads_json(text, f"prompts file {str(p)!r}", PromptError)
    entries = data.get("prompts") if isinstance(data, dict) else data
    if isinstance(data, dict) and set(data) - {"prompts"}:
        raise PromptError(
            f"prompts file {str(p)!r}: unknown top-level key(s) {sorted(set(data) - {'prompts'})}"
        )
    if not isinstance(entries, list) or not entries:
        raise PromptError(f'prompts file {str(p)!r}: expected {{"prompts": [ ... ]}} with at least one entry')
    out = [_entry_prompt(e, f"prompts file {str(p)!r}, entry {i}", p.parent) for i, e in enumerate(entries)]
    return out


def prompts_from_dicts(
    entries: Sequence[dict[str, Any]], where: str = "config", base: Path = Path(".")
) -> list[Any]:
    """Same schema as the prompts file, from already-parsed data (e.g. a TOML config's ``[[prompts]]``)."""
    return [_entry_prompt(e, f"{where}, prompt {i}", base) for i, e in enumerate(entries)]


def check_prompt_sequence(
    messages: Iterable[Any], width: int | None = None, height: int | None = None, source: str = ""
) -> None:
    """Validate a whole schedule before running: every point inside the frame, every object's first prompt
    positive (a point, box or mask), no removal of an object that does not exist at that frame, and at most
    :data:`~vostream.pipeline.types.MAX_OBJECTS` distinct objects in the run."""
    from vostream.pipeline.types import RemoveObject, ResetTracker

    ordered = sorted(enumerate(messages), key=lambda im: (im[1].frame_index, im[0]))
    distinct = {msg.obj_id for _, msg in ordered if isinstance(msg, Prompt)}
    if len(distinct) > MAX_OBJECTS:
        raise PromptError(
            f"{len(distinct)} objects prompted; a run tracks at most {MAX_OBJECTS} (one DAVIS palette label each)"
        )
    alive: set[int] = set()
    for _, msg in ordered:
        if isinstance(msg, Prompt):
            if width is not None and height is not None:
                msg.check_bounds(width, height, source)
            if msg.obj_id not in alive:
                if not starts_object(msg):  # the tracker sessions' rule, checked for the whole schedule
                    raise PromptError(
                        f"object {msg.obj_id}: its first prompt (frame {msg.frame_index}) has only negative points; "
                        "an object must start with a positive point, a box or a mask"
                    )
                alive.add(msg.obj_id)
        elif isinstance(msg, RemoveObject):
            if msg.obj_id not in alive:
                raise PromptError(
                    f"cannot remove object {msg.obj_id} at frame {msg.frame_index}: unknown object id "
                    f"(known then: {sorted(alive) or 'none'})"
                )
            alive.discard(msg.obj_id)
        elif isinstance(msg, ResetTracker):
            alive.clear()


__all__ = [
    "check_prompt_sequence",
    "load_mask_png",
    "load_prompts_file",
    "parse_box",
    "parse_xy",
    "prompts_from_dicts",
]
