"""``vostream export``: a transformers SAM-2-family checkpoint -> four ONNX graphs + ``manifest.json``.

Needs the ``[export]`` extra (torch, transformers >= 5, onnx, onnxruntime); nothing else in vostream imports it.
Every graph is checked against its PyTorch wrapper on random inputs with ONNX Runtime before the export directory
appears: the graphs are written to a temporary sibling directory that is renamed at the end, so a failed export
leaves nothing half-written.  Design: ``docs/sam2-backend.md``.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
#: frames of the ``--int8`` clip used for calibration (from its start)
DEFAULT_CALIB_FRAMES = 32
#: verification tolerance for fp32 graphs: max |onnx - torch| <= TOL * max(1, max |torch|)
TOL = 1e-4


def _require_export_deps() -> tuple[Any, Any]:
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


def load_checkpoint(model: str) -> tuple[Any, Family, dict[str, Any]]:
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


def resize_model(net: Any, family: Family, size: int) -> Any:
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
    torch: Any,
    module: Any,
    args: tuple[Any, ...],
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


def _dtype_name(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


def _specs(
    names: list[str], tensors: tuple[Any, ...], dynamic: dict[str, dict[int, str]] | None = None
) -> tuple[TensorSpec, ...]:
    out = []
    for name, t in zip(names, tensors):
        shape: list[int | str] = list(t.shape)
        for axis, label in (dynamic or {}).get(name, {}).items():
            shape[axis] = label
        out.append(TensorSpec(name, tuple(shape), _dtype_name(t)))
    return tuple(out)


def _bf16_step(magnitude: Any) -> Any:
    """The spacing of bfloat16 values (8 significant bits) at ``|x|`` = ``magnitude``, elementwise: 2**(e - 8)
    for ``|x|`` in [2**(e-1), 2**e).  (Zero gets the smallest normal spacing; the absolute tolerance covers it.)"""
    _, exp = np.frexp(np.asarray(magnitude, dtype=np.float64))
    return np.ldexp(1.0, np.maximum(exp, -125) - 8)


def _verify(
    graph: str,
    path: Path,
    module: Any,
    feeds_list: list[tuple[Any, ...]],
    in_names: list[str],
    out_names: list[str],
    torch: Any,
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

    def rewire(nodes: Any) -> None:  # nested graphs (If/Loop bodies) may read outer-scope constants too
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


def _three(values: Any) -> tuple[float, float, float]:
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
    if fp16 and int8 is not None:
        raise ConfigError("--fp16 and --int8 exclude each other: choose one precision per export")
    if compare is not None and not (fp16 or int8 is not None):
        raise ConfigError("--compare measures an --fp16 or --int8 export against fp32: add one of them")
    if amct and int8 is None:
        raise ConfigError("the Ascend INT8 files (amct/) need --int8 CLIP")
    calib_clip = compare_clip = None
    if int8 is not None:
        calib_clip = _precision().read_clip(int8, calib_frames, "--int8")
        _precision().check_prompts(prompts, calib_clip, "--int8", int8, tracking=True)
    if compare is not None:
        compare_clip = _precision().read_clip(compare, compare_frames, "--compare")
        _precision().check_prompts(prompts, compare_clip, "--compare", compare)
    if out_dir.exists() and any(out_dir.iterdir()):
        if not (out_dir / MANIFEST_NAME).is_file():
            raise ConfigError(
                f"{out_dir} exists and is not a vostream export; choose an empty or new directory"
            )
        if not overwrite:
            raise ConfigError(f"{out_dir} already holds an export; pass --force to replace it")
    if opset < 17:
        raise ConfigError(f"--opset {opset}: the graphs need opset >= 17 (LayerNormalization)")
    torch, transformers = _require_export_deps()
    t_start = time.perf_counter()
    say(f"loading {model}")
    net, family, config_json = load_checkpoint(model)
    trained_size = int(net.config.image_size)
    if image_size is not None and image_size != trained_size:
        say(f"resizing from {trained_size} to {image_size} px")
        net = resize_model(net, family, image_size)
    from vostream.apps.export.wrappers import (
        DecoderGraph,
        ImageEncoderGraph,
        MemoryAttentionGraph,
        MemoryEncoderGraph,
        top_grid,
    )

    cfg = net.config
    S = int(cfg.image_size)
    g = top_grid(net)
    D, M = int(net.hidden_dim), int(net.mem_dim)
    P = int(net.prompt_encoder.mask_input_size[0])
    C = int(cond_slots or family.cond_slots)
    max_cond = int(getattr(cfg, "max_cond_frame_num", -1))
    if max_cond > 0:
        C = min(C, max_cond) if cond_slots is None else C
    if C < 1:
        raise ConfigError(f"--cond-slots must be >= 1, got {C}")
    N = int(cfg.num_maskmem) - 1
    L = C + N
    max_ptrs = int(cfg.max_object_pointers_in_encoder)
    Q = C + max_ptrs - 1
    pre = _read_json(model, "preprocessor_config.json") or {}
    mean = _three(pre.get("image_mean", family.mean))
    std = _three(pre.get("image_std", family.std))

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stop = _StopOnSignals(out_dir)  # a signal removes the staging directories (below) and exits 130
    stop.install()
    staged: Path | None = None
    fp32_staged: Path | None = None
    precision = "int8" if int8 is not None else "fp16" if fp16 else "fp32"
    try:
        tmp = staged = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        # the fp32 graphs: the export itself, or (fp16 / int8) the reference the other precision is made from and
        # measured against, staged beside it and removed at the end
        ref = tmp
        if precision != "fp32":
            ref = fp32_staged = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.fp32.", dir=out_dir.parent))
        gen = torch.Generator().manual_seed(0)

        def rnd(*shape: int, scale: float = 1.0) -> Any:
            return torch.randn(*shape, generator=gen) * scale

        graphs: dict[str, GraphSpec] = {}
        verify: dict[str, Any] = {}

        def do(
            name: str,
            module: Any,
            args_list: list[tuple[Any, ...]],
            in_names: list[str],
            out_names: list[str],
            dynamic: dict[str, dict[int, str]] | None = None,
            bf16: tuple[str, ...] = (),
            shrink: dict[str, tuple[int, str]] | None = None,
        ) -> tuple[Any, ...]:
            """Export, verify on every feed of ``args_list``, record.  ``dynamic``: symbolic axes in the manifest;
            ``shrink``: axes dynamic in the ONNX file but kept at the first feed's size in the manifest."""
            t0 = time.perf_counter()
            path = ref / f"{name}.onnx"
            module.eval()
            with torch.no_grad():
                outs = module(*args_list[0])
            outs = outs if isinstance(outs, tuple) else (outs,)
            with torch.no_grad():
                axes = dict(dynamic or {})
                for tname, (axis, symbol) in (shrink or {}).items():
                    axes.setdefault(tname, {})[axis] = symbol
                _onnx_export(torch, module, args_list[0], path, in_names, out_names, opset, axes or None)
            _dedupe_constants(path)
            diffs = _verify(name, path, module, args_list, in_names, out_names, torch, bf16=bf16)
            if fp16:
                _to_fp16(path, tmp / path.name)
                diffs = _verify(
                    name,
                    tmp / path.name,
                    module,
                    args_list,
                    in_names,
                    out_names,
                    torch,
                    {n: FP16_TOL for n in out_names},
                    tol=FP16_TOL,
                )
            graphs[name] = GraphSpec(
                name,
                path.name,
                _specs(in_names, args_list[0], dynamic),
                _specs(out_names, outs, dynamic),
                dict(shrink or {}),
            )
            verify[name] = {"max_abs_diff": diffs, "export_s": round(time.perf_counter() - t0, 2)}
            say(
                f"  {name}: exported and verified in {time.perf_counter() - t0:.1f} s "
                f"(max |diff| {max(diffs.values()):.2g})"
            )
            return outs

        ie = ImageEncoderGraph(net)
        images = [(rnd(1, 3, S, S),), (rnd(1, 3, S, S),)]
        s0, s1, feat, nomem, fmap = do(
            "image_encoder", ie, images, ["image"], ["feat_s0", "feat_s1", "feat", "feat_nomem", "feat_map"]
        )

        ma = MemoryAttentionGraph(net, family, S, L, Q)
        T = int(ma.mem_pos.shape[0])

        def ma_args(n_valid: int, n_ptr: int, slots: int = L, pointers: int = Q) -> tuple[Any, ...]:
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

        # full, masked, and shorter views of the slot and pointer axes (what the session binds while the bank fills)
        short = N + 1, Q - C + 1  # one conditioning frame, full recent rings
        do(
            "memory_attention",
            ma,
            [
                ma_args(L, Q),
                ma_args(1, 1),
                ma_args(C + 2, 5),
                ma_args(*short, *short),
                ma_args(1, 1, 1, 1),
                ma_args(2, 3, 3, 4),
            ],
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

        de = DecoderGraph(net)
        pts = torch.tensor([[[S * 0.3, S * 0.4], [S * 0.6, S * 0.7], [0.0, 0.0]]])
        lbl = torch.tensor([[1, 0, -1]], dtype=torch.int32)
        mprompt = (rnd(1, 1, S, S) > 0).to(torch.float32)
        dec_args = [
            (nomem, s0, s1, pts, lbl, torch.zeros(1, 1, S, S), torch.zeros(1)),
            (
                fmap,
                s0,
                s1,
                torch.zeros(1, 1, 2),
                -torch.ones(1, 1, dtype=torch.int32),
                mprompt,
                torch.ones(1),
            ),
        ]
        dyn = {"points": {1: "K"}, "labels": {1: "K"}}
        masks, _iou, _score, obj_ptrs = do(
            "decoder",
            de,
            dec_args,
            ["pix_feat", "feat_s0", "feat_s1", "points", "labels", "mask_prompt", "has_mask"],
            ["low_res_masks", "iou", "object_score", "obj_ptrs"],
            dyn,
        )

        me = MemoryEncoderGraph(net, family, S)
        one = torch.ones(1)

        def i64(v: int) -> Any:
            return torch.tensor([v], dtype=torch.int64)

        # Binarising (mask > 0) is only checked on a blocky mask prompt: upsampled random logits have pixels within
        # 1e-6 of 0, where ONNX Runtime and PyTorch may round to different sides (a real but meaningless flip).
        yy, xx = torch.meshgrid(torch.arange(S), torch.arange(S), indexing="ij")
        blocks = (((yy // 16) + (xx // 16)) % 2).to(torch.float32)[None, None]
        zero = torch.zeros(1)
        me_args = [
            (feat, masks, obj_ptrs, torch.tensor([[0.7]]), mprompt, i64(1), i64(1), zero, zero),
            (feat, masks, obj_ptrs, torch.tensor([[-0.7]]), mprompt, i64(0), i64(0), zero, zero),
            (feat, masks, obj_ptrs, torch.tensor([[0.7]]), blocks, i64(2), i64(3), one, one),
        ]
        do(
            "memory_encoder",
            me,
            me_args,
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
            bf16=("maskmem",) if family.bank_bf16 else (),
        )

        md = net.mask_decoder
        algorithm = {
            "multimask_output_in_sam": bool(cfg.multimask_output_in_sam),
            "multimask_output_for_tracking": bool(cfg.multimask_output_for_tracking),
            "multimask_min_pt_num": int(cfg.multimask_min_pt_num),
            "multimask_max_pt_num": int(cfg.multimask_max_pt_num),
            "dynamic_multimask_via_stability": bool(md.dynamic_multimask_via_stability),
            "stability_delta": float(md.dynamic_multimask_stability_delta),
            "stability_thresh": float(md.dynamic_multimask_stability_thresh),
            "batch_binarize": family.batch_binarize,
            "max_cond_frame_num": max_cond,
            "ptr_temporal_encoding": bool(cfg.enable_temporal_pos_encoding_for_object_pointers),
            "no_obj_score": -1024.0,
            "mask_prompt_scale": 20.0,
            "mask_prompt_bias": -10.0,
        }
        vs_version = package_version()
        import dataclasses

        import onnx
        import onnxruntime

        manifest = Manifest(
            family=family.name,
            image_size=S,
            mean=mean,
            std=std,
            grid=g,
            hidden_dim=D,
            mem_dim=M,  # type: ignore[arg-type]
            tokens_per_slot=T,
            mask_size=P,
            cond_slots=C,
            recent_slots=N,
            pointer_slots=Q,
            max_object_pointers=max_ptrs,
            num_maskmem=int(cfg.num_maskmem),
            algorithm=algorithm,
            graphs=graphs,
            dtype="float32",
            opset=opset,
            source={
                "model": str(model),
                "model_type": config_json.get("model_type"),
                "class": family.model_class,
                "trained_image_size": trained_size,
                "parameters": int(sum(p.numel() for p in net.parameters())),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__,
            },
            verify=verify,
            format_version=FORMAT_VERSION,
            vostream_version=vs_version,
        )
        manifest.write(ref)
        if fp16:
            manifest = dataclasses.replace(manifest, dtype="float16-mixed")
        if calib_clip is not None:
            assert int8 is not None
            manifest = _int8_from(ref, tmp, manifest, int8, calib_clip, prompts, threads, amct, say)
        if compare_clip is not None:
            manifest.write(tmp)
            say(f"comparing with fp32 on {compare} ({len(compare_clip)} frames, side by side)")
            label = manifest.dtype
            report = _precision().compare_exports(
                ref, {label: tmp}, compare, compare_clip, prompts, threads=threads, progress=say
            )[label]
            manifest = dataclasses.replace(manifest, verify={**manifest.verify, "compare": report})
        manifest.write(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        tmp.rename(out_dir)
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
    say(
        f"wrote {out_dir} ({family.name}, {S}px, {precision}, C={C} N={N} Q={Q}) in {time.perf_counter() - t_start:.1f} s"
    )
    return manifest


def _precision() -> Any:
    """``precision.py`` (imported on use: it needs onnxruntime)."""
    from vostream.apps.export import precision

    return precision


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
    import dataclasses

    p = _precision()
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
