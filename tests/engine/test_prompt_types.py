"""``Prompt`` normalises and checks its fields once, at construction (``pipeline/types.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Prompt


def test_fields_are_normalised_from_any_accepted_input() -> None:
    p = Prompt(3, 2, [(10, 20), (30.5, 40)], [1, 0], box=[1, 2, 5, 6], mask=np.eye(4, dtype=np.uint8))
    assert p.points.dtype == np.float32 and p.points.shape == (2, 2)
    assert p.points.tolist() == [[10.0, 20.0], [30.5, 40.0]]
    assert p.labels.dtype == np.int32 and p.labels.tolist() == [1, 0]
    assert p.box == (1.0, 2.0, 5.0, 6.0) and all(type(v) is float for v in p.box)
    assert p.mask is not None and p.mask.dtype == bool and int(p.mask.sum()) == 4
    assert (type(p.obj_id), type(p.frame_index)) == (int, int)
    q = Prompt(np.int64(4), np.int32(1), box=np.array([0, 0, 2, 2]))
    assert (type(q.obj_id), type(q.frame_index)) == (int, int)
    assert q.points.shape == (0, 2) and q.labels.shape == (0,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"points": [[1, 2, 3]], "labels": [1]}, "points must be"),
        ({"points": [["a", "b"]], "labels": [1]}, "points must be"),
        ({"points": [[1, np.nan]], "labels": [1]}, "finite"),
        ({"points": [[1, 2]], "labels": [1, 1]}, "1 points but 2 labels"),
        ({"points": [[1, 2]], "labels": [2]}, "labels must be 1"),
        ({"box": (1, 2, 3)}, "four finite numbers"),
        ({"box": "abcd"}, "four finite numbers"),
        ({"box": (5, 2, 3, 4)}, "is empty"),
        ({"mask": np.zeros((4, 4), bool)}, "mask prompt is empty"),
        ({"mask": np.ones((2, 4, 4), bool)}, "must be 2-D"),
        ({}, "needs at least one point"),
    ],
)
def test_a_prompt_it_cannot_normalise_is_a_prompt_error(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PromptError, match=message):
        Prompt(1, 0, **kwargs)  # type: ignore[arg-type]


def test_ids_and_frame_are_checked() -> None:
    with pytest.raises(PromptError, match="out of range"):
        Prompt(0, 0, [[1, 2]], [1])
    with pytest.raises(PromptError, match="frame index"):
        Prompt(1, -1, [[1, 2]], [1])
    with pytest.raises(PromptError, match="frame index"):
        Prompt(1, True, [[1, 2]], [1])


def test_prompt_is_frozen_and_derived_prompts_stay_normalised() -> None:
    p = Prompt(1, 0, [[2, 4]], [1], box=(0, 0, 8, 8))
    with pytest.raises(AttributeError):
        p.obj_id = 2  # type: ignore[misc]
    s = p.scaled(0.5, 0.5)
    assert s.points.tolist() == [[1.0, 2.0]] and s.box == (0.0, 0.0, 4.0, 4.0)
    m = p.with_points_of(Prompt(1, 3, [[5, 5]], [0]))
    assert m.frame_index == 3 and m.labels.tolist() == [1, 0] and m.box == p.box
