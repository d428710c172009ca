"""ONNX export -> Ascend ``.om`` models: the ATC command lines, a conversion script, and (where ``atc`` exists) the run.

Why a separate step: ``vostream export`` runs anywhere (CPU, no CANN); ATC runs only where the CANN toolkit is
installed, usually the Ascend host itself.  So the export directory always gets ``atc_convert.sh`` (paths relative to
the directory, so it can be copied), plus one ``<graph>.keep_dtype.cfg`` per graph for the mixed-precision build;
``convert_export`` runs the commands when ``atc`` is on ``PATH`` (or when asked to).

Choices, from ``shared/reference/ascend-acl.md`` §6 and the CANN ATC parameter pages:

* ``--framework=5`` (ONNX), ``--soc_version`` = "Ascend" + the ``Name`` column of ``npu-smi info`` (the .om only runs
  on that SoC), ``--input_shape`` with every input's static shape from the manifest, ``--log=error``.
* The decoder's ``points`` [1,K,2] / ``labels`` [1,K] become ``-1`` in ``--input_shape`` plus ``--dynamic_dims`` with
  one gear per allowed K (``"1,1;2,2;...;8,8"``: one value per ``-1`` across all inputs), which needs
  ``--input_format=ND``; 2..100 gears are allowed.  A single gear is compiled as a static shape instead.
* Precision ``fp16-mixed`` (default): ``--precision_mode_v2=fp16`` (fp16 wherever an operator supports both) plus
  ``--keep_dtype=<graph>.keep_dtype.cfg`` listing, by ONNX node name, every LayerNormalization and Softmax (all
  graphs), the memory encoder's Sigmoid and threshold (Greater) nodes, and the Casts that round through bfloat16.
  ``--keep_dtype`` is documented to work with ``--precision_mode_v2`` except when it is ``origin``; node names are
  the original model's operator names (OpType lines would need Ascend-IR type names, which we do not guess).
  ``fp32``: ``--precision_mode_v2=origin`` (keep the graph's fp32 everywhere; slower).
* CANN versions: ``--precision_mode_v2`` is documented from CANN 6.2.RC2; ONNX opset 17 is documented as accepted
  by CANN 7.0.0 (opsets 9-18) and 9.x (11-18), but the 8.0.RC1 page lists only 11-15 and 6.0.1 only 11.

Nothing here needs CANN, torch or a device; reading node names needs the ``onnx`` package.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypedDict, cast

from vostream.pipeline.errors import BackendError, ConfigError
from vostream.stages.trackers.sam2.manifest import DTYPE_INT8, GraphSpec, Manifest, load_manifest

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_SOC = "Ascend910B3"
DEFAULT_K_GEARS: tuple[int, ...] = tuple(range(1, 9))
PRECISIONS = ("fp16-mixed", "fp32")
SCRIPT_NAME = "atc_convert.sh"
RECORD_NAME = "atc_convert.json"
KEEP_DTYPE_SUFFIX = ".keep_dtype.cfg"
#: INT8 for Ascend (an export made with ``--int8 CLIP --om``): the fp32 graphs, the calibration data and AMCT's
#: output live under this directory of the export
AMCT_DIR = "amct"
AMCT_RECORD = "calibration.json"
#: AMCT writes ``<save_path>_deploy_model.onnx`` (for ATC) and ``<save_path>_fake_quant_model.onnx`` (for ORT)
AMCT_DEPLOY_SUFFIX = "_deploy_model.onnx"
#: at most this many calibration runs per graph go to AMCT (evenly spaced over the recorded ones)
AMCT_MAX_BATCHES = 16
MAX_GEARS = 100  # ATC: --dynamic_dims takes 2..100 gears

#: SoC names ATC accepts for the products we target (``--soc_version``; "Ascend" + ``npu-smi info`` Name).
KNOWN_SOCS: dict[str, str] = {
    **{f"Ascend910B{v}": "Atlas A2 (Atlas 800T/800I A2, 910B)" for v in ("1", "2", "2C", "3", "4", "4-1")},
    **{f"Ascend910_93{v}": "Atlas A3 (910C)" for v in ("91", "92", "81", "82", "72", "62")},
    "Ascend310P1": "Atlas inference series (310P)",
    "Ascend310P3": "Atlas inference series (310P, e.g. Atlas 300I Pro)",
}

#: ONNX opsets each CANN release's ATC documentation says it parses (reference §6).  Other releases: not documented
#: in what we read; ATC itself reports an opset it cannot parse.
DOCUMENTED_OPSETS: dict[str, tuple[int, int]] = {
    "6.0": (11, 11),
    "7.0": (9, 18),
    "8.0.RC1": (11, 15),
    "9": (11, 18),
}
#: no documented release accepts opsets outside this range
OPSET_RANGE = (9, 18)

#: op types kept at the graph's precision in every graph / additionally per graph (fp16-mixed)
KEEP_OPS_ALL: tuple[str, ...] = ("LayerNormalization", "Softmax")
KEEP_OPS_GRAPH: dict[str, tuple[str, ...]] = {"memory_encoder": ("Sigmoid", "Greater")}
_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16

CANN_VERSION_NOTE = (
    "CANN: ONNX opset {opset} graphs need an ATC that parses opset {opset} (documented: CANN 7.0.0 opsets 9-18, "
    "9.x 11-18; the 8.0.RC1 page lists only 11-15, 6.0.1 only 11); --precision_mode_v2 needs CANN >= 6.2.RC2; "
    "--dynamic_dims needs --input_format=ND and 2..100 gears."
)


# ------------------------------------------------------------------------------------------------ validation
def check_soc(soc_version: str, allow_unknown: bool = False) -> str:
    """Return ``soc_version`` if it is a known ATC SoC name; ``ConfigError`` otherwise (unless ``allow_unknown``)."""
    soc = str(soc_version).strip()
    if not soc:
        raise ConfigError(
            "--soc-version is empty; use the 'Ascend' + Name column of npu-smi info, e.g. Ascend910B3"
        )
    if soc in KNOWN_SOCS or allow_unknown:
        return soc
    near = [s for s in KNOWN_SOCS if s.lower() == soc.lower()]
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise ConfigError(
        f"unknown --soc-version {soc!r}{hint}; known: {', '.join(KNOWN_SOCS)}. It must be 'Ascend' + "
        "the Name column of 'npu-smi info' on the inference host (pass allow_unknown_soc=True to use "
        "another one)"
    )


def check_gears(k_gears: Iterable[int]) -> tuple[int, ...]:
    """Sorted unique positive gears, at most ``MAX_GEARS``; ``ConfigError`` otherwise."""
    try:
        gears = tuple(sorted({int(k) for k in k_gears}))
    except (TypeError, ValueError):
        raise ConfigError(f"K gears must be integers, got {k_gears!r}") from None
    if not gears or gears[0] < 1:
        raise ConfigError(f"K gears must be >= 1 (points per object per frame), got {list(gears)}")
    if len(gears) > MAX_GEARS:
        raise ConfigError(f"ATC --dynamic_dims allows at most {MAX_GEARS} gears, got {len(gears)}")
    return gears


def documented_opsets(cann_version: str | None) -> tuple[int, int] | None:
    """The ONNX opset range the ATC docs of ``cann_version`` (e.g. ``"8.0.RC1"``) state, or None if not known."""
    if not cann_version:
        return None
    v = cann_version.strip()
    for key in sorted(DOCUMENTED_OPSETS, key=len, reverse=True):
        if v == key or v.startswith(key + ".") or (key.isdigit() and v.split(".")[0] == key):
            return DOCUMENTED_OPSETS[key]
    return None


def check_opset(opset: int, cann_version: str | None = None) -> list[str]:
    """``ConfigError`` if no documented CANN release parses ``opset``; warnings (strings) if ``cann_version``'s docs
    exclude it (ATC itself then reports it; docs can be conservative, so this is not an error)."""
    lo, hi = OPSET_RANGE
    if not lo <= int(opset) <= hi:
        raise ConfigError(
            f"the export is ONNX opset {opset}; no CANN release's ATC is documented to parse it "
            f"(documented opsets {lo}-{hi}); re-export with --opset 17"
        )
    rng = documented_opsets(cann_version)
    if rng and not rng[0] <= int(opset) <= rng[1]:
        return [
            (
                f"CANN {cann_version}'s ATC docs list ONNX opsets {rng[0]}-{rng[1]}, the export is opset {opset}: "
                "conversion may fail; CANN 7.0.0 or 9.x is documented to accept opset 17"
            )
        ]
    return []


# ------------------------------------------------------------------------------------------------ CANN version
def detect_cann_version(env: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """``(version, source)`` of the installed CANN toolkit from ``ascend_toolkit_install.info`` (``version=...``)
    under ``$ASCEND_TOOLKIT_HOME`` / ``$ASCEND_HOME_PATH`` (set by ``set_env.sh``) or the default install roots;
    ``(None, reason)`` when none is found."""
    env = os.environ if env is None else env
    arch = platform.machine() or "x86_64"
    roots: list[Path] = []
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        if env.get(var):
            roots.append(Path(env[var]))
    roots += [Path("/usr/local/Ascend/ascend-toolkit/latest"), Path("/usr/local/Ascend/cann")]
    for root in roots:
        for info in (
            root / f"{arch}-linux" / "ascend_toolkit_install.info",
            root / "ascend_toolkit_install.info",
            root / "compiler" / "version.info",
        ):
            try:
                text = info.read_text(errors="replace")
            except OSError:
                continue
            m = re.search(r"^\s*version\s*=\s*(\S+)", text, re.IGNORECASE | re.MULTILINE)
            if m:
                return m.group(1), str(info)
    return (
        None,
        "no ascend_toolkit_install.info found (CANN toolkit not installed, or set_env.sh not sourced)",
    )


# ------------------------------------------------------------------------------------------------ commands
def _dims(spec_shape: Sequence[int | str]) -> tuple[str, list[str]]:
    """``"1,-1,2"`` and the dynamic-axis labels (in order) of one manifest shape."""
    parts, labels = [], []
    for d in spec_shape:
        if isinstance(d, str):
            parts.append("-1")
            labels.append(d)
        else:
            parts.append(str(int(d)))
    return ",".join(parts), labels


def _graph_shapes(g: GraphSpec, gears: tuple[int, ...]) -> tuple[str, str | None, bool]:
    """``(--input_shape, --dynamic_dims or None, dynamic)`` for one graph.  All dynamic axes of a graph must share one
    label (the decoder's ``K``): each gear repeats its value once per ``-1``."""
    shapes, labels = [], []
    for t in g.inputs:
        dims, lab = _dims(t.shape)
        shapes.append(f"{t.name}:{dims}")
        labels += lab
    if not labels:
        return ";".join(shapes), None, False
    if len(set(labels)) > 1:
        raise ConfigError(
            f"graph {g.name}: dynamic axes {sorted(set(labels))} — ATC gears here support one dynamic "
            "size per graph"
        )
    if len(gears) == 1:  # one gear: compile it static (ATC wants 2..100 gears for --dynamic_dims)
        k = str(gears[0])
        static = [
            f"{t.name}:{','.join(k if isinstance(d, str) else str(int(d)) for d in t.shape)}"
            for t in g.inputs
        ]
        return ";".join(static), None, False
    gear_text = ";".join(",".join([str(k)] * len(labels)) for k in gears)
    return ";".join(shapes), gear_text, True


def keep_dtype_path(base: str | Path, g: GraphSpec) -> Path:
    return Path(base) / f"{Path(g.file).stem}{KEEP_DTYPE_SUFFIX}"


def atc_commands(
    manifest: Manifest,
    export_dir: str | Path,
    *,
    soc_version: str = DEFAULT_SOC,
    precision: str = "fp16-mixed",
    k_gears: Iterable[int] = DEFAULT_K_GEARS,
    out_dir: str | Path | None = None,
    cfg_dir: str | Path | None = None,
    allow_unknown_soc: bool = False,
    atc: str = "atc",
    deploy_dir: str | Path | None = None,
) -> list[list[str]]:
    """One ``atc`` argv per graph of ``manifest`` (in manifest order).

    ``export_dir``: where the ``.onnx`` files are (paths are joined as given, so ``Path(".")`` gives relative
    commands); ``out_dir``: where ``<stem>.om`` is written (default ``export_dir``); ``cfg_dir``: where the
    ``<stem>.keep_dtype.cfg`` files are (default ``export_dir``; they are written by :func:`convert_export`).
    ``deploy_dir`` (INT8): ATC reads AMCT's ``<stem>_deploy_model.onnx`` from there instead of the ONNX graphs.
    Raises ``ConfigError`` for an unknown SoC or precision, bad gears, or an opset no CANN parses."""
    soc = check_soc(soc_version, allow_unknown_soc)
    if precision not in PRECISIONS:
        raise ConfigError(f"unknown --om-precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    gears = check_gears(k_gears)
    check_opset(manifest.opset)
    base, out = Path(export_dir), Path(out_dir) if out_dir is not None else Path(export_dir)
    cfg = Path(cfg_dir) if cfg_dir is not None else base
    cmds: list[list[str]] = []
    for g in manifest.graphs.values():
        input_shape, dyn, dynamic = _graph_shapes(g, gears)
        all_4d = all(len(t.shape) == 4 for t in g.inputs)
        argv = [
            atc,
            "--framework=5",
            f"--model={base / g.file if deploy_dir is None else Path(deploy_dir) / (Path(g.file).stem + AMCT_DEPLOY_SUFFIX)}",
            f"--output={out / Path(g.file).stem}",
            f"--soc_version={soc}",
            f"--input_format={'NCHW' if all_4d and not dynamic else 'ND'}",
            f"--input_shape={input_shape}",
        ]
        if dyn:
            argv.append(f"--dynamic_dims={dyn}")
        if precision == "fp32":
            argv.append("--precision_mode_v2=origin")
        else:
            argv += ["--precision_mode_v2=fp16", f"--keep_dtype={keep_dtype_path(cfg, g)}"]
        argv.append("--log=error")
        cmds.append(argv)
    return cmds


def keep_dtype_nodes(onnx_path: str | Path, graph: str) -> dict[str, list[str]]:
    """``op type -> node names`` to keep at the graph's precision in ``onnx_path``: LayerNormalization, Softmax,
    the graph's extra types (memory encoder: Sigmoid, Greater) and the Casts that round through bfloat16
    (key ``"Cast"``).  Unnamed nodes cannot be listed; they are counted under ``"unnamed:<OpType>"``."""
    try:
        import onnx
    except ImportError:
        raise ConfigError(
            "writing the ATC keep_dtype lists needs the onnx package: pip install onnx"
        ) from None
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:
        raise BackendError(
            f"graph {graph}: cannot read {onnx_path} to list the fp32 operators: {exc}"
        ) from exc
    types = set(KEEP_OPS_ALL) | set(KEEP_OPS_GRAPH.get(graph, ()))
    nodes = list(model.graph.node)
    bf16_out = {
        o
        for n in nodes
        if n.op_type == "Cast" and any(a.name == "to" and a.i == _ONNX_BFLOAT16 for a in n.attribute)
        for o in n.output
    }
    out: dict[str, list[str]] = collections.defaultdict(list)
    for n in nodes:
        is_bf16_cast = n.op_type == "Cast" and (set(n.output) & bf16_out or set(n.input) & bf16_out)
        if n.op_type in types or is_bf16_cast:
            if n.name:
                out[n.op_type].append(n.name)
            else:
                out[f"unnamed:{n.op_type}"].append("")
    return {k: v for k, v in out.items()}


# ------------------------------------------------------------------------------------------------ INT8 (AMCT)
class AmctInput(TypedDict):
    """One input of a graph in ``amct/calibration.json``."""

    name: str
    #: the recorded runs' shape (the manifest's, with its axis labels, when none was recorded)
    shape: list[int | str]
    dtype: str
    dir: str  # the input's .bin files, relative to the export


class AmctGraph(TypedDict):
    batch_num: int  # recorded runs given to AMCT
    inputs: list[AmctInput]  # in the graph's input order
    model: str  # the fp32 graph AMCT quantizes, relative to the export


class AmctRecord(TypedDict):
    """``amct/calibration.json``."""

    graphs: dict[str, AmctGraph]


class FeedSource(Protocol):
    """Recorded graph inputs (:class:`~.precision.FeedStore`)."""

    def feeds(self, graph: str) -> Iterable[dict[str, np.ndarray]]: ...


def write_amct_inputs(manifest: Manifest, fp32_dir: Path, store: FeedSource, export_dir: Path) -> AmctRecord:
    """The inputs of the Ascend INT8 build, into ``export_dir/amct/``: the fp32 graphs (AMCT quantizes those), and
    per graph up to :data:`AMCT_MAX_BATCHES` recorded runs as raw ``.bin`` files, one directory per input
    (``calib/<graph>/<input>/00000.bin``: C order, the manifest's static shape and dtype; AMCT's ``--data_dir``
    layout).  The decoder's point axis K takes the value most runs had (a tracking frame: 1).  ``store``: the
    :class:`~.precision.FeedStore` of the calibration.  Writes and returns ``amct/calibration.json``."""
    root = Path(export_dir) / AMCT_DIR
    root.mkdir(parents=True, exist_ok=True)
    record: AmctRecord = {"graphs": {}}
    for name, g in manifest.graphs.items():
        shutil.copyfile(Path(fp32_dir) / g.file, root / g.file)
        feeds = list(store.feeds(name))
        sigs = [tuple((k, v.shape) for k, v in sorted(f.items())) for f in feeds]
        common = collections.Counter(sigs).most_common(1)[0][0] if sigs else ()
        chosen = [f for f, sig in zip(feeds, sigs) if sig == common]
        if len(chosen) > AMCT_MAX_BATCHES:
            step = len(chosen) / AMCT_MAX_BATCHES
            chosen = [chosen[int(i * step)] for i in range(AMCT_MAX_BATCHES)]
        inputs: list[AmctInput] = []
        for t in g.inputs:
            d = root / "calib" / name / t.name
            d.mkdir(parents=True, exist_ok=True)
            for i, f in enumerate(chosen):
                f[t.name].astype(t.dtype, copy=False).tofile(d / f"{i:05d}.bin")
            shape: list[int | str] = list(chosen[0][t.name].shape) if chosen else list(t.shape)
            inputs.append(
                {"name": t.name, "shape": shape, "dtype": t.dtype, "dir": f"{AMCT_DIR}/calib/{name}/{t.name}"}
            )
        record["graphs"][name] = {"batch_num": len(chosen), "inputs": inputs, "model": f"{AMCT_DIR}/{g.file}"}
    _atomic_write(root / AMCT_RECORD, json.dumps(record, indent=2) + "\n")
    return record


def read_amct_record(export_dir: Path, manifest: Manifest) -> AmctRecord:
    """``amct/calibration.json`` of an INT8 export, checked against ``manifest``; ``ConfigError`` when absent."""
    path = Path(export_dir) / AMCT_DIR / AMCT_RECORD
    try:
        record = cast(AmctRecord, dict(json.loads(path.read_text())))
        graphs = dict(record["graphs"])
    except FileNotFoundError:
        raise ConfigError(
            f"{export_dir} is an INT8 export for ONNX Runtime without the Ascend INT8 inputs ({AMCT_DIR}/): "
            "re-export with --int8 CLIP --om (AMCT calibrates the fp32 graphs on the same recordings)"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: cannot read the AMCT calibration record: {exc}") from None
    missing = [n for n in manifest.graphs if n not in graphs]
    if missing:
        raise ConfigError(f"{path}: no calibration data for {', '.join(missing)}; re-export with --int8 --om")
    return record


def amct_commands(
    manifest: Manifest,
    export_dir: str | Path,
    record: AmctRecord,
    *,
    save_dir: str | Path | None = None,
    amct: str = "amct_onnx",
) -> list[list[str]]:
    """One ``amct_onnx calibration`` argv per graph (manifest order): the fp32 graph in ``amct/``, its calibration
    ``.bin`` directories (one per input, ``;``-separated, in the graph's input order) with their shapes and dtypes,
    ``--batch_num`` = the number of runs recorded for it.  AMCT writes ``<save_dir>/<stem>_deploy_model.onnx``
    (default ``save_dir``: ``amct/out`` under ``export_dir``), which :func:`atc_commands` compiles with
    ``deploy_dir``."""
    base = Path(export_dir)
    out = Path(save_dir) if save_dir is not None else base / AMCT_DIR / "out"
    cmds = []
    for name, g in manifest.graphs.items():
        r = record["graphs"][name]
        ins = list(r["inputs"])
        cmds.append(
            [
                amct,
                "calibration",
                f"--model={base / r['model']}",
                f"--save_path={out / Path(g.file).stem}",
                "--input_shape="
                + ";".join(f"{i['name']}:{','.join(str(int(d)) for d in i['shape'])}" for i in ins),
                "--data_dir=" + ";".join(str(base / i["dir"]) for i in ins),
                "--data_types=" + ";".join(str(i["dtype"]) for i in ins),
                f"--batch_num={int(r['batch_num'])}",
            ]
        )
    return cmds


# ------------------------------------------------------------------------------------------------ files
def _atomic_write(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to a temporary sibling and rename it over ``path`` (readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _script(
    manifest: Manifest,
    cmds: list[list[str]],
    soc: str,
    precision: str,
    gears: tuple[int, ...],
    amct_cmds: list[list[str]] | None = None,
) -> str:
    lines = [
        "#!/usr/bin/env bash",
        "# Convert this vostream export's ONNX graphs to Ascend .om models (written by vostream export --om).",
        (
            f"# SoC {soc}, precision {precision}{' + INT8 (AMCT)' if amct_cmds else ''}, decoder K gears "
            f"{','.join(map(str, gears))} (points per object per frame, box corners included)."
        ),
        "# Run it on a machine with the CANN toolkit after: source /usr/local/Ascend/ascend-toolkit/set_env.sh",
        f"# {CANN_VERSION_NOTE.format(opset=manifest.opset)}",
        "# The .om files only run on the SoC named above and with the CANN version that built them.",
    ]
    if amct_cmds:
        lines += [
            "# INT8: AMCT (amct_onnx, CANN's model compression toolkit) calibrates the fp32 graphs in amct/ on the",
            "# inputs recorded while the fp32 export tracked the --int8 clip (amct/calib/), then ATC compiles AMCT's",
            "# deploy models; ops AMCT leaves in float follow the precision above. Not run by vostream's tests (no",
            "# CANN there): see docs/ascend.md section 3.",
        ]
    lines += ["set -euo pipefail", 'cd "$(dirname "$0")"', ""]
    for name, argv in zip(manifest.graphs, amct_cmds or []):
        lines += [f"echo 'amct: {name}' >&2", shlex.join(argv), ""]
    for name, argv in zip(manifest.graphs, cmds):
        lines += [f"echo 'atc: {name}' >&2", shlex.join(argv), ""]
    return "\n".join(lines)


def _keep_dtype_text(graph: str, nodes: Mapping[str, list[str]]) -> str:
    names = [n for k, v in nodes.items() if not k.startswith("unnamed:") for n in v]
    return "".join(f"{n}\n" for n in names)


# ------------------------------------------------------------------------------------------------ running
def _run_one(
    graph: str,
    argv: list[str],
    cwd: Path,
    say: Callable[[str], None],
    env: Mapping[str, str] | None,
    tool: str = "atc",
) -> None:
    """Run one atc (or amct) command, streaming its output through ``say``; ``BackendError`` with the tail on
    failure."""
    tail: collections.deque[str] = collections.deque(maxlen=25)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env=dict(env) if env is not None else None,
        )
    except OSError as exc:
        raise BackendError(f"{tool} for graph {graph}: cannot start {argv[0]}: {exc}") from exc
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            line = line.rstrip("\n")
            tail.append(line)
            say(f"  {tool} {graph}: {line}")
        rc = proc.wait()
    if rc != 0:
        last = "\n".join(tail) or "(no output)"
        raise BackendError(
            f"{tool} failed for graph {graph} (exit code {rc}); last output:\n{last}\n"
            f"command: {shlex.join(argv)}"
        )


def _produced_om(tmp: Path, stem: str) -> Path | None:
    exact = tmp / f"{stem}.om"
    if exact.is_file():
        return exact
    others = sorted(tmp.glob(f"{stem}_*.om"))  # some ATC builds add an OS/arch suffix
    return others[0] if len(others) == 1 else None


class ConvertRecord(TypedDict):
    """What :func:`convert_export` did (also written as ``atc_convert.json`` after a run)."""

    soc_version: str
    precision: str  # one of PRECISIONS
    k_gears: list[int]
    opset: int
    script: str  # atc_convert.sh
    keep_dtype: dict[str, str]  # graph -> <stem>.keep_dtype.cfg (fp16-mixed)
    kept_ops: dict[str, dict[str, int]]  # graph -> op type -> nodes kept at the graph's precision
    commands: list[list[str]]  # the ATC commands of the script (relative paths)
    amct_commands: list[list[str]]  # INT8: the AMCT commands of the script
    int8: bool
    ran: bool
    reason: str  # why not run
    om: dict[str, str]  # graph -> produced .om file
    seconds: dict[str, float]  # graph -> conversion time
    warnings: list[str]
    cann_version: str | None


@dataclass(frozen=True)
class _Conversion:
    """What :func:`convert_export` converts: the export and the checked options."""

    export_dir: Path
    manifest: Manifest
    soc: str
    precision: str
    gears: tuple[int, ...]
    allow_unknown_soc: bool
    amct_record: AmctRecord | None  # INT8 (built with AMCT first): amct/calibration.json

    @property
    def int8(self) -> bool:
        return self.amct_record is not None


def convert_export(
    manifest: Manifest | None,
    export_dir: str | Path,
    *,
    soc_version: str = DEFAULT_SOC,
    precision: str = "fp16-mixed",
    k_gears: Iterable[int] = DEFAULT_K_GEARS,
    run: bool | None = None,
    allow_unknown_soc: bool = False,
    atc: str = "atc",
    amct: str = "amct_onnx",
    env: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> ConvertRecord:
    """Write ``atc_convert.sh`` and the keep_dtype lists into ``export_dir``; run ATC when ``run`` is True, or when
    ``run`` is None and ``atc`` is found on ``PATH``.

    ATC runs in a temporary directory inside ``export_dir``; the ``.om`` files replace any old ones only after every
    graph converted, so a failure leaves the directory as it was (plus the script).  Returns a record: ``script``,
    ``keep_dtype`` (graph -> file), ``commands``, ``ran``, ``reason`` (why not run), ``om`` (graph -> produced file),
    ``seconds`` (graph -> s), ``warnings``, ``cann_version``.  Also written as ``atc_convert.json`` after a run.
    Raises ``ConfigError`` (bad options, ``atc`` missing with ``run=True``) or ``BackendError`` (ATC failed: the
    message names the graph, the exit code and the last lines of its output).

    An INT8 export (manifest ``dtype`` ``int8-qdq``, made with ``--int8 CLIP --om``) is built with AMCT first: the
    script (and a run, which then also needs ``amct`` on ``PATH``) calibrates the fp32 graphs in ``amct/`` on the
    recorded inputs (``amct_commands``, record key ``amct_commands``) and compiles AMCT's deploy models."""
    say = progress or (lambda msg: logger.info("%s", msg))
    conv, rel_cmds, rel_amct = _plan_conversion(
        manifest, Path(export_dir), soc_version, precision, k_gears, allow_unknown_soc
    )
    record = _new_record(conv, rel_cmds, rel_amct)
    if precision == "fp16-mixed":
        _write_keep_dtype(conv, record)
    m, export_dir = conv.manifest, conv.export_dir
    _atomic_write(
        export_dir / SCRIPT_NAME, _script(m, rel_cmds, conv.soc, precision, conv.gears, rel_amct), 0o755
    )
    say(f"wrote {export_dir / SCRIPT_NAME}")

    path_var = (env or os.environ).get("PATH")
    atc_path = shutil.which(atc, path=path_var)
    amct_path = shutil.which(amct, path=path_var) if conv.int8 else None
    absent = [t for t, p in ((atc, atc_path), (amct, amct_path if conv.int8 else "")) if p is None]
    if run is False or (run is None and absent):
        record["reason"] = (
            "not requested (--no-run-atc)"
            if run is False
            else f"{' and '.join(map(repr, absent))} not on PATH (install CANN"
            f"{' and AMCT' if amct in absent else ''} and source set_env.sh, then run {SCRIPT_NAME})"
        )
        for w in record["warnings"]:
            logger.warning("%s", w)
        return record
    if absent:
        raise ConfigError(
            f"ATC requested but {' and '.join(map(repr, absent))} not on PATH: install the CANN toolkit"
            f"{' and AMCT (amct_onnx)' if amct in absent else ''} and "
            "'source /usr/local/Ascend/ascend-toolkit/set_env.sh' (or copy the export and run "
            f"{SCRIPT_NAME} on the Ascend host)"
        )
    assert atc_path is not None
    cann, _src = detect_cann_version(env)
    record["cann_version"] = cann
    record["warnings"] += check_opset(m.opset, cann)
    for w in record["warnings"]:
        logger.warning("%s", w)
    _run_conversion(conv, record, atc_path, amct_path or amct, env, say)
    record["ran"] = True
    _atomic_write(export_dir / RECORD_NAME, json.dumps(record, indent=2) + "\n")
    return record


def _plan_conversion(
    manifest: Manifest | None,
    export_dir: Path,
    soc_version: str,
    precision: str,
    k_gears: Iterable[int],
    allow_unknown_soc: bool,
) -> tuple[_Conversion, list[list[str]], list[list[str]] | None]:
    """The options checked, the export's files found; the script's ATC (and INT8: AMCT) commands."""
    m = manifest if manifest is not None else load_manifest(export_dir)
    soc = check_soc(soc_version, allow_unknown_soc)
    gears = check_gears(k_gears)
    int8 = m.dtype == DTYPE_INT8
    amct_record = read_amct_record(export_dir, m) if int8 else None
    rel_cmds = atc_commands(
        m,
        Path("."),
        soc_version=soc,
        precision=precision,
        k_gears=gears,
        allow_unknown_soc=allow_unknown_soc,
        deploy_dir=Path(AMCT_DIR) / "out" if int8 else None,
    )
    rel_amct = amct_commands(m, Path("."), amct_record) if amct_record is not None else None
    missing = [g.file for g in m.graphs.values() if not (export_dir / g.file).is_file()]
    if amct_record is not None:
        missing += [
            r["model"] for r in amct_record["graphs"].values() if not (export_dir / r["model"]).is_file()
        ]
    if missing:
        raise ConfigError(
            f"{export_dir}: graph file(s) missing: {', '.join(missing)}; re-run vostream export"
        )
    conv = _Conversion(export_dir, m, soc, precision, gears, allow_unknown_soc, amct_record)
    return conv, rel_cmds, rel_amct


def _new_record(
    conv: _Conversion, rel_cmds: list[list[str]], rel_amct: list[list[str]] | None
) -> ConvertRecord:
    return {
        "soc_version": conv.soc,
        "precision": conv.precision,
        "k_gears": list(conv.gears),
        "opset": conv.manifest.opset,
        "script": str(conv.export_dir / SCRIPT_NAME),
        "keep_dtype": {},
        "kept_ops": {},
        "commands": rel_cmds,
        "amct_commands": rel_amct or [],
        "int8": conv.int8,
        "ran": False,
        "reason": "",
        "om": {},
        "seconds": {},
        "warnings": [],
        "cann_version": None,
    }


def _write_keep_dtype(conv: _Conversion, record: ConvertRecord) -> None:
    """The fp16-mixed build's ``<graph>.keep_dtype.cfg`` files; recorded in ``record`` (unnamed nodes: a warning)."""
    export_dir = conv.export_dir
    for name, g in conv.manifest.graphs.items():
        # INT8: the float ops of AMCT's deploy model keep the fp32 graph's node names
        src = export_dir / AMCT_DIR / g.file if conv.int8 else export_dir / g.file
        nodes = keep_dtype_nodes(src, name)
        unnamed = {k.split(":", 1)[1]: len(v) for k, v in nodes.items() if k.startswith("unnamed:")}
        if unnamed:
            record["warnings"].append(
                f"graph {name}: unnamed nodes cannot be kept in fp32 by name: "
                f"{unnamed}; they follow --precision_mode_v2=fp16"
            )
        path = keep_dtype_path(export_dir, g)
        _atomic_write(path, _keep_dtype_text(name, nodes))
        record["keep_dtype"][name] = str(path)
        record["kept_ops"][name] = {k: len(v) for k, v in nodes.items() if not k.startswith("unnamed:")}


def _run_conversion(
    conv: _Conversion,
    record: ConvertRecord,
    atc: str,
    amct: str,
    env: Mapping[str, str] | None,
    say: Callable[[str], None],
) -> None:
    """Run the commands (absolute paths) in a temporary directory inside the export; move the ``.om`` files into
    place only when every graph converted (recorded in ``record``).  The temporary directory is always removed."""
    m, export_dir = conv.manifest, conv.export_dir.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=".atc-", dir=export_dir))  # absolute: ATC runs with cwd=tmp
    try:
        cmds = atc_commands(
            m,
            export_dir,
            soc_version=conv.soc,
            precision=conv.precision,
            k_gears=conv.gears,
            out_dir=tmp,
            cfg_dir=export_dir,
            allow_unknown_soc=conv.allow_unknown_soc,
            atc=atc,
            deploy_dir=tmp / AMCT_DIR if conv.int8 else None,
        )
        amct_run: list[list[str]] = (
            amct_commands(m, export_dir, conv.amct_record, save_dir=tmp / AMCT_DIR, amct=amct)
            if conv.amct_record is not None
            else [[] for _ in m.graphs]
        )
        produced: dict[str, Path] = {}
        for (name, g), argv, amct_argv in zip(m.graphs.items(), cmds, amct_run):
            t0 = time.perf_counter()
            if amct_argv:
                assert conv.amct_record is not None
                say(
                    f"amct: calibrating {name} on {conv.amct_record['graphs'][name]['batch_num']} recorded runs"
                )
                _run_one(name, amct_argv, tmp, say, env, tool="amct")
                deploy = tmp / AMCT_DIR / (Path(g.file).stem + AMCT_DEPLOY_SUFFIX)
                if not deploy.is_file():
                    raise BackendError(
                        f"amct for graph {name} exited 0 but wrote no {deploy.name} in {deploy.parent}"
                    )
            say(f"atc: converting {name} ({g.file}) for {conv.soc}")
            _run_one(name, argv, tmp, say, env)
            om = _produced_om(tmp, Path(g.file).stem)
            if om is None:
                raise BackendError(
                    f"atc for graph {name} exited 0 but wrote no {Path(g.file).stem}.om in {tmp}"
                )
            produced[name] = om
            record["seconds"][name] = round(time.perf_counter() - t0, 2)
        for name, g in m.graphs.items():  # all converted: move them into place
            dst = conv.export_dir / f"{Path(g.file).stem}.om"
            os.replace(produced[name], dst)
            record["om"][name] = str(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ CLI glue
def add_om_arguments(parser: argparse.ArgumentParser) -> None:
    """``vostream export`` options for the Ascend conversion (see :func:`om_from_args`)."""
    g = parser.add_argument_group("Ascend .om conversion (docs/ascend.md)")
    g.add_argument(
        "--om",
        action="store_true",
        help="also write atc_convert.sh (ONNX -> Ascend .om) and run it when atc is on PATH",
    )
    g.add_argument(
        "--soc-version",
        default=DEFAULT_SOC,
        metavar="SOC",
        help=f"ATC --soc_version: 'Ascend' + the Name column of npu-smi info (default {DEFAULT_SOC})",
    )
    g.add_argument(
        "--om-precision",
        choices=PRECISIONS,
        default="fp16-mixed",
        help="fp16-mixed: fp16 with LayerNorm/Softmax/thresholds kept fp32 (default); fp32: keep the "
        "graphs' fp32 everywhere",
    )
    g.add_argument(
        "--om-max-points",
        type=int,
        default=max(DEFAULT_K_GEARS),
        metavar="K",
        help="decoder gears 1..K: points (box corners count) per object per frame (default 8)",
    )
    g.add_argument(
        "--run-atc",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run atc now (default: when atc is on PATH)",
    )


def om_from_args(
    args: argparse.Namespace,
    manifest: Manifest | None,
    export_dir: str | Path,
    progress: Callable[[str], None] | None = None,
) -> ConvertRecord | None:
    """After ``vostream export``: convert when ``--om`` was given; returns the record (None without ``--om``)."""
    if not getattr(args, "om", False):
        return None
    k = int(args.om_max_points)
    return convert_export(
        manifest,
        export_dir,
        soc_version=args.soc_version,
        precision=args.om_precision,
        k_gears=range(1, k + 1),
        run=args.run_atc,
        progress=progress,
    )


def describe(record: ConvertRecord) -> str:
    """One summary line for a :func:`convert_export` record."""
    if record.get("ran"):
        precision = f"INT8 via AMCT + {record['precision']}" if record.get("int8") else record["precision"]
        return (
            f"converted {len(record['om'])} graphs to .om for {record['soc_version']} ({precision}) in "
            f"{sum(record['seconds'].values()):.1f} s"
        )
    return f"wrote {record['script']} (not run: {record['reason']})"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vostream.apps.export.atc DIR``: convert an existing export (no torch needed)."""
    import sys

    p = argparse.ArgumentParser(
        prog="python -m vostream.apps.export.atc",
        description="Write (and run, where atc exists) the ATC commands for a vostream export",
    )
    p.add_argument("export_dir", metavar="DIR")
    add_om_arguments(p)
    args = p.parse_args(argv)
    args.om = True
    try:
        record = om_from_args(args, None, args.export_dir, lambda s: print(s, file=sys.stderr, flush=True))
    except (ConfigError, BackendError) as exc:
        print(f"atc: error: {exc}", file=sys.stderr)
        return exc.exit_code
    assert record is not None
    print(describe(record))
    return 0


__all__ = [
    "AMCT_DEPLOY_SUFFIX",
    "AMCT_DIR",
    "AMCT_MAX_BATCHES",
    "AmctRecord",
    "CANN_VERSION_NOTE",
    "DEFAULT_K_GEARS",
    "DEFAULT_SOC",
    "DOCUMENTED_OPSETS",
    "KNOWN_SOCS",
    "PRECISIONS",
    "RECORD_NAME",
    "SCRIPT_NAME",
    "ConvertRecord",
    "add_om_arguments",
    "amct_commands",
    "atc_commands",
    "check_gears",
    "check_opset",
    "check_soc",
    "convert_export",
    "describe",
    "detect_cann_version",
    "documented_opsets",
    "keep_dtype_nodes",
    "om_from_args",
    "read_amct_record",
    "write_amct_inputs",
]

if __name__ == "__main__":
    raise SystemExit(main())
