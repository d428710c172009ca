"""ATC conversion commands / script / run (with a fake ``atc``), and ``vostream doctor``.

The export used here is synthetic: four small ONNX graphs with exactly the tiny SAM 2 export's I/O (names, shapes,
dtypes, the decoder's dynamic ``K``) and real LayerNormalization / Softmax / Sigmoid / Greater / bfloat16-Cast nodes,
built with ``onnx.helper`` in milliseconds instead of a ~40 s torch export.  The streaming session runs on it (its
outputs are arbitrary but deterministic), which is all the doctor's acl-vs-onnx comparison needs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="onnx is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip("onnxruntime", reason="onnxruntime is part of the [test] extra: pip install -e '.[test]'")

from fakes import fake_acl as acl_fake
from fakes import fake_atc as fake_atc_module
from onnx import TensorProto, helper, numpy_helper

from vostream.apps import doctor
from vostream.apps.export import atc
from vostream.pipeline.errors import BackendError, ConfigError
from vostream.stages.trackers.sam2.manifest import GraphSpec, Manifest, TensorSpec, load_manifest

ALGORITHM = {
    "multimask_output_in_sam": True,
    "multimask_output_for_tracking": True,
    "multimask_min_pt_num": 0,
    "multimask_max_pt_num": 1,
    "dynamic_multimask_via_stability": True,
    "stability_delta": 0.05,
    "stability_thresh": 0.98,
    "batch_binarize": True,
    "max_cond_frame_num": -1,
    "ptr_temporal_encoding": True,
    "no_obj_score": -1024.0,
    "mask_prompt_scale": 20.0,
    "mask_prompt_bias": -10.0,
}

F, I32, I64 = "float32", "int32", "int64"
IO: dict[str, tuple[list[tuple[str, tuple[Any, ...], str]], list[tuple[str, tuple[int, ...], str]]]] = {
    "image_encoder": (
        [("image", (1, 3, 128, 128), F)],
        [
            ("feat_s0", (1, 16, 32, 32), F),
            ("feat_s1", (1, 32, 16, 16), F),
            ("feat", (1, 64, 128), F),
            ("feat_nomem", (1, 128, 8, 8), F),
            ("feat_map", (1, 128, 8, 8), F),
        ],
    ),
    "memory_attention": (
        [
            ("feat", (1, 64, 128), F),
            ("bank", (8, 64, 64), F),
            ("slot_tpos", (8,), I64),
            ("slot_valid", (8,), F),
            ("ptrs", (17, 128), F),
            ("ptr_tdiff", (17,), F),
            ("ptr_valid", (17,), F),
        ],
        [("pix_feat", (1, 128, 8, 8), F)],
    ),
    "decoder": (
        [
            ("pix_feat", (1, 128, 8, 8), F),
            ("feat_s0", (1, 16, 32, 32), F),
            ("feat_s1", (1, 32, 16, 16), F),
            ("points", (1, "K", 2), F),
            ("labels", (1, "K"), I32),
            ("mask_prompt", (1, 1, 128, 128), F),
            ("has_mask", (1,), F),
        ],
        [
            ("low_res_masks", (1, 4, 32, 32), F),
            ("iou", (1, 4), F),
            ("object_score", (1, 1), F),
            ("obj_ptrs", (1, 4, 128), F),
        ],
    ),
    "memory_encoder": (
        [
            ("feat", (1, 64, 128), F),
            ("low_res_masks", (1, 4, 32, 32), F),
            ("obj_ptrs", (1, 4, 128), F),
            ("object_score", (1, 1), F),
            ("mask_prompt", (1, 1, 128, 128), F),
            ("plane", (1,), I64),
            ("token", (1,), I64),
            ("use_mask_prompt", (1,), F),
            ("binarize", (1,), F),
        ],
        [("maskmem", (1, 64, 64), F), ("obj_ptr", (1, 128), F)],
    ),
}
_ELEM = {F: TensorProto.FLOAT, I32: TensorProto.INT32, I64: TensorProto.INT64}


def _graph(name: str, seed: int) -> Any:
    """One ONNX model with ``IO[name]``: every output = pattern * s + bias, s = a scalar summary of all inputs that
    passes through LayerNormalization and Softmax (named like the TorchScript exporter names them)."""
    rng = np.random.default_rng(seed)
    ins, outs = IO[name]
    nodes: list[Any] = []
    inits: list[Any] = []
    terms: list[str] = []
    for i, (iname, _shape, dt) in enumerate(ins):
        src = iname
        if dt != F:
            nodes.append(
                helper.make_node("Cast", [iname], [f"{iname}_f"], to=TensorProto.FLOAT, name=f"/in/Cast_{i}")
            )
            src = f"{iname}_f"
        nodes.append(helper.make_node("ReduceMean", [src], [f"m{i}"], keepdims=0, name=f"/in/ReduceMean_{i}"))
        terms.append(f"m{i}")
    first = next((n, s) for n, s, d in ins if d == F and len(s) >= 2 and all(isinstance(v, int) for v in s))
    last = int(first[1][-1])
    inits += [
        numpy_helper.from_array(np.ones(last, np.float32), "ln_w"),
        numpy_helper.from_array(np.zeros(last, np.float32), "ln_b"),
    ]
    nodes += [
        helper.make_node(
            "LayerNormalization",
            [first[0], "ln_w", "ln_b"],
            ["ln"],
            axis=-1,
            name="/blocks.0/layer_norm1/LayerNormalization",
        ),
        helper.make_node("Softmax", ["ln"], ["sm"], axis=-1, name="/blocks.0/attn/Softmax"),
        helper.make_node("ReduceMax", ["sm"], ["smx"], keepdims=0, name="/blocks.0/ReduceMax"),
    ]
    terms.append("smx")
    if name == "memory_attention":  # an unnamed node to keep: reported, not listed
        nodes += [
            helper.make_node("Softmax", ["ln"], ["sm2"], axis=-1),
            helper.make_node("ReduceMax", ["sm2"], ["smx2"], keepdims=0, name="/blocks.0/ReduceMax_2"),
        ]
        terms.append("smx2")
    nodes.append(helper.make_node("Sum", terms, ["s"], name="/Sum"))
    if name == "memory_encoder":  # sigmoid / threshold / bf16 rounding, like the real memory encoder
        inits.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
        nodes += [
            helper.make_node("Sigmoid", ["s"], ["sig"], name="/Sigmoid"),
            helper.make_node("Greater", ["sig", "half"], ["gt"], name="/Greater"),
            helper.make_node("Cast", ["gt"], ["gtf"], to=TensorProto.FLOAT, name="/Cast"),
            helper.make_node("Cast", ["sig"], ["bf"], to=TensorProto.BFLOAT16, name="/Cast_3"),
            helper.make_node("Cast", ["bf"], ["bff"], to=TensorProto.FLOAT, name="/Cast_4"),
            helper.make_node("Sum", ["s", "gtf", "bff"], ["s2"], name="/Sum_2"),
        ]
        scalar = "s2"
    else:
        scalar = "s"
    for oname, shape, _ in outs:
        inits += [
            numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), f"{oname}_p"),
            numpy_helper.from_array(rng.normal(scale=0.5, size=shape).astype(np.float32), f"{oname}_b"),
        ]
        nodes += [
            helper.make_node("Mul", [f"{oname}_p", scalar], [f"{oname}_ps"], name=f"/out/{oname}/Mul"),
            helper.make_node("Add", [f"{oname}_ps", f"{oname}_b"], [oname], name=f"/out/{oname}/Add"),
        ]
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, _ELEM[d], list(s)) for n, s, d in ins],
        [helper.make_tensor_value_info(n, _ELEM[d], list(s)) for n, s, d in outs],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def make_export(out: Path) -> Manifest:
    """A synthetic ``vostream export`` directory (manifest + 4 graphs) with the tiny SAM 2 I/O."""
    out.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for k, name in enumerate(IO):
        onnx.save(_graph(name, k), str(out / f"{name}.onnx"))
        ins, outs = IO[name]
        graphs[name] = GraphSpec(
            name,
            f"{name}.onnx",
            tuple(TensorSpec(n, tuple(s), d) for n, s, d in ins),
            tuple(TensorSpec(n, tuple(s), d) for n, s, d in outs),
        )
    m = Manifest(
        family="sam2",
        image_size=128,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        grid=8,
        hidden_dim=128,
        mem_dim=64,
        tokens_per_slot=64,
        mask_size=32,
        cond_slots=2,
        recent_slots=6,
        pointer_slots=17,
        max_object_pointers=16,
        num_maskmem=7,
        algorithm=dict(ALGORITHM),
        graphs=graphs,
        opset=17,
        vostream_version="test",
    )
    m.write(out)
    return load_manifest(out)


@pytest.fixture()
def export(tmp_path: Path) -> tuple[Manifest, Path]:
    d = tmp_path / "export"
    return make_export(d), d


@pytest.fixture()
def fake_atc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake ``atc`` (``tests/fakes/fake_atc.py``) first on PATH; returns the log file of its invocations (one JSON
    line each)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake_atc_module.install(bindir)
    log = tmp_path / "atc.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_ATC_LOG", str(log))
    monkeypatch.delenv("FAKE_ATC_FAIL", raising=False)
    return log


@pytest.fixture()
def no_atc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH with only the python interpreter's directory (no atc)."""
    bindir = tmp_path / "emptybin"
    bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))


