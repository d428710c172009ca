"""Loading compiled ``.om`` graphs for :class:`~.acl.AclRuntime`: where the files are, their I/O checked against the
manifest, and the decoder's dynamic point count compiled as gears.

Graphs are ``.om`` files compiled by ATC from the export's ONNX graphs: ``<model_dir>/<stem>.om`` (or
``<om_dir>/<stem>.om``), ``stem`` = the manifest's ``file`` without ``.onnx``.  Their I/O (names, order, static dims,
dtypes) is checked against the manifest at load.  The decoder's point count ``K`` is dynamic: ATC compiles it as
gears (``--input_shape "points:1,-1,2;labels:1,-1" --dynamic_dims "1,1;2,2;...;8,8"``, see
:func:`atc_dynamic_options`); the gears are read at load, and a small device buffer is set aside for the model's
``ascend_mbatch_shape_data`` input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import TYPE_CHECKING

from vostream.pipeline.errors import BackendError
from vostream.stages.trackers.sam2.backends.acl_api import (
    ACL_DTYPES,
    ACL_DYNAMIC_TENSOR_NAME,
    ACL_MEM_MALLOC_HUGE_FIRST,
    IO_ALIGN,
    AclCalls,
    align,
)
from vostream.stages.trackers.sam2.backends.binding import fmt_shape
from vostream.stages.trackers.sam2.runtime import DTYPES

if TYPE_CHECKING:
    from vostream.stages.trackers.sam2.manifest import GraphSpec, TensorSpec

#: the decoder's point-count gears the .om is expected to be compiled with (ATC --dynamic_dims)
DECODER_GEARS: tuple[int, ...] = tuple(range(1, 9))


def atc_dynamic_options(spec: GraphSpec, gears: Sequence[int] = DECODER_GEARS) -> dict[str, str]:
    """ATC ``--input_shape`` / ``--dynamic_dims`` values for a graph whose manifest shapes have symbolic axes.

    Every symbolic axis becomes ``-1``; each gear gives every ``-1`` the same value (one symbol, e.g. ``K``), e.g.
    ``{"input_shape": "...;points:1,-1,2;labels:1,-1;...", "dynamic_dims": "1,1;2,2;...;8,8"}``.  Returns ``{}``
    for a fully static graph.  A graph whose ONNX file has dynamic axes the manifest pins (``spec.shrinkable``:
    memory attention's slot and pointer axes) gets just ``input_shape`` with the manifest's static shapes.  (The fake
    ``acl`` takes the same strings through ``fake_acl.model_options``.)"""
    markers = sum(1 for t in spec.inputs for d in t.shape if isinstance(d, str))
    if not markers:
        if spec.shrinkable:
            return {
                "input_shape": ";".join(
                    f"{t.name}:" + ",".join(str(int(d)) for d in t.shape) for t in spec.inputs
                )
            }
        return {}
    symbols = {d for t in spec.inputs for d in t.shape if isinstance(d, str)}
    if len(symbols) != 1:
        raise BackendError(
            f"atc_dynamic_options: graph {spec.name!r} has several dynamic axes {sorted(symbols)}; "
            "only one symbol (the decoder's K) is supported"
        )
    shape = ";".join(
        f"{t.name}:" + ",".join("-1" if isinstance(d, str) else str(d) for d in t.shape) for t in spec.inputs
    )
    dims = ";".join(",".join([str(int(g))] * markers) for g in gears)
    return {"input_shape": shape, "dynamic_dims": dims}


@dataclass
class OmTensor:
    """One model input/output as the .om describes it, matched to its manifest entry."""

    name: str
    index: int
    dims: list[int]
    dtype: str
    size: int
    spec: TensorSpec


@dataclass
class OmGraph:
    """A loaded .om: model id, desc, its tensors, datasets (built on the first run) and what is bound now."""

    spec: GraphSpec
    path: Path
    model_id: int
    desc: int
    inputs: list[OmTensor]
    outputs: list[OmTensor]
    dyn_index: int = -1  # index of ascend_mbatch_shape_data, -1 for a static model
    dyn_ptr: int = 0  # device buffer behind it
    dyn_size: int = 0
    gears: dict[tuple[int, ...], dict[str, int]] = field(default_factory=dict)  # flat dims -> {symbol: value}
    in_ds: int = 0
    out_ds: int = 0
    data_buffers: list[int] = field(default_factory=list)
    in_buffers: list[int] = field(default_factory=list)  # per model input index (real inputs only)
    out_buffers: list[int] = field(default_factory=list)
    bound: dict[tuple[str, int], tuple[int, int]] = field(
        default_factory=dict
    )  # (kind, index) -> (addr, size)


def manifest_name(model_name: str, by_name: Mapping[str, object]) -> str:
    """The manifest tensor a model tensor name refers to: the same name, or (ATC-renamed outputs) a ``node:idx:name``
    / ``name:idx`` form whose last or first ``:`` component is the manifest name."""
    if model_name in by_name:
        return model_name
    parts = model_name.split(":")
    for cand in (parts[-1], parts[0]):
        if cand in by_name:
            return cand
    return model_name


class OmLoader:
    """Loads the ``.om`` of a manifest graph for one runtime (``calls``: its checked pyACL calls; ``om_dir``: where
    the ``.om`` files are, default the export directory).  Every failure is a :class:`BackendError` naming the
    graph, the file and the fix."""

    def __init__(self, calls: AclCalls, om_dir: Path | None = None) -> None:
        self.calls = calls
        self.om_dir = om_dir

    def path(self, spec: GraphSpec, model_dir: Path) -> Path:
        """Where the ``.om`` of ``spec`` is expected: ``<om_dir or model_dir>/<file stem>.om``."""
        stem = spec.file[:-5] if spec.file.endswith(".onnx") else Path(spec.file).stem
        return Path(self.om_dir or model_dir) / f"{stem}.om"

    def load(self, gname: str, spec: GraphSpec, model_dir: Path) -> OmGraph:
        """Load the graph's ``.om``, check its I/O against the manifest, read its dynamic gears."""
        path = self.path(spec, model_dir)
        if not path.is_file():
            hint = ""
            opts = atc_dynamic_options(spec)
            if "dynamic_dims" in opts:
                hint = (
                    f' --input_format=ND --input_shape="{opts["input_shape"]}" '
                    f'--dynamic_dims="{opts["dynamic_dims"]}"'
                )
            elif opts:
                hint = f' --input_shape="{opts["input_shape"]}"'
            raise BackendError(
                f"{self.calls.owner}.load: graph {gname!r}: {path} not found; convert the export with ATC, e.g. "
                f"atc --framework=5 --model={model_dir / spec.file} --output={path.with_suffix('')} "
                f"--soc_version=<Ascend + npu-smi Name>{hint}"
            )
        return self._load_graph(gname, spec, path)

    def _load_graph(self, gname: str, spec: GraphSpec, path: Path) -> OmGraph:
        acl = self.calls.acl
        where = f"load(graph {gname!r}, {path.name})"
        model_id = self.calls.pair(
            acl.mdl.load_from_file(str(path)), where, "acl.mdl.load_from_file", str(path)
        )
        desc = acl.mdl.create_desc()
        if not desc:
            acl.mdl.unload(model_id)
            raise self.calls.error(where, "acl.mdl.create_desc", 100000, "returned a NULL desc")
        g = OmGraph(spec, path, model_id, desc, [], [])
        try:
            self.calls.check(acl.mdl.get_desc(desc, model_id), where, "acl.mdl.get_desc")
            self._read_io(g, where)
            self._check_io(g, where)
            if g.dyn_index >= 0:
                self._read_gears(g, where)
        except BaseException:
            acl.mdl.destroy_desc(desc)
            if g.dyn_ptr:
                acl.rt.free(g.dyn_ptr)
            acl.mdl.unload(model_id)
            raise
        return g

    def _read_io(self, g: OmGraph, where: str) -> None:
        acl = self.calls.acl
        desc = g.desc
        for kind, count_fn, name_fn, dims_fn, type_fn, size_fn, specs, out in (
            (
                "input",
                acl.mdl.get_num_inputs,
                acl.mdl.get_input_name_by_index,
                acl.mdl.get_input_dims,
                acl.mdl.get_input_data_type,
                acl.mdl.get_input_size_by_index,
                g.spec.inputs,
                g.inputs,
            ),
            (
                "output",
                acl.mdl.get_num_outputs,
                acl.mdl.get_output_name_by_index,
                acl.mdl.get_output_dims,
                acl.mdl.get_output_data_type,
                acl.mdl.get_output_size_by_index,
                g.spec.outputs,
                g.outputs,
            ),
        ):
            by_name = {t.name: t for t in specs}
            for i in range(int(count_fn(desc))):
                name = name_fn(desc, i)
                if name is None:
                    raise BackendError(
                        f"{self.calls.owner}.{where}: acl.mdl.get_{kind}_name_by_index({i}) returned None"
                    )
                name = str(name)
                if kind == "input" and name == ACL_DYNAMIC_TENSOR_NAME:
                    g.dyn_index = i
                    continue
                dims_dict = self.calls.pair(
                    dims_fn(desc, i), where, f"acl.mdl.get_{kind}_dims", f"{kind} {i} {name!r}"
                )
                dims = [int(d) for d in dims_dict.get("dims", [])]
                dtype = ACL_DTYPES.get(int(type_fn(desc, i)), f"aclDataType {int(type_fn(desc, i))}")
                spec = by_name.get(manifest_name(name, by_name))
                tensor = OmTensor(name, i, dims, dtype, int(size_fn(desc, i)), spec)  # type: ignore[arg-type]
                out.append(tensor)

    def _check_io(self, g: OmGraph, where: str) -> None:
        """Names and order, dtypes and static dims of the .om against the manifest; ``BackendError`` naming graph,
        tensor and both values on the first difference."""
        pre = f"{self.calls.owner}.{where}"
        for kind, want, got in (("input", g.spec.inputs, g.inputs), ("output", g.spec.outputs, g.outputs)):
            model_names = [t.name for t in got]
            for t in got:
                if t.spec is None:
                    raise BackendError(
                        f"{pre}: model {kind} {t.name!r} is not in the manifest (manifest {kind}s: "
                        f"{', '.join(s.name for s in want)})"
                    )
            matched = [t.spec.name for t in got]
            missing = [s.name for s in want if s.name not in matched]
            if missing:
                raise BackendError(
                    f"{pre}: manifest {kind}(s) {', '.join(map(repr, missing))} not in the model "
                    f"(model {kind}s: {', '.join(model_names) or 'none'})"
                )
            if matched != [s.name for s in want]:
                raise BackendError(
                    f"{pre}: {kind} order differs: manifest {[s.name for s in want]}, model "
                    f"{model_names} (datasets are positional; re-export or reconvert)"
                )
            for t in got:
                s = t.spec
                if t.dtype != s.dtype:
                    raise BackendError(
                        f"{pre}: {kind} {s.name!r} dtype: manifest {s.dtype}, model {t.dtype} (ATC "
                        "may have changed it: keep fp32 I/O, e.g. without --output_type/"
                        "--input_fp16_nodes)"
                    )
                bad = len(t.dims) != len(s.shape)
                for want_d, got_d in zip(s.shape, t.dims):
                    if isinstance(want_d, str):
                        bad |= kind == "input" and got_d != -1  # dynamic inputs must be gears
                    elif got_d not in (-1, want_d):
                        bad = True
                if bad:
                    hint = (
                        " (compile the dynamic axis as gears: ATC --dynamic_dims)"
                        if any(isinstance(d, str) for d in s.shape)
                        else ""
                    )
                    raise BackendError(
                        f"{pre}: {kind} {s.name!r} shape: manifest {fmt_shape(s.shape)}, model "
                        f"{fmt_shape(t.dims)}{hint}"
                    )
                if all(isinstance(d, int) for d in s.shape) and -1 not in t.dims:
                    need = prod(int(d) for d in s.shape) * DTYPES[s.dtype].itemsize
                    if t.size != need:
                        raise BackendError(
                            f"{pre}: {kind} {s.name!r} size: manifest {need} bytes, model {t.size}"
                        )
        if any(isinstance(d, str) for t in g.spec.inputs for d in t.shape) and g.dyn_index < 0:
            raise BackendError(
                f"{pre}: the manifest's inputs have dynamic axes but the model has no "
                f"{ACL_DYNAMIC_TENSOR_NAME} input (compile it with ATC --dynamic_dims)"
            )

    def _read_gears(self, g: OmGraph, where: str) -> None:
        """The compiled ``--dynamic_dims`` gears, each mapped to the manifest's symbols (e.g. ``{"K": 3}``), and the
        device buffer for ``ascend_mbatch_shape_data``."""
        acl = self.calls.acl
        count = self.calls.pair(
            acl.mdl.get_input_dynamic_gear_count(g.desc, -1), where, "acl.mdl.get_input_dynamic_gear_count"
        )
        if not count:
            raise BackendError(
                f"{self.calls.owner}.{where}: the model has an {ACL_DYNAMIC_TENSOR_NAME} input but no "
                "dynamic-dims gears (dynamic batch / image size are not supported; use ATC "
                "--dynamic_dims)"
            )
        gears = self.calls.pair(
            acl.mdl.get_input_dynamic_dims(g.desc, -1, int(count)), where, "acl.mdl.get_input_dynamic_dims"
        )
        for entry in gears:
            flat = tuple(int(d) for d in entry["dims"][: int(entry.get("dimCount", len(entry["dims"])))])
            values: dict[str, int] = {}
            pos = 0
            for t in g.inputs:
                rank = len(t.dims)
                shape = flat[pos : pos + rank]
                pos += rank
                for want, got in zip(t.spec.shape, shape):
                    if isinstance(want, str):
                        values[want] = got
            if pos != len(flat):
                raise BackendError(
                    f"{self.calls.owner}.{where}: gear dims {list(flat)} do not cover the model inputs ({pos} dims)"
                )
            g.gears[flat] = values
        size = int(acl.mdl.get_input_size_by_index(g.desc, g.dyn_index)) or 8
        g.dyn_ptr = self.calls.pair(
            acl.rt.malloc(align(size, IO_ALIGN), ACL_MEM_MALLOC_HUGE_FIRST),
            where,
            "acl.rt.malloc",
            f"{ACL_DYNAMIC_TENSOR_NAME}, {size} bytes",
        )
        g.dyn_size = size
        self.calls.check(
            acl.rt.memset(g.dyn_ptr, align(size, IO_ALIGN), 0, align(size, IO_ALIGN)),
            where,
            "acl.rt.memset",
            ACL_DYNAMIC_TENSOR_NAME,
        )


__all__ = ["DECODER_GEARS", "OmGraph", "OmLoader", "OmTensor", "atc_dynamic_options", "manifest_name"]
