"""``vostream annotate`` end to end on real encoded synthetic scenes with ground truth: correctness, resume after
SIGKILL and Ctrl-C, failures, workers and Ray giving identical files, prompts-file errors."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fakes.media import make_video, square_frames, square_mask
from fakes.waiting import wait_until
from PIL import Image
from pycocotools import mask as mask_utils

from vostream.samples.scenes import render_scene, score_sequence, write_scene

CLI = [sys.executable, "-m", "vostream.apps.cli"]
ALL = "json,png,mot,video"
#: (scene, width, height, frames, key): sizes where the classic tracker keeps IoU >= 0.85 on that scene
SCENES = [
    ("crossing", 256, 144, 48, "crossing.mp4"),
    ("illumination", 256, 144, 48, "illumination.mp4"),
    ("translate", 160, 96, 40, "translate.mp4"),
    ("camera_pan", 256, 144, 48, "sub/camera_pan.mp4"),
    ("distractor", 320, 192, 30, "sub/distractor.mp4"),
]
IGNORED = {"summary.json", "manifest.json", ".annotate.lock"}  # hold run times / lock state, not annotations


def run_cli(*args, timeout=240):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def scene_of(name, w, h, t):
    return render_scene(name, w, h, frames=t)


def tree(root: Path) -> dict[str, str]:
    """relative path → sha256 of every annotation file under ``root``.  An MP4 is summarised by what it holds
    (frame count, size, timestamps) instead: libx264 does not always give the same bytes for the same frames
    (docs/annotate.md, "Determinism")."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name not in IGNORED:
            key = p.relative_to(root).as_posix()
            out[key] = _video_summary(p) if p.suffix == ".mp4" else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _video_summary(path: Path) -> str:
    import av

    with av.open(str(path)) as c:
        frames = [(f.pts, f.width, f.height) for f in c.decode(video=0)]
    return f"{len(frames)} frames {frames[0][1]}x{frames[0][2]} pts {[f[0] for f in frames]}"


@functools.cache
def _batch_dir() -> Path:
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="vostream-annotate-"))
    vids = root / "vids"
    rows, videos = ["video,frame,obj_id,x,y,label"], []
    for name, w, h, t, key in SCENES:
        scene = scene_of(name, w, h, t)
        (vids / key).parent.mkdir(parents=True, exist_ok=True)
        write_scene(scene, vids / key)
        entries = []
        for k, oid in enumerate(scene.obj_ids):
            x, y = (int(round(float(v))) for v in scene.clicks[k])
            rows.append(f"{key},0,{oid},{x},{y},1")
            entries.append({"obj": int(oid), "frame": 0, "points": [[x, y]], "labels": [1]})
        videos.append({"video": key, "prompts": entries})
    (root / "prompts.csv").write_text("\n".join(rows) + "\n")
    (root / "prompts.json").write_text(json.dumps({"videos": videos}))
    return root


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    root = _batch_dir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(batch):
    """A clean, uninterrupted ``--workers 1`` run: the outputs every other run must reproduce byte for byte."""
    out = batch / "ref"
    r = run_cli(
        "annotate",
        batch / "vids",
        "--prompts",
        batch / "prompts.csv",
        "--out",
        out,
        "--formats",
        ALL,
        "--workers",
        "1",
    )
    assert r.returncode == 0, r.stderr
    return out, r


