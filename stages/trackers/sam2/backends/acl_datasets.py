"""Binding device buffers to a loaded ``.om`` graph for one run (:class:`~.acl.AclRuntime`).

Each graph has one input and one output dataset (one data buffer per tensor), built on its first run and then only
*re-pointed* (``acl.update_data_buffer``) where the bound address or size changed -- e.g. the memory encoder's
``maskmem`` output moving to the next bank slot.  A graph with dynamic dims gets the gear of this run's symbol
values set (``acl.mdl.set_input_dynamic_dims``) before every execution.  Both are counted per graph
(:attr:`Datasets.repoints`, :attr:`Datasets.gear_sets`).
"""

from __future__ import annotations

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.backends.acl_api import AclCalls
from vostream.stages.trackers.sam2.backends.acl_models import OmGraph


class Datasets:
    """The datasets of one runtime's graphs: built, re-pointed and geared through ``calls``."""

    def __init__(self, calls: AclCalls) -> None:
        self.calls = calls
        #: graph -> how many data buffers were re-pointed (acl.update_data_buffer) since load
        self.repoints: dict[str, int] = {}
        #: graph -> how many times a dynamic gear was set (acl.mdl.set_input_dynamic_dims)
        self.gear_sets: dict[str, int] = {}

    def loaded(self, name: str) -> None:
        """Start the counters of a graph just loaded."""
        self.repoints[name] = 0
        self.gear_sets[name] = 0

    def bind(self, g: OmGraph, where: str, addrs: dict[tuple[str, int], tuple[int, int]]) -> None:
        """Build the datasets on the first run; afterwards re-point only the data buffers whose window moved."""
        acl = self.calls.acl
        if not g.in_ds:
            self._build(g, where, addrs)
            return
        for kind, buffers, tensors in (
            ("input", g.in_buffers, g.inputs),
            ("output", g.out_buffers, g.outputs),
        ):
            for t, dbuf in zip(tensors, buffers):
                key = (kind, t.index)
                addr, size = addrs[key]
                if g.bound.get(key) == (addr, size):
                    continue
                self.calls.check(
                    acl.update_data_buffer(dbuf, addr, size),
                    where,
                    "acl.update_data_buffer",
                    f"{kind} {t.spec.name!r} -> 0x{addr:x}, {size} bytes",
                )
                g.bound[key] = (addr, size)
                self.repoints[g.spec.name] = self.repoints.get(g.spec.name, 0) + 1

    def _build(self, g: OmGraph, where: str, addrs: dict[tuple[str, int], tuple[int, int]]) -> None:
        """One input and one output dataset, a data buffer per tensor in model order (the gear tensor at its own
        index).  All or nothing: a failure destroys what was created."""
        acl = self.calls.acl
        created: list[int] = []
        datasets: list[int] = []
        in_buffers: list[int] = []
        out_buffers: list[int] = []
        bound: dict[tuple[str, int], tuple[int, int]] = {}
        try:
            for _ in range(2):
                ds = acl.mdl.create_dataset()
                if not ds:
                    raise self.calls.error(where, "acl.mdl.create_dataset", 100000, "returned NULL")
                datasets.append(ds)
            in_ds, out_ds = datasets
            n_in = len(g.inputs) + (1 if g.dyn_index >= 0 else 0)
            for i in range(n_in):
                addr, size = (g.dyn_ptr, g.dyn_size) if i == g.dyn_index else addrs[("input", i)]
                dbuf = self._data_buffer(where, addr, size)
                created.append(dbuf)
                if i != g.dyn_index:
                    in_buffers.append(dbuf)
                    bound[("input", i)] = (addr, size)
                self.calls.pair(
                    acl.mdl.add_dataset_buffer(in_ds, dbuf), where, "acl.mdl.add_dataset_buffer", f"input {i}"
                )
            for t in g.outputs:
                addr, size = addrs[("output", t.index)]
                dbuf = self._data_buffer(where, addr, size)
                created.append(dbuf)
                out_buffers.append(dbuf)
                bound[("output", t.index)] = (addr, size)
                self.calls.pair(
                    acl.mdl.add_dataset_buffer(out_ds, dbuf),
                    where,
                    "acl.mdl.add_dataset_buffer",
                    f"output {t.index}",
                )
        except BaseException:
            for dbuf in created:
                acl.destroy_data_buffer(dbuf)
            for ds in datasets:
                acl.mdl.destroy_dataset(ds)
            raise
        g.in_ds, g.out_ds = in_ds, out_ds
        g.data_buffers, g.in_buffers, g.out_buffers, g.bound = created, in_buffers, out_buffers, bound

    def _data_buffer(self, where: str, addr: int, size: int) -> int:
        dbuf = self.calls.acl.create_data_buffer(addr, size)
        if not dbuf:
            raise self.calls.error(
                where, "acl.create_data_buffer", 100000, f"returned NULL for 0x{addr:x}, {size} bytes"
            )
        return int(dbuf)

    def set_gear(self, g: OmGraph, where: str, syms: dict[str, tuple[int, str]]) -> None:
        """``acl.mdl.set_input_dynamic_dims`` with every input's full shape for this run's symbol values."""
        flat = tuple(int(v) if not isinstance(v, str) else syms[v][0] for t in g.inputs for v in t.spec.shape)
        if flat not in g.gears:
            got = ", ".join(f"{k}={v}" for k, (v, _) in sorted(syms.items()))
            compiled: dict[str, list[int]] = {}
            for values in g.gears.values():
                for k, v in values.items():
                    compiled.setdefault(k, []).append(v)
            have = "; ".join(f"{k} in {sorted(set(v))}" for k, v in sorted(compiled.items()))
            most = max((max(v) for v in compiled.values()), default=0)
            raise BackendError(
                f"{self.calls.owner}.{where}: {got} is not a compiled gear of {g.path.name} ({have}); the .om "
                f"has fixed gears (ATC --dynamic_dims): use at most {most} points per object and frame "
                "(a box counts as two), or recompile with more gears"
            )
        dims = {"name": "", "dimCount": len(flat), "dims": list(flat)}
        self.calls.check(
            self.calls.acl.mdl.set_input_dynamic_dims(g.model_id, g.in_ds, g.dyn_index, dims),
            where,
            "acl.mdl.set_input_dynamic_dims",
            ", ".join(f"{k}={v}" for k, (v, _) in sorted(syms.items())),
        )
        self.gear_sets[g.spec.name] = self.gear_sets.get(g.spec.name, 0) + 1


__all__ = ["Datasets"]
