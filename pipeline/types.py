"""The data types shared by every stage: :class:`Frame`, :class:`Prompt`, :class:`TrackResult`.

One of each, used from decode to the sinks.  Coordinates in prompts and results are always in *source pixels*
(the decoded frame's width and height); each tracker maps them to its own input size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TypeAlias, TypedDict

import numpy as np
import numpy.typing as npt

from .errors import PromptError

#: Object ids are 1..MAX_OBJ_ID: the DAVIS palette PNG stores one object per label value (0 is background), and
#: every output, tracker and viewer keys on the id.
MAX_OBJ_ID = 255
#: At most this many distinct objects in one run (one palette label each).
MAX_OBJECTS = 255


def check_obj_id(obj_id: object, what: str = "object id") -> int:
    """``obj_id`` as an int if it is an integer in 1..:data:`MAX_OBJ_ID`, else :class:`PromptError`."""
    if isinstance(obj_id, bool) or not isinstance(obj_id, (int, np.integer)):
        raise PromptError(f"{what} must be an integer 1..{MAX_OBJ_ID}, got {obj_id!r}")
    if not 1 <= obj_id <= MAX_OBJ_ID:
        raise PromptError(
            f"{what} {obj_id} is out of range: ids are 1..{MAX_OBJ_ID} (one DAVIS palette label per object, "
            f"0 is the background); renumber the objects"
        )
    return int(obj_id)


@dataclass(eq=False)
class Frame:
    """One decoded frame travelling through the pipeline.

    ``image`` is RGB ``uint8`` (H, W, 3) at source resolution.  Stages add to the same object as it flows:
    ``tensor`` (preprocess: the tracker's input), ``result`` (track, then postprocess: full-size masks).
    ``stamps`` records ``time.monotonic()`` when each stage finished with the frame (used for metrics).
    """

    index: int
    image: np.ndarray
    pts: int | None = None
    time_base: Fraction | None = None
    capture_time: float = 0.0  # wall clock (time.time()) when the frame left the decoder / camera
    source_id: str = ""
    tensor: np.ndarray | None = None
    result: TrackResult | None = None
    stamps: dict[str, float] = field(default_factory=dict)

    @property
    def height(self) -> int:
        return int(self.image.shape[0])

    @property
    def width(self) -> int:
        return int(self.image.shape[1])

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this frame holds (image, tensor, the result's masks and logits): what a queue of
        frames is bounded by (``pipeline/queues.py``)."""
        n = self.image.nbytes
        if self.tensor is not None:
            n += self.tensor.nbytes
        result = self.result
        if result is not None:
            for arr in (result.masks, result.logits):
                if arr is not None:
                    n += arr.nbytes
        return int(n)

    @property
    def time(self) -> float | None:
        """Presentation time in seconds, when the source gave one."""
        if self.pts is None or self.time_base is None:
            return None
        return float(self.pts * self.time_base)


def outside_frame(
    points: np.ndarray | Iterable[Sequence[float]], box: Sequence[float] | None, width: int, height: int
) -> str | None:
    """What lies outside a ``width`` x ``height`` frame (``"point (x, y) is outside ..."``), or ``None``.

    The one bounds rule for prompts wherever they come from (command line, prompts files, the viewer): points
    need ``0 <= x < width`` and ``0 <= y < height``; a box may touch the far edges (``x1 <= width``)."""
    for x, y in points:
        if not (0 <= x < width and 0 <= y < height):
            return (
                f"point ({x:g}, {y:g}) is outside the {width}x{height} frame "
                f"(valid x 0..{width - 1}, y 0..{height - 1})"
            )
    if box is not None:
        x0, y0, x1, y1 = box
        if x0 < 0 or y0 < 0 or x1 > width or y1 > height:
            return f"box ({x0:g}, {y0:g}, {x1:g}, {y1:g}) is outside the {width}x{height} frame"
    return None


#: (K, 2) float32 ``x, y`` in source pixels
Points: TypeAlias = "npt.NDArray[np.float32]"
#: (K,) int32 point labels: 1 positive, 0 negative
Labels: TypeAlias = "npt.NDArray[np.int32]"
#: ``(x0, y0, x1, y1)`` in source pixels (x1, y1 exclusive)
Box: TypeAlias = "tuple[float, float, float, float]"
#: boolean (H, W) at source size
Mask: TypeAlias = "npt.NDArray[np.bool_]"
#: what :class:`Prompt` takes as points: an (K, 2) array or a sequence of ``(x, y)`` pairs
PointsLike: TypeAlias = "np.ndarray | Sequence[Sequence[float]]"
#: what :class:`Prompt` takes as labels: a (K,) array or a sequence of 0/1
LabelsLike: TypeAlias = "np.ndarray | Sequence[int]"
#: what :class:`Prompt` takes as a box: four numbers
BoxLike: TypeAlias = "np.ndarray | Sequence[float]"


def _points(obj_id: int, points: PointsLike) -> Points:
    """``points`` as a (K, 2) float32 array of finite numbers, else :class:`PromptError`."""
    try:
        arr = np.asarray(points, dtype=np.float32)
        pts = arr.reshape(-1, 2) if arr.size else np.zeros((0, 2), np.float32)
    except (TypeError, ValueError):
        raise PromptError(
            f"object {obj_id}: points must be (x, y) pairs of numbers, got {points!r}"
        ) from None
    if not np.all(np.isfinite(pts)):
        raise PromptError(f"object {obj_id}: point coordinates must be finite numbers")
    return pts


def _box(obj_id: int, box: BoxLike) -> Box:
    """``box`` as four finite floats with x1 > x0 and y1 > y0, else :class:`PromptError`."""
    try:
        values = tuple(float(v) for v in box)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 4 or not all(math.isfinite(v) for v in values):
        raise PromptError(f"object {obj_id}: a box is four finite numbers x0,y0,x1,y1")
    x0, y0, x1, y1 = values
    if x1 <= x0 or y1 <= y0:
        raise PromptError(f"object {obj_id}: box {values} is empty (need x1 > x0 and y1 > y0)")
    return x0, y0, x1, y1


def _mask(obj_id: int, mask: np.ndarray) -> Mask:
    """``mask`` as a non-empty boolean 2-D array, else :class:`PromptError`."""
    m = np.asarray(mask)
    if m.ndim != 2:
        raise PromptError(f"object {obj_id}: a mask prompt must be 2-D, got shape {m.shape}")
    m = m.astype(bool)
    if not m.any():
        raise PromptError(f"object {obj_id}: the mask prompt is empty")
    return m


@dataclass(frozen=True, eq=False, init=False)
class Prompt:
    """Points, a box and/or a mask for one object on one frame, checked and normalised once, at construction.

    ``points`` is (K, 2) float32 ``x, y`` in source pixels; ``labels`` (K,) int32: 1 positive, 0 negative.
    ``box`` is ``(x0, y0, x1, y1)`` in source pixels with ``x1 > x0`` and ``y1 > y0``.  ``mask`` is a non-empty
    boolean (H, W) array at source size.  ``obj_id`` is 1..:data:`MAX_OBJ_ID`, ``frame_index`` >= 0.

    The constructor also takes points as any sequence of ``(x, y)`` pairs, labels as a sequence of ints, the box as
    any four numbers and a mask of any dtype (non-zero = object); a prompt it cannot normalise is a
    :class:`PromptError`.  Every entry point builds a ``Prompt``, so a tracker, sink or app that receives one
    needs no checks of its own beyond the frame bounds (:meth:`check_bounds`, which needs the frame size).
    """

    obj_id: int
    frame_index: int
    points: Points
    labels: Labels
    box: Box | None
    mask: Mask | None

    def __init__(
        self,
        obj_id: int,
        frame_index: int = 0,
        points: PointsLike = (),
        labels: LabelsLike = (),
        box: BoxLike | None = None,
        mask: np.ndarray | None = None,
    ) -> None:
        check_obj_id(obj_id)
        if isinstance(frame_index, bool) or not isinstance(frame_index, (int, np.integer)) or frame_index < 0:
            raise PromptError(f"frame index must be a non-negative integer, got {frame_index!r}")
        pts = _points(obj_id, points)
        labs = np.asarray(labels, dtype=np.int32).reshape(-1)
        if len(labs) != len(pts):
            raise PromptError(f"object {obj_id}: {len(pts)} points but {len(labs)} labels")
        if np.any((labs != 0) & (labs != 1)):
            raise PromptError(f"object {obj_id}: point labels must be 1 (positive) or 0 (negative)")
        norm_box = None if box is None else _box(obj_id, box)
        norm_mask = None if mask is None else _mask(obj_id, mask)
        if len(pts) == 0 and norm_box is None and norm_mask is None:
            # negative points alone are fine as a correction of an existing object; the tracker checks that
            raise PromptError(f"object {obj_id}: a prompt needs at least one point, a box or a mask")
        object.__setattr__(self, "obj_id", int(obj_id))
        object.__setattr__(self, "frame_index", int(frame_index))
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "labels", labs)
        object.__setattr__(self, "box", norm_box)
        object.__setattr__(self, "mask", norm_mask)

    @property
    def positive_points(self) -> Points:
        return self.points[self.labels == 1]

    @property
    def negative_points(self) -> Points:
        return self.points[self.labels == 0]

    def check_bounds(self, width: int, height: int, source: str = "") -> None:
        """Raise :class:`PromptError` if a point or box lies outside a ``width`` x ``height`` frame."""
        where = f" of {source}" if source else ""
        problem = outside_frame(self.points, self.box, width, height)
        if problem is not None:
            raise PromptError(f"object {self.obj_id}: {problem}{where}")
        if self.mask is not None and self.mask.shape != (height, width):
            raise PromptError(
                f"object {self.obj_id}: mask prompt is {self.mask.shape[1]}x{self.mask.shape[0]} but the frame{where} "
                f"is {width}x{height}"
            )

    def with_points_of(self, other: Prompt) -> Prompt:
        """This prompt's box and mask with ``other``'s points appended, on ``other``'s frame (negative clicks
        added to the prompt that starts an object)."""
        return Prompt(
            self.obj_id,
            other.frame_index,
            np.concatenate([self.points, other.points]),
            np.concatenate([self.labels, other.labels]),
            self.box,
            self.mask,
        )

    def scaled(self, sx: float, sy: float, size: tuple[int, int] | None = None) -> Prompt:
        """This prompt with coordinates multiplied by (sx, sy); a mask is resized to ``size`` = (w, h)."""
        import cv2

        pts = self.points * np.array([sx, sy], np.float32)
        box = (
            None
            if self.box is None
            else (self.box[0] * sx, self.box[1] * sy, self.box[2] * sx, self.box[3] * sy)
        )
        mask = self.mask
        if mask is not None and size is not None:
            mask = cv2.resize(mask.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST).astype(bool)
            if not mask.any():  # a tiny mask can vanish when shrunk: keep its centre pixel
                ys, xs = np.nonzero(np.asarray(self.mask))
                mask[min(int(ys.mean() * sy), size[1] - 1), min(int(xs.mean() * sx), size[0] - 1)] = True
        return Prompt(self.obj_id, self.frame_index, pts, self.labels, box, mask)


