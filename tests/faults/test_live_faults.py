"""Faults of the live path, against real parts on loopback: GStreamer's RTSP server as the input camera
(``tests/fakes/rtsp_server.py``) and a PyAV RTSP listener as the relay that receives the annotated output."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from fakes import harness
from fakes.media import media_dir
from fakes.rtsp_server import RtspServer, server_available  # noqa: E402

needs_server = pytest.mark.skipif(server_available() is not None, reason=str(server_available()))


@functools.cache
def noise_clip(width: int = 480, height: int = 360, frames: int = 150, fps: int = 30) -> Path:
    """Random pictures: every frame of the annotated output is ~100 KB, so a relay that stops reading fills the
    loopback socket buffers within a second or two."""
    path = media_dir() / f"live_noise_{width}x{height}_{frames}.mp4"
    if path.exists():
        return path
    rng = np.random.default_rng(7)
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(tmp), "w") as out:
        stream = out.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "28", "preset": "ultrafast", "g": str(fps), "bf": "0"}
        for _ in range(frames):
            img = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode(None))
    tmp.replace(path)
    return path


#: the relay: a PyAV RTSP listener that receives the published stream (as in tests/sinks/test_rtsp_out.py)
LISTENER = (
    "import av, sys\n"
    "c = av.open(sys.argv[1], options={'rtsp_flags': 'listen', 'listen_timeout': '60'}, timeout=(65, 10))\n"
    "for f in c.decode(video=0):\n"
    "    pass\n"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener:
    def __init__(self, url: str) -> None:
        self.url = url
        self.proc = subprocess.Popen([sys.executable, "-c", LISTENER, url], stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def listening(port: int) -> bool:
    """Something listens on 127.0.0.1:``port`` (``/proc/net/tcp``, state 0A)."""
    return _tcp_state(port, "0A")


def established(port: int) -> bool:
    """A TCP connection to 127.0.0.1:``port`` is established (``/proc/net/tcp``)."""
    return _tcp_state(port, "01")


def _tcp_state(port: int, wanted: str) -> bool:
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        if local.endswith(f":{port:04X}") and state == wanted:
            return True
    return False


class Lines:
    """Collects a pipe's lines in a thread (so the child never blocks on a full pipe)."""

    def __init__(self, pipe: Any) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe: Any) -> None:
        for line in pipe:
            self.lines.append(line)

    def has(self, text: str) -> bool:
        return any(text in line for line in self.lines)


@needs_server
@pytest.mark.slow
def test_ctrl_c_with_a_relay_that_stopped_reading(tmp_path: Path) -> None:
    """The RTSP output's relay is paused (SIGSTOP) mid-stream: the blocked write is cut off after the write
    timeout and reported; Ctrl-C then stops the run within a bound, with summary.json written."""
    port = free_port()
    listener = Listener(f"rtsp://127.0.0.1:{port}/out")
    assert harness.wait_for(lambda: listening(port), 20), "the relay did not start"
    out = tmp_path / "run"
    stopped = False
    with RtspServer(noise_clip()) as server:
        server.start()
        proc = harness.start_cli(
            [
                "track",
                server.url,
                "--point",
                "240,180",
                "--rtsp-out",
                listener.url,
                "--out",
                out,
                "--save",
                "mot",
            ],
            timeout=60,
        )
        err = Lines(proc.stderr)
        try:
            assert harness.wait_for(lambda: established(port), 30), "the RTSP output never connected"
            time.sleep(1.0)  # frames flow to the relay
            os.kill(listener.proc.pid, signal.SIGSTOP)
            stopped = True
            harness.wait_for(lambda: err.has("stopped reading"), 15)
            harness.signal_child(proc, signal.SIGINT)
            t0 = time.monotonic()
            try:
                proc.wait(20)
            except Exception:
                pass
            took = time.monotonic() - t0
        finally:
            if stopped:
                os.kill(listener.proc.pid, signal.SIGCONT)
            listener.kill()
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    err.thread.join(5)
    text = "".join(err.lines)
    assert proc.returncode == 130, (proc.returncode, text[-2000:])
    assert took < 10, took
    assert "the server stopped reading" in text
    summary = json.loads((out / "summary.json").read_text())
    rtsp = {n["name"]: n for n in summary["metrics"]["nodes"]}["rtsp"]["extra"]
    assert rtsp["stalls"] >= 1 and "stopped reading" in rtsp["last_stall"]
    assert rtsp["sent"] >= 1


