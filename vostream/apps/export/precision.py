"""INT8 exports and the precision report of ``vostream export`` (``docs/deploy.md`` §3).

* **Calibration from the user's clip.**  The fp32 export (staged beside the real one) tracks the clip from the
  user's prompt on ONNX Runtime (CPU) through a runtime that records every graph's inputs: the image encoder sees
  the clip's frames, memory attention, the decoder and the memory encoder see exactly what they see while
  tracking.  Memory attention is recorded with the whole bank bound (the static shapes ATC compiles), so the same
  recordings serve the Ascend calibration (``atc.py``).  The recordings are ``.npz`` files on disk, not in memory.
* **Static INT8 for ONNX Runtime** (``onnxruntime.quantization.quantize_static``, QDQ format, MinMax ranges over
  the recordings): weights int8 per output channel, activations uint8 (asymmetric).  Quantized: the Conv nodes that
  sum at least :data:`MIN_CONV_REDUCTION` products per output, and the MatMul/Gemm nodes whose activation has at
  least :data:`MIN_ROWS` rows (image, memory and mask tokens: nearly all of the arithmetic).  Kept fp32: the MatMuls
  over the handful of prompt/output tokens in the decoder (about a quarter of its arithmetic on the tiny model, whose
  image has 64 tokens, well under 1 % at 1024 px; with every MatMul quantized, the tiny model's object score, which
  decides "object present", had a relative RMS error of 0.74), the convs on the 1-channel mask inputs (negligible arithmetic; a bimodal input:
  +-10 on prompted frames, sigmoid-scaled logits otherwise, which a random-weight model keeps within +-0.07 so one
  shared range wiped them out), and every other op (LayerNorm, Softmax, the attention masks, the bf16 rounding).
* **The check.**  Each quantized graph is run against its fp32 graph on the recordings; a relative RMS error above
  :data:`INT8_REL_RMS` on any output (or a non-finite value) fails the export, like the fp32 check does.
* **The report** (:func:`compare_exports`): the fp32 export and the others track a stated clip side by side in one
  run (interleaved rounds, the same frames and prompts, the same threads): mask IoU (mean, min) of ``logits > 0``
  on the low-res masks, max |Δ logit| where both see the object, frames where they disagree on presence, file size
  ratio and time-per-frame ratio.  On random weights these only say the graph is still faithful.

Needs onnx and onnxruntime (the ``[export]`` extra); torch is not imported here.
"""

from __future__ import annotations

import logging
import os
import shutil
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vostream.pipeline.errors import BackendError, ConfigError, VostreamError
from vostream.pipeline.types import Frame, Prompt
from vostream.stages.trackers.sam2.backends.ort import OrtRuntime
from vostream.stages.trackers.sam2.manifest import DTYPE_INT8, GRAPHS, Manifest
from vostream.stages.trackers.sam2.runtime import DeviceBuffer

if TYPE_CHECKING:
    import onnxruntime as ort

    from vostream.stages.trackers.sam2 import Sam2Tracker

logger = logging.getLogger(__name__)

#: manifest ``dtype`` of an INT8 export (QDQ int8 where quantized, fp32 elsewhere; graph I/O fp32)
INT8_DTYPE = DTYPE_INT8
#: op types quantized (subject to :data:`MIN_ROWS` for MatMul / Gemm)
INT8_OP_TYPES: tuple[str, ...] = ("Conv", "MatMul", "Gemm")
#: a MatMul / Gemm is quantized only when its first input has at least this many rows (a linear layer: the product
#: of its leading axes; attention: the query tokens per head): image and memory tokens (64 on the tiny model, 4096 at
#: 1024 px) yes, the decoder's prompt and output tokens (the points + 7) no
MIN_ROWS = 32
#: a Conv is quantized only when each output sums at least this many products (input channels per group x kernel
#: area): the convs on the 1-channel mask inputs (memory encoder, decoder) stay fp32; their arithmetic is negligible
#: and their input is bimodal (+-10 on prompted frames, the sigmoid of the logits otherwise)
MIN_CONV_REDUCTION = 32
#: the INT8 check: ||int8 - fp32|| / ||fp32|| (RMS over all recorded runs) per output must stay at or below this
INT8_REL_RMS = 0.25
#: interleaved rounds of the side-by-side timing
DEFAULT_ROUNDS = 3