def _opts(argv: list[str]) -> dict[str, str]:
    assert argv[0].endswith("atc")
    out = {}
    for a in argv[1:]:
        assert a.startswith("--") and "=" in a, a
        k, v = a[2:].split("=", 1)
        assert k not in out, f"duplicate option {k}"
        out[k] = v
    return out


def _shapes(text: str) -> dict[str, list[int]]:
    return {n: [int(v) for v in d.split(",")] for n, d in (p.rsplit(":", 1) for p in text.split(";"))}


# ------------------------------------------------------------------------------------------------ atc commands
def test_commands_have_manifest_names_shapes_and_decoder_gears(export: tuple[Manifest, Path]) -> None:
    m, d = export
    cmds = atc.atc_commands(m, d, soc_version="Ascend910B4")
    assert len(cmds) == 4
    for (name, g), argv in zip(m.graphs.items(), cmds):
        o = _opts(argv)
        assert o["framework"] == "5" and o["soc_version"] == "Ascend910B4" and o["log"] == "error"
        assert o["model"] == str(d / g.file) and o["output"] == str(d / name)
        want = {t.name: [-1 if isinstance(v, str) else v for v in t.shape] for t in g.inputs}
        assert _shapes(o["input_shape"]) == want  # every input, names exactly as in the manifest, in order
        assert list(_shapes(o["input_shape"])) == [t.name for t in g.inputs]
        assert o["precision_mode_v2"] == "fp16" and o["keep_dtype"] == str(d / f"{name}.keep_dtype.cfg")
        assert "precision_mode" not in o  # mutually exclusive with precision_mode_v2
        if name == "decoder":
            assert _shapes(o["input_shape"])["points"] == [1, -1, 2] and _shapes(o["input_shape"])[
                "labels"
            ] == [1, -1]
            gears = [tuple(int(v) for v in gear.split(",")) for gear in o["dynamic_dims"].split(";")]
            assert gears == [(k, k) for k in range(1, 9)]  # one value per -1 (points, labels) per gear
            assert o["input_format"] == "ND"
        else:
            assert "dynamic_dims" not in o
            assert o["input_format"] == ("NCHW" if name == "image_encoder" else "ND")