@pytest.mark.realtime
@needs_server
def test_ctrl_c_while_reconnecting_to_a_stopped_rtsp_relay(tmp_path: Path) -> None:
    """The fault as it was found: a real RTSP server receiving the output (GStreamer, RECORD mode) is stopped with
    SIGSTOP.  The write timeout fires and the sink reconnects -- to a server whose kernel still accepts the TCP
    connection but never answers.  FFmpeg's RTSP handshake then blocked for good holding the GIL: every thread
    froze, three SIGINTs did nothing, and the run left ``*.tmp`` files and no summary.  Ctrl-C must now finish
    within 10 s with every output final."""
    out = tmp_path / "run"
    # a live input (random pictures played in real time by another RTSP server, 30 s): the run lasts as long as
    # the feed, and its ~100 KB frames fill the stopped relay's socket buffers within a second or two
    with RtspServer(noise_clip(frames=900)) as camera, RtspServer(None, path="/out", record=True) as relay:
        camera.start()
        relay.start()
        proc = harness.start_cli(
            ["track", camera.url, "--point", "240,180", "--rtsp-out", relay.url, "--out", out]
            + ["--save", "video,json,mot"],
            timeout=120,
        )
        err = Lines(proc.stderr)
        took = None
        try:
            assert harness.wait_for(lambda: established(relay.port), 30), "the RTSP output never connected"
            time.sleep(1.0)  # frames flow to the relay
            relay.pause()
            assert harness.wait_for(lambda: err.has("reconnecting"), 20), "".join(err.lines)[-2000:]
            time.sleep(2.0)  # past the backoff (0.5 s): a reconnect attempt is under way
            assert proc.poll() is None, "".join(err.lines)[-2000:]
            harness.signal_child(proc, signal.SIGINT)
            t0 = time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)
            took = time.monotonic() - t0
        finally:
            relay.resume()
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    err.thread.join(5)
    text = "".join(err.lines)
    assert proc.returncode == 130, (proc.returncode, text[-2000:])
    assert took is not None and took < 10, took
    names = sorted(p.name for p in out.iterdir())
    assert not [n for n in names if n.endswith(".tmp")], names  # every output final
    assert {"mot.txt", "overlay.mp4", "summary.json"} <= set(names), names
    assert any(n.startswith("annotations") and n.endswith(".json") for n in names), names  # live: segments
    rtsp = {n["name"]: n for n in json.loads((out / "summary.json").read_text())["metrics"]["nodes"]}["rtsp"]
    assert rtsp["extra"]["stalls"] >= 1 and rtsp["extra"]["sent"] >= 1


@pytest.mark.realtime
@needs_server
def test_live_mp4_follows_real_time_across_an_outage(tmp_path: Path) -> None:
    """A live run with the camera away for 2 s in the middle: the MP4 is written on the capture clock, so its
    duration matches the wall time (within 10 %) and the outage is a gap in its timestamps."""
    out = tmp_path / "run"
    with RtspServer(noise_clip(160, 120, 600)) as server:
        server.start()
        proc = harness.start_cli(
            [
                "track",
                server.url,
                "--point",
                "80,60",
                "--out",
                out,
                "--save",
                "video,mot",
                "--read-timeout",
                "1",
            ],
            timeout=60,
        )
        err = Lines(proc.stderr)
        try:
            assert harness.wait_for(lambda: established(server.port), 30), "the source never connected"
            first = time.monotonic()
            time.sleep(2.0)
            server.kill()
            time.sleep(2.0)
            server.start()
            assert harness.wait_for(lambda: established(server.port), 10), "the source never reconnected"
            time.sleep(2.0)
            last = time.monotonic()
            harness.signal_child(proc, signal.SIGINT)
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
    err.thread.join(5)
    assert proc.returncode == 130, "".join(err.lines)[-2000:]
    with av.open(str(out / "overlay.mp4")) as video:
        stream = video.streams.video[0]
        times = sorted(float(p.pts * stream.time_base) for p in video.demux(stream) if p.pts is not None)
    duration = times[-1] - times[0]
    wall = last - first
    assert abs(duration - wall) <= 0.1 * wall, (duration, wall)
    gaps = np.diff(times)
    assert gaps.max() >= 1.5, gaps.max()  # the outage (2 s, less the time to notice and reconnect)


def _read_slowly(url: str, max_lag: float | None, seconds: float, per_frame: float) -> dict[str, Any]:
    """A consumer three times slower than the feed: what a decoder that cannot keep up looks like upstream."""
    from vostream.stages.sources.live import LiveSource

    src = LiveSource(url, max_lag=max_lag, read_timeout=5.0)
    ages = []
    try:
        src.open()
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            frame = src.read()
            assert frame is not None
            ages.append(time.time() - frame.capture_time)
            time.sleep(per_frame)
        stats = src.stats()
    finally:
        src.close()
    stats["age_max"] = max(ages[-10:])
    return stats


@needs_server
@pytest.mark.realtime
def test_lag_before_the_decoder_is_measured_and_caught_up(tmp_path):
    """A reader three times slower than a 30 fps feed: without catch-up it falls further and further behind the
    stream's clock, and the frames' age (now measured on the stream's clock) says so; with ``max_lag`` it skips
    undecoded packets up to an on-time keyframe and stays within about a GOP of the live edge."""
    clip = noise_clip(320, 240, 300, 30)  # 10 s, a keyframe every 30 frames
    with RtspServer(clip) as server:
        server.start()
        behind = _read_slowly(server.url, None, seconds=4.0, per_frame=0.1)
    with RtspServer(clip) as server:
        server.start()
        kept = _read_slowly(server.url, 0.5, seconds=4.0, per_frame=0.1)
    assert behind["stream_lag_s_max"] > 1.5, behind
    assert behind["age_max"] > 1.5, behind  # the frame age sees the lag (it was ~0.1 s when taken at decode)
    assert behind["skipped_catchup"] == 0
    assert kept["catchups"] >= 1 and kept["skipped_catchup"] > 0, kept
    assert kept["age_max"] < 1.6, kept  # at most max_lag plus about one GOP (1 s) behind