class Rle(TypedDict):
    """COCO run-length encoding of one mask: ``size`` ``[h, w]`` and the compressed ``counts`` string."""

    size: list[int]
    counts: str


def _empty_masks(h: int, w: int) -> np.ndarray:
    return np.zeros((0, h, w), dtype=bool)


@dataclass(eq=False)
class TrackResult:
    """Per-frame tracking output: parallel arrays, one row per object.

    ``masks`` are boolean (N, H, W) at source size once postprocess has run; a tracker may instead fill
    ``logits`` (N, h, w) float32 at its own resolution (> 0 means foreground) and leave ``masks`` None.
    ``boxes`` are (N, 4) float32 ``x0, y0, x1, y1`` in source pixels (exclusive x1/y1); a row whose object is
    absent has ``present`` False, an all-false mask and a zero box.
    """

    frame_index: int
    obj_ids: np.ndarray
    scores: np.ndarray
    present: np.ndarray
    boxes: np.ndarray
    masks: np.ndarray | None = None
    logits: np.ndarray | None = None
    rles: list[Rle] | None = None

    def __post_init__(self) -> None:
        self.obj_ids = np.asarray(self.obj_ids, dtype=np.int64).reshape(-1)
        n = len(self.obj_ids)
        self.scores = np.asarray(self.scores, dtype=np.float32).reshape(-1)
        self.present = np.asarray(self.present, dtype=bool).reshape(-1)
        self.boxes = np.asarray(self.boxes, dtype=np.float32).reshape(-1, 4)
        for name in ("scores", "present", "boxes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrackResult.{name} has {len(getattr(self, name))} rows, expected {n}")
        for name in ("masks", "logits"):
            arr = getattr(self, name)
            if arr is not None and (arr.ndim != 3 or len(arr) != n):
                raise ValueError(f"TrackResult.{name} must be (N, H, W) with N={n}, got {arr.shape}")
        if self.rles is not None and len(self.rles) != n:
            raise ValueError(f"TrackResult.rles has {len(self.rles)} entries, expected {n}")

    def __len__(self) -> int:
        return len(self.obj_ids)

    @classmethod
    def empty(cls, frame_index: int, height: int = 0, width: int = 0) -> TrackResult:
        return cls(
            frame_index,
            np.zeros(0, np.int64),
            np.zeros(0, np.float32),
            np.zeros(0, bool),
            np.zeros((0, 4), np.float32),
            masks=_empty_masks(height, width),
        )

    def __getitem__(self, index: npt.ArrayLike) -> TrackResult:
        """Boolean or integer-array slicing of every parallel array: ``result[result.present]``."""
        idx = np.asarray(index)
        if idx.dtype == bool:
            if idx.shape != (len(self),):
                raise IndexError(f"boolean index of shape {idx.shape} for {len(self)} objects")
            idx = np.flatnonzero(idx)
        idx = idx.reshape(-1).astype(np.int64)
        return TrackResult(
            self.frame_index,
            self.obj_ids[idx],
            self.scores[idx],
            self.present[idx],
            self.boxes[idx],
            None if self.masks is None else self.masks[idx],
            None if self.logits is None else self.logits[idx],
            None if self.rles is None else [self.rles[i] for i in idx],
        )

    def index_of(self, obj_id: int) -> int:
        hits = np.nonzero(self.obj_ids == obj_id)[0]
        if not len(hits):
            raise KeyError(obj_id)
        return int(hits[0])

    def label_map(self) -> np.ndarray:
        """(H, W) uint8 map where each pixel holds the object id that covers it (0 = background).

        Object ids must be 1..255 for this representation (DAVIS convention); where masks overlap, the object
        listed later wins.
        """
        if self.masks is None:
            raise ValueError("label_map needs full-size masks; run postprocess first")
        h, w = self.masks.shape[1:]
        out = np.zeros((h, w), np.uint8)
        for oid, m, p in zip(self.obj_ids, self.masks, self.present):
            if p:
                if not 0 < oid < 256:
                    raise ValueError(f"object id {oid} does not fit a palette PNG (1..255)")
                out[m] = oid
        return out

    def to_rles(self) -> list[Rle]:
        """COCO RLE (compressed ``counts`` as str, the same string pycocotools makes) for each row's mask; cached
        in ``rles``.  See :func:`rle_counts`."""
        if self.rles is None:
            if self.masks is None:
                raise ValueError("to_rles needs full-size masks; run postprocess first")
            h, w = self.masks.shape[1:]
            self.rles = [{"size": [int(h), int(w)], "counts": rle_counts(m)} for m in self.masks]
        return self.rles