def test_fp32_single_gear_and_relative_paths(export: tuple[Manifest, Path]) -> None:
    m, _ = export
    cmds = atc.atc_commands(m, Path("."), precision="fp32", k_gears=[4], out_dir="om")
    dec = _opts(cmds[2])
    assert dec["model"] == "decoder.onnx" and dec["output"] == "om/decoder"
    assert (
        _shapes(dec["input_shape"])["points"] == [1, 4, 2] and "dynamic_dims" not in dec
    )  # one gear: static
    assert all(_opts(c)["precision_mode_v2"] == "origin" and "keep_dtype" not in _opts(c) for c in cmds)
    two = _opts(atc.atc_commands(m, ".", k_gears=[8, 2, 2])[2])
    assert two["dynamic_dims"] == "2,2;8,8"


def test_bad_options_raise_config_error(export: tuple[Manifest, Path]) -> None:
    m, d = export
    with pytest.raises(ConfigError, match="unknown --soc-version 'Ascend999'.*npu-smi"):
        atc.atc_commands(m, d, soc_version="Ascend999")
    with pytest.raises(ConfigError, match="did you mean Ascend910B3"):
        atc.check_soc("ascend910b3")
    assert (
        _opts(atc.atc_commands(m, d, soc_version="Ascend999", allow_unknown_soc=True)[0])["soc_version"]
        == "Ascend999"
    )
    with pytest.raises(ConfigError, match="om-precision"):
        atc.atc_commands(m, d, precision="int8")
    with pytest.raises(ConfigError, match="at most 100 gears"):
        atc.atc_commands(m, d, k_gears=range(1, 102))
    with pytest.raises(ConfigError, match=">= 1"):
        atc.check_gears([0, 1])
    with pytest.raises(ConfigError, match="opset 19"):
        atc.check_opset(19)
    assert atc.check_opset(17, "7.0.0") == [] and atc.check_opset(17, "9.0.0") == []
    assert "11-15" in atc.check_opset(17, "8.0.RC1")[0]
    assert atc.check_opset(17, "8.2.RC1") == []  # undocumented here: no claim
    assert atc.documented_opsets("8.0.RC1") == (11, 15) and atc.documented_opsets("6.0.1") == (11, 11)
    assert atc.documented_opsets(None) is None


