"""``vostream export``: a transformers SAM-2-family checkpoint -> four ONNX graphs + ``manifest.json``.

Needs the ``[export]`` extra (torch, transformers >= 5, onnx, onnxruntime); nothing else in vostream imports it.
Every graph is checked against its PyTorch wrapper on random inputs with ONNX Runtime before the export directory
appears: the graphs are written to a temporary sibling directory that is renamed at the end, so a failed export
leaves nothing half-written.  Design: ``docs/sam2-backend.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from vostream.apps.export.families import Family, family_for, resize_config
from vostream.pipeline.errors import BackendError, ConfigError, Interrupted
from vostream.pipeline.types import Frame, Prompt
from vostream.pipeline.version import package_version
from vostream.stages.trackers.sam2.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    GraphSpec,
    Manifest,
    TensorSpec,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    from torch import Tensor, nn

    #: the inputs of one graph, in its input order
    Feed = tuple[Tensor, ...]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
#: frames of the ``--int8`` clip used for calibration (from its start)
DEFAULT_CALIB_FRAMES = 32
#: verification tolerance for fp32 graphs: max |onnx - torch| <= TOL * max(1, max |torch|)
TOL = 1e-4


def _require_export_deps() -> tuple[ModuleType, ModuleType]:
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise ConfigError(
            f"vostream export needs PyTorch and transformers ({exc.name} is missing): "
            "pip install torch==2.13.0 && pip install 'vostream[export]'"
        ) from None
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise ConfigError(
            f"vostream export needs transformers >= 5 (installed {transformers.__version__}): "
            "pip install -U 'transformers>=5'"
        )
    return torch, transformers


def _hub_file(model: str, name: str) -> Path:
    """``name`` of hub repo ``model``: from the local cache when it is there (no network), else downloaded.

    Raises :class:`ConfigError` saying which of these it is: not cached while offline (``HF_HUB_OFFLINE``), the
    hub's host does not resolve (checked first, so an offline machine fails at once instead of after the hub
    client's retries), no such repo, a gated repo, or no such file in it."""
    import os
    import socket
    from urllib.parse import urlparse

    try:
        from huggingface_hub import constants, hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError
    except ImportError:
        raise ConfigError(
            f"{model!r} is not a local directory, and huggingface_hub (to fetch it from the hub) "
            "is not installed: pip install 'vostream[export]'"
        ) from None
    try:
        return Path(hf_hub_download(model, name, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (or not a valid id): go online below
        pass
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"{model!r} is not a local directory and its {name} is not in the Hugging Face cache "
            "(HF_HUB_OFFLINE is set): download it on a connected machine first"
        )
    host = urlparse(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise ConfigError(
            f"{model!r} is not a local directory, and the Hugging Face hub is unreachable from "
            f"here ({host}: {exc.strerror or exc}); pass a directory written by save_pretrained, or "
            "fetch the checkpoint on a connected machine (it is then read from the cache)"
        ) from None
    try:
        return Path(hf_hub_download(model, name))
    except GatedRepoError:
        raise ConfigError(
            f"{model} is gated on the Hugging Face hub: accept its licence on "
            f"https://huggingface.co/{model} and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{model!r} is neither a local directory nor a Hugging Face hub repo "
            "(or it is private: log in with `hf auth login`)"
        ) from None
    except EntryNotFoundError:
        raise ConfigError(f"{model}: the hub repo has no {name}") from None
    except Exception as exc:  # noqa: BLE001 - network failures of every kind
        raise ConfigError(
            f"cannot fetch {name} of {model} from the Hugging Face hub: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}"
        ) from None


def _read_json(model: str, name: str, required: bool = False) -> dict[str, Any] | None:
    """``name`` from a local checkpoint directory, or from the hub cache/hub.  None when unavailable, unless
    ``required`` (then :class:`ConfigError` says why)."""
    if Path(model).exists():
        local = Path(model) / name
        try:
            return dict(json.loads(local.read_text()))
        except FileNotFoundError:
            if required:
                raise ConfigError(f"cannot load checkpoint: {model}: no {name}") from None
            return None
        except (OSError, ValueError) as exc:
            if required:
                raise ConfigError(f"cannot load checkpoint: {local}: {exc}") from None
            return None
    try:
        path = _hub_file(model, name)
        return dict(json.loads(path.read_text()))
    except ConfigError:
        if required:
            raise
        return None  # optional metadata: fall back to the family's defaults
    except (OSError, ValueError) as exc:
        if required:
            raise ConfigError(f"cannot load checkpoint: {model}: {name}: {exc}") from None
        return None


def load_checkpoint(model: str) -> tuple[nn.Module, Family, dict[str, Any]]:
    """Load ``model`` (hub id or ``save_pretrained`` directory) as its family's video model, in eval mode, fp32."""
    torch, transformers = _require_export_deps()
    config_json = _read_json(model, "config.json", required=True)
    assert config_json is not None
    family = family_for(config_json.get("model_type"), str(model))
    cls = getattr(transformers, family.model_class)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = cls.from_pretrained(model, torch_dtype=torch.float32)
    except Exception as exc:
        raise ConfigError(
            f"cannot load {model} as {family.model_class}: {type(exc).__name__}: {exc}"
        ) from exc
    net.eval()
    return net, family, config_json


def resize_model(net: nn.Module, family: Family, size: int) -> nn.Module:
    """``net`` rebuilt to run at ``size`` px: a copy of its config with :func:`resize_config` applied, and every
    weight loaded strictly (no weight depends on the input size in these families; a strict load proves it)."""
    import copy

    torch, _ = _require_export_deps()
    cfg = copy.deepcopy(net.config)
    resize_config(cfg, family, size)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resized = type(net)(cfg)
            resized.load_state_dict(net.state_dict(), strict=True)
            resized.eval()
            with torch.no_grad():  # the backbone must actually take the new size
                resized.get_image_features(torch.zeros(1, 3, size, size))
    except Exception as exc:
        raise ConfigError(
            f"--image-size {size}: {family.model_class} cannot run at that size: {type(exc).__name__}: {exc}"
        ) from exc
    return resized


def _onnx_export(
    torch: ModuleType,
    module: nn.Module,
    args: Feed,
    path: Path,
    inputs: list[str],
    outputs: list[str],
    opset: int,
    dynamic: dict[str, dict[int, str]] | None = None,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            str(path),
            input_names=inputs,
            output_names=outputs,
            opset_version=opset,
            dynamo=False,
            dynamic_axes=dynamic or None,
            do_constant_folding=True,
        )


def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _specs(
    names: list[str], tensors: Feed, dynamic: dict[str, dict[int, str]] | None = None
) -> tuple[TensorSpec, ...]:
    out = []
    for name, t in zip(names, tensors):
        shape: list[int | str] = list(t.shape)
        for axis, label in (dynamic or {}).get(name, {}).items():
            shape[axis] = label
        out.append(TensorSpec(name, tuple(shape), _dtype_name(t)))
    return tuple(out)


def _bf16_step(magnitude: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """The spacing of bfloat16 values (8 significant bits) at ``|x|`` = ``magnitude``, elementwise: 2**(e - 8)
    for ``|x|`` in [2**(e-1), 2**e).  (Zero gets the smallest normal spacing; the absolute tolerance covers it.)"""
    _, exp = np.frexp(np.asarray(magnitude, dtype=np.float64))
    return np.ldexp(1.0, np.maximum(exp, -125) - 8)


def _verify(
    graph: str,
    path: Path,
    module: nn.Module,
    feeds_list: list[Feed],
    in_names: list[str],
    out_names: list[str],
    torch: ModuleType,
    rel: dict[str, float] | None = None,
    tol: float = TOL,
    bf16: tuple[str, ...] = (),
) -> dict[str, float]:
    """Run the ONNX file with ONNX Runtime (CPU) on each feed and compare with the torch module.

    ``rel``: per-output relative tolerance (``--fp16``).  ``bf16``: outputs rounded to bfloat16 at the end of the
    graph (the SAM 2.1 / SAM 3 memory bank).  Two values within the tolerance before that rounding can land one or
    two bf16 steps apart after it, which at 0.01 is already 1.2e-4 > 1e-4; so their tolerance is the fp32 one plus
    one bf16 step at the compared value's magnitude (:func:`_bf16_step`), element by element."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)

    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise BackendError(f"graph {graph}: the exported file does not load in ONNX Runtime: {exc}") from exc
    worst: dict[str, float] = {n: 0.0 for n in out_names}
    for args in feeds_list:
        with torch.no_grad():
            ref = module(*args)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = sess.run(out_names, {n: a.numpy() for n, a in zip(in_names, args)})
        for name, r, g in zip(out_names, ref, got):
            r = r.numpy()
            if r.shape != g.shape:
                raise BackendError(
                    f"graph {graph}: output {name} has shape {g.shape} in ONNX, {r.shape} in torch"
                )
            err = np.abs(r.astype(np.float64) - g)
            diff = float(np.max(err)) if r.size else 0.0
            bound = tol * max(1.0, float(np.max(np.abs(r))) if r.size else 0.0)
            if name in bf16:
                ok = not bool(np.any(err > bound + _bf16_step(np.maximum(np.abs(r), np.abs(g)))))
            elif rel and name in rel:
                over = err > np.maximum(bound, rel[name] * np.abs(r))
                ok = not bool(np.any(over))
            else:
                ok = diff <= bound
            if not ok:
                raise BackendError(
                    f"graph {graph}: max |onnx - torch| {diff:.3g} > {bound:.3g}"
                    f"{' + one bfloat16 step' if name in bf16 else ''} on output {name}; "
                    "the export is not faithful (try another --opset)"
                )
            worst[name] = max(worst[name], diff)
    return worst


#: ops kept in fp32 by ``--fp16`` (besides onnxruntime's default list): normalisation and softmax statistics, the
#: memory encoder's sigmoid/threshold, and the casts that reproduce the reference's bfloat16 bank
FP16_KEEP_FP32 = ("LayerNormalization", "Softmax", "Sigmoid", "Cast", "ReduceMean", "Pow", "Sqrt", "Erf")
#: fp16 verification: max |onnx - torch| <= FP16_TOL * max(1, max |torch|)
FP16_TOL = 5e-2


def _dedupe_constants(path: Path) -> int:
    """Share identical ``Constant`` tensors in the ONNX file at ``path``; returns the bytes saved.

    The TorchScript exporter's constant folding materialises a copy of a constant per use: in SAM 2.1's memory
    attention the RoPE cos/sin tables ([1, 4096, 256] each) appear once per attention call, 109 MiB of 138. On a
    device every copy would be resident."""
    import hashlib

    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    canonical: dict[tuple[int, tuple[int, ...], str], str] = {}
    rename: dict[str, str] = {}
    keep = []
    saved = 0
    for node in graph.node:
        tensor = (
            next(
                (a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR),
                None,
            )
            if node.op_type == "Constant" and len(node.attribute) == 1
            else None
        )
        if tensor is not None and tensor.raw_data:
            key = (tensor.data_type, tuple(tensor.dims), hashlib.sha256(tensor.raw_data).hexdigest())
            first = canonical.setdefault(key, node.output[0])
            if first != node.output[0]:
                rename[node.output[0]] = first
                saved += len(tensor.raw_data)
                continue
        keep.append(node)
    if not rename:
        return 0

    # nested graphs (If/Loop bodies) may read outer-scope constants too
    def rewire(nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            for i, name in enumerate(node.input):
                if name in rename:
                    node.input[i] = rename[name]
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    rewire(attr.g.node)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        rewire(sub.node)

    rewire(keep)
    for out in graph.output:
        if out.name in rename:  # a graph output must keep its name: keep that node after all
            return 0
    del graph.node[:]
    graph.node.extend(keep)
    onnx.save(model, str(path))
    return saved


def _to_fp16(src: Path, dst: Path) -> None:
    """Write ``src`` (an ONNX file) to ``dst`` with fp16 weights and arithmetic, fp32 inputs/outputs and the
    :data:`FP16_KEEP_FP32` ops in fp32 (onnxruntime's converter)."""
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(src))
    converted = convert_float_to_float16(
        model, keep_io_types=True, op_block_list=list(DEFAULT_OP_BLOCK_LIST) + list(FP16_KEEP_FP32)
    )
    onnx.save(converted, str(dst))


def _three(values: Iterable[float]) -> tuple[float, float, float]:
    a, b, c = (float(v) for v in values)
    return a, b, c


class _StopOnSignals:
    """While installed, the first SIGINT/SIGTERM/SIGHUP raises :class:`Interrupted` (``export_model`` then removes
    its staging directory; the CLI prints one line and exits 130); later ones are ignored until that cleanup is
    done and :meth:`restore` puts the previous handlers back.  Main thread only (elsewhere a no-op)."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir, self.count = out_dir, 0
        self.previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for name in ("SIGINT", "SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                signum = getattr(signal, name)
                self.previous[signum] = signal.signal(signum, self._handler)

    def _handler(self, signum: int, _frame: object) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            raise Interrupted(f"export interrupted by {name}; nothing was written to {self.out_dir}")
        logger.warning("%s: removing the partial export, please wait", name)

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self.previous = {}


# ------------------------------------------------------------------------------------------------ export_model
# ``export_model`` is five steps: load -> resize -> export -> verify -> manifest.  Export and verify alternate graph
# by graph (each graph's test feeds are the previous graphs' outputs); the values that flow between the steps are
# the small dataclasses below.


@dataclass(frozen=True)
class _Request:
    """What ``export_model`` was asked to write, checked before anything heavy is loaded."""

    precision: str  # "fp32", "fp16" or "int8"
    int8: str | Path | None  # the --int8 calibration clip ...
    calib_clip: list[Frame] | None  # ... and its first frames
    compare: str | Path | None  # the --compare clip ...
    compare_clip: list[Frame] | None  # ... and its first frames


@dataclass(frozen=True)
class _Checkpoint:
    """Step 1 (load) and 2 (resize): the model in eval mode, at the size it is exported at."""

    model: str  # hub id or directory, as given
    net: nn.Module
    family: Family
    config_json: dict[str, Any]  # the checkpoint's config.json
    trained_size: int  # the input size it was trained at


@dataclass(frozen=True)
class _Layout:
    """The sizes the graphs are built for (names as in ``docs/sam2-backend.md``)."""

    image_size: int  # S
    grid: int  # g: top-level feature grid
    hidden_dim: int  # D
    mem_dim: int  # M
    mask_size: int  # P: low-res mask logits
    cond_slots: int  # C: conditioning frames in the memory bank
    recent_slots: int  # N: recent frames in the memory bank
    pointer_slots: int  # Q: object pointers
    max_cond: int  # the checkpoint's max_cond_frame_num (<= 0: no limit)
    max_ptrs: int  # the checkpoint's max_object_pointers_in_encoder
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def key_slots(self) -> int:  # L = C + N
        return self.cond_slots + self.recent_slots


@dataclass(frozen=True)
class _Dirs:
    """Where the export is staged: ``tmp`` becomes ``out_dir`` at the end; ``ref`` holds the fp32 graphs (``tmp``
    itself, or for fp16 / int8 the reference beside it that the other precision is made from and measured
    against, removed at the end)."""

    tmp: Path
    ref: Path


@dataclass
class _GraphJob:
    """One graph to export and verify: its wrapper module and the feeds it is checked on (the first also traces it)."""

    name: str
    module: nn.Module
    feeds: list[Feed]
    inputs: list[str]
    outputs: list[str]
    dynamic: dict[str, dict[int, str]] | None = None  # symbolic axes, in the ONNX file and the manifest
    bf16: tuple[str, ...] = ()  # outputs rounded to bfloat16 at the end of the graph (see :func:`_verify`)
    shrink: dict[str, tuple[int, str]] | None = (
        None  # dynamic in the ONNX file, the first feed's size in the manifest
    )


@dataclass(frozen=True)
class _Exported:
    """Steps 3 and 4 (export, verify) for the four graphs: what the manifest records of them."""

    graphs: dict[str, GraphSpec]
    verify: dict[str, dict[str, Any]]  # graph -> {"max_abs_diff": {output: diff}, "export_s": seconds}
    tokens_per_slot: int  # T


def export_model(
    model: str,
    out_dir: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    cond_slots: int | None = None,
    fp16: bool = False,
    int8: str | Path | None = None,
    prompts: Sequence[Prompt] = (),
    compare: str | Path | None = None,
    calib_frames: int = DEFAULT_CALIB_FRAMES,
    compare_frames: int | None = None,
    threads: int | None = None,
    amct: bool = False,
    image_size: int | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Manifest:
    """Export ``model`` into ``out_dir``; returns the manifest.  Raises ConfigError / BackendError.

    ``fp16``: graphs compute in float16 with LayerNorm, Softmax and the memory encoder's sigmoid/threshold kept in
    float32; inputs and outputs stay float32 (so every runtime drives them the same way).  Checked against the fp32
    PyTorch model with a looser tolerance (:data:`FP16_TOL`).

    ``int8``: a video file or frames directory (the user's own footage): static INT8 (QDQ) graphs for ONNX Runtime,
    calibrated on what the fp32 export sees while tracking its first ``calib_frames`` frames from ``prompts``, and
    checked against the fp32 graphs on those recordings (``precision.py``).  ``amct``: also keep the fp32 graphs
    and the recordings in ``amct/`` for the Ascend INT8 build (AMCT + ATC, ``atc.py``).

    ``compare``: a clip (its first ``compare_frames`` frames) that the fp32 export and this one track side by side
    from ``prompts`` (``threads`` intra-op threads): mask IoU, logit delta, size and time ratios, recorded in the
    manifest (``verify["compare"]``).  Needs ``fp16`` or ``int8``.

    ``image_size``: export for this input size instead of the one the checkpoint was trained at (a multiple of
    :func:`image_size_step`); smaller is faster and coarser."""
    say = progress or (lambda msg: logger.info("%s", msg))
    out_dir = Path(out_dir)
    request = _check_request(
        out_dir,
        opset=opset,
        fp16=fp16,
        int8=int8,
        prompts=prompts,
        compare=compare,
        calib_frames=calib_frames,
        compare_frames=compare_frames,
        amct=amct,
        overwrite=overwrite,
    )
    _require_export_deps()
    t_start = time.perf_counter()
    ckpt = _resize(_load(model, say), image_size, say)
    layout = _layout(ckpt, cond_slots)
    with _staging(out_dir, request.precision) as dirs:
        exported = _export_graphs(ckpt, layout, dirs, opset, fp16, say)
        manifest = _manifest(ckpt, layout, exported, opset)
        manifest.write(dirs.ref)
        manifest = _other_precision(manifest, dirs, request, prompts, threads, amct, say)
        manifest.write(dirs.tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        dirs.tmp.rename(out_dir)
    say(
        f"wrote {out_dir} ({ckpt.family.name}, {layout.image_size}px, {request.precision}, "
        f"C={layout.cond_slots} N={layout.recent_slots} Q={layout.pointer_slots}) in "
        f"{time.perf_counter() - t_start:.1f} s"
    )
    return manifest


def _check_request(
    out_dir: Path,
    *,
    opset: int,
    fp16: bool,
    int8: str | Path | None,
    prompts: Sequence[Prompt],
    compare: str | Path | None,
    calib_frames: int,
    compare_frames: int | None,
    amct: bool,
    overwrite: bool,
) -> _Request:
    """The options of :func:`export_model` checked against each other and ``out_dir``; the clips read."""
    if fp16 and int8 is not None:
        raise ConfigError("--fp16 and --int8 exclude each other: choose one precision per export")
    if compare is not None and not (fp16 or int8 is not None):
        raise ConfigError("--compare measures an --fp16 or --int8 export against fp32: add one of them")
    if amct and int8 is None:
        raise ConfigError("the Ascend INT8 files (amct/) need --int8 CLIP")
    calib_clip = compare_clip = None
    if int8 is not None:
        from vostream.apps.export import precision as p  # imported on use: it needs onnxruntime

        calib_clip = p.read_clip(int8, calib_frames, "--int8")
        p.check_prompts(prompts, calib_clip, "--int8", int8, tracking=True)
    if compare is not None:
        from vostream.apps.export import precision as p

        compare_clip = p.read_clip(compare, compare_frames, "--compare")
        p.check_prompts(prompts, compare_clip, "--compare", compare)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (out_dir / MANIFEST_NAME).is_file():
            raise ConfigError(
                f"{out_dir} exists and is not a vostream export; choose an empty or new directory"
            )
        if not overwrite:
            raise ConfigError(f"{out_dir} already holds an export; pass --force to replace it")
    if opset < 17:
        raise ConfigError(f"--opset {opset}: the graphs need opset >= 17 (LayerNormalization)")
    precision = "int8" if int8 is not None else "fp16" if fp16 else "fp32"
    return _Request(precision, int8, calib_clip, compare, compare_clip)


def _load(model: str, say: Callable[[str], None]) -> _Checkpoint:
    """Step 1: the checkpoint, as trained."""
    say(f"loading {model}")
    net, family, config_json = load_checkpoint(model)
    return _Checkpoint(model, net, family, config_json, int(net.config.image_size))


def _resize(ckpt: _Checkpoint, image_size: int | None, say: Callable[[str], None]) -> _Checkpoint:
    """Step 2: the checkpoint rebuilt for ``image_size`` px (unchanged when that is None or its trained size)."""
    if image_size is None or image_size == ckpt.trained_size:
        return ckpt
    say(f"resizing from {ckpt.trained_size} to {image_size} px")
    return dataclasses.replace(ckpt, net=resize_model(ckpt.net, ckpt.family, image_size))


def _layout(ckpt: _Checkpoint, cond_slots: int | None) -> _Layout:
    """The graphs' sizes from the model's config; ``cond_slots`` (``--cond-slots``) overrides the family's C."""
    from vostream.apps.export.wrappers import top_grid

    net, family = ckpt.net, ckpt.family
    cfg = net.config
    grid = top_grid(net)
    C = int(cond_slots or family.cond_slots)
    max_cond = int(getattr(cfg, "max_cond_frame_num", -1))
    if max_cond > 0:
        C = min(C, max_cond) if cond_slots is None else C
    if C < 1:
        raise ConfigError(f"--cond-slots must be >= 1, got {C}")
    max_ptrs = int(cfg.max_object_pointers_in_encoder)
    pre = _read_json(ckpt.model, "preprocessor_config.json") or {}
    return _Layout(
        image_size=int(cfg.image_size),
        grid=grid,
        hidden_dim=int(net.hidden_dim),
        mem_dim=int(net.mem_dim),
        mask_size=int(net.prompt_encoder.mask_input_size[0]),
        cond_slots=C,
        recent_slots=int(cfg.num_maskmem) - 1,
        pointer_slots=C + max_ptrs - 1,
        max_cond=max_cond,
        max_ptrs=max_ptrs,
        mean=_three(pre.get("image_mean", family.mean)),
        std=_three(pre.get("image_std", family.std)),
    )


@contextlib.contextmanager
def _staging(out_dir: Path, precision: str) -> Iterator[_Dirs]:
    """The staging directories, siblings of ``out_dir``.  On any exception, or a signal (:class:`_StopOnSignals`,
    then raised as :class:`Interrupted`), ``tmp`` is removed; ``ref`` (when apart from ``tmp``) always is."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stop = _StopOnSignals(out_dir)  # a signal removes the staging directories (below) and exits 130
    stop.install()
    staged: Path | None = None
    fp32_staged: Path | None = None
    try:
        tmp = staged = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        ref = tmp
        if precision != "fp32":
            ref = fp32_staged = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.fp32.", dir=out_dir.parent))
        yield _Dirs(tmp, ref)
    except BaseException as exc:
        if staged is not None:  # a second signal meanwhile is ignored (_StopOnSignals)
            shutil.rmtree(staged, ignore_errors=True)
        if stop.count and not isinstance(exc, Interrupted):
            # the signal's Interrupted surfaced as something else: raised inside an extension module's import
            # (onnxruntime's), Python reports "ImportError: initialization failed"
            raise Interrupted(f"export interrupted by a signal; nothing was written to {out_dir}") from exc
        raise
    finally:
        if fp32_staged is not None:
            shutil.rmtree(fp32_staged, ignore_errors=True)
        stop.restore()


class _GraphExporter:
    """Steps 3 (export) and 4 (verify) of one graph at a time (:meth:`run`), recording what the manifest needs."""

    def __init__(self, dirs: _Dirs, opset: int, fp16: bool, say: Callable[[str], None]) -> None:
        self.dirs, self.opset, self.fp16, self.say = dirs, opset, fp16, say
        self.graphs: dict[str, GraphSpec] = {}
        self.verify: dict[str, dict[str, Any]] = {}

    def run(self, job: _GraphJob) -> tuple[Tensor, ...]:
        """Export ``job`` into ``ref``, verify it on every feed (and its fp16 copy in ``tmp``), record it; returns the
        torch outputs of the first feed."""
        t0 = time.perf_counter()
        path = self.dirs.ref / f"{job.name}.onnx"
        outs = _export_graph(job, path, self.opset)
        diffs = _verify_graph(job, path, self.dirs.tmp / path.name if self.fp16 else None)
        self.graphs[job.name] = GraphSpec(
            job.name,
            path.name,
            _specs(job.inputs, job.feeds[0], job.dynamic),
            _specs(job.outputs, outs, job.dynamic),
            dict(job.shrink or {}),
        )
        self.verify[job.name] = {"max_abs_diff": diffs, "export_s": round(time.perf_counter() - t0, 2)}
        self.say(
            f"  {job.name}: exported and verified in {time.perf_counter() - t0:.1f} s "
            f"(max |diff| {max(diffs.values()):.2g})"
        )
        return outs


def _export_graph(job: _GraphJob, path: Path, opset: int) -> tuple[Tensor, ...]:
    """Step 3 for one graph: ``job.module`` traced on its first feed into ``path``, identical constants shared;
    returns the module's outputs on that feed."""
    import torch

    job.module.eval()
    with torch.no_grad():
        outs = job.module(*job.feeds[0])
    outs = outs if isinstance(outs, tuple) else (outs,)
    with torch.no_grad():
        axes = dict(job.dynamic or {})
        for tname, (axis, symbol) in (job.shrink or {}).items():
            axes.setdefault(tname, {})[axis] = symbol
        _onnx_export(torch, job.module, job.feeds[0], path, job.inputs, job.outputs, opset, axes or None)
    _dedupe_constants(path)
    return outs


def _verify_graph(job: _GraphJob, path: Path, fp16_path: Path | None) -> dict[str, float]:
    """Step 4 for one graph: the ONNX file at ``path`` against ``job.module`` on every feed; with ``fp16_path``,
    its fp16 conversion written there and checked instead (:data:`FP16_TOL`).  Returns max |diff| per output."""
    import torch

    diffs = _verify(job.name, path, job.module, job.feeds, job.inputs, job.outputs, torch, bf16=job.bf16)
    if fp16_path is not None:
        _to_fp16(path, fp16_path)
        fp16_rel = {n: FP16_TOL for n in job.outputs}
        diffs = _verify(
            job.name, fp16_path, job.module, job.feeds, job.inputs, job.outputs, torch, fp16_rel, tol=FP16_TOL
        )
    return diffs


class _RandomFeeds:
    """Random test inputs, the same in every export (a generator seeded with 0, drawn from in a fixed order)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._gen = torch.Generator().manual_seed(0)

    def __call__(self, *shape: int) -> Tensor:
        return self._torch.randn(*shape, generator=self._gen)


def _export_graphs(
    ckpt: _Checkpoint, layout: _Layout, dirs: _Dirs, opset: int, fp16: bool, say: Callable[[str], None]
) -> _Exported:
    """Steps 3 and 4 for the four graphs, in the order their test feeds need: each is fed the previous ones' outputs."""
    import torch

    from vostream.apps.export.wrappers import MemoryAttentionGraph

    net, S = ckpt.net, layout.image_size
    exporter = _GraphExporter(dirs, opset, fp16, say)
    rnd = _RandomFeeds()
    s0, s1, feat, nomem, fmap = exporter.run(_image_encoder_job(net, S, rnd))
    attention = MemoryAttentionGraph(net, ckpt.family, S, layout.key_slots, layout.pointer_slots)
    tokens = int(attention.mem_pos.shape[0])
    exporter.run(_memory_attention_job(attention, layout, tokens, feat, rnd))
    mask_prompt = (rnd(1, 1, S, S) > 0).to(torch.float32)
    masks, _iou, _score, obj_ptrs = exporter.run(_decoder_job(net, S, (nomem, fmap, s0, s1), mask_prompt))
    exporter.run(_memory_encoder_job(ckpt, S, (feat, masks, obj_ptrs), mask_prompt))
    return _Exported(exporter.graphs, exporter.verify, tokens)


def _image_encoder_job(net: nn.Module, S: int, rnd: _RandomFeeds) -> _GraphJob:
    from vostream.apps.export.wrappers import ImageEncoderGraph

    module = ImageEncoderGraph(net)
    images = [(rnd(1, 3, S, S),), (rnd(1, 3, S, S),)]
    return _GraphJob(
        "image_encoder", module, images, ["image"], ["feat_s0", "feat_s1", "feat", "feat_nomem", "feat_map"]
    )


def _memory_attention_job(
    module: nn.Module, layout: _Layout, T: int, feat: Tensor, rnd: _RandomFeeds
) -> _GraphJob:
    """Full, masked, and shorter views of the slot and pointer axes (what the session binds while the bank fills)."""
    import torch

    C, N, L, Q = layout.cond_slots, layout.recent_slots, layout.key_slots, layout.pointer_slots
    D, M = layout.hidden_dim, layout.mem_dim

    def feed(n_valid: int, n_ptr: int, slots: int = L, pointers: int = Q) -> Feed:
        tpos = torch.tensor(([N] * C + list(range(N)))[L - slots :], dtype=torch.int64)
        sv = torch.zeros(slots)
        sv[:n_valid] = 1
        pv = torch.zeros(pointers)
        pv[:n_ptr] = 1
        return (
            feat,
            rnd(slots, T, M),
            tpos,
            sv,
            rnd(pointers, D),
            torch.arange(1, pointers + 1, dtype=torch.float32),
            pv,
        )

    short = N + 1, Q - C + 1  # one conditioning frame, full recent rings
    return _GraphJob(
        "memory_attention",
        module,
        [feed(L, Q), feed(1, 1), feed(C + 2, 5), feed(*short, *short), feed(1, 1, 1, 1), feed(2, 3, 3, 4)],
        ["feat", "bank", "slot_tpos", "slot_valid", "ptrs", "ptr_tdiff", "ptr_valid"],
        ["pix_feat"],
        shrink={
            "bank": (0, "slots"),
            "slot_tpos": (0, "slots"),
            "slot_valid": (0, "slots"),
            "ptrs": (0, "pointers"),
            "ptr_tdiff": (0, "pointers"),
            "ptr_valid": (0, "pointers"),
        },
    )


def _decoder_job(net: nn.Module, S: int, features: Feed, mask_prompt: Tensor) -> _GraphJob:
    """Points (one positive, one negative, one padding) on the plain features; a mask prompt on the memory ones.
    ``features``: the image encoder's ``feat_nomem``, ``feat_map``, ``feat_s0``, ``feat_s1``."""
    import torch

    from vostream.apps.export.wrappers import DecoderGraph

    nomem, fmap, s0, s1 = features
    module = DecoderGraph(net)
    pts = torch.tensor([[[S * 0.3, S * 0.4], [S * 0.6, S * 0.7], [0.0, 0.0]]])
    lbl = torch.tensor([[1, 0, -1]], dtype=torch.int32)
    no_points = torch.zeros(1, 1, 2), -torch.ones(1, 1, dtype=torch.int32)
    feeds = [
        (nomem, s0, s1, pts, lbl, torch.zeros(1, 1, S, S), torch.zeros(1)),
        (fmap, s0, s1, *no_points, mask_prompt, torch.ones(1)),
    ]
    return _GraphJob(
        "decoder",
        module,
        feeds,
        ["pix_feat", "feat_s0", "feat_s1", "points", "labels", "mask_prompt", "has_mask"],
        ["low_res_masks", "iou", "object_score", "obj_ptrs"],
        {"points": {1: "K"}, "labels": {1: "K"}},
    )


def _memory_encoder_job(ckpt: _Checkpoint, S: int, decoded: Feed, mask_prompt: Tensor) -> _GraphJob:
    """Present and absent objects, on the random mask prompt and (binarised) on a blocky one.  ``decoded``: the
    image encoder's ``feat`` and the decoder's ``low_res_masks`` and ``obj_ptrs``."""
    import torch

    from vostream.apps.export.wrappers import MemoryEncoderGraph

    feat, masks, obj_ptrs = decoded
    module = MemoryEncoderGraph(ckpt.net, ckpt.family, S)
    one = torch.ones(1)

    def i64(v: int) -> Tensor:
        return torch.tensor([v], dtype=torch.int64)

    # Binarising (mask > 0) is only checked on a blocky mask prompt: upsampled random logits have pixels within
    # 1e-6 of 0, where ONNX Runtime and PyTorch may round to different sides (a real but meaningless flip).
    yy, xx = torch.meshgrid(torch.arange(S), torch.arange(S), indexing="ij")
    blocks = (((yy // 16) + (xx // 16)) % 2).to(torch.float32)[None, None]
    zero = torch.zeros(1)
    feeds = [
        (feat, masks, obj_ptrs, torch.tensor([[0.7]]), mask_prompt, i64(1), i64(1), zero, zero),
        (feat, masks, obj_ptrs, torch.tensor([[-0.7]]), mask_prompt, i64(0), i64(0), zero, zero),
        (feat, masks, obj_ptrs, torch.tensor([[0.7]]), blocks, i64(2), i64(3), one, one),
    ]
    return _GraphJob(
        "memory_encoder",
        module,
        feeds,
        [
            "feat",
            "low_res_masks",
            "obj_ptrs",
            "object_score",
            "mask_prompt",
            "plane",
            "token",
            "use_mask_prompt",
            "binarize",
        ],
        ["maskmem", "obj_ptr"],
        bf16=("maskmem",) if ckpt.family.bank_bf16 else (),
    )


def _manifest(ckpt: _Checkpoint, layout: _Layout, exported: _Exported, opset: int) -> Manifest:
    """Step 5: the fp32 export's manifest (the runtime's sizes, the session's algorithm settings, provenance)."""
    import onnx
    import onnxruntime

    torch, transformers = _require_export_deps()
    net, family = ckpt.net, ckpt.family
    cfg, md = net.config, net.mask_decoder
    algorithm = {
        "multimask_output_in_sam": bool(cfg.multimask_output_in_sam),
        "multimask_output_for_tracking": bool(cfg.multimask_output_for_tracking),
        "multimask_min_pt_num": int(cfg.multimask_min_pt_num),
        "multimask_max_pt_num": int(cfg.multimask_max_pt_num),
        "dynamic_multimask_via_stability": bool(md.dynamic_multimask_via_stability),
        "stability_delta": float(md.dynamic_multimask_stability_delta),
        "stability_thresh": float(md.dynamic_multimask_stability_thresh),
        "batch_binarize": family.batch_binarize,
        "max_cond_frame_num": layout.max_cond,
        "ptr_temporal_encoding": bool(cfg.enable_temporal_pos_encoding_for_object_pointers),
        "no_obj_score": -1024.0,
        "mask_prompt_scale": 20.0,
        "mask_prompt_bias": -10.0,
    }
    return Manifest(
        family=family.name,
        image_size=layout.image_size,
        mean=layout.mean,
        std=layout.std,
        grid=layout.grid,
        hidden_dim=layout.hidden_dim,
        mem_dim=layout.mem_dim,
        tokens_per_slot=exported.tokens_per_slot,
        mask_size=layout.mask_size,
        cond_slots=layout.cond_slots,
        recent_slots=layout.recent_slots,
        pointer_slots=layout.pointer_slots,
        max_object_pointers=layout.max_ptrs,
        num_maskmem=int(cfg.num_maskmem),
        algorithm=algorithm,
        graphs=exported.graphs,
        dtype="float32",
        opset=opset,
        source={
            "model": str(ckpt.model),
            "model_type": ckpt.config_json.get("model_type"),
            "class": family.model_class,
            "trained_image_size": ckpt.trained_size,
            "parameters": int(sum(p.numel() for p in net.parameters())),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
        },
        verify=exported.verify,
        format_version=FORMAT_VERSION,
        vostream_version=package_version(),
    )


def _other_precision(
    manifest: Manifest,
    dirs: _Dirs,
    request: _Request,
    prompts: Sequence[Prompt],
    threads: int | None,
    amct: bool,
    say: Callable[[str], None],
) -> Manifest:
    """The manifest of the precision asked for: fp32 as is; fp16 (graphs converted and verified in step 4)
    relabelled; int8 quantized from the fp32 reference; with ``--compare``, measured against it."""
    if request.precision == "fp16":
        manifest = dataclasses.replace(manifest, dtype="float16-mixed")
    if request.calib_clip is not None:
        assert request.int8 is not None
        manifest = _int8_from(
            dirs.ref, dirs.tmp, manifest, request.int8, request.calib_clip, prompts, threads, amct, say
        )
    if request.compare is not None and request.compare_clip is not None:
        from vostream.apps.export import precision as p  # imported on use: it needs onnxruntime

        manifest.write(dirs.tmp)
        say(f"comparing with fp32 on {request.compare} ({len(request.compare_clip)} frames, side by side)")
        label = manifest.dtype
        report = p.compare_exports(
            dirs.ref,
            {label: dirs.tmp},
            request.compare,
            request.compare_clip,
            prompts,
            threads=threads,
            progress=say,
        )[label]
        manifest = dataclasses.replace(manifest, verify={**manifest.verify, "compare": report})
    return manifest


def _int8_from(
    ref: Path,
    out: Path,
    manifest: Manifest,
    clip: str | Path,
    frames: Sequence[Frame],
    prompts: Sequence[Prompt],
    threads: int | None,
    amct: bool,
    say: Callable[[str], None],
) -> Manifest:
    """The INT8 export in ``out`` from the verified fp32 export in ``ref`` (its ``manifest``): record the graphs'
    inputs while ``ref`` tracks ``frames`` from ``prompts``, quantize, check; with ``amct``, also ``out/amct/``."""
    from vostream.apps.export import precision as p  # imported on use: it needs onnxruntime

    say(f"calibrating INT8 on {clip}: tracking {len(frames)} frames with the fp32 export")
    store = p.FeedStore(ref / "calibration")
    runs = p.record_calibration(ref, p.preprocess(frames, manifest), prompts, store, threads)
    info = p.quantize_export(ref, out, manifest, store, say)
    verify = {name: {**manifest.verify.get(name, {}), "int8": info[name]} for name in manifest.graphs}
    verify["int8"] = {
        "calibration_clip": str(clip),
        "calibration_frames": len(frames),
        "calibration_runs": runs,
        "prompts": [{"obj_id": q.obj_id, "frame": q.frame_index} for q in prompts],
        "format": "QDQ",
        "weights": "int8, symmetric, per output channel",
        "activations": "uint8, asymmetric, per tensor, MinMax over the calibration runs",
        "op_types": list(p.INT8_OP_TYPES),
        "min_rows": p.MIN_ROWS,
        "check": f"relative RMS error vs fp32 <= {p.INT8_REL_RMS} per output, on the calibration runs",
    }
    if amct:
        from vostream.apps.export.atc import write_amct_inputs

        write_amct_inputs(manifest, ref, store, out)
        say(f"wrote {out.name}/amct/ (fp32 graphs and calibration data for AMCT)")
    return dataclasses.replace(manifest, dtype=p.INT8_DTYPE, verify=verify)


__all__ = ["DEFAULT_CALIB_FRAMES", "DEFAULT_OPSET", "TOL", "export_model", "load_checkpoint"]
