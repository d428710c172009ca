"""Faults of ``vostream run`` (a deployment file): bad keys, outputs that two runs or streams would share, a
metrics port in use, stops at any moment (issue 24, items 2, 3, 4 and 6)."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest
from fakes import harness
from fakes.media import moving_square_clip, square_box

from vostream.apps.deploy import Deployment, load_deploy
from vostream.sinks.outdir import lock_output_dir

W, H = 96, 64


def _stream(source: Path, out: Path, name: str = "s1", extra: str = "") -> str:
    x0, y0, x1, y1 = square_box(0, W, H)
    return (
        f'[[streams]]\nname = "{name}"\nsource = "{source}"\nout = "{out}"\nsave = "png,json"\n'
        f"prompts = [{{ obj = 1, box = [{x0}, {y0}, {x1}, {y1}] }}]\n{extra}"
    )


def _deploy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "deploy.toml"
    path.write_text(text)
    return path


def _one_line_error(r) -> str:  # type: ignore[no-untyped-def]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("INFO")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize(
    "head, extra, says",
    [
        ('[trackr]\nbackend = "onnx"\n', "", "['trackr']"),  # silently ran the classic tracker
        ("", 'sav = "png"\n', "['sav']"),
        ("tracker = 5\n", "", "'tracker' must be a table"),  # was: internal error: TypeError
        ("[metrics]\nprot = 9100\n", "", "['prot']"),
    ],
)
def test_unknown_or_malformed_keys_are_refused_with_their_name(tmp_path, head, extra, says):
    clip = moving_square_clip(count=8, width=W, height=H)
    config = _deploy(tmp_path, head + _stream(clip, tmp_path / "a", extra=extra))
    r = harness.run_cli(["run", "--config", config])
    assert r.returncode == 2, r.stderr
    assert says in _one_line_error(r)
    assert not (tmp_path / "a").exists()


def test_two_streams_writing_one_out_are_refused(tmp_path):
    clip = moving_square_clip(count=8, width=W, height=H)
    config = _deploy(tmp_path, _stream(clip, tmp_path / "o", "a") + _stream(clip, tmp_path / "o", "b"))
    r = harness.run_cli(["run", "--config", config])
    assert r.returncode == 2
    assert "streams 'a' and 'b' both write to" in _one_line_error(r)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_an_out_held_by_a_running_track_is_left_alone(tmp_path):
    """`vostream track` holds its --out with a lock; a deployment stream writing there fails alone (exit 4)."""
    clip = moving_square_clip(count=8, width=W, height=H)
    held = tmp_path / "held"
    held.mkdir()
    config = _deploy(tmp_path, _stream(clip, held, "a") + _stream(clip, tmp_path / "free", "b"))
    with lock_output_dir(held, "vostream track"):
        r = harness.run_cli(["run", "--config", config])
    assert r.returncode == 4, r.stderr
    assert "vostream track" in r.stderr  # the lock names who holds it
    assert sorted(p.name for p in held.iterdir()) == []  # nothing written beside the other run's files
    assert len(list((tmp_path / "free" / "masks").glob("*.png"))) == 8  # the other stream ran


@pytest.mark.slow
def test_a_reused_out_keeps_none_of_the_previous_runs_files(tmp_path):
    out = tmp_path / "o"
    long_clip, short_clip = (moving_square_clip(count=n, width=W, height=H) for n in (20, 6))
    mine = out / "notes.txt"
    for clip in (long_clip, short_clip):
        r = harness.run_cli(["run", "--config", _deploy(tmp_path, _stream(clip, out))])
        assert r.returncode == 0, r.stderr
        if not mine.exists():
            mine.write_text("the user's own file")
    assert len(list((out / "masks").glob("*.png"))) == 6  # 14 stale masks of the first run were kept
    assert json.loads((out / "summary.json").read_text())["frames"] == 6
    assert mine.read_text() == "the user's own file"


def test_a_metrics_port_in_use_starts_nothing(tmp_path):
    clip = moving_square_clip(count=8, width=W, height=H)
    config = _deploy(tmp_path, _stream(clip, tmp_path / "o"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = harness.run_cli(["run", "--config", config, "--metrics-port", port])
    assert r.returncode == 4, r.stderr  # was SIGABRT (134) after a stream had started
    assert f"--metrics-port {port}: cannot listen" in _one_line_error(r)
    assert not (tmp_path / "o" / "masks").exists()


@pytest.mark.slow
def test_a_stop_before_the_streams_start_stops_them(tmp_path):
    """A SIGTERM while the tracker loads (the first ~0.4 s) reached no stream: stop() skipped streams that had
    not started, and they then ran to their end (with a live feed, forever)."""
    clip = moving_square_clip(count=200, width=W, height=H)
    deployment = Deployment(load_deploy(_deploy(tmp_path, _stream(clip, tmp_path / "o"))))
    deployment.stop(drain=True)  # what the signal handler does
    deployment.start()
    summary = deployment.wait()
    stream = summary["streams"]["s1"]
    assert stream["reason"] == "stop" and stream["frames"] < 200, stream


@pytest.mark.slow
def test_three_quick_sigints_leave_every_output_final(tmp_path):
    """Three SIGINTs in a row (an impatient Ctrl-C) left *.tmp files and no summaries; now the second cancels,
    the third changes nothing, and every stream's outputs, its summary.json and deploy-summary.json are final."""
    clip = moving_square_clip(count=1500, width=W, height=H)
    outs = [tmp_path / "a", tmp_path / "b"]
    config = _deploy(tmp_path, _stream(clip, outs[0], "a") + _stream(clip, outs[1], "b"))
    proc = harness.start_cli(["run", "--config", config], timeout=120)
    try:
        assert harness.wait_for(lambda: all(len(list(o.glob("masks/*.png"))) > 5 for o in outs), 60)
        for _ in range(3):
            harness.signal_child(proc, signal.SIGINT)
            time.sleep(0.05)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert harness.leftovers(tmp_path) == []
    for out in outs:
        summary = json.loads((out / "summary.json").read_text())
        assert 5 < summary["frames"] < 1500
        # a cancel drops what waits in the sinks' queues: every mask written is final, none half-written
        assert 0 < len(list((out / "masks").glob("*.png"))) <= summary["frames"]
    assert json.loads((tmp_path / "deploy-summary.json").read_text())["signalled"] is True