# ------------------------------------------------------------------------------------------------ clips
def read_clip(path: str | Path, max_frames: int | None, option: str) -> list[Frame]:
    """The first ``max_frames`` frames of a video file or frames directory (RGB uint8 :class:`Frame` objects).
    ``option`` names the command-line option in errors (:class:`ConfigError`, one line)."""
    from vostream.stages.sources import is_live_uri, open_source

    text = os.fspath(path)
    if is_live_uri(text):
        raise ConfigError(f"{option} {text}: needs a video file or frames directory, not a live stream")
    if max_frames is not None and max_frames < 1:
        raise ConfigError(f"{option}: the number of frames must be >= 1, got {max_frames}")
    try:
        source = open_source(text)
        source.open()
    except VostreamError as exc:
        raise ConfigError(f"{option} {text}: {exc}") from None
    frames: list[Frame] = []
    try:
        while max_frames is None or len(frames) < max_frames:
            frame = source.read()
            if frame is None:
                break
            frames.append(frame)
    except VostreamError as exc:
        raise ConfigError(f"{option} {text}: {exc}") from None
    finally:
        source.close()
    if not frames:
        raise ConfigError(f"{option} {text}: no frames could be decoded")
    return frames


def check_prompts(
    prompts: Sequence[Prompt], frames: Sequence[Frame], option: str, clip: str | Path, tracking: bool = False
) -> None:
    """:class:`ConfigError` unless ``prompts`` start at least one object inside ``frames``' size, on a frame the
    clip has; with ``tracking``, also unless a frame follows the first prompt (memory attention must run)."""
    from vostream.apps.prompts import check_prompt_sequence

    if not prompts:
        raise ConfigError(
            f"{option} needs a prompt on the clip to track from: --point X,Y (or --box, --mask, --prompts)"
        )
    for p in prompts:
        if not isinstance(p, Prompt):
            raise ConfigError(
                f"{option}: only prompts (points, boxes, masks) are used here, not {type(p).__name__}"
            )
        if p.frame_index >= len(frames):
            raise ConfigError(
                f"{option} {clip}: object {p.obj_id}'s prompt is on frame {p.frame_index}, but only "
                f"{len(frames)} frames are used"
            )
    check_prompt_sequence(prompts, frames[0].width, frames[0].height, f"{option} {clip}")
    first = min(p.frame_index for p in prompts)
    if tracking and first >= len(frames) - 1:
        raise ConfigError(
            f"{option} {clip}: no frame follows the first prompt (frame {first} of the {len(frames)} used), so "
            "memory attention would never run: use more frames or an earlier prompt"
        )


def preprocess(frames: Sequence[Frame], manifest: Manifest) -> list[Frame]:
    """Copies of ``frames`` with ``tensor`` set the way ``vostream track`` sets it (same spec for every precision
    of one checkpoint)."""
    from vostream.stages.preprocess import Preprocessor
    from vostream.stages.trackers.base import InputSpec

    m = manifest
    spec = InputSpec(m.image_size, m.image_size, "stretch", m.mean, m.std, "NCHW", "float32")
    pre = Preprocessor(spec, ring=1)
    out = []
    for f in frames:
        g = Frame(f.index, f.image, f.pts, f.time_base)
        g.tensor = pre(f.image).copy()
        out.append(g)
    return out


@dataclass
class ClipRun:
    """One export tracking one clip: per frame, each object's low-res logits and presence; per frame, seconds in
    ``session.step``."""

    logits: list[dict[int, np.ndarray]] = field(default_factory=list)
    present: list[dict[int, bool]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)