def test_detect_cann_version(tmp_path: Path) -> None:
    import platform

    root = tmp_path / "ascend-toolkit" / "latest"
    info = root / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
    info.parent.mkdir(parents=True)
    info.write_text("package_name=Ascend-cann-toolkit\nversion=8.0.RC2\ninnerversion=V100R001C19\n")
    assert atc.detect_cann_version({"ASCEND_TOOLKIT_HOME": str(root)}) == ("8.0.RC2", str(info))
    version, why = atc.detect_cann_version({"ASCEND_HOME_PATH": str(tmp_path / "nowhere")})
    if version is None:  # a real CANN under /usr/local/Ascend would be found instead
        assert "set_env.sh" in why


# ------------------------------------------------------------------------------------------------ convert_export
def test_script_and_precision_files_written_when_atc_absent(
    export: tuple[Manifest, Path], no_atc: None
) -> None:
    m, d = export
    rec = atc.convert_export(m, d, soc_version="Ascend910B2")
    assert rec["ran"] is False and "not on PATH" in rec["reason"] and rec["om"] == {}
    assert not list(d.glob("*.om")) and not (d / atc.RECORD_NAME).exists()
    script = d / atc.SCRIPT_NAME
    assert os.access(script, os.X_OK)
    text = script.read_text()
    assert "set -euo pipefail" in text and 'cd "$(dirname "$0")"' in text and "CANN 7.0.0" in text
    cmd_lines = [shlex.split(ln) for ln in text.splitlines() if ln.startswith("atc ")]
    assert cmd_lines == rec["commands"] and len(cmd_lines) == 4
    assert (
        _opts(cmd_lines[2])["model"] == "decoder.onnx"
    )  # relative: the export can be copied to the Ascend host
    for name, g in m.graphs.items():
        cfg = Path(rec["keep_dtype"][name])
        assert cfg == d / f"{name}.keep_dtype.cfg" and cfg.is_file()
        listed = cfg.read_text().splitlines()
        model = onnx.load(str(d / g.file))
        want = [n.name for n in model.graph.node if n.op_type in ("LayerNormalization", "Softmax") and n.name]
        assert want and set(want) <= set(listed)
        assert any("LayerNormalization" in ln for ln in listed) and any("Softmax" in ln for ln in listed)
        assert all(ln.strip() and not ln.startswith("#") for ln in listed)
    me = (d / "memory_encoder.keep_dtype.cfg").read_text().splitlines()
    assert {"/Sigmoid", "/Greater", "/Cast_3", "/Cast_4"} <= set(
        me
    ) and "/Cast" not in me  # bool->float cast not
    assert "/Sigmoid" not in (d / "decoder.keep_dtype.cfg").read_text().splitlines()
    assert rec["kept_ops"]["memory_encoder"] == {
        "LayerNormalization": 1,
        "Softmax": 1,
        "Sigmoid": 1,
        "Greater": 1,
        "Cast": 2,
    }
    assert any("memory_attention" in w and "Softmax" in w for w in rec["warnings"])  # the unnamed Softmax
    rec = atc.convert_export(None, d, precision="fp32", run=False)  # manifest loaded from the directory
    assert rec["reason"].startswith("not requested") and "--precision_mode_v2=origin" in script.read_text()


def test_run_true_without_atc_is_a_config_error(export: tuple[Manifest, Path], no_atc: None) -> None:
    m, d = export
    with pytest.raises(ConfigError, match="not on PATH"):
        atc.convert_export(m, d, run=True)


