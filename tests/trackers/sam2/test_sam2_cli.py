"""``vostream export`` and ``vostream track --backend onnx`` end to end, in-process through ``cli.main``.

One tiny random SAM 2.1 checkpoint (``sam2_reference.save_tiny``, no downloads) is exported once per session through
the CLI; the export is then tracked through a real H.264 clip with every output format, from flags and from a config
file, and through ``annotate`` / ``serve``.  Bad exports, bad model directories and damaged exports must each end in
one ``vostream: error:`` line with the documented exit code and no traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)

import av
import numpy as np
from fakes.media import copy_to, moving_square_clip, square_mask
from PIL import Image
from pycocotools import mask as mask_utils

from vostream.apps.cli import build_parser, main
from vostream.apps.config import merge_settings, tracker_options
from vostream.pipeline.errors import ConfigError

W, H, N = 96, 64, 8
GRAPHS = ("image_encoder", "memory_attention", "decoder", "memory_encoder")


def clip() -> Path:
    return moving_square_clip(".mp4", "libx264", N, W, H)


def square_centre(i: int = 0) -> tuple[int, int]:
    ys, xs = np.nonzero(square_mask(i, W, H))
    return int(xs.mean()), int(ys.mean())


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The tiny checkpoint exported by ``vostream export`` (once): paths, exit code, stdout and stderr."""
    from fakes import sam2_reference as ref

    root = tmp_path_factory.mktemp("sam2_cli")
    ckpt = ref.save_tiny("sam2", root / "ckpt")
    out = root / "export"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        rc = main(["export", str(ckpt), "--out", str(out)])
    return {
        "root": root,
        "ckpt": ckpt,
        "out": out,
        "rc": rc,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
    }


@pytest.mark.slow
def test_export_writes_manifest_and_four_graphs(exported: dict) -> None:
    import onnx

    assert exported["rc"] == 0, exported["stderr"]
    out: Path = exported["out"]
    # progress lines on stderr: loading, one per graph, the final "wrote"; one summary line on stdout
    progress = exported["stderr"]
    assert "loading" in progress and all(f"{g}: exported and verified" in progress for g in GRAPHS), progress
    (summary,) = exported["stdout"].strip().splitlines()
    assert "4 graphs" in summary and str(out) in summary and " MB" in summary and "--backend onnx" in summary
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["family"] == "sam2" and manifest["format_version"] == 1 and manifest["opset"] == 17
    assert set(manifest["graphs"]) == set(GRAPHS)
    assert sorted(p.name for p in out.glob("*.onnx")) == sorted(f"{g}.onnx" for g in GRAPHS)
    for g in GRAPHS:
        model = onnx.load(str(out / manifest["graphs"][g]["file"]))
        inputs = {i.name for i in model.graph.input}
        assert {t["name"] for t in manifest["graphs"][g]["inputs"]} <= inputs
    assert not list(out.parent.glob(f".{out.name}.*")), "the temporary export directory was left behind"


def test_export_refuses_existing_export_without_force(exported: dict, capfd: pytest.CaptureFixture) -> None:
    rc = main(["export", str(exported["ckpt"]), "--out", str(exported["out"]), "-q"])
    _, err = capfd.readouterr()
    assert rc == 2 and err.strip().splitlines() == [err.strip()] and "--force" in err


def test_track_onnx_writes_every_output(exported: dict, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    x, y = square_centre()
    out = tmp_path / "out"
    rc = main(
        [
            "track",
            str(clip()),
            "--backend",
            "onnx",
            "--model",
            str(exported["out"]),
            "--point",
            f"{x},{y}",
            "--out",
            str(out),
            "--save",
            "video,png,json,mot",
            "--threads",
            "1",
        ]
    )
    _, err = capfd.readouterr()
    assert rc == 0, err
    assert f"{N} frames in" in err and "Traceback" not in err

    with av.open(str(out / "overlay.mp4")) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) == N and frames[0].shape == (H, W, 3)

    pngs = sorted((out / "masks").glob("*.png"))
    assert [p.name for p in pngs] == [f"{i:05d}.png" for i in range(N)]

    data = json.loads((out / "annotations.json").read_text())
    assert data["videos"][0]["length"] == N
    (ann,) = data["annotations"]  # one annotation per object
    assert ann["id"] == 1 and len(ann["segmentations"]) == N
    present = set()
    for i, (png, seg) in enumerate(zip(pngs, ann["segmentations"])):
        assert isinstance(seg, dict) and seg["size"] == [H, W] and isinstance(seg["counts"], str), seg
        from_json = mask_utils.decode(seg).astype(bool)
        labels = np.asarray(Image.open(png))
        assert labels.shape == (H, W)
        assert np.array_equal(from_json, labels == 1), f"frame {i}: JSON and PNG masks differ"
        if from_json.any():
            present.add(i + 1)
    assert present, "the tracker produced no mask on any frame"

    mot = [line.split(",") for line in (out / "mot.txt").read_text().splitlines()]
    assert all(len(r) == 10 and int(r[1]) == 1 and float(r[4]) > 0 and float(r[5]) > 0 for r in mot), mot
    assert {
        int(r[0]) for r in mot
    } == present  # MOT rows (1-based frames) exactly where the mask is non-empty

    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["backend"] == "onnx" and summary["model"] == str(exported["out"]) and summary["frames"] == N
    )
    (track,) = [n for n in summary["metrics"]["nodes"] if n["name"] == "track"]
    backend = track["extra"]["backend"]
    assert (
        backend["frames"] == N and backend["h2d_bytes_per_frame"] > 0 and backend["d2h_bytes_per_frame"] > 0
    )
    assert {k.removesuffix("_ms_per_frame") for k in backend if k.endswith("_ms_per_frame")} == set(GRAPHS)


