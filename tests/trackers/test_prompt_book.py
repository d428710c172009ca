"""The pending-prompt bookkeeping both tracker sessions share (``vostream.stages.trackers.prompting``), with plain
calls: no tracker, no frames."""

from __future__ import annotations

import numpy as np
import pytest

from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Prompt
from vostream.stages.trackers.prompting import PromptBook, starts_object


def pos(oid: int, frame: int = 0, xy: tuple[float, float] = (5.0, 5.0)) -> Prompt:
    return Prompt(oid, frame, [xy], [1])


def neg(oid: int, frame: int = 0, xy: tuple[float, float] = (7.0, 7.0)) -> Prompt:
    return Prompt(oid, frame, [xy], [0])


def put(book: PromptBook, prompt: Prompt, tracked: set[int] | None = None) -> None:
    tracked = tracked or set()
    book.add(book.check(prompt, tracked), tracked)


def test_what_starts_an_object() -> None:
    assert starts_object(pos(1))
    assert starts_object(Prompt(1, 0, [[1, 1], [2, 2]], [0, 1]))
    assert starts_object(Prompt(1, 0, box=(0, 0, 4, 4)))
    assert starts_object(Prompt(1, 0, [[1, 1]], [0], box=(0, 0, 4, 4)))
    assert starts_object(Prompt(1, 0, mask=np.ones((3, 3), bool)))
    assert not starts_object(neg(1))
    assert not starts_object(Prompt(1, 0, [[1, 1], [2, 2]], [0, 0]))


def test_negative_points_alone_need_a_known_object() -> None:
    book = PromptBook()
    with pytest.raises(
        PromptError, match="object 3: a prompt with only negative points needs a known object"
    ):
        book.check(neg(3), tracked=set())
    assert len(book) == 0 and book.object_ids(set()) == []
    assert book.check(neg(3), tracked={3}) is not None  # a tracked object takes a correction
    put(book, pos(4))
    assert book.check(neg(4), tracked=set()) is not None  # ... and so does one that a pending prompt starts
    with pytest.raises(PromptError, match="add_prompt expects a Prompt, got dict"):
        book.check({"obj": 1}, tracked=set())


def test_negatives_merge_into_the_prompt_that_starts_an_object() -> None:
    book = PromptBook()
    put(book, Prompt(2, 0, box=(0, 0, 9, 9)))
    put(book, neg(2, frame=1, xy=(3, 4)))
    (merged,) = book.due(1).values()
    assert merged.box == (0.0, 0.0, 9.0, 9.0)
    assert merged.points.tolist() == [[3.0, 4.0]] and merged.labels.tolist() == [0]
    assert merged.frame_index == 1  # on the later prompt's frame
    put(book, neg(2, frame=1, xy=(6, 6)))
    assert book.due(1)[2].labels.tolist() == [0, 0]  # every negative click is kept


def test_a_later_prompt_replaces_the_pending_one() -> None:
    book = PromptBook()
    put(book, pos(1, xy=(1, 1)))
    put(book, pos(2))
    put(book, pos(1, xy=(8, 8)))  # a second positive prompt replaces, it does not merge
    assert book.object_ids(set()) == [1, 2]  # the order the objects were first prompted in
    assert book.due(0)[1].points.tolist() == [[8.0, 8.0]]
    put(book, neg(5), tracked={5})  # a correction of a tracked object replaces too: nothing to merge into
    put(book, neg(5, xy=(2, 2)), tracked={5})
    assert book.due(0)[5].points.tolist() == [[2.0, 2.0]]


def test_prompts_wait_for_their_frame_and_stay_until_taken() -> None:
    book = PromptBook()
    put(book, pos(1, frame=2))
    put(book, pos(2, frame=5))
    assert book.due(1) == {}
    due = book.due(3)  # frame 2 was skipped: its prompt is late, not lost
    assert list(due) == [1]
    assert 1 in book and len(book) == 2  # checked first, taken once applied
    book.take(due)
    assert 1 not in book and list(book.due(9)) == [2]
    assert book.object_ids({1}) == [1, 2]


def test_remove_and_clear() -> None:
    book = PromptBook()
    put(book, pos(1))
    put(book, pos(2))
    with pytest.raises(
        PromptError, match=r"cannot remove object 9: it is not tracked \(known ids: \[7, 1, 2\]\)"
    ):
        book.remove(9, tracked={7})
    book.remove(7, tracked={7})  # tracked only: nothing pending to forget, no error
    book.remove(1, tracked=set())
    assert book.object_ids(set()) == [2]
    with pytest.raises(PromptError, match="cannot remove object 1"):
        book.remove(1, tracked=set())
    book.clear()
    assert len(book) == 0 and book.due(100) == {}