def test_fake_atc_is_run_and_om_files_reported(export: tuple[Manifest, Path], fake_atc: Path) -> None:
    m, d = export
    lines: list[str] = []
    rec = atc.convert_export(m, d, soc_version="Ascend910B3", progress=lines.append)
    assert rec["ran"] is True and set(rec["om"]) == set(m.graphs)
    for name in m.graphs:
        om = d / f"{name}.om"
        assert rec["om"][name] == str(om) and om.is_file()
        meta = {p.key: p.value for p in onnx.load(str(om)).metadata_props}
        assert meta["fake_acl.input_shape"].startswith(IO[name][0][0][0] + ":")
    assert {p.key: p.value for p in onnx.load(str(d / "decoder.om")).metadata_props}[
        "fake_acl.dynamic_dims"
    ].startswith("1,1;2,2")
    calls = [json.loads(ln) for ln in fake_atc.read_text().splitlines()]
    assert len(calls) == 4 and all(c["keep_dtype_exists"] for c in calls)
    assert all(
        Path(c["cwd"]).parent == d.resolve() and Path(c["cwd"]).name.startswith(".atc-") for c in calls
    )
    assert any("ATC run success" in ln for ln in lines)  # atc's output is streamed
    assert json.loads((d / atc.RECORD_NAME).read_text())["om"] == rec["om"]
    assert not list(d.glob(".atc-*")) and not list(d.glob(".*.tmp*"))
    assert "converted 4 graphs" in atc.describe(rec)