def test_track_onnx_from_config_file(exported: dict, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    model = shutil.copytree(exported["out"], tmp_path / "models" / "tiny")
    x, y = square_centre()
    cfg = tmp_path / "run.toml"
    cfg.write_text(
        f'source = "{clip()}"\nout = "result"\nsave = ["json"]\nmax_frames = 3\nbackend = "onnx"\n'
        f'model = "models/tiny"\nprovider = "cpu"\nthreads = 1\ndevice_id = 0\n'
        f"[[prompts]]\nobj = 4\npoints = [[{x}, {y}]]\n"
    )
    rc = main(["track", "--config", str(cfg), "-q"])
    _, err = capfd.readouterr()
    assert rc == 0, err
    summary = json.loads((tmp_path / "result" / "summary.json").read_text())  # out is relative to the config
    assert summary["backend"] == "onnx" and summary["provider"] == "cpu" and summary["frames"] == 3
    assert Path(summary["model"]) == model
    (ann,) = json.loads((tmp_path / "result" / "annotations.json").read_text())["annotations"]
    assert ann["id"] == 4 and len(ann["segmentations"]) == 3


def test_tracker_options_merge_config_and_flags() -> None:
    config = {
        "source": "v.mp4",
        "out": "o",
        "backend": "onnx",
        "model": "m",
        "threads": 2,
        "device_id": 1,
        "provider": "cuda",
        "tracker": {"threads": 9, "extra": True},
    }
    s = merge_settings(config, {"threads": 3, "provider": None, "device_id": None, "prompts": []})
    # the [tracker] table is the base; top-level keys win over it; flags win over the config
    assert tracker_options(s) == {
        "model": "m",
        "threads": 3,
        "device_id": 1,
        "provider": "cuda",
        "extra": True,
    }
    assert tracker_options(merge_settings(None, {"source": "v", "out": "o", "prompts": []})) == {}
    for key, bad in (("threads", 0), ("device_id", -1), ("provider", "gpu"), ("threads", True)):
        with pytest.raises(ConfigError, match=key):
            merge_settings({"source": "v", "out": "o", key: bad}, {"prompts": []})


def test_annotate_and_serve_load_the_onnx_backend(
    exported: dict, tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    (tmp_path / "videos").mkdir()
    video = copy_to(clip(), tmp_path / "videos", "walk.mp4")
    x, y = square_centre()
    prompts = tmp_path / "clicks.csv"
    prompts.write_text(f"video,frame,obj_id,x,y,label\nwalk.mp4,0,1,{x},{y},1\n")
    rc = main(
        [
            "annotate",
            str(video),
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "ann"),
            "--backend",
            "onnx",
            "--model",
            str(exported["out"]),
            "--formats",
            "json",
            "--workers",
            "0",
            "-q",
        ]
    )
    _, err = capfd.readouterr()
    assert rc == 0, err
    (row,) = json.loads((tmp_path / "ann" / "summary.json").read_text())["videos"]
    assert row["status"] == "done" and row["frames"] == N, row
    (ann,) = json.loads((tmp_path / "ann" / "walk" / "annotations.json").read_text())["annotations"]
    assert len(ann["segmentations"]) == N

    from vostream.apps.serve.server import serve_config
    from vostream.stages.trackers import load_tracker
    from vostream.stages.trackers.sam2 import Sam2Tracker

    cfg = serve_config(
        build_parser().parse_args(["serve", str(video), "--backend", "onnx", "--model", str(exported["out"])])
    )
    tracker = load_tracker(cfg.session.backend, **cfg.session.tracker_options)  # what each serve session does
    try:
        assert isinstance(tracker, Sam2Tracker) and tracker.manifest.family == "sam2"
    finally:
        tracker.close()


def _damaged_export(exported: dict, tmp_path: Path, damage: str) -> Path:
    model = shutil.copytree(exported["out"], tmp_path / "damaged")
    if damage == "version":
        m = json.loads((model / "manifest.json").read_text())
        m["format_version"] = 99
        (model / "manifest.json").write_text(json.dumps(m))
    else:
        data = (model / "decoder.onnx").read_bytes()
        (model / "decoder.onnx").write_bytes(data[: len(data) // 3])
    return model


@pytest.mark.parametrize(
    "case, code, needles",
    [
        ("export-not-a-checkpoint", 2, ["no config.json"]),
        (
            "export-unsupported-family",
            2,
            ["'bert'", "Sam2VideoModel", "EdgeTamVideoModel", "Sam3TrackerVideoModel"],
        ),
        ("export-bad-image-size", 2, ["--image-size 100", "multiples of 32", "trained at 128"]),
        (
            "export-hub-unreachable",
            2,
            ["'nobody/no-such-model' is not a local directory", "hub is unreachable", "hub.invalid"],
        ),
        (
            "export-hub-offline",
            2,
            [
                "'nobody/no-such-model' is not a local directory",
                "not in the Hugging Face cache",
                "HF_HUB_OFFLINE",
            ],
        ),
        ("track-not-an-export", 2, ["not a vostream export", "vostream export"]),
        ("track-no-model", 2, ["--model"]),
        ("track-classic-provider", 2, ["'classic'", "provider"]),
        ("track-format-99", 2, ["format 99", "upgrade vostream"]),
        ("track-corrupt-graph", 5, ["decoder.onnx"]),
    ],
)
def test_bad_input_one_line_error(
    case: str,
    code: int,
    needles: list[str],
    exported: dict,
    tmp_path: Path,
    capfd: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    x, y = square_centre()
    track = ["track", str(clip()), "--point", f"{x},{y}", "--out", str(tmp_path / "out")]
    if case == "export-not-a-checkpoint":
        (tmp_path / "notes").mkdir()
        (tmp_path / "notes" / "readme.txt").write_text("not a model")
        argv = ["export", str(tmp_path / "notes"), "--out", str(tmp_path / "exp")]
    elif case == "export-unsupported-family":
        (tmp_path / "bert").mkdir()
        (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
        argv = ["export", str(tmp_path / "bert"), "--out", str(tmp_path / "exp"), "--quiet"]
    elif case in ("export-hub-unreachable", "export-hub-offline"):
        # a hub id that is not cached: offline it must fail at once with the reason, not after the client's retries
        if case == "export-hub-offline":
            from huggingface_hub import constants

            monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
        else:
            monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")  # RFC 2606: never resolves
        argv = ["export", "nobody/no-such-model", "--out", str(tmp_path / "exp")]
    elif case == "export-bad-image-size":
        argv = ["export", str(exported["ckpt"]), "--out", str(tmp_path / "exp"), "--image-size", "100"]
    elif case == "track-not-an-export":
        argv = track + ["--backend", "onnx", "--model", str(exported["ckpt"])]
    elif case == "track-no-model":
        argv = track + ["--backend", "onnx"]
    elif case == "track-classic-provider":
        argv = track + ["--backend", "classic", "--provider", "cpu"]
    else:
        model = _damaged_export(exported, tmp_path, "version" if case == "track-format-99" else "truncate")
        argv = track + ["--backend", "onnx", "--model", str(model)]
    rc = main(argv)
    out, err = capfd.readouterr()
    assert rc == code, err
    lines = err.strip().splitlines()
    errors = [line for line in lines if line.startswith("vostream: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    assert all(n in errors[0] for n in needles), errors[0]
    assert "Traceback" not in err + out
    if "--quiet" in argv:
        assert lines == errors  # nothing but the error
    if case.startswith("export"):
        assert not (tmp_path / "exp").exists() and not list(tmp_path.glob(".exp.*"))


def test_help_names_real_checkpoints_and_new_flags(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["export", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for name in (
        "facebook/sam2.1-hiera-tiny",
        "yonigozlan/EdgeTAM-hf",
        "facebook/sam3",
        "--cond-slots",
        "--opset",
        "--force",
        "--image-size",
        "--int8",
        "--compare",
        "--calib-frames",
        "--point",
    ):
        assert name in text
    with pytest.raises(SystemExit):
        main(["track", "--help"])
    text = capsys.readouterr().out
    assert all(flag in text for flag in ("--provider", "--threads", "--device-id", "--backend onnx"))
