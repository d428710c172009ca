"""How much device memory SAM-2 sessions on :class:`~.acl.AclRuntime` will take, against the free HBM.

Per object: the memory bank ``[C+N, T, M]`` and the pointer ring ``[Q, D]``; per session: every scratch tensor the
session allocates (graph I/O other than the bank, pointers and their slot views, the points buffer at
``MAX_POINTS``, one extra mask for the zero mask prompt).  Sizes include the allocation rounding of
:meth:`AclRuntime.alloc <.acl.AclRuntime.alloc>`.
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import TYPE_CHECKING

from vostream.pipeline.errors import ConfigError
from vostream.stages.trackers.sam2.backends.acl_api import IO_ALIGN, align
from vostream.stages.trackers.sam2.runtime import DTYPES, MemoryPlan
from vostream.stages.trackers.sam2.session import MAX_POINTS

if TYPE_CHECKING:
    from vostream.stages.trackers.sam2.manifest import Manifest

#: device memory kept free on top of the plan (runtime workspace, fragmentation)
RESERVE_BYTES = 64 << 20
#: tensors that are per object (bank, pointer ring) or views of them, not session scratch
_PER_OBJECT = {"bank", "ptrs", "maskmem", "obj_ptr"}


def footprint(nbytes: int) -> int:
    """Device bytes one :meth:`AclRuntime.alloc` of ``nbytes`` takes (our 64-byte rounding, then acl.rt.malloc's
    rounding to 32 plus 32 bytes)."""
    return align(max(align(nbytes, IO_ALIGN), IO_ALIGN), 32) + 32


def memory_plan(
    manifest: Manifest,
    objects: int,
    sessions: int,
    reserve_bytes: int,
    mem_info: Callable[[], tuple[int, int]],
) -> MemoryPlan:
    """The plan for ``sessions`` sessions of ``objects`` objects each; ``mem_info()`` gives the device's
    ``(free, total)`` bytes now."""
    bank_spec = manifest.graphs["memory_attention"].input("bank")
    ptr_spec = manifest.graphs["memory_attention"].input("ptrs")
    bank = footprint(
        manifest.key_slots * manifest.tokens_per_slot * manifest.mem_dim * DTYPES[bank_spec.dtype].itemsize
    )
    ptrs = footprint(manifest.pointer_slots * manifest.hidden_dim * DTYPES[ptr_spec.dtype].itemsize)
    scratch: dict[str, int] = {}
    for g in manifest.graphs.values():
        for t in (*g.inputs, *g.outputs):
            if t.name in _PER_OBJECT or t.name in scratch:
                continue
            n = prod(MAX_POINTS if isinstance(d, str) else int(d) for d in t.shape)
            scratch[t.name] = footprint(n * DTYPES[t.dtype].itemsize)
    if "mask_prompt" in scratch:
        scratch["zero_mask"] = scratch["mask_prompt"]
    session_bytes = sum(scratch.values())
    per_object = bank + ptrs
    need = sessions * (session_bytes + objects * per_object) + reserve_bytes
    free, total = mem_info()
    room = free - reserve_bytes - sessions * session_bytes
    max_objects = max(0, room // (sessions * per_object)) if sessions and per_object else 0
    return {
        "objects": objects,
        "sessions": sessions,
        "bank_bytes": bank,
        "pointer_bytes": ptrs,
        "per_object_bytes": per_object,
        "session_scratch_bytes": session_bytes,
        "reserve_bytes": reserve_bytes,
        "need_bytes": need,
        "free_bytes": free,
        "total_bytes": total,
        "max_objects": int(max_objects),
        "fits": need <= free,
    }


def does_not_fit(p: MemoryPlan, device_id: int) -> ConfigError:
    """The :class:`ConfigError` for a plan that does not fit: every number, and what to lower."""
    mib = 1 << 20
    return ConfigError(
        f"acl backend: {p['sessions']} session(s) of {p['objects']} objects need {p['need_bytes']} bytes "
        f"({p['need_bytes'] / mib:.1f} MiB) of device memory but device {device_id} has "
        f"{p['free_bytes']} bytes ({p['free_bytes'] / mib:.1f} MiB) free of {p['total_bytes']}: "
        f"{p['per_object_bytes']} bytes per object (bank {p['bank_bytes']} + pointers {p['pointer_bytes']}), "
        f"{p['session_scratch_bytes']} bytes of scratch per session, {p['reserve_bytes']} bytes reserve; "
        f"at most {p['max_objects']} objects fit: lower max_objects or free device memory"
    )


__all__ = ["RESERVE_BYTES", "does_not_fit", "footprint", "memory_plan"]
