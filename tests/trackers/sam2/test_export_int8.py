"""``vostream export --int8 CLIP --compare CLIP`` (docs/deploy.md §3) on the tiny random SAM 2.1 checkpoint.

One export through the CLI (module fixture): INT8 graphs calibrated on a real H.264 clip from a click, compared with
the fp32 export side by side on the same clip, plus the Ascend INT8 inputs (``--om``; ATC not run).  The tests check
that the int8 graphs are really quantized and smaller, that the report's figures come from real runs (they match
an independent fp32 export's sizes, an identical export compares as IoU 1 / Δ 0, the int8 one does not), that the
export loads and tracks on ``--backend onnx`` and (through fake AMCT + fake ATC + the fake pyACL) on ``acl``, that a
deliberately corrupted quantized graph fails the export with nothing written, and that bad input is one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)
pytest.importorskip("onnxruntime", reason="onnxruntime is part of the [test] extra: pip install -e '.[test]'")

import numpy as np
import onnx
from fakes.media import moving_square_clip, square_mask

from vostream.apps.cli import main
from vostream.apps.export import atc, export_model, precision
from vostream.pipeline.errors import BackendError, ConfigError
from vostream.pipeline.types import Prompt
from vostream.stages.trackers.sam2.manifest import GRAPHS, load_manifest

W, H, N = 128, 96, 10


def clip() -> Path:
    return moving_square_clip(".mp4", "libx264", N, W, H)


def click() -> tuple[int, int]:
    ys, xs = np.nonzero(square_mask(0, W, H))
    return int(xs.mean()), int(ys.mean())


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def int8_export(sam2_tiny: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The tiny SAM 2 checkpoint exported with --int8 and --compare on the same clip, and --om (not run)."""
    ckpt, fp32 = sam2_tiny("sam2")
    out = tmp_path_factory.mktemp("int8") / "export"
    x, y = click()
    argv = ["export", str(ckpt), "--out", str(out), "--int8", str(clip()), "--compare", str(clip())]
    argv += ["--point", f"{x},{y}", "--threads", "1", "--om", "--no-run-atc"]
    rc, stdout, stderr = _cli(argv)
    return {"ckpt": ckpt, "fp32": fp32, "out": out, "rc": rc, "stdout": stdout, "stderr": stderr}


def _graph_bytes(d: Path) -> int:
    return sum((d / f"{g}.onnx").stat().st_size for g in GRAPHS)


@pytest.mark.slow
def test_int8_graphs_are_quantized_checked_and_smaller(int8_export: dict[str, Any]) -> None:
    assert int8_export["rc"] == 0, int8_export["stderr"]
    out, fp32 = int8_export["out"], int8_export["fp32"]
    m = load_manifest(out)  # the validation accepts the QDQ graphs and records the precision
    assert m.dtype == "int8-qdq" and load_manifest(fp32).dtype == "float32"
    for g in GRAPHS:
        model = onnx.load(str(out / f"{g}.onnx"))
        ops = {n.op_type for n in model.graph.node}
        assert {"QuantizeLinear", "DequantizeLinear"} <= ops, g
        assert any(t.data_type == onnx.TensorProto.INT8 for t in model.graph.initializer), g  # int8 weights
        info = m.verify[g]["int8"]
        assert info["quantized_nodes"] > 0 and info["calibration_runs"] >= N - 1
        # the check ran on real recordings: a quantized graph differs from fp32, within the tolerance (an output
        # computed by no quantized node, like the memory encoder's object pointer, may be exact)
        rel = info["rel_rms"]
        assert 0 < max(rel.values()) <= precision.INT8_REL_RMS and min(rel.values()) >= 0, (g, rel)
    assert m.verify["image_encoder"]["int8"]["calibration_runs"] == N  # every frame of the clip
    assert m.verify["memory_attention"]["int8"]["calibration_runs"] == N - 1  # every tracking frame
    assert m.verify["int8"]["calibration_clip"] == str(clip())
    # the decoder's prompt/output-token MatMuls stay fp32 (the object score is sensitive there), and so do the convs
    # on the 1-channel mask inputs (bimodal values; negligible arithmetic)
    assert m.verify["decoder"]["int8"]["kept_fp32"]["MatMul"] > 0
    assert m.verify["decoder"]["int8"]["kept_fp32"]["Conv"] > 0
    assert m.verify["memory_encoder"]["int8"]["kept_fp32"]["Conv"] > 0
    assert _graph_bytes(out) < _graph_bytes(fp32)
    assert not list(out.parent.glob(".export.*")), "a staging directory was left behind"


