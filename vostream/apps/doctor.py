"""``vostream doctor``: which tracker backends can run on this machine, and why the others cannot.

Checks (one line each, status OK / MISSING / FAIL / SKIP):

* ``classic`` — the built-in tracker (OpenCV);
* ``onnx`` — ``onnxruntime`` importable, its version and execution providers (CUDA / TensorRT or not);
* ``acl`` — pyACL (``import acl``, shipped with the CANN toolkit): ACL version, CANN version, SoC, device count and
  free/total HBM of ``--device-id``.  pyACL is probed in a child process, so a native crash or a device left set
  cannot affect this process.  A module that declares itself a fake (``__vostream_fake__``, the tests' fake pyACL
  run through ``python tests/fakes/fake_acl.py doctor``) is labelled as such;
* ``atc`` — the ATC converter (``.onnx`` -> ``.om``) on ``PATH``;
* ``export`` — torch / transformers / onnx for ``vostream export`` (versions read from package metadata; nothing
  heavy is imported);
* ``media`` — PyAV, the ffmpeg CLI, GStreamer.

With ``--model DIR`` (a ``vostream export`` directory): a manifest summary (with memory per object), two frames of a
synthetic clip through the ``onnx`` backend on CPU, and — where ``acl`` is usable and ``<graph>.om`` files exist —
the same frames through the ``acl`` backend, comparing the masks (IoU of ``logits > 0``, max |Δ logit|).

Exit code 0 when the checks ran, whatever is missing; 1 when a requested ``--model`` check failed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from vostream.stages.trackers.base import TrackerSession
    from vostream.stages.trackers.sam2.manifest import Manifest

    Image = npt.NDArray[np.uint8]  # one RGB frame, H x W x 3
    Logits = npt.NDArray[np.float32]  # one object's mask logits

OK, MISSING, FAIL, SKIP = "OK", "MISSING", "FAIL", "SKIP"
EXIT_MODEL_FAILED = 1
ACL_HBM_MEM = 1  # aclrtMemAttr
ACL_ERROR_REPEAT_INITIALIZE = 100002
PROBE_TIMEOUT_S = 120.0
CANN_HINT = (
    "install the CANN toolkit (it ships pyACL) and 'source /usr/local/Ascend/ascend-toolkit/set_env.sh'"
)


@dataclass
class Check:
    """One result line."""

    name: str
    status: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _vostream_version() -> str:
    return _version("vostream") or "unknown"


# ------------------------------------------------------------------------------------------------ backends
def check_classic() -> Check:
    """The classic tracker needs only OpenCV and NumPy (core dependencies)."""
    try:
        import cv2

        importlib.import_module("vostream.stages.trackers.classic")
    except Exception as exc:  # noqa: BLE001 - a broken OpenCV install must be reported, not raised
        return Check("classic", FAIL, f"cannot import the classic tracker: {type(exc).__name__}: {exc}")
    return Check("classic", OK, f"built in (OpenCV {cv2.__version__})", {"opencv": cv2.__version__})


def check_onnx() -> Check:
    """onnxruntime importable; its providers; whether the CUDA and TensorRT providers are available."""
    try:
        import onnxruntime as ort
    except Exception as exc:  # noqa: BLE001
        return Check(
            "onnx",
            MISSING,
            f"onnxruntime not importable ({exc}): pip install onnxruntime "
            "(or onnxruntime-gpu for CUDA / TensorRT)",
        )
    providers = list(ort.get_available_providers())
    cuda = "CUDAExecutionProvider" in providers
    trt = "TensorrtExecutionProvider" in providers
    data = {
        "version": ort.__version__,
        "providers": providers,
        "cuda": cuda,
        "tensorrt": trt,
        "device": ort.get_device(),
    }
    if "CPUExecutionProvider" not in providers:
        return Check(
            "onnx",
            FAIL,
            f"onnxruntime {ort.__version__} has no CPUExecutionProvider (providers: {', '.join(providers)})",
            data,
        )
    return Check(
        "onnx",
        OK,
        f"onnxruntime {ort.__version__}; providers {', '.join(providers)}; "
        f"CUDA {'yes' if cuda else 'no'}, TensorRT {'yes' if trt else 'no'}",
        data,
    )


def probe_acl_module(acl: ModuleType, device_id: int = 0) -> dict[str, Any]:
    """Ask a pyACL module (real or fake) for its version, SoC, device count and HBM of ``device_id``.

    init -> get_version / get_soc_name / get_device_count -> set_device -> get_mem_info(HBM) -> reset_device ->
    finalize (only if this call initialised ACL).  Raises ``RuntimeError`` naming the failing call and its code."""
    info: dict[str, Any] = {}

    def need(ret: int, call: str) -> None:
        if ret != 0:
            try:
                msg = acl.get_recent_err_msg() or ""
            except Exception as exc:  # noqa: BLE001 - the message is a nicety; the code is what matters
                msg = f"(get_recent_err_msg failed: {exc})"
            raise RuntimeError(f"{call} returned {ret}" + (f": {msg}" if msg else ""))

    ret = acl.init()
    if ret not in (0, ACL_ERROR_REPEAT_INITIALIZE):
        need(ret, "acl.init")
    ours = ret == 0
    try:
        major, minor, patch, ret = acl.get_version()
        if ret == 0:
            info["acl_version"] = f"{major}.{minor}.{patch}"
        info["soc"] = acl.get_soc_name() or None
        count, ret = acl.rt.get_device_count()
        need(ret, "acl.rt.get_device_count")
        info["device_count"] = int(count)
        if not 0 <= device_id < count:
            raise RuntimeError(f"device {device_id} does not exist ({count} device(s))")
        need(acl.rt.set_device(device_id), f"acl.rt.set_device({device_id})")
        try:
            free, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
            need(ret, "acl.rt.get_mem_info(ACL_HBM_MEM)")
            info["hbm_free"], info["hbm_total"] = int(free), int(total)
            mode, ret = acl.rt.get_run_mode()
            if ret == 0:
                info["run_mode"] = "device" if mode == 0 else "host"
            if not info.get("soc"):
                info["soc"] = acl.get_soc_name() or None
        finally:
            acl.rt.reset_device(device_id)
    finally:
        if ours:
            acl.finalize()
    return info


def _acl_probe_child(device_id: int) -> None:
    """Entry point of the child process that probes a real pyACL: prints one JSON object."""
    try:
        import acl  # type: ignore[import-not-found]
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"import_error": f"{type(exc).__name__}: {exc}"}))
        return
    try:
        info = probe_acl_module(acl, device_id)
        info["module"] = getattr(acl, "__file__", None)
        info["fake"] = bool(getattr(acl, "__vostream_fake__", False))
    except Exception as exc:  # noqa: BLE001
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    print(json.dumps(info))


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def _acl_detail(info: dict[str, Any], cann: str | None) -> str:
    parts = []
    if cann:
        parts.append(f"CANN {cann}")
    if info.get("acl_version"):
        parts.append(f"ACL {info['acl_version']}")
    parts.append(f"SoC {info.get('soc') or '?'}")
    parts.append(f"{info.get('device_count', '?')} device(s)")
    if "hbm_total" in info:
        parts.append(
            f"device {info.get('device_id', 0)} HBM free {_gib(info['hbm_free'])} of "
            f"{_gib(info['hbm_total'])}"
        )
    return ", ".join(parts)


def check_acl(device_id: int = 0) -> Check:
    """pyACL (``import acl``), probed in a child process."""
    from vostream.apps.export.atc import detect_cann_version

    cann, cann_src = detect_cann_version()
    loaded = sys.modules.get("acl")
    try:
        found = loaded is not None or importlib.util.find_spec("acl") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        where = f"; CANN {cann} found ({cann_src}) but its Python path is not set" if cann else ""
        return Check(
            "acl",
            MISSING,
            f"pyACL ('import acl') not found{where}: {CANN_HINT}",
            {"fake": False, "cann_version": cann},
        )
    try:
        code = f"from vostream.apps.doctor import _acl_probe_child; _acl_probe_child({int(device_id)})"
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return Check(
            "acl",
            FAIL,
            f"pyACL probe did not finish in {PROBE_TIMEOUT_S:.0f} s (driver hung? check npu-smi info)",
            {"fake": False, "cann_version": cann},
        )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        why = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(
            "acl", FAIL, f"pyACL probe crashed ({why}): {tail}", {"fake": False, "cann_version": cann}
        )
    info = json.loads(lines[-1])
    info.setdefault("fake", False)
    info.update(device_id=device_id, cann_version=cann)
    if "import_error" in info:
        return Check(
            "acl", MISSING, f"pyACL found but 'import acl' fails ({info['import_error']}): {CANN_HINT}", info
        )
    if "error" in info:
        return Check(
            "acl",
            FAIL,
            f"pyACL imports but the device probe failed: {info['error']} (is the NPU driver "
            "installed? npu-smi info)",
            info,
        )
    if info["fake"]:
        return Check(
            "acl",
            OK,
            f"fake pyACL ({info.get('module')}; ONNX Runtime on CPU, no NPU): " + _acl_detail(info, None),
            info,
        )
    return Check("acl", OK, "pyACL: " + _acl_detail(info, cann), info)


def check_atc() -> Check:
    from vostream.apps.export.atc import detect_cann_version

    path = shutil.which("atc")
    cann, src = detect_cann_version()
    if path is None:
        return Check(
            "atc",
            MISSING,
            "atc (ONNX -> .om converter, CANN toolkit) not on PATH; 'vostream export --om' "
            "still writes atc_convert.sh to run on the Ascend host",
            {"cann_version": cann},
        )
    return Check(
        "atc",
        OK,
        f"{path}" + (f" (CANN {cann})" if cann else " (CANN version unknown: " + src + ")"),
        {"path": path, "cann_version": cann},
    )


def check_export() -> Check:
    """torch, transformers >= 5, onnx (onnxscript optional) for ``vostream export`` — from package metadata."""
    want = {
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "onnx": _version("onnx"),
        "onnxscript": _version("onnxscript"),
    }
    missing = [k for k in ("torch", "transformers", "onnx") if not want[k]]
    have = ", ".join(f"{k} {v}" for k, v in want.items() if v)
    if missing:
        return Check(
            "export",
            MISSING,
            f"{', '.join(missing)} not installed (have: {have or 'none'}): pip install 'vostream[export]'",
            want,
        )
    if int(str(want["transformers"]).split(".")[0]) < 5:
        return Check(
            "export",
            MISSING,
            f"transformers {want['transformers']} < 5: pip install -U 'transformers>=5'",
            want,
        )
    return Check("export", OK, have, want)


def check_media() -> Check:
    """PyAV (the decoder), the ffmpeg CLI and GStreamer — presence only."""
    data: dict[str, Any] = {
        "pyav": None,
        "ffmpeg": shutil.which("ffmpeg"),
        "gstreamer": shutil.which("gst-launch-1.0"),
    }
    try:
        import av

        data["pyav"] = av.__version__
    except Exception as exc:  # noqa: BLE001
        data["pyav_error"] = str(exc)
    try:
        import cv2

        info = cv2.getBuildInformation()
        data["opencv_gstreamer"] = any("GStreamer:" in ln and "YES" in ln for ln in info.splitlines())
    except Exception:  # noqa: BLE001
        data["opencv_gstreamer"] = None
    detail = (
        f"PyAV {data['pyav'] or 'missing'}; ffmpeg CLI {'at ' + data['ffmpeg'] if data['ffmpeg'] else 'absent'}"
        f"; GStreamer {'at ' + data['gstreamer'] if data['gstreamer'] else 'absent'}"
        f" (OpenCV GStreamer {'yes' if data['opencv_gstreamer'] else 'no'})"
    )
    return Check("media", OK if data["pyav"] else MISSING, detail, data)


# ------------------------------------------------------------------------------------------------ --model
class ClipTracker(Protocol):
    """What the ``--model`` check drives: a :class:`~vostream.stages.trackers.sam2.Sam2Tracker` (or a test's
    stand-in)."""

    manifest: Manifest

    def new_session(self) -> TrackerSession: ...

    def close(self) -> None: ...


#: builds a tracker for an export directory
TrackerFactory = Callable[[Path], ClipTracker]


def _synthetic_clip(size: int, n: int = 2) -> list[Image]:
    """``n`` RGB uint8 frames: a bright square drifting on a grey gradient (deterministic)."""
    import numpy as np

    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    frames = []
    for i in range(n):
        img = np.stack([60 + 60 * xx / size, 70 + 50 * yy / size, np.full_like(xx, 90)], -1)
        x0, y0, s = size // 3 + 2 * i, size // 3 + i, size // 3
        img[y0 : y0 + s, x0 : x0 + s] = (230, 200, 40)
        frames.append(img.astype(np.uint8))
    return frames


def _run_clip(tracker: ClipTracker, frames: list[Image]) -> tuple[list[Logits], float]:
    """Track object 1 (a click at the square's centre on frame 0) through ``frames``; per-frame logits, ms/frame."""
    import numpy as np

    from vostream.pipeline.types import Frame, Prompt

    m = tracker.manifest
    mean = np.asarray(m.mean, np.float32).reshape(1, 1, 3)
    std = np.asarray(m.std, np.float32).reshape(1, 1, 3)
    size = m.image_size
    session = tracker.new_session()
    out = []
    t0 = time.perf_counter()
    try:
        session.add_prompt(Prompt(1, 0, [[size // 3 + size // 6, size // 3 + size // 6]], [1]))
        for i, img in enumerate(frames):
            f = Frame(i, img)
            f.tensor = np.ascontiguousarray(
                ((img.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)[None]
            )
            res = session.step(f)
            if res.logits is None:  # allowed by the session contract; a SAM 2 session always returns logits
                raise TypeError(f"frame {i}: the session returned no mask logits")
            out.append(np.array(res.logits[0], np.float32))
    finally:
        session.close()
    return out, (time.perf_counter() - t0) * 1e3 / max(1, len(frames))


def _compare(a: list[Logits], b: list[Logits]) -> tuple[float, float]:
    """(min IoU of ``logits > 0`` over frames — 1 where both are empty; max |a - b| over the finite logits)."""
    import numpy as np

    ious, diffs = [], []
    for x, y in zip(a, b):
        mx, my = x > 0, y > 0
        union = int(np.count_nonzero(mx | my))
        ious.append(1.0 if union == 0 else int(np.count_nonzero(mx & my)) / union)
        diffs.append(float(np.max(np.abs(x.astype(np.float64) - y))) if x.size else 0.0)
    return min(ious), max(diffs)


def _memory_per_object(m: Manifest) -> tuple[int, int]:
    """(bank bytes, pointer bytes) per object at fp32: ``(C+N)·T·M·4`` and ``Q·D·4``."""
    return (
        m.cond_slots + m.recent_slots
    ) * m.tokens_per_slot * m.mem_dim * 4, m.pointer_slots * m.hidden_dim * 4


def check_model(
    model_dir: str | Path,
    acl_check: Check | None,
    device_id: int = 0,
    min_iou: float = 0.9,
    onnx_factory: TrackerFactory | None = None,
    acl_factory: TrackerFactory | None = None,
) -> list[Check]:
    """Manifest summary, one synthetic clip on ``onnx`` (CPU) and, when possible, on ``acl``; compare the masks.

    ``onnx_factory`` / ``acl_factory`` (tests) build the trackers; defaults: ``OnnxTracker(dir, threads=2)`` and
    ``Sam2Tracker(dir, AclRuntime(device_id))``."""
    from vostream.pipeline.errors import VostreamError
    from vostream.stages.trackers.sam2.manifest import load_manifest

    model_dir = Path(model_dir)
    try:
        m = load_manifest(model_dir)
    except VostreamError as exc:
        return [Check("model", FAIL, str(exc))]
    om = {name: (model_dir / f"{Path(g.file).stem}.om").is_file() for name, g in m.graphs.items()}
    checks = [_model_summary(m, om)]
    if m.dtype != "float32":
        checks.append(_measured_precision(m))
    frames = _synthetic_clip(m.image_size)
    try:
        ref, ms = _run_model(onnx_factory or _onnx_tracker, model_dir, frames)
    except Exception as exc:  # noqa: BLE001 - any failure is the model check's result
        checks.append(
            Check(
                "model.onnx", FAIL, f"{len(frames)} frames on onnx (CPU) failed: {type(exc).__name__}: {exc}"
            )
        )
        return checks
    checks.append(
        Check(
            "model.onnx",
            OK,
            f"{len(frames)} frames on onnx (CPU): {ms:.1f} ms/frame, mask "
            f"{int((ref[-1] > 0).sum())} px of {ref[-1].size}",
            {"ms_per_frame": ms},
        )
    )
    checks.append(
        _check_model_on_acl(model_dir, m, om, acl_check, device_id, min_iou, acl_factory, frames, ref)
    )
    return checks


def _model_summary(m: Manifest, om: dict[str, bool]) -> Check:
    """The ``model`` line: family, size, precision, slots, memory per object, ``.om`` files present."""
    bank, ptrs = _memory_per_object(m)
    data = {
        "family": m.family,
        "image_size": m.image_size,
        "opset": m.opset,
        "dtype": m.dtype,
        "slots": {"C": m.cond_slots, "N": m.recent_slots, "Q": m.pointer_slots},
        "bank_bytes_per_object": bank,
        "pointer_bytes_per_object": ptrs,
        "om": om,
        "graphs": {n: g.file for n, g in m.graphs.items()},
    }
    return Check(
        "model",
        OK,
        f"{m.family} {m.image_size}px, {m.dtype}, opset {m.opset}, C/N/Q {m.cond_slots}/"
        f"{m.recent_slots}/{m.pointer_slots}, per object: bank {bank / 2**20:.2f} MiB + "
        f"pointers {ptrs / 2**10:.1f} KiB (fp32); .om {sum(om.values())}/{len(om)}",
        data,
    )


def _measured_precision(m: Manifest) -> Check:
    """The ``model.precision`` line of an fp16 / int8 export: its delta against fp32 as measured at export."""
    report = m.verify.get("compare")
    if isinstance(report, dict) and report:
        from vostream.apps.export.precision import describe_report

        return Check("model.precision", OK, f"measured at export: {describe_report(m.dtype, report)}", report)
    return Check(
        "model.precision",
        SKIP,
        f"{m.dtype} export without a measured delta against fp32: re-export with "
        "--compare CLIP --point X,Y (docs/deploy.md section 3)",
    )


def _run_model(factory: TrackerFactory, model_dir: Path, frames: list[Image]) -> tuple[list[Logits], float]:
    """:func:`_run_clip` on a tracker that ``factory`` builds for ``model_dir`` (closed afterwards)."""
    tracker = factory(model_dir)
    try:
        return _run_clip(tracker, frames)
    finally:
        tracker.close()


def _onnx_tracker(model_dir: Path) -> ClipTracker:
    from vostream.stages.trackers.sam2 import OnnxTracker

    return OnnxTracker(model_dir, threads=2)


def _acl_tracker_factory(device_id: int) -> TrackerFactory:
    """``Sam2Tracker(dir, AclRuntime(device_id))``; raises whatever importing the acl runtime raises."""
    from vostream.stages.trackers.sam2 import Sam2Tracker
    from vostream.stages.trackers.sam2.backends.acl import AclRuntime

    def make(model_dir: Path) -> ClipTracker:
        return Sam2Tracker(model_dir, AclRuntime(device_id=device_id))

    return make


def _check_model_on_acl(
    model_dir: Path,
    m: Manifest,
    om: dict[str, bool],
    acl_check: Check | None,
    device_id: int,
    min_iou: float,
    acl_factory: TrackerFactory | None,
    frames: list[Image],
    ref: list[Logits],
) -> Check:
    """The ``model.acl`` line: ``frames`` on the acl backend, masks compared with ``ref`` (onnx on CPU); SKIP when
    acl is not usable here or the ``.om`` files are missing."""
    if acl_check is None or acl_check.status != OK:
        return Check("model.acl", SKIP, "acl backend not usable here (see the acl line)")
    absent = [f"{Path(m.graphs[n].file).stem}.om" for n, ok in om.items() if not ok]
    if absent:
        return Check(
            "model.acl",
            SKIP,
            f"no {', '.join(absent)} in {model_dir}: convert with "
            f"'bash {model_dir}/atc_convert.sh' (vostream export --om)",
        )
    if acl_factory is None:
        try:
            acl_factory = _acl_tracker_factory(device_id)
        except Exception as exc:  # noqa: BLE001 - the acl runtime module may be absent or broken
            return Check("model.acl", MISSING, f"acl runtime unavailable: {type(exc).__name__}: {exc}")
    try:
        got, ms_acl = _run_model(acl_factory, model_dir, frames)
    except Exception as exc:  # noqa: BLE001
        return Check("model.acl", FAIL, f"{len(frames)} frames on acl failed: {type(exc).__name__}: {exc}")
    iou, diff = _compare(ref, got)
    return Check(
        "model.acl",
        OK if iou >= min_iou else FAIL,
        f"{len(frames)} frames on acl (device {device_id}): {ms_acl:.1f} "
        f"ms/frame; vs onnx CPU: mask IoU {iou:.4f} (min {min_iou}), max "
        f"|Δ logit| {diff:.3g}",
        {"iou": iou, "max_abs_diff": diff, "ms_per_frame": ms_acl, "min_iou": min_iou},
    )


# ------------------------------------------------------------------------------------------------ report
def run_checks(model: str | Path | None = None, device_id: int = 0, min_iou: float = 0.9) -> list[Check]:
    """Every check, in display order (``--model`` checks last)."""
    checks = [check_classic(), check_onnx()]
    acl = check_acl(device_id)
    checks += [acl, check_atc(), check_export(), check_media()]
    if model is not None:
        checks += check_model(model, acl, device_id, min_iou)
    return checks


def format_table(checks: Sequence[Check]) -> str:
    head = (
        f"vostream doctor: vostream {_vostream_version()}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}"
    )
    width = max(len(c.name) for c in checks) if checks else 8
    return "\n".join([head] + [f"  {c.name:<{width}}  {c.status:<7}  {c.detail}" for c in checks])


def to_json(checks: Sequence[Check]) -> dict[str, Any]:
    return {
        "vostream": _vostream_version(),
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
        "checks": [asdict(c) for c in checks],
        "backends": {c.name: c.status == OK for c in checks if c.name in ("classic", "onnx", "acl")},
    }


def model_failed(checks: Sequence[Check]) -> bool:
    return any(c.status == FAIL for c in checks if c.name == "model" or c.name.startswith("model."))


def add_doctor_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    add_common: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    """Add ``doctor`` to the ``vostream`` subcommands (``add_common`` adds --quiet/--verbose/--debug)."""
    p = sub.add_parser(
        "doctor",
        help="report which backends (classic, onnx, acl) can run here, and why not",
        description="Checks the classic tracker, ONNX Runtime (and its CUDA / TensorRT providers), "
        "pyACL / CANN / the NPU, atc, the export dependencies and media tools. With --model "
        "DIR: runs two synthetic frames on onnx (CPU) and, where possible, on acl, and "
        "compares the masks. Exit code 0 unless a --model check fails. Without an NPU, "
        "from a source checkout, 'python tests/fakes/fake_acl.py doctor ...' runs it with the "
        "tests' fake pyACL and fake atc. Reference: docs/ascend.md (sections 8, 9).",
    )
    _add_doctor_arguments(p)
    add_common(p)
    return p


def _add_doctor_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="DIR", help="a 'vostream export' directory to load and run")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument(
        "--device-id", type=int, default=0, metavar="N", help="NPU to probe and run on (default 0)"
    )
    p.add_argument(
        "--min-iou",
        type=float,
        default=0.9,
        metavar="F",
        help="--model: lowest acceptable acl-vs-onnx mask IoU (default 0.9)",
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    """``vostream doctor``: print the table (or JSON); 0 unless a requested ``--model`` check failed."""
    checks = run_checks(args.model, device_id=args.device_id, min_iou=args.min_iou)
    if args.json:
        print(json.dumps(to_json(checks), indent=2))
    else:
        print(format_table(checks))
    return EXIT_MODEL_FAILED if model_failed(checks) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vostream.apps.doctor`` (same options as ``vostream doctor``)."""
    p = argparse.ArgumentParser(prog="python -m vostream.apps.doctor", description=__doc__.split("\n")[0])
    _add_doctor_arguments(p)
    return cmd_doctor(p.parse_args(argv))


__all__ = [
    "Check",
    "add_doctor_parser",
    "check_acl",
    "check_model",
    "cmd_doctor",
    "format_table",
    "probe_acl_module",
    "run_checks",
    "to_json",
]

if __name__ == "__main__":
    raise SystemExit(main())
