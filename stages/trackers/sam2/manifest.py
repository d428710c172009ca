"""``manifest.json`` of a vostream SAM-2-family export: what the graphs are and how to drive them.

Written by ``vostream export`` (:mod:`.export`), read by every runtime.  The format is versioned: a reader refuses a
manifest from a newer format with a clear "upgrade vostream" error instead of misreading it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vostream.pipeline.errors import ConfigError

FORMAT = "vostream-sam2-export"
FORMAT_VERSION = 1
FAMILIES = ("sam2", "edgetam", "sam3_tracker")
GRAPHS = ("image_encoder", "memory_attention", "decoder", "memory_encoder")
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output.  ``shape`` entries are ints, or strings for dynamic axes (e.g. ``"K"``)."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(str(d["name"]), tuple(d["shape"]), str(d["dtype"]))


@dataclass(frozen=True)
class GraphSpec:
    """One graph.  ``shrinkable``: input name -> (axis, symbol) where the ONNX file also accepts any size up to the
    manifest's (memory attention's slot and pointer axes): a runtime with dynamic shapes may bind a shorter view
    there, one compiled for static shapes (ATC) uses the manifest's size."""

    name: str
    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    shrinkable: dict[str, tuple[int, str]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, name: str, d: dict[str, Any]) -> GraphSpec:
        shrink = {str(k): (int(v[0]), str(v[1])) for k, v in dict(d.get("shrinkable") or {}).items()}
        return cls(
            name,
            str(d["file"]),
            tuple(TensorSpec.from_json(t) for t in d["inputs"]),
            tuple(TensorSpec.from_json(t) for t in d["outputs"]),
            shrink,
        )

    def with_shrinkable_axes(self) -> GraphSpec:
        """This spec with every shrinkable axis made symbolic (what a dynamic-shape runtime checks against)."""
        if not self.shrinkable:
            return self

        def sym(t: TensorSpec) -> TensorSpec:
            if t.name not in self.shrinkable:
                return t
            axis, symbol = self.shrinkable[t.name]
            shape = list(t.shape)
            shape[axis] = symbol
            return TensorSpec(t.name, tuple(shape), t.dtype)

        return GraphSpec(
            self.name, self.file, tuple(sym(t) for t in self.inputs), self.outputs, self.shrinkable
        )

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)


@dataclass(frozen=True)
class Manifest:
    """Everything a runtime and the streaming session need to know about an export."""

    family: str
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    grid: int  # g: top-level feature grid (S/16, or S/14 for SAM 3)
    hidden_dim: int  # D
    mem_dim: int  # M
    tokens_per_slot: int  # T
    mask_size: int  # P = 4g, low-res mask logits
    cond_slots: int  # C
    recent_slots: int  # N = num_maskmem - 1
    pointer_slots: int  # Q = C + max_object_pointers - 1
    max_object_pointers: int  # 16: pointers are normalised by (this - 1)
    num_maskmem: int  # 7
    algorithm: dict[str, Any]  # multimask rules, stability, binarize policy, ...
    graphs: dict[str, GraphSpec]
    dtype: str = "float32"
    opset: int = 17
    source: dict[str, Any] = field(default_factory=dict)
    verify: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    vostream_version: str = ""

    @property
    def key_slots(self) -> int:
        return self.cond_slots + self.recent_slots

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["format"] = FORMAT
        d["graphs"] = {
            name: {
                "file": g.file,
                "inputs": [asdict(t) for t in g.inputs],
                "outputs": [asdict(t) for t in g.outputs],
                **({"shrinkable": {k: list(v) for k, v in g.shrinkable.items()}} if g.shrinkable else {}),
            }
            for name, g in self.graphs.items()
        }
        return d

    def write(self, out_dir: Path) -> Path:
        path = Path(out_dir) / MANIFEST_NAME
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path


def _rgb(values: Any, key: str) -> tuple[float, float, float]:
    """Three finite numbers (per-channel ``mean``/``std``)."""
    try:
        r, g, b = (float(v) for v in values)
    except (TypeError, ValueError):
        raise ConfigError(f"manifest {key!r} must be three numbers, got {values!r}") from None
    if not all(math.isfinite(v) for v in (r, g, b)):
        raise ConfigError(f"manifest {key!r} must be finite, got {values!r}")
    return r, g, b


#: Valid range of every integer field (inclusive).  Generous (SAM 2.1 large: image 1024, grid 64, D 256, M 64,
#: T 4096, C 2..16, N 6, Q <= 31), but finite: a value outside is a damaged or hand-edited manifest, and would
#: otherwise surface mid-run as a huge allocation or a shape error deep in a runtime.
INT_RANGES: dict[str, tuple[int, int]] = {
    "image_size": (16, 4096),
    "grid": (1, 512),
    "hidden_dim": (1, 8192),
    "mem_dim": (1, 8192),
    "tokens_per_slot": (1, 65536),
    "mask_size": (1, 4096),
    "cond_slots": (1, 64),
    "recent_slots": (0, 64),
    "pointer_slots": (1, 128),
    "max_object_pointers": (1, 128),
    "num_maskmem": (1, 65),
    "opset": (7, 64),
}
#: Most bytes one object's memory bank (``[C + N, T, M]`` float32) may take.
MAX_BANK_BYTES = 2**30
#: ``dtype`` of an INT8 export (``vostream export --int8``): QDQ int8 where quantized, fp32 elsewhere, graph I/O
#: fp32 (so every runtime binds it like an fp32 export)
DTYPE_INT8 = "int8-qdq"
DTYPES = ("float32", "float16", "float16-mixed", DTYPE_INT8)


