"""The prompts a tracker session has been given but not yet applied: one :class:`PromptBook` per session.

Both tracker sessions (classic and SAM-2) keep their pending prompts here, so the rules about them are written
once: a prompt waits, per object, until the first frame at or after its ``frame_index``; a later prompt for the
same object replaces it, except that a prompt of only negative points is merged into the pending prompt that
starts a new object; and only a known object (tracked, or started by a pending prompt) can take a prompt of only
negative points.  Sans-I/O and not thread-safe, like the session that owns it.
"""

from __future__ import annotations

from collections.abc import Collection

import numpy as np

from vostream.pipeline.errors import PromptError
from vostream.pipeline.types import Prompt


def starts_object(prompt: Prompt) -> bool:
    """True when ``prompt`` can start an object: it has a positive point, a box or a mask (negative points alone
    only correct an object that is already known)."""
    return prompt.box is not None or prompt.mask is not None or bool(np.any(prompt.labels == 1))


class PromptBook:
    """Pending prompts of one session, by object id, in the order the objects were first prompted.

    ``tracked`` arguments are the ids the session tracks already (its per-object state); the book knows only
    the objects that still wait for their first frame.
    """

    def __init__(self) -> None:
        self._pending: dict[int, Prompt] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, obj_id: object) -> bool:
        return obj_id in self._pending

    def object_ids(self, tracked: Collection[int]) -> list[int]:
        """The ``tracked`` ids, then those only pending (a prompt given, no frame tracked yet)."""
        return list(tracked) + [i for i in self._pending if i not in tracked]

    def check(self, prompt: object, tracked: Collection[int]) -> Prompt:
        """``prompt``, checked against the rules every session shares; :class:`PromptError` if it breaks one:
        it is not a :class:`Prompt`, or it has only negative points for an object that is neither tracked nor
        pending.  Checks only: :meth:`add` queues it."""
        if not isinstance(prompt, Prompt):
            raise PromptError(f"add_prompt expects a Prompt, got {type(prompt).__name__}")
        oid = int(prompt.obj_id)
        if not starts_object(prompt) and oid not in tracked and oid not in self._pending:
            raise PromptError(
                f"object {oid}: a prompt with only negative points needs a known object; add a "
                f"positive point, a box or a mask to start object {oid}"
            )
        return prompt

    def add(self, prompt: Prompt, tracked: Collection[int]) -> None:
        """Queue a prompt that passed :meth:`check`: it replaces the object's pending prompt, except that
        negative points for an object that is pending but not tracked yet are added to the prompt that starts it
        (on the later prompt's frame)."""
        oid = int(prompt.obj_id)
        if not starts_object(prompt) and oid in self._pending and oid not in tracked:
            prompt = self._pending[oid].with_points_of(prompt)
        self._pending[oid] = prompt

    def due(self, frame_index: int) -> dict[int, Prompt]:
        """The pending prompts to apply on frame ``frame_index`` (those for it or an earlier frame, which a
        skipped frame makes late), by object.  They stay pending until :meth:`take`: a session checks them all
        before it changes any state."""
        return {oid: p for oid, p in self._pending.items() if p.frame_index <= frame_index}

    def take(self, prompts: Collection[int]) -> None:
        """Drop the pending prompts of the objects ``prompts`` (the :meth:`due` ones, once applied)."""
        for oid in prompts:
            del self._pending[oid]

    def remove(self, obj_id: int, tracked: Collection[int]) -> None:
        """Forget the object's pending prompt; :class:`PromptError` when the object is neither tracked nor
        pending.  The session then drops its own state of the object."""
        oid = int(obj_id)
        if oid not in tracked and oid not in self._pending:
            raise PromptError(
                f"cannot remove object {oid}: it is not tracked (known ids: {self.object_ids(tracked)})"
            )
        self._pending.pop(oid, None)

    def clear(self) -> None:
        """Forget every pending prompt (a reset)."""
        self._pending.clear()


__all__ = ["PromptBook", "starts_object"]