def track_clip(tracker: Any, frames: Sequence[Frame], prompts: Sequence[Prompt]) -> ClipRun:
    """Track ``frames`` (tensors set) with ``tracker`` from ``prompts``."""
    run = ClipRun()
    session = tracker.new_session()
    try:
        for p in prompts:
            session.add_prompt(p)
        for f in frames:
            t0 = time.perf_counter()
            res = session.step(f)
            run.step_s.append(time.perf_counter() - t0)
            ids = [int(i) for i in res.obj_ids]
            run.logits.append({i: np.asarray(res.logits[k], np.float32) for k, i in enumerate(ids)})
            run.present.append({i: bool(res.present[k]) for k, i in enumerate(ids)})
    finally:
        session.close()
    return run


# ------------------------------------------------------------------------------------------------ recording
class FeedStore:
    """Recorded graph inputs on disk: ``root/<graph>/<nnnnn>.npz``, one file per graph run."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.counts: dict[str, int] = {}

    def add(self, graph: str, feed: dict[str, np.ndarray]) -> None:
        d = self.root / graph
        d.mkdir(parents=True, exist_ok=True)
        i = self.counts.get(graph, 0)
        np.savez(d / f"{i:05d}.npz", **feed)  # type: ignore[arg-type]
        self.counts[graph] = i + 1

    def feeds(self, graph: str) -> Iterator[dict[str, np.ndarray]]:
        for i in range(self.counts.get(graph, 0)):
            with np.load(self.root / graph / f"{i:05d}.npz") as z:
                yield {k: z[k] for k in z.files}


class RecordingRuntime(OrtRuntime):
    """:class:`OrtRuntime` (CPU) that saves every graph's inputs into a :class:`FeedStore` before running it.
    ``dynamic_shapes`` is off: memory attention gets the whole bank, empty slots masked (ATC's static shapes)."""

    name = "RecordingRuntime"

    def __init__(self, store: FeedStore, threads: int | None = None) -> None:
        super().__init__(providers=["cpu"], threads=threads)
        self.store = store
        self.dynamic_shapes = False

    def run(self, graph: str, inputs: dict[str, DeviceBuffer], outputs: dict[str, DeviceBuffer]) -> None:  # type: ignore[override]
        feed = {}
        for name, buf in inputs.items():
            feed[name] = self._host_window(self._alloc_of(buf, "record"), buf).copy()
        self.store.add(graph, feed)
        super().run(graph, inputs, outputs)


def record_calibration(
    fp32_dir: Path, frames: Sequence[Frame], prompts: Sequence[Prompt], store: FeedStore, threads: int | None
) -> dict[str, int]:
    """Track ``frames`` (tensors set) with the fp32 export in ``fp32_dir`` from ``prompts``, recording every graph
    run into ``store``; returns the runs per graph."""
    from vostream.stages.trackers.sam2.tracker import Sam2Tracker

    tracker = Sam2Tracker(fp32_dir, RecordingRuntime(store, threads))
    try:
        track_clip(tracker, frames, prompts)
    finally:
        tracker.close()
    missing = [g for g in GRAPHS if not store.counts.get(g)]
    if missing:  # memory attention needs a second frame; every graph needs at least one run to calibrate
        raise ConfigError(
            f"--int8: tracking the calibration clip never ran {', '.join(missing)} "
            f"({len(frames)} frames); use a clip of at least 2 frames with the prompt on an early frame"
        )
    return dict(store.counts)


# ------------------------------------------------------------------------------------------------ quantization
def _session(path: Path | bytes, threads: int | None = 1, optimize: bool = True) -> ort.InferenceSession:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads is not None:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(
        path if isinstance(path, bytes) else str(path), so, providers=["CPUExecutionProvider"]
    )


def select_nodes(path: Path, feed: dict[str, np.ndarray]) -> tuple[list[str], dict[str, tuple[str, int]]]:
    """``(quantize, kept)`` for the ONNX file at ``path``: the nodes to quantize (each Conv reducing over at least
    :data:`MIN_CONV_REDUCTION` values, each MatMul/Gemm with at least :data:`MIN_ROWS` rows), and the Conv / MatMul
    / Gemm nodes kept fp32 (``name -> (op type, reduction or rows)``).  The rows are measured: ``feed`` runs once
    with the MatMul/Gemm first inputs as extra outputs."""
    import onnx

    model = onnx.load(str(path))
    graph = model.graph
    known = {i.name for i in graph.initializer} | {o.name for o in graph.output}
    feeds_in = {i.name for i in graph.input}
    extra: list[onnx.ValueInfoProto] = []
    for n in graph.node:
        t = n.input[0] if n.op_type in ("MatMul", "Gemm") else ""
        if t and t not in known and t not in feeds_in and t not in {e.name for e in extra}:
            extra.append(onnx.ValueInfoProto(name=t))
    graph.output.extend(extra)
    sess = _session(model.SerializeToString(), optimize=False)
    names = [e.name for e in extra]
    shapes = {n: v.shape for n, v in zip(names, sess.run(names, feed))}
    shapes.update({k: v.shape for k, v in feed.items()})
    init = {i.name: tuple(i.dims) for i in graph.initializer}
    consts = {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    chosen: list[str] = []
    kept: dict[str, tuple[str, int]] = {}
    for n in graph.node:
        if n.op_type == "Conv":
            w = init.get(n.input[1])
            size, least = (int(np.prod(w[1:])) if w is not None else 0), MIN_CONV_REDUCTION
        elif n.op_type in ("MatMul", "Gemm"):
            shape = shapes.get(n.input[0], init.get(n.input[0]))
            if not shape or len(shape) < 2:
                size = 0
            elif n.input[1] in init or n.input[1] in consts:  # a linear layer: every leading axis is rows
                size = int(np.prod(shape[:-1]))
            else:  # activation x activation (attention): rows per head
                size = int(shape[-2])
            least = MIN_ROWS
        else:
            continue
        if size >= least:
            chosen.append(n.name)
        else:
            kept[n.name] = (n.op_type, size)
    return chosen, kept


class _Reader:
    """``onnxruntime.quantization.CalibrationDataReader`` over a :class:`FeedStore` graph."""

    def __init__(self, store: FeedStore, graph: str) -> None:
        self.it = store.feeds(graph)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.it, None)

    def rewind(self) -> None:  # pragma: no cover - ORT's interface; the quantizer reads once
        raise NotImplementedError


def quantize_graph(src: Path, dst: Path, graph: str, store: FeedStore) -> dict[str, Any]:
    """INT8 QDQ copy of the fp32 graph ``src`` at ``dst``, calibrated on ``store``'s ``graph`` recordings."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    first = next(store.feeds(graph))
    nodes, kept = select_nodes(src, first)
    counts: dict[str, int] = {}
    for op, _ in kept.values():
        counts[op] = counts.get(op, 0) + 1
    if not nodes:
        shutil.copyfile(src, dst)
        return {"quantized_nodes": 0, "kept_fp32": counts}
    root = logging.getLogger()
    level = root.level
    root.setLevel(
        logging.ERROR
    )  # the quantizer warns through the root logger ("consider pre-processing", ...)
    try:
        quantize_static(
            str(src),
            str(dst),
            _Reader(store, graph),  # type: ignore[arg-type]
            quant_format=QuantFormat.QDQ,
            nodes_to_quantize=nodes,
            op_types_to_quantize=list(INT8_OP_TYPES),
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,  # per-run ReduceMin/ReduceMax: small, whatever the clip
        )
    except Exception as exc:
        raise BackendError(f"graph {graph}: INT8 quantization failed: {type(exc).__name__}: {exc}") from exc
    finally:
        root.setLevel(level)
    return {"quantized_nodes": len(nodes), "kept_fp32": counts}


def check_int8_graph(graph: str, ref: Path, got: Path, store: FeedStore) -> dict[str, dict[str, float]]:
    """Run the quantized graph ``got`` against its fp32 graph ``ref`` on every recording of ``graph``:
    ``{"rel_rms": {output: ...}, "max_abs_diff": {output: ...}}``.  :class:`BackendError` when an output is not
    finite or its relative RMS error exceeds :data:`INT8_REL_RMS`."""
    try:
        a, b = _session(ref), _session(got)
    except Exception as exc:
        raise BackendError(f"graph {graph}: the INT8 file does not load in ONNX Runtime: {exc}") from exc
    names = [o.name for o in a.get_outputs()]
    err2 = dict.fromkeys(names, 0.0)
    ref2 = dict.fromkeys(names, 0.0)
    worst = dict.fromkeys(names, 0.0)
    for feed in store.feeds(graph):
        for name, x, y in zip(names, a.run(names, feed), b.run(names, feed)):
            if not np.all(np.isfinite(y)):
                raise BackendError(
                    f"graph {graph}: the INT8 graph gives non-finite values on output {name}; the export "
                    "is not faithful"
                )
            d = x.astype(np.float64) - y
            err2[name] += float(np.sum(d * d))
            ref2[name] += float(np.sum(np.square(x, dtype=np.float64)))
            worst[name] = max(worst[name], float(np.max(np.abs(d))) if d.size else 0.0)
    rel = {n: float(np.sqrt(err2[n] / ref2[n])) if ref2[n] > 0 else float(np.sqrt(err2[n])) for n in names}
    for n in names:
        if rel[n] > INT8_REL_RMS:
            raise BackendError(
                f"graph {graph}: INT8 vs fp32 relative RMS error {rel[n]:.3g} > {INT8_REL_RMS} on output {n} "
                f"(over {store.counts.get(graph, 0)} recorded runs); the export is not faithful (a calibration "
                "clip unlike the footage, or a model that does not quantize well: use --fp16)"
            )
    return {"rel_rms": rel, "max_abs_diff": worst}


def quantize_export(
    fp32_dir: Path,
    out_dir: Path,
    manifest: Manifest,
    store: FeedStore,
    progress: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Quantize every graph of the fp32 export in ``fp32_dir`` into ``out_dir`` (same file names) and check it;
    returns ``graph -> {rel_rms, max_abs_diff, quantized_nodes, kept_fp32 (op type -> nodes), calibration_runs,
    export_s}``."""
    out: dict[str, dict[str, Any]] = {}
    for name, g in manifest.graphs.items():
        t0 = time.perf_counter()
        info = quantize_graph(fp32_dir / g.file, out_dir / g.file, name, store)
        info.update(check_int8_graph(name, fp32_dir / g.file, out_dir / g.file, store))
        info["calibration_runs"] = store.counts.get(name, 0)
        info["export_s"] = round(time.perf_counter() - t0, 2)
        out[name] = info
        progress(
            f"  {name}: INT8 quantized ({info['quantized_nodes']} nodes) and checked against fp32 on "
            f"{info['calibration_runs']} recorded runs in {info['export_s']:.1f} s "
            f"(relative RMS error {max(info['rel_rms'].values()):.2g})"
        )
    return out


# ------------------------------------------------------------------------------------------------ the report
def graph_bytes(model_dir: Path, manifest: Manifest) -> int:
    return sum((Path(model_dir) / g.file).stat().st_size for g in manifest.graphs.values())


def _mask_stats(ref: ClipRun, run: ClipRun) -> dict[str, Any]:
    ious: list[float] = []
    diff, flips, compared = 0.0, 0, 0
    for lr, lo, pr, po in zip(ref.logits, run.logits, ref.present, run.present):
        for oid, a in lr.items():
            b = lo.get(oid)
            if b is None:
                flips += 1
                ious.append(0.0)
                continue
            ma, mb = a > 0, b > 0
            union = int(np.count_nonzero(ma | mb))
            ious.append(1.0 if union == 0 else int(np.count_nonzero(ma & mb)) / union)
            if pr.get(oid) != po.get(oid):
                flips += 1
            elif pr.get(oid):
                diff = max(diff, float(np.max(np.abs(a.astype(np.float64) - b))))
                compared += 1
    return {
        "iou_mean": float(np.mean(ious)) if ious else 1.0,
        "iou_min": float(np.min(ious)) if ious else 1.0,
        "max_abs_logit_diff": diff,
        "presence_flips": flips,
        "masks_compared": len(ious),
    }


def compare_exports(
    ref_dir: Path,
    others: dict[str, Path],
    clip: str | Path,
    frames: Sequence[Frame],
    prompts: Sequence[Prompt],
    *,
    threads: int | None = None,
    rounds: int = DEFAULT_ROUNDS,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """Track ``frames`` from ``prompts`` with the fp32 export ``ref_dir`` and each of ``others`` (label -> export
    directory), side by side: all trackers are loaded first, then every round runs the clip once per export, in
    turn.  Masks come from the first round; ms per frame is the median over ``rounds`` of each run's mean
    ``session.step`` time (frame 0 included).  Returns ``label -> report`` (see :func:`_mask_stats`, plus
    ``bytes``, ``fp32_bytes``, ``size_ratio``, ``ms_per_frame``, ``fp32_ms_per_frame``, ``time_ratio``)."""
    from vostream.stages.trackers.sam2 import OnnxTracker

    say = progress or (lambda msg: logger.info("%s", msg))
    if rounds < 1:
        raise ConfigError(f"rounds must be >= 1, got {rounds}")
    dirs = {"float32": Path(ref_dir), **{k: Path(v) for k, v in others.items()}}
    trackers: dict[str, Sam2Tracker] = {}
    try:
        for label, d in dirs.items():
            trackers[label] = OnnxTracker(d, threads=threads)
        tensors = preprocess(frames, trackers["float32"].manifest)
        first: dict[str, ClipRun] = {}
        times: dict[str, list[float]] = {label: [] for label in dirs}
        for r in range(rounds):
            for label, tracker in trackers.items():
                run = track_clip(tracker, tensors, prompts)
                first.setdefault(label, run)
                times[label].append(statistics.fmean(run.step_s) * 1e3)
            say(f"  compare: round {r + 1}/{rounds} done")
        ref_ms = statistics.median(times["float32"])
        ref_bytes = graph_bytes(dirs["float32"], trackers["float32"].manifest)
        out: dict[str, dict[str, Any]] = {}
        for label in others:
            ms = statistics.median(times[label])
            size = graph_bytes(dirs[label], trackers[label].manifest)
            out[label] = {
                "clip": str(clip),
                "frames": len(frames),
                "objects": len({p.obj_id for p in prompts}),
                "threads": threads,
                "rounds": rounds,
                **_mask_stats(first["float32"], first[label]),
                "bytes": size,
                "fp32_bytes": ref_bytes,
                "size_ratio": size / ref_bytes,
                "ms_per_frame": ms,
                "fp32_ms_per_frame": ref_ms,
                "time_ratio": ms / ref_ms,
            }
        return out
    finally:
        for t in trackers.values():
            t.close()


def describe_report(label: str, r: dict[str, Any]) -> str:
    """One line for a :func:`compare_exports` report."""
    return (
        f"{label} vs float32 on {r['clip']} ({r['frames']} frames, {r['objects']} object(s)): mask IoU mean "
        f"{r['iou_mean']:.4f} min {r['iou_min']:.4f}, max |Δ logit| {r['max_abs_logit_diff']:.3g}, presence "
        f"flips {r['presence_flips']}; size {r['size_ratio']:.2f}x ({r['bytes'] / 1e6:.1f} vs "
        f"{r['fp32_bytes'] / 1e6:.1f} MB); time per frame {r['time_ratio']:.2f}x ({r['ms_per_frame']:.1f} vs "
        f"{r['fp32_ms_per_frame']:.1f} ms)"
    )


__all__ = [
    "INT8_DTYPE",
    "INT8_OP_TYPES",
    "INT8_REL_RMS",
    "MIN_CONV_REDUCTION",
    "MIN_ROWS",
    "ClipRun",
    "FeedStore",
    "RecordingRuntime",
    "check_int8_graph",
    "check_prompts",
    "compare_exports",
    "describe_report",
    "preprocess",
    "quantize_export",
    "quantize_graph",
    "read_clip",
    "record_calibration",
    "select_nodes",
    "track_clip",
]