def _check_fields(d: dict[str, Any], path: Path) -> None:
    """Every integer field is an integer in its :data:`INT_RANGES` range (ConfigError naming the field)."""
    for key, (lo, hi) in INT_RANGES.items():
        if key not in d and key == "opset":
            continue
        value = d.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise ConfigError(
                f"{path}: {key!r} must be an integer in {lo}..{hi}, got {value!r}; the manifest is damaged: "
                f"re-run 'vostream export'"
            )


def _check_manifest(m: Manifest, path: Path, model_dir: Path) -> None:
    """Cross-field rules and graph files that stay inside the model directory."""
    if m.recent_slots != m.num_maskmem - 1:
        raise ConfigError(
            f"{path}: 'recent_slots' ({m.recent_slots}) must be 'num_maskmem' - 1 ({m.num_maskmem - 1})"
        )
    if m.pointer_slots != m.cond_slots + m.max_object_pointers - 1:
        raise ConfigError(
            f"{path}: 'pointer_slots' ({m.pointer_slots}) must be 'cond_slots' + 'max_object_pointers' - 1 "
            f"({m.cond_slots + m.max_object_pointers - 1})"
        )
    bank = m.key_slots * m.tokens_per_slot * m.mem_dim * 4
    if bank > MAX_BANK_BYTES:
        raise ConfigError(
            f"{path}: 'cond_slots' + 'recent_slots' x 'tokens_per_slot' x 'mem_dim' make a {bank / 2**30:.1f} GiB "
            f"memory bank per object (at most {MAX_BANK_BYTES / 2**30:.0f} GiB); the manifest is damaged"
        )
    if m.dtype not in DTYPES:
        raise ConfigError(
            f"{path}: 'dtype' must be one of {', '.join(DTYPES)}, got {m.dtype!r} (an export from a newer "
            "vostream? upgrade vostream)"
        )
    root = model_dir.resolve()
    for name, g in m.graphs.items():
        where = f"{path}: graphs.{name}.file"
        if not g.file or Path(g.file).is_absolute() or ".." in Path(g.file).parts:
            raise ConfigError(
                f"{where} {g.file!r} must be a file name inside the model directory {model_dir}"
            )
        if not (root / g.file).resolve().is_relative_to(root):
            raise ConfigError(
                f"{where} {g.file!r} leads outside the model directory {model_dir} (a symlink?)"
            )
        for t in (*g.inputs, *g.outputs):
            for v in t.shape:
                if isinstance(v, bool) or not (
                    isinstance(v, str) or (isinstance(v, int) and 0 <= v <= 2**31)
                ):
                    raise ConfigError(
                        f"{path}: graphs.{name} tensor {t.name!r} has a bad shape {list(t.shape)!r} "
                        f"(each axis an integer 0..2**31 or a symbol)"
                    )


def load_manifest(model_dir: str | Path) -> Manifest:
    """Read and validate ``model_dir/manifest.json``.  Raises :class:`ConfigError` with a one-line reason."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ConfigError(
            f"model directory {model_dir} not found; run 'vostream export MODEL --out {model_dir}' first"
        )
    path = model_dir / MANIFEST_NAME
    if not path.is_file():
        raise ConfigError(
            f"{model_dir} is not a vostream export: no {MANIFEST_NAME} (make one with "
            f"'vostream export MODEL --out {model_dir}')"
        )
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the manifest: {exc}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise ConfigError(
            f"{path} is not a vostream SAM-2 export manifest (format {d.get('format') if isinstance(d, dict) else None!r})"
        )
    version = d.get("format_version")
    if not isinstance(version, int):
        raise ConfigError(f"{path}: format_version missing or not an integer")
    if version > FORMAT_VERSION:
        raise ConfigError(
            f"{path} was written by vostream {d.get('vostream_version') or '?'} (format {version}); "
            f"this vostream reads format <= {FORMAT_VERSION}: upgrade vostream"
        )
    _check_fields(d, path)
    try:
        graphs = {name: GraphSpec.from_json(name, g) for name, g in d["graphs"].items()}
        m = Manifest(
            family=str(d["family"]),
            image_size=int(d["image_size"]),
            mean=_rgb(d["mean"], "mean"),
            std=_rgb(d["std"], "std"),
            grid=int(d["grid"]),
            hidden_dim=int(d["hidden_dim"]),
            mem_dim=int(d["mem_dim"]),
            tokens_per_slot=int(d["tokens_per_slot"]),
            mask_size=int(d["mask_size"]),
            cond_slots=int(d["cond_slots"]),
            recent_slots=int(d["recent_slots"]),
            pointer_slots=int(d["pointer_slots"]),
            max_object_pointers=int(d["max_object_pointers"]),
            num_maskmem=int(d["num_maskmem"]),
            algorithm=dict(d["algorithm"]),
            graphs=graphs,
            dtype=str(d.get("dtype", "float32")),
            opset=int(d.get("opset", 17)),
            source=dict(d.get("source", {})),
            verify=dict(d.get("verify", {})),
            format_version=version,
            vostream_version=str(d.get("vostream_version", "")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{path}: malformed manifest ({type(exc).__name__}: {exc})") from None
    if m.family not in FAMILIES:
        raise ConfigError(f"{path}: unsupported family {m.family!r}; supported: {', '.join(FAMILIES)}")
    missing = [g for g in GRAPHS if g not in graphs]
    if missing:
        raise ConfigError(f"{path}: graphs missing from the manifest: {', '.join(missing)}")
    _check_manifest(m, path, model_dir)
    return m


__all__ = [
    "DTYPES",
    "DTYPE_INT8",
    "FAMILIES",
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPHS",
    "MANIFEST_NAME",
    "GraphSpec",
    "Manifest",
    "TensorSpec",
    "load_manifest",
]