def test_compare_report_comes_from_real_runs(int8_export: dict[str, Any]) -> None:
    out, fp32 = int8_export["out"], int8_export["fp32"]
    report = load_manifest(out).verify["compare"]
    assert report["clip"] == str(clip()) and report["frames"] == N and report["objects"] == 1
    assert report["masks_compared"] == N
    assert 0.5 < report["iou_mean"] <= 1.0 and 0.0 <= report["iou_min"] <= report["iou_mean"]
    assert report["max_abs_logit_diff"] > 0  # int8 is not fp32: the masks were really computed by both
    # the fp32 side is the same graphs a plain export writes (the staged reference, measured before it is removed)
    assert report["fp32_bytes"] == _graph_bytes(fp32) and report["bytes"] == _graph_bytes(out)
    assert (
        report["size_ratio"] == pytest.approx(report["bytes"] / report["fp32_bytes"])
        and report["size_ratio"] < 1
    )
    assert report["ms_per_frame"] > 0 and report["fp32_ms_per_frame"] > 0
    assert report["time_ratio"] == pytest.approx(report["ms_per_frame"] / report["fp32_ms_per_frame"])
    lines = int8_export["stdout"].strip().splitlines()
    assert len(lines) == 3 and "int8-qdq" in lines[0] and lines[1].startswith("int8-qdq vs float32 on ")
    assert "atc_convert.sh (not run" in lines[2]
    assert f"mask IoU mean {report['iou_mean']:.4f}" in lines[1]

    # the same comparison between two identical fp32 exports: exactly equal masks and logits, same size
    x, y = click()
    frames = precision.read_clip(clip(), N, "--compare")
    same = precision.compare_exports(
        fp32, {"copy": fp32}, clip(), frames, [Prompt(1, 0, [[x, y]], [1])], threads=1, rounds=1
    )["copy"]
    assert same["iou_mean"] == same["iou_min"] == 1.0 and same["max_abs_logit_diff"] == 0.0
    assert same["presence_flips"] == 0 and same["size_ratio"] == 1.0


def test_int8_export_tracks_on_onnx(int8_export: dict[str, Any], tmp_path: Path) -> None:
    x, y = click()
    argv = ["track", str(clip()), "--backend", "onnx", "--model", str(int8_export["out"])]
    argv += ["--point", f"{x},{y}", "--out", str(tmp_path / "run"), "--save", "json", "--threads", "1", "-q"]
    rc, _, err = _cli(argv)
    assert rc == 0, err
    data = json.loads((tmp_path / "run" / "annotations.json").read_text())
    (ann,) = data["annotations"]
    assert len(ann["segmentations"]) == N and any(s is not None for s in ann["segmentations"])