@pytest.mark.slow
def test_batch_outputs_complete_correct_and_summarised(reference):
    out, r = reference
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["done"] == 5 and summary["totals"]["failed"] == 0 and not summary["interrupted"]
    rows = {v["video"]: v for v in summary["videos"]}
    dataset = json.loads((out / "dataset.json").read_text())
    assert [v["video"] for v in dataset["videos"]] == sorted(rows, key=lambda k: rows[k]["folder"])
    for name, w, h, t, key in SCENES:
        row = rows[key]
        folder = out / row["folder"]
        assert row["folder"] == Path(key).stem
        assert (
            row["status"] == "done" and row["frames"] == t and row["attempts"] == 1 and row["error"] is None
        )
        scene = scene_of(name, w, h, t)
        assert row["objects"] == len(scene.obj_ids)
        pngs = sorted((folder / "masks").glob("*.png"))
        assert [p.name for p in pngs] == [f"{i:05d}.png" for i in range(t)]
        score = score_sequence((np.asarray(Image.open(p)) for p in pngs), scene)
        assert score.mean >= 0.85, (key, score.per_object)
        manifest = json.loads((folder / "manifest.json").read_text())
        assert set(manifest["files"]) == {"overlay.mp4", "annotations.json", "mot.txt"} | {
            f"masks/{p.name}" for p in pngs
        }
        for rel, digest in manifest["files"].items():
            assert hashlib.sha256((folder / rel).read_bytes()).hexdigest() == digest
        # the merged dataset carries the same masks as the per-video files
        vid = next(v["id"] for v in dataset["videos"] if v["video"] == key)
        anns = [a for a in dataset["annotations"] if a["video_id"] == vid]
        assert sorted(a["obj_id"] for a in anns) == list(scene.obj_ids)
        last = np.asarray(Image.open(pngs[-1]))
        for a in anns:
            seg = a["segmentations"][t - 1]
            dec = mask_utils.decode(seg).astype(bool) if seg else np.zeros_like(last, bool)
            assert np.array_equal(dec, last == a["obj_id"])
    assert [a["id"] for a in dataset["annotations"]] == list(range(1, 7))
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_workers_2_give_the_same_files(batch, reference):
    out = batch / "w2"
    r = run_cli(
        "annotate",
        batch / "vids",
        "--prompts",
        batch / "prompts.csv",
        "--out",
        out,
        "--formats",
        ALL,
        "--workers",
        "2",
        "-q",
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # --quiet
    assert tree(out) == tree(reference[0])
    workers = {v["video"]: v for v in json.loads((out / "summary.json").read_text())["videos"]}
    assert len(workers) == 5


@pytest.mark.slow
def test_rerun_skips_done_redoes_partial_and_force_redoes_all(batch, reference):
    from vostream.apps.annotate.batch import AnnotateOptions, run_annotate

    out = batch / "resume"
    shutil.copytree(reference[0], out)
    ref_tree = tree(reference[0])
    opts = dict(
        inputs=[str(batch / "vids")],
        prompts=str(batch / "prompts.csv"),
        out=str(out),
        formats=tuple(ALL.split(",")),
        workers=0,
        quiet=True,
    )
    stamp = {p: p.stat().st_mtime_ns for p in out.glob("*/**/*") if p.is_file()}  # per-video files
    report = run_annotate(AnnotateOptions(**opts))
    assert report.exit_code == 0 and all(r.reused for r in report.results.values())
    assert len(stamp) > 200 and {p: p.stat().st_mtime_ns for p in stamp} == stamp  # nothing rewritten

    (out / "translate" / "mot.txt").write_text("1,1,0,0,1,1,1.0,-1,-1,-1\n")  # a damaged output
    (out / "camera_pan" / "manifest.json").unlink()  # killed before its manifest
    (out / "crossing" / "annotations.json.abcd1234.tmp").write_text("{")  # a SIGKILLed writer's leftover
    (out / "crossing" / "manifest.json").unlink()
    report = run_annotate(AnnotateOptions(**opts))
    redone = sorted(k for k, r in report.results.items() if not r.reused)
    assert redone == ["crossing.mp4", "sub/camera_pan.mp4", "translate.mp4"]
    assert tree(out) == ref_tree

    report = run_annotate(AnnotateOptions(**opts, force=True))
    assert report.exit_code == 0 and not any(r.reused for r in report.results.values())
    assert tree(out) == ref_tree


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_mid_batch(p: subprocess.Popen, out: Path, timeout: float = 120) -> int:
    """Wait until at least one video is done and the next one has started writing; return the done count."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.poll() is not None:
            pytest.fail(
                f"the batch ended (rc {p.returncode}) before it could be interrupted: {p.stderr.read()}"
            )
        done = [d for d in out.glob("*/") if (d / "manifest.json").exists()]
        started = [d for d in out.glob("*/") if not (d / "manifest.json").exists() and any(d.iterdir())]
        if done and started:
            return len(done)
        time.sleep(0.01)
    pytest.fail("the batch did not progress")


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="needs Linux /proc to find the worker processes"
)
def test_sigkill_mid_batch_then_rerun_gives_identical_files(batch, reference):
    out = batch / "killed"
    p = subprocess.Popen(
        [
            *CLI,
            "annotate",
            str(batch / "vids"),
            "--prompts",
            str(batch / "prompts.csv"),
            "--out",
            str(out),
            "--formats",
            ALL,
            "--workers",
            "1",
            "-q",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_mid_batch(p, out)
        workers = _children(p.pid)
        assert workers, "no worker process found"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_until(lambda: not any(_alive(w) for w in workers), 10), (
            "a worker outlived the killed parent"
        )
    finally:
        if p.poll() is None:
            p.kill()
    done_before = len(list(out.glob("*/manifest.json")))
    assert 1 <= done_before < 5
    assert not (out / "summary.json").exists()

    r = run_cli(
        "annotate",
        batch / "vids",
        "--prompts",
        batch / "prompts.csv",
        "--out",
        out,
        "--formats",
        ALL,
        "--workers",
        "1",
        "-q",
    )
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(reference[0])  # nothing lost, no duplicates, byte-identical
    assert not list(out.rglob("*.tmp"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["totals"]["reused"] == done_before and summary["totals"]["done"] == 5


@pytest.mark.slow
def test_ctrl_c_finishes_the_running_video_and_keeps_manifests_honest(batch, reference):
    out = batch / "sigint"
    p = subprocess.Popen(
        [
            *CLI,
            "annotate",
            str(batch / "vids"),
            "--prompts",
            str(batch / "prompts.csv"),
            "--out",
            str(out),
            "--formats",
            ALL,
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_mid_batch(p, out)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "finishing the videos in progress" in err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True
    statuses = [v["status"] for v in summary["videos"]]
    assert statuses.count("done") >= 2 and statuses.count("pending") >= 1  # the running one finished
    ref = tree(reference[0])
    for folder in out.glob("*/"):
        files = {k: v for k, v in tree(out).items() if k.startswith(folder.name + "/")}
        if (folder / "manifest.json").exists():
            assert files == {k: v for k, v in ref.items() if k.startswith(folder.name + "/")}
        else:
            assert files == {}


@pytest.mark.slow
def test_corrupt_video_and_unprompted_video_are_reported_others_finish(tmp_path):
    vids = tmp_path / "vids"
    vids.mkdir()
    w, h, n = 160, 96, 20
    make_video(vids / "good1.mp4", square_frames(n, w, h))
    make_video(vids / "good2.mkv", square_frames(n, w, h, step=2))
    make_video(vids / "unprompted.mp4", square_frames(n, w, h))
    (vids / "corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(4000))
    ys, xs = np.nonzero(square_mask(0, w, h))
    x, y = int(xs.mean()), int(ys.mean())
    (tmp_path / "p.csv").write_text(
        "video,frame,obj_id,x,y,label,note\n"
        f"good1.mp4,0,1,{x},{y},1,first\ngood2.mkv,0,1,{x},{y},,\n"
        f"corrupt.mp4,0,1,{x},{y},1,\n"
    )
    out = tmp_path / "out"
    r = run_cli(
        "annotate",
        vids,
        "--prompts",
        tmp_path / "p.csv",
        "--out",
        out,
        "--formats",
        "json,png,mot",
        "--retries",
        "1",
    )
    assert r.returncode == 1, r.stderr
    assert "FAILED corrupt.mp4" in r.stderr and "unprompted.mp4: no prompts" in r.stderr
    rows = {v["video"]: v for v in json.loads((out / "summary.json").read_text())["videos"]}
    assert rows["good1.mp4"]["status"] == rows["good2.mkv"]["status"] == "done"
    assert rows["good1.mp4"]["frames"] == n
    assert rows["corrupt.mp4"]["status"] == "failed" and rows["corrupt.mp4"]["attempts"] == 2
    assert "corrupt.mp4" in rows["corrupt.mp4"]["error"]
    assert rows["unprompted.mp4"]["status"] == "no_prompts"
    assert (
        not (out / "corrupt" / "manifest.json").exists() and not list((out / "corrupt").glob("*"))
        if (out / "corrupt").exists()
        else True
    )
    assert not (out / "unprompted").exists()
    dataset = json.loads((out / "dataset.json").read_text())
    assert [v["video"] for v in dataset["videos"]] == ["good1.mp4", "good2.mkv"]
    ious = []
    for i in range(1, n):
        pred = np.asarray(Image.open(out / "good1" / "masks" / f"{i:05d}.png")) == 1
        gt = square_mask(i, w, h)
        ious.append((pred & gt).sum() / (pred | gt).sum())
    assert np.mean(ious) >= 0.8


# -- prompts-file errors: in-process CLI, before any work -----------------------------------------------------------


def _cli_error(capsys, tmp_path, vids, prompts_name, text, *extra):
    from vostream.apps.cli import main

    pf = tmp_path / prompts_name
    pf.write_text(text)
    out = tmp_path / "out"
    code = main(["annotate", str(vids), "--prompts", str(pf), "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert not out.exists()  # nothing was started
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("vostream: error: ")
    return lines[0]


@pytest.fixture(scope="module")
def small_vids(tmp_path_factory):
    vids = tmp_path_factory.mktemp("small") / "vids"
    (vids / "a").mkdir(parents=True)
    (vids / "b").mkdir()
    make_video(vids / "a" / "clip.mp4", square_frames(4, 96, 64))
    make_video(vids / "b" / "clip.mp4", square_frames(4, 96, 64))
    make_video(vids / "solo.mp4", square_frames(4, 64, 48))
    return vids


@pytest.mark.parametrize(
    "name,text,expect",
    [
        (
            "p.csv",
            "video,frame,obj_id,x,y,label\nsolo.mp4,0,1,10,10,1\nmissing.mp4,0,1,5,5,1\n",
            ["line 3", "'missing.mp4' is not among the 3 input video(s)"],
        ),
        (
            "p.csv",
            "video,frame,obj_id,x,y,label\nsolo.mp4,0,1,10,10,1\nsolo.mp4,0,2,64,10,1\n",
            ["line 3", "point (64, 10) is outside video 'solo.mp4' (64x48"],
        ),
        (
            "p.csv",
            "video,frame,obj_id,x,y,label\nsolo.mp4,0,1,ten,10,1\n",
            ["line 2", "x 'ten' is not a number"],
        ),
        (
            "p.csv",
            "video,frame,obj,x,y,label\nsolo.mp4,0,1,1,1,1\n",
            ["line 1", "lacks column(s) ['obj_id']"],
        ),
        ("p.csv", "video,frame,obj_id,x,y,label\nsolo.mp4,-1,1,1,1,1\n", ["line 2", "frame '-1'"]),
        ("p.csv", "video,frame,obj_id,x,y,label\nsolo.mp4,0,1,1,1,2\n", ["line 2", "label '2'"]),
        (
            "p.csv",
            "video,frame,obj_id,x,y,label\nclip.mp4,0,1,1,1,1\n",
            ["line 2", "matches several inputs", "a/clip.mp4"],
        ),
        (
            "p.csv",
            "video,frame,obj_id,x,y,label\nsolo.mp4,0,1,1,1,0\n",
            ["video 'solo.mp4'", "only negative points"],
        ),
        (
            "p.json",
            '{"videos": [{"video": "solo.mp4", "prompts": [{"obj": 1, "points": [[1, 1]]}]},\n'
            ' {"video": "a/clip.mp4" "prompts": []}]}',
            ["invalid JSON at line 2 column"],
        ),
        (
            "p.json",
            json.dumps(
                {
                    "videos": [
                        {"video": "solo.mp4", "prompts": [{"obj": 1, "points": [[1, 1]]}]},
                        {"video": "b/clip.mp4", "prompts": [{"obj": 1, "box": [0, 0, 97, 20]}]},
                    ]
                }
            ),
            ["videos[1] ('b/clip.mp4'), prompt 0", "box (0, 0, 97, 20) is outside"],
        ),
        (
            "p.json",
            json.dumps({"videos": [{"video": "nope.mp4", "prompts": [{"obj": 1, "points": [[1, 1]]}]}]}),
            ["videos[0]", "'nope.mp4' is not among"],
        ),
        (
            "p.json",
            json.dumps({"videos": [{"video": "solo.mp4", "prompts": [{"obj": 1, "pts": [[1, 1]]}]}]}),
            ["videos[0] ('solo.mp4'), prompt 0", "unknown key(s) ['pts']"],
        ),
        ("p.json", json.dumps({"prompts": []}), ['expected {"videos"']),
    ],
)
def test_prompts_file_errors_name_the_entry(capsys, tmp_path, small_vids, name, text, expect):
    line = _cli_error(capsys, tmp_path, small_vids, name, text)
    for piece in expect:
        assert piece in line, line


# -- units: inputs, names, manifests ------------------------------------------------------------------------------


def test_inputs_dirs_lists_dedupe_and_deterministic_names(tmp_path, small_vids):
    from vostream.apps.annotate.inputs import discover_videos

    lst = tmp_path / "videos.txt"
    lst.write_text(f"# a comment\n\n{small_vids / 'solo.mp4'}\n")
    entries = discover_videos([str(small_vids), str(lst)])
    assert [e.key for e in entries] == [
        "solo.mp4",
        "a/clip.mp4",
        "b/clip.mp4",
    ]  # solo.mp4 found twice, kept once
    names = {e.key: e.name for e in entries}
    assert names["solo.mp4"] == "solo"
    assert names["a/clip.mp4"] != names["b/clip.mp4"] and names["a/clip.mp4"].startswith("clip-")
    again = discover_videos([f"@{lst}", str(small_vids)])
    assert {e.key: e.name for e in again if e.key != str(small_vids / "solo.mp4")} == {
        k: v for k, v in names.items() if k != "solo.mp4"
    }
    from vostream.pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="no such file or directory"):
        discover_videos([str(tmp_path / "nothing")])
    (tmp_path / "bad.txt").write_text("missing.mp4\n")
    with pytest.raises(ConfigError, match="line 1: no such video file"):
        discover_videos([str(tmp_path / "bad.txt")])


def test_manifest_detects_tampering_and_clean_removes_only_outputs(tmp_path):
    from vostream.apps.annotate.manifest import clean_outputs, verify_manifest, write_manifest

    d = tmp_path / "v"
    (d / "masks").mkdir(parents=True)
    (d / "mot.txt").write_text("1,1,0,0,1,1,1,-1,-1,-1\n")
    (d / "masks" / "00000.png").write_bytes(b"png")
    (d / "notes.txt").write_text("mine")
    write_manifest(d, "v.mp4", "fp1", {"frames": 1})
    assert verify_manifest(d, "fp1") is not None
    assert verify_manifest(d, "fp2") is None  # prompts/options changed
    (d / "masks" / "00001.png").write_bytes(b"extra")
    assert verify_manifest(d, "fp1") is None
    (d / "masks" / "00001.png").unlink()
    (d / "mot.txt").write_text("changed\n")
    assert verify_manifest(d, "fp1") is None
    (d / "x.tmp").write_text("")
    clean_outputs(d)
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]


@pytest.mark.parametrize(
    "cores, workers, opencv, codec",
    [(2, 1, 1, None), (2, 2, 1, 1), (8, 1, 4, None), (8, 2, 2, 4), (8, 3, 1, 2), (8, 16, 1, 1)],
)
def test_each_worker_gets_its_share_of_the_cores(monkeypatch, cores, workers, opencv, codec):
    """Workers, not one video's threads, fill the cores: OpenCV threads per stage and FFmpeg threads per decoder
    and encoder are divided by the number of workers (one worker: FFmpeg picks); flags win."""
    from vostream.apps.annotate.batch import AnnotateOptions

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    track = AnnotateOptions(inputs=["x"], prompts="p.csv", out="o", workers=workers).track_options()
    assert (track.opencv_threads, track.codec_threads) == (opencv, codec)
    given = AnnotateOptions(
        inputs=["x"], prompts="p.csv", out="o", workers=workers, opencv_threads=3, codec_threads=5
    ).track_options()
    assert (given.opencv_threads, given.codec_threads) == (3, 5)


def test_worker_processes_start_with_numpy_thread_limits(monkeypatch):
    """NumPy reads its BLAS/OpenMP pool sizes at import, so a worker gets them in its environment at spawn: sized
    like its OpenCV threads, except variables the user set, which it inherits unchanged."""
    import psutil

    from vostream.apps.annotate.job import TrackOptions
    from vostream.apps.annotate.local_executor import LocalExecutor

    for name in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    executor = LocalExecutor(TrackOptions(opencv_threads=2), 1)
    executor.start()
    try:
        (worker,) = [p for p in psutil.Process().children() if "spawn_main" in " ".join(p.cmdline())]
        env = worker.environ()
    finally:
        executor.close()
    assert (env["OPENBLAS_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OMP_NUM_THREADS"]) == ("2", "2", "3")
    assert "OPENBLAS_NUM_THREADS" not in os.environ  # the parent's own environment is left as it was


@pytest.mark.slow
def test_codec_threads_below_one_is_a_config_error(tmp_path, small_vids):
    prompts = tmp_path / "p.csv"
    prompts.write_text("video,frame,obj_id,x,y,label\nsolo.mp4,0,1,10,10,1\n")
    r = run_cli("annotate", small_vids, "-p", prompts, "--out", tmp_path / "o", "--codec-threads", "0")
    assert r.returncode == 2 and "--codec-threads must be >= 1" in r.stderr, r.stderr


def test_ray_missing_or_bad_options_are_config_errors(tmp_path, small_vids, capsys):
    from vostream.apps.cli import main

    pf = tmp_path / "p.csv"
    pf.write_text("video,frame,obj_id,x,y,label\nsolo.mp4,0,1,10,10,1\n")
    code = main(
        ["annotate", str(small_vids), "--prompts", str(pf), "--out", str(tmp_path / "o"), "--workers", "-1"]
    )
    assert code == 2 and "--workers must be >= 1" in capsys.readouterr().err
    code = main(
        ["annotate", str(small_vids), "--prompts", str(pf), "--out", str(tmp_path / "o"), "--formats", "gif"]
    )
    assert code == 2 and "unknown format" in capsys.readouterr().err


# -- Ray: one local cluster for the module ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_address():
    pytest.importorskip("ray", reason="Ray is the [ray] extra: pip install -e '.[ray]'")
    from vostream.apps.annotate.ray_executor import start_local_ray

    ray = start_local_ray(2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_ray_gives_the_same_files_as_local_workers(batch, reference, ray_address):
    out = batch / "ray"
    # JSON prompts here (CSV for the reference): the two schemas must mean the same thing
    r = run_cli(
        "annotate",
        batch / "vids",
        "--prompts",
        batch / "prompts.json",
        "--out",
        out,
        "--formats",
        ALL,
        "--workers",
        "2",
        "--ray",
        ray_address,
        "-q",
    )
    assert r.returncode == 0, r.stderr
    assert tree(out) == tree(reference[0])
    rows = json.loads((out / "summary.json").read_text())["videos"]
    assert all(v["status"] == "done" for v in rows)
    assert json.loads((out / "summary.json").read_text())["options"]["ray"] is True