def rle_counts(mask: np.ndarray) -> str:
    """The compressed COCO RLE ``counts`` string of a boolean (H, W) mask: exactly what pycocotools'
    ``encode`` makes, in less time for a mask that fills a small part of the frame.

    pycocotools needs the whole mask in column-major order (a transposing copy of the frame: about 0.55 ms of
    the 0.85 ms it takes for one 1280x720 mask).  Here the runs are found inside the mask's bounding box only
    and pycocotools compresses them (about 0.2 ms for a 20,000-pixel object at 720p).  A mask whose box covers
    more than a quarter of the frame goes the whole-frame way, which is then the faster one."""
    from pycocotools import mask as mask_utils

    h, w = mask.shape
    rows = np.flatnonzero(mask.any(axis=1))
    if not len(rows):
        return str(
            mask_utils.frPyObjects({"size": [h, w], "counts": [h * w]}, h, w)["counts"].decode("ascii")
        )
    cols = np.flatnonzero(mask.any(axis=0))
    y0, y1, x0, x1 = int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1
    if 4 * (y1 - y0) * (x1 - x0) > h * w:
        full = mask_utils.encode(_column_major(mask[None]))[0]
        return str(full["counts"].decode("ascii"))
    # column-major runs inside the box: a zero above and below each column, then the changes along it
    crop = mask[y0:y1, x0:x1].T
    padded = np.zeros((crop.shape[0], crop.shape[1] + 2), np.int8)
    padded[:, 1:-1] = crop
    cx, cy = np.nonzero(np.diff(padded, axis=1))
    pos = (cx + x0) * h + (cy + y0)  # where each run starts or ends, as an index into the column-major frame
    # a run reaching the bottom of one column and going on at the top of the next is one run
    joined = np.flatnonzero(pos[1:] == pos[:-1])
    if len(joined):
        keep = np.ones(len(pos), bool)
        keep[joined] = keep[joined + 1] = False
        pos = pos[keep]
    end = [] if pos[-1] == h * w else [h * w]
    counts = np.diff(np.concatenate(([0], pos, end)))
    rle = mask_utils.frPyObjects({"size": [h, w], "counts": counts.tolist()}, h, w)
    return str(rle["counts"].decode("ascii"))