def test_ascend_int8_script_and_fake_toolchain(
    int8_export: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--int8 --om writes AMCT's inputs and an atc_convert.sh that calibrates with AMCT, then compiles AMCT's deploy
    models; run through the fake amct_onnx + fake atc, the .om files load on the fake pyACL with the INT8
    manifest and track like the fp32 graphs they were made from (the fake AMCT does not quantize)."""
    from fakes import fake_acl, fake_amct, fake_atc

    src = int8_export["out"]
    script = (src / "atc_convert.sh").read_text()
    cmds = [shlex.split(ln) for ln in script.splitlines() if ln.startswith(("amct_onnx ", "atc "))]
    assert [c[0] for c in cmds] == ["amct_onnx"] * 4 + ["atc"] * 4
    record = json.loads((src / "amct" / "calibration.json").read_text())
    m = load_manifest(src)
    for (name, g), amct_argv, atc_argv in zip(m.graphs.items(), cmds[:4], cmds[4:]):
        opts = dict(a[2:].split("=", 1) for a in amct_argv[2:])
        assert opts["model"] == f"amct/{g.file}" and (src / opts["model"]).is_file()
        assert int(opts["batch_num"]) == record["graphs"][name]["batch_num"] > 0
        shapes = [s.split(":") for s in opts["input_shape"].split(";")]
        assert [s[0] for s in shapes] == [t.name for t in g.inputs]  # every input, in graph order
        for (_, dims), d, t in zip(shapes, opts["data_dir"].split(";"), opts["data_types"].split(";")):
            bins = sorted((src / d).glob("*.bin"))
            size = int(np.prod([int(v) for v in dims.split(",")])) * np.dtype(t).itemsize
            assert len(bins) == int(opts["batch_num"]) and all(b.stat().st_size == size for b in bins)
        assert (
            dict(a[2:].split("=", 1) for a in atc_argv[1:])["model"] == f"amct/out/{name}_deploy_model.onnx"
        )
    assert "INT8 (AMCT)" in script and (src / "decoder.keep_dtype.cfg").is_file()

    d = tmp_path / "export"
    shutil.copytree(src, d)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_atc.install(bindir)
    monkeypatch.setenv("PATH", str(bindir))  # atc without amct_onnx: the INT8 build is written, not run
    rec = atc.convert_export(None, d, progress=lambda s: None)
    assert not rec["ran"] and "'amct_onnx'" in rec["reason"] and not list(d.glob("*.om"))
    with pytest.raises(ConfigError, match="amct_onnx"):
        atc.convert_export(None, d, run=True, progress=lambda s: None)
    no_amct = tmp_path / "no-amct"
    shutil.copytree(src, no_amct, ignore=shutil.ignore_patterns("amct"))
    with pytest.raises(ConfigError, match=r"re-export with --int8 CLIP --om"):
        atc.convert_export(None, no_amct, run=False, progress=lambda s: None)

    fake_amct.install(bindir)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.delenv("FAKE_ATC_FAIL", raising=False)
    rec = atc.convert_export(None, d, progress=lambda s: None)
    assert rec["ran"] and rec["int8"] and sorted(rec["om"]) == sorted(GRAPHS)
    assert "INT8 via AMCT" in atc.describe(rec)

    from vostream.stages.trackers.sam2 import AclTracker, OnnxTracker

    x, y = click()
    frames = precision.read_clip(clip(), 4, "--compare")
    prompts = [Prompt(1, 0, [[x, y]], [1])]
    fake_acl.reset(ort_threads=1)
    fake_acl.install()
    try:
        tracker = AclTracker(d)
        try:
            assert tracker.manifest.dtype == "int8-qdq"
            got = precision.track_clip(tracker, precision.preprocess(frames, tracker.manifest), prompts)
        finally:
            tracker.close()
    finally:
        fake_acl.uninstall()
        fake_acl.reset()
    ref = OnnxTracker(int8_export["fp32"], threads=1)
    try:
        want = precision.track_clip(ref, precision.preprocess(frames, ref.manifest), prompts)
    finally:
        ref.close()
    for a, b in zip(got.logits, want.logits):
        assert float(np.max(np.abs(a[1] - b[1]))) <= 1e-5


def _corrupt_activation_scales(path: Path, factor: float) -> int:
    """Divide the scale of every activation QuantizeLinear in ``path`` by ``factor`` (a calibration range far too
    narrow: the activations clip); returns how many were changed."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    changed = 0
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[1] in inits and n.input[0] not in inits:
            t = inits[n.input[1]]
            scale = onnx.numpy_helper.to_array(t) / factor
            t.CopyFrom(onnx.numpy_helper.from_array(scale.astype(np.float32), t.name))
            changed += 1
    onnx.save(model, str(path))
    return changed


@pytest.mark.slow
def test_corrupted_quantized_graph_fails_the_export(
    int8_export: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = precision.quantize_graph
    corrupted: list[str] = []

    def quantize_then_corrupt(src: Path, dst: Path, graph: str, store: Any) -> dict[str, Any]:
        info = real(src, dst, graph, store)
        if graph == "memory_attention":
            assert _corrupt_activation_scales(dst, 20.0) > 0
            corrupted.append(graph)
        return info

    monkeypatch.setattr(precision, "quantize_graph", quantize_then_corrupt)
    out = tmp_path / "bad"
    x, y = click()
    with pytest.raises(
        BackendError, match=r"graph memory_attention: INT8 vs fp32 relative RMS error .* > 0\.25"
    ):
        export_model(
            str(int8_export["ckpt"]), out, int8=clip(), prompts=[Prompt(1, 0, [[x, y]], [1])], threads=1
        )
    assert corrupted == ["memory_attention"]
    assert not out.exists() and not list(tmp_path.iterdir()), "the failed export left files behind"


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--int8", "CLIP"], "--int8 needs a prompt on the clip"),
        (["--fp16", "--int8", "CLIP", "--point", "5,5"], "--fp16 and --int8 exclude each other"),
        (["--compare", "CLIP", "--point", "5,5"], "--compare measures an --fp16 or --int8 export"),
        (["--int8", "CLIP", "--point", "500,5"], "outside the 128x96 frame"),
        (["--int8", "CLIP", "--frame", "40", "--point", "5,5"], "only 10 frames are used"),
        (["--int8", "missing.mp4", "--point", "5,5"], "--int8 missing.mp4: no such file"),
        (["--int8", "CLIP", "--point", "5,5", "--calib-frames", "0"], "must be >= 1"),
        (["--point", "5,5"], "prompts are used by --int8 and --compare only"),
    ],
)
def test_bad_precision_options_are_one_line_errors(
    int8_export: dict[str, Any], tmp_path: Path, extra: list[str], message: str
) -> None:
    extra = [str(clip()) if a == "CLIP" else a for a in extra]
    out = tmp_path / "x"
    rc, stdout, err = _cli(["export", str(int8_export["ckpt"]), "--out", str(out), "-q", *extra])
    assert rc == 2 and stdout == "" and message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_calibration_clip_too_short_for_memory_attention(int8_export: dict[str, Any], tmp_path: Path) -> None:
    x, y = click()
    out = tmp_path / "x"
    argv = ["export", str(int8_export["ckpt"]), "--out", str(out), "-q", "--int8", str(clip())]
    rc, _, err = _cli([*argv, "--calib-frames", "1", "--point", f"{x},{y}"])
    assert rc == 2 and "memory attention would never run" in err and len(err.strip().splitlines()) == 1
    assert not out.exists() and not list(tmp_path.iterdir())
    # the backstop after tracking: a recording without memory attention runs cannot be calibrated
    store = precision.FeedStore(tmp_path / "store")
    frames = precision.preprocess(
        precision.read_clip(clip(), 1, "--int8"), load_manifest(int8_export["fp32"])
    )
    with pytest.raises(ConfigError, match="never ran memory_attention"):
        precision.record_calibration(int8_export["fp32"], frames, [Prompt(1, 0, [[x, y]], [1])], store, 1)


def test_doctor_model_reports_the_measured_precision(int8_export: dict[str, Any]) -> None:
    from vostream.apps import doctor

    checks = {c.name: c for c in doctor.check_model(int8_export["out"], None)}
    assert checks["model"].status == "OK" and "int8-qdq" in checks["model"].detail
    assert checks["model.onnx"].status == "OK"  # the INT8 graphs run on ONNX Runtime (CPU)
    report = load_manifest(int8_export["out"]).verify["compare"]
    precision_check = checks["model.precision"]
    assert (
        precision_check.status == "OK" and f"mask IoU mean {report['iou_mean']:.4f}" in precision_check.detail
    )
    plain = {c.name: c for c in doctor.check_model(int8_export["fp32"], None)}
    assert "model.precision" not in plain  # fp32 is the reference