def test_relative_export_dir_converts(
    export: tuple[Manifest, Path], fake_atc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``vostream export ... --out exports/x --om`` gives a relative directory while ATC runs inside the temporary
    directory: every path ATC gets must still point to the right place."""
    m, d = export
    monkeypatch.chdir(d.parent)
    rec = atc.convert_export(m, Path(d.name), progress=lambda s: None)
    assert rec["ran"] is True and sorted(p.name for p in d.glob("*.om")) == sorted(
        f"{n}.om" for n in m.graphs
    )
    for c in (json.loads(ln) for ln in fake_atc.read_text().splitlines()):
        o = _opts(c["argv"] and ["atc", *c["argv"]])
        assert Path(o["output"]).is_absolute() and Path(o["model"]).is_absolute()


def test_failing_graph_names_graph_and_leaves_no_om(
    export: tuple[Manifest, Path], fake_atc: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m, d = export
    monkeypatch.setenv("FAKE_ATC_FAIL", "decoder")
    with pytest.raises(BackendError) as err:
        atc.convert_export(m, d, progress=lambda s: None)
    msg = str(err.value)
    assert "graph decoder" in msg and "exit code 3" in msg and "fake failure for decoder" in msg
    assert not list(d.glob("*.om"))  # image_encoder and memory_attention converted, but nothing was moved in
    assert not list(d.glob(".atc-*")) and (d / atc.SCRIPT_NAME).is_file()
    assert len(fake_atc.read_text().splitlines()) == 3  # stopped at the failing graph


def test_om_cli_arguments(export: tuple[Manifest, Path], no_atc: None) -> None:
    p = argparse.ArgumentParser()
    atc.add_om_arguments(p)
    a = p.parse_args([])
    assert (a.om, a.soc_version, a.om_precision, a.run_atc, a.om_max_points) == (
        False,
        "Ascend910B3",
        "fp16-mixed",
        None,
        8,
    )
    a = p.parse_args(
        [
            "--om",
            "--soc-version",
            "Ascend910B1",
            "--om-precision",
            "fp32",
            "--no-run-atc",
            "--om-max-points",
            "3",
        ]
    )
    assert (a.om, a.soc_version, a.om_precision, a.run_atc) == (True, "Ascend910B1", "fp32", False)
    m, d = export
    assert atc.om_from_args(p.parse_args([]), m, d) is None
    rec = atc.om_from_args(a, m, d)
    assert rec is not None and rec["k_gears"] == [1, 2, 3] and rec["ran"] is False
    assert atc.main([str(d), "--soc-version", "Ascend000"]) == 2


# ------------------------------------------------------------------------------------------------ doctor
@pytest.fixture()
def clean_acl() -> Any:
    """No acl module installed; the fake is uninstalled and reset afterwards."""
    acl_fake.uninstall()
    acl_fake.reset()
    yield
    acl_fake.uninstall()
    acl_fake.reset()


@pytest.fixture()
def acl_shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_acl: None) -> Path:
    """An importable ``acl`` (tests/fakes/fake_acl.py's shim) on sys.path and PYTHONPATH, as a CANN install puts the real
    one there; child processes configure the fake from FAKE_ACL_CONFIG.  Nothing is imported here."""
    shim = tmp_path / "shim"
    shim.mkdir()
    acl_fake.write_shim(shim)
    monkeypatch.syspath_prepend(str(shim))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv(acl_fake.CONFIG_ENV, raising=False)
    return shim


def _by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_doctor_in_process_without_acl(clean_acl: None) -> None:
    if _has_real_acl():
        pytest.skip("a real pyACL is importable here")
    c = _by_name(doctor.run_checks())
    assert c["classic"].status == "OK"
    assert c["onnx"].status == "OK" and "CPUExecutionProvider" in c["onnx"].detail
    assert "CPUExecutionProvider" in c["onnx"].data["providers"] and c["onnx"].data["cuda"] in (True, False)
    assert c["acl"].status == "MISSING" and "CANN" in c["acl"].detail and "set_env.sh" in c["acl"].detail
    assert c["export"].status in ("OK", "MISSING") and c["media"].status in ("OK", "MISSING")
    assert not any(k.startswith("model") for k in c)
    table = doctor.format_table(list(c.values()))
    assert table.splitlines()[0].startswith("vostream doctor") and len(table.splitlines()) == 1 + len(c)


def _has_real_acl() -> bool:
    import importlib.util

    mod = sys.modules.get("acl")
    if mod is not None:
        return not getattr(mod, "__vostream_fake__", False)
    return importlib.util.find_spec("acl") is not None


def test_doctor_probes_acl_in_a_child_process(acl_shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An importable ``acl`` is probed in a child process: the doctor itself imports nothing.  The shim turns into
    the fake there, configured through the environment (an A3 SoC, 2 devices, 32 GiB), and the fake says it is
    one."""
    monkeypatch.setenv(
        acl_fake.CONFIG_ENV,
        json.dumps({"soc_name": "Ascend910_9392", "hbm_bytes": 32 * 2**30, "device_count": 2}),
    )
    c = doctor.check_acl(device_id=1)
    assert c.status == "OK", c.detail
    assert c.data["fake"] is True and c.detail.startswith("fake pyACL (") and "fake_acl.py" in c.detail
    assert (
        c.data["soc"] == "Ascend910_9392"
        and c.data["hbm_total"] == 32 * 2**30
        and c.data["device_count"] == 2
    )
    assert "Ascend910_9392" in c.detail and "32.0 GiB" in c.detail and c.data["run_mode"] == "host"
    assert "acl" not in sys.modules  # nothing imported acl in this process
    bad = doctor.check_acl(device_id=5)
    assert bad.status == "FAIL" and "device 5 does not exist" in bad.detail
    monkeypatch.setenv(acl_fake.CONFIG_ENV, json.dumps({"soc_name": "Ascend910B2"}))
    (acl_shim / "acl.py").write_text(  # a module that does not call itself a fake is reported as pyACL
        f"import sys\nsys.path.insert(0, {str(Path(acl_fake.__file__).parents[1])!r})\nfrom fakes import fake_acl\n"
        "m = fake_acl.install()\ndel m.__vostream_fake__\nsys.modules['acl'] = m\n"
    )
    c = doctor.check_acl()
    assert (
        c.status == "OK"
        and c.data["fake"] is False
        and c.detail.startswith("pyACL:")
        and "HBM free" in c.detail
    )
    (acl_shim / "acl.py").write_text("raise ImportError('libascendcl.so: cannot open shared object file')\n")
    c = doctor.check_acl()
    assert c.status == "MISSING" and "libascendcl.so" in c.detail and "CANN" in c.detail


def test_doctor_does_not_switch_to_the_fake_by_itself(
    clean_acl: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old switch is gone: VOSTREAM_FAKE_ACL=1 changes nothing, and a fake installed in this process only is
    not what the doctor reports (it probes 'import acl' in a child process, which has no fake)."""
    if _has_real_acl():
        pytest.skip("a real pyACL is importable here")
    monkeypatch.setenv("VOSTREAM_FAKE_ACL", "1")
    assert doctor.check_acl().status == "MISSING"
    acl_fake.install()
    c = doctor.check_acl()
    assert c.status == "MISSING" and "CANN" in c.detail and "VOSTREAM_FAKE_ACL" not in c.detail


def test_fake_acl_wrapper_runs_doctor_json(tmp_path: Path) -> None:
    """``python tests/fakes/fake_acl.py doctor --json``: the fake pyACL (in the doctor's child probe too) and the fake
    atc on PATH."""
    env = {**os.environ, acl_fake.CONFIG_ENV: json.dumps({"hbm_bytes": 16 * 2**30})}
    out = subprocess.run(
        [sys.executable, acl_fake.__file__, "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    checks = {c["name"]: c for c in d["checks"]}
    assert d["backends"] == {"classic": True, "onnx": True, "acl": True}
    assert checks["acl"]["data"]["fake"] is True and checks["acl"]["data"]["soc"] == "Ascend910B3"
    assert checks["acl"]["data"]["hbm_total"] == 16 * 2**30
    assert checks["atc"]["status"] == "OK" and checks["atc"]["data"]["path"].endswith("/atc")
    assert "fake-acl-" in checks["atc"]["data"]["path"]


def test_doctor_model_without_acl_runs_onnx_and_skips_acl(
    export: tuple[Manifest, Path], clean_acl: None, capsys: pytest.CaptureFixture[str]
) -> None:
    if _has_real_acl():
        pytest.skip("a real pyACL is importable here")
    m, d = export
    c = _by_name(doctor.run_checks(d))
    assert c["model"].status == "OK" and "sam2 128px" in c["model"].detail
    assert c["model"].data["bank_bytes_per_object"] == (2 + 6) * 64 * 64 * 4  # (C+N)·T·M·4
    assert c["model"].data["pointer_bytes_per_object"] == 17 * 128 * 4  # Q·D·4
    assert c["model"].data["om"] == {n: False for n in m.graphs}
    assert c["model.onnx"].status == "OK" and c["model.onnx"].data["ms_per_frame"] > 0
    assert c["model.acl"].status == "SKIP"
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command")
    doctor.add_doctor_parser(sub, lambda q: q.add_argument("--quiet", action="store_true"))
    args = p.parse_args(["doctor", "--model", str(d), "--json", "--quiet"])
    assert args.command == "doctor" and doctor.cmd_doctor(args) == 0
    assert json.loads(capsys.readouterr().out)["checks"][-1]["name"] == "model.acl"
    assert doctor.main(["--model", str(d / "missing")]) == 1  # a requested model check that fails
    assert "FAIL" in capsys.readouterr().out


class _Scaled:
    """Wraps a tracker so its sessions' logits are multiplied by ``k`` (a stand-in for a broken device)."""

    def __init__(self, inner: Any, k: float) -> None:
        self.inner, self.k, self.manifest = inner, k, inner.manifest

    def new_session(self) -> Any:
        s = self.inner.new_session()
        step, k = s.step, self.k

        def scaled(frame: Any) -> Any:
            r = step(frame)
            r.logits = r.logits * k
            return r

        s.step = scaled
        return s

    def close(self) -> None:
        self.inner.close()


def test_doctor_model_compare_detects_mismatch(export: tuple[Manifest, Path], clean_acl: None) -> None:
    from vostream.stages.trackers.sam2 import OnnxTracker

    _, d = export
    ok = doctor.Check("acl", "OK", "stand-in")
    same = _by_name(doctor.check_model(d, ok, acl_factory=lambda p: _Scaled(OnnxTracker(p, threads=1), 1.0)))
    assert same["model.acl"].status == "SKIP"  # no .om files yet
    for name in IO:
        (d / f"{name}.om").write_bytes((d / f"{name}.onnx").read_bytes())
    same = _by_name(doctor.check_model(d, ok, acl_factory=lambda p: _Scaled(OnnxTracker(p, threads=1), 1.0)))
    assert same["model.acl"].status == "OK" and same["model.acl"].data["iou"] == 1.0
    assert same["model.acl"].data["max_abs_diff"] == 0.0
    flipped = _by_name(
        doctor.check_model(d, ok, acl_factory=lambda p: _Scaled(OnnxTracker(p, threads=1), -1.0))
    )
    assert flipped["model.acl"].status == "FAIL" and flipped["model.acl"].data["iou"] < 0.9
    assert doctor.model_failed(list(flipped.values()))

    def broken(p: Path) -> Any:
        raise BackendError("AclRuntime.load: graph 'decoder': 145021")

    c = _by_name(doctor.check_model(d, ok, acl_factory=broken))
    assert c["model.acl"].status == "FAIL" and "145021" in c["model.acl"].detail


def test_doctor_model_acl_runtime_vs_onnx_on_fake(
    export: tuple[Manifest, Path], fake_atc: Path, acl_shim: Path
) -> None:
    """End to end on the fake: the fake atc writes .om stand-ins (ONNX + the ATC shapes/gears as metadata), the
    doctor runs the clip through AclRuntime on the fake pyACL and through ONNX Runtime, and compares."""
    m, d = export
    atc.convert_export(m, d, progress=lambda s: None)
    acl_fake.install()  # what the shim does in this process on 'import acl'
    c = _by_name(doctor.run_checks(d))
    assert c["acl"].status == "OK" and c["acl"].data["fake"]
    assert c["model"].data["om"] == {n: True for n in m.graphs}
    assert c["model.acl"].status == "OK", c["model.acl"].detail
    assert c["model.acl"].data["iou"] == 1.0 and c["model.acl"].data["max_abs_diff"] < 1e-5
    assert acl_fake.stats().executes >= 4  # the four graphs really ran on the fake


# ------------------------------------------------------------------------------------------------ docs/ascend.md §9
def _documented_fake_acl_commands() -> list[str]:
    """The ``python tests/fakes/fake_acl.py ...`` lines of the code block in docs/ascend.md §9 that runs the fake."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "ascend.md").read_text()
    section = text[text.index("## 9. Tracking") : text.index("## 10.")]
    blocks = section.split("```bash\n")[1:]
    block = next(b.split("```")[0] for b in blocks if "python tests/fakes/fake_acl.py export" in b)
    return [ln for ln in block.splitlines() if ln.strip()]


@pytest.mark.slow
def test_ascend_md_fake_acl_commands(sam2_tiny: Any, tmp_path: Path) -> None:
    """Runs docs/ascend.md §9's fake-ACL command lines verbatim as subprocesses, from a directory whose ``tests``
    is this checkout's, with CHECKPOINT = a tiny random SAM 2 checkpoint, VIDEO = a small clip and POINT = a click
    on its square: export --om (the fake atc writes the .om files), doctor --model (the fake pyACL, acl vs onnx),
    track --backend acl."""
    from fakes.media import make_video, square_frames, square_mask

    lines = _documented_fake_acl_commands()
    assert [shlex.split(ln)[2] for ln in lines] == ["export", "doctor", "track"]
    assert all(shlex.split(ln)[:2] == ["python", "tests/fakes/fake_acl.py"] for ln in lines)
    ckpt, _ = sam2_tiny("sam2")
    w, h, n = 128, 96, 6
    video = make_video(tmp_path / "clip.mp4", square_frames(n, w, h, step=2), fps=25)
    ys, xs = np.nonzero(square_mask(0, w, h, step=2))
    work = tmp_path / "checkout"
    work.mkdir()
    (work / "tests").symlink_to(Path(__file__).resolve().parents[2])
    env = {
        **os.environ,
        "CHECKPOINT": str(ckpt),
        "VIDEO": str(video),
        "POINT": f"{xs.mean():.0f},{ys.mean():.0f}",
    }
    env.pop("FAKE_ACL_CONFIG", None)
    outputs = []
    for ln in lines:
        argv = shlex.split(ln)  # then the shell's expansion of "$CHECKPOINT", "$VIDEO", "$POINT"
        for var in ("CHECKPOINT", "VIDEO", "POINT"):
            argv = [a.replace(f"${var}", env[var]) for a in argv]
        argv[0] = sys.executable  # "python"
        proc = subprocess.run(
            argv, cwd=work, env=env, capture_output=True, text=True, timeout=600, check=False
        )
        assert proc.returncode == 0, f"{ln}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout + proc.stderr)
    export = work / "exports" / "fake-acl"
    om = sorted(p.name for p in export.glob("*.om"))
    assert om == ["decoder.om", "image_encoder.om", "memory_attention.om", "memory_encoder.om"]
    meta = {p.key: p.value for p in onnx.load(str(export / "decoder.om")).metadata_props}
    assert meta["fake_acl.dynamic_dims"].startswith("1,1;2,2")  # written by the fake atc from the ATC command
    doctor_rows = {ln.split()[0]: ln.split()[1] for ln in outputs[1].splitlines()[1:] if ln.startswith("  ")}
    assert doctor_rows["acl"] == "OK" and "fake pyACL" in outputs[1] and doctor_rows["atc"] == "OK"
    assert (
        doctor_rows["model"] == "OK"
        and doctor_rows["model.onnx"] == "OK"
        and doctor_rows["model.acl"] == "OK"
    )
    assert "mask IoU 1.0000" in outputs[1]
    out = work / "out" / "fake-acl"
    assert out.is_dir() and any(out.iterdir()), outputs[2]