def _column_major(masks: np.ndarray) -> np.ndarray:
    """(H, W, N) uint8 Fortran-ordered copy of (N, H, W) masks, as pycocotools' encoder wants them: each mask
    transposed by OpenCV (about 10x faster than NumPy's strided copy of a transposed view; the GIL is released)."""
    import cv2

    n, h, w = masks.shape
    if not (h and w):
        return np.zeros((h, w, n), np.uint8, order="F")
    if masks.dtype != np.bool_ and masks.dtype != np.uint8:
        masks = masks != 0
    cols = np.empty((n, w, h), np.uint8)
    for i in range(n):
        cv2.transpose(masks[i].view(np.uint8), dst=cols[i])
    return cols.transpose(2, 1, 0)


def boxes_from_masks(masks: np.ndarray) -> np.ndarray:
    """(N, 4) float32 x0, y0, x1, y1 (exclusive) boxes of boolean (N, H, W) masks; zeros for empty masks."""
    out = np.zeros((len(masks), 4), np.float32)
    for i, m in enumerate(masks):
        rows = np.flatnonzero(m.any(axis=1))
        if not len(rows):
            continue
        cols = np.flatnonzero(m.any(axis=0))
        out[i] = (cols[0], rows[0], cols[-1] + 1, rows[-1] + 1)
    return out


# -- control messages (Pipeline.send_control → the track stage) ----------------------------------------------


@dataclass(frozen=True)
class RemoveObject:
    """Control message: forget object ``obj_id`` (1..:data:`MAX_OBJ_ID`) from frame ``frame_index`` on."""

    obj_id: int
    frame_index: int = 0

    def __post_init__(self) -> None:
        check_obj_id(self.obj_id)


@dataclass(frozen=True)
class ResetTracker:
    """Control message: forget every object from frame ``frame_index`` on."""

    frame_index: int = 0


#: what the track stage accepts besides frames: a prompt, or one of the two messages above
Control = Prompt | RemoveObject | ResetTracker


__all__ = [
    "Control",
    "Frame",
    "MAX_OBJECTS",
    "MAX_OBJ_ID",
    "Prompt",
    "RemoveObject",
    "ResetTracker",
    "Rle",
    "TrackResult",
    "boxes_from_masks",
    "rle_counts",
    "check_obj_id",
    "outside_frame",
]
