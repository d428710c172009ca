"""The RTSP output sink, read back by a real client: a PyAV RTSP listener (``rtsp_flags=listen``) in another
process decodes what the sink publishes; while the input feed is down the output carries a "source lost" banner."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fakes.live_clips import FAST, deform_clip, deform_scene
from fakes.rtsp_listener import Listener, free_port
from fakes.rtsp_server import RtspServer, server_available
from fakes.waiting import wait_until

from vostream.pipeline import Pipeline
from vostream.pipeline.errors import ConfigError
from vostream.pipeline.types import Frame
from vostream.sinks.rtsp import RtspSinkSpec, draw_banner
from vostream.stages.sources.live import LiveSource

needs_server = pytest.mark.skipif(server_available() is not None, reason=str(server_available()))


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    lis = Listener(f"rtsp://127.0.0.1:{free_port()}/out", tmp_path / "received.json")
    try:
        yield lis
    finally:
        lis.kill()


def is_banner(rgb: list[float]) -> bool:
    r, g, b = rgb
    return r > 150 and g < 90 and b < 90


def test_spec_validation_and_banner() -> None:
    for bad in (
        dict(url="http://x/y"),
        dict(url="rtsp://x/y", transport="sctp"),
        dict(url="rtsp://x/y", fps=0),
        dict(url="rtsp://x/y", gop=0),
        dict(url="rtsp://x/y", bitrate=-5),
    ):
        with pytest.raises(ConfigError):
            RtspSinkSpec(**bad)  # type: ignore[arg-type]
    image = np.full((120, 160, 3), 200, np.uint8)
    stub = draw_banner(image, "SOURCE LOST")
    assert image.max() == 200 and image.min() == 200  # the input is not touched
    assert is_banner(stub[:10].reshape(-1, 3).mean(axis=0).tolist())
    assert stub[60:].max() == 100  # the stale picture is dimmed


@pytest.mark.slow
def test_published_frames_are_decoded_by_a_real_client(listener: Listener) -> None:
    """Frames written at 30 fps, then the input stops: every picture is sent once, then banner frames follow;
    the client decodes exactly what the sink says it sent."""
    sink = RtspSinkSpec(listener.url, fps=30, lost_after_s=0.5).build()
    sink.open()
    image = np.zeros((240, 320, 3), np.uint8)
    image[:] = (0, 120, 0)
    try:
        for i in range(45):
            sink.write(Frame(i, image))
            time.sleep(1 / 30)
        time.sleep(1.2)  # input down: 0.5 s of silence, then ~0.7 s of banner frames
        for i in range(45, 60):
            sink.write(Frame(i, image))
            time.sleep(1 / 30)
    finally:
        sink.close()
    stats = sink.stats()
    res = listener.result()
    assert res["error"] is None
    assert stats["sent"] + stats["dropped"] == 60 and stats["dropped"] <= 2
    assert 10 <= stats["stub_frames"] <= 30
    assert res["frames"] == stats["sent"] + stats["stub_frames"]
    banners = [is_banner(t) for t in res["top"]]
    assert sum(banners) == stats["stub_frames"]
    assert not any(banners[:40]) and not any(banners[-10:]) and any(banners[45:])
    assert stats["encode_cpu_ms"] is not None and stats["state"] == "ended"


@needs_server
@pytest.mark.realtime
def test_banner_while_the_input_feed_is_down(listener: Listener) -> None:
    """RTSP in → RTSP out: the input server is killed for 2 s; the output stays up with banner frames, then
    carries the feed again after the source reconnected."""
    before = {t.name for t in threading.enumerate() if t.name.startswith("vostream")}
    server = RtspServer(deform_clip()).start()
    try:
        source = LiveSource(server.url, read_timeout=2, reconnect=FAST)
        out = RtspSinkSpec(listener.url, fps=30, lost_after_s=0.5)
        pipe = Pipeline(source, [], [out], queue_size=1, name="relay")
        pipe.start()
        try:
            time.sleep(1.5)
            server.kill()
            time.sleep(2.0)
            server.start()
            wait_until(lambda: pipe.metrics().source.extra.get("reconnects", 0) >= 1, 8)  # asserted below
            time.sleep(1.0)
        finally:
            pipe.stop()
            report = pipe.wait(10)
    finally:
        server.close()
    stats = report.metrics["rtsp"].extra
    res = listener.result()
    assert res["error"] is None
    assert report.metrics.source.extra["reconnects"] == 1
    assert stats["stub_frames"] >= 15  # ~1.5 s of banner at 30 fps while the source was away
    assert res["frames"] == stats["sent"] + stats["stub_frames"]
    banners = [is_banner(t) for t in res["top"]]
    first, last = banners.index(True), len(banners) - 1 - banners[::-1].index(True)
    assert first > 20 and not any(banners[last + 1 :]) and len(banners) - last > 15  # feed again afterwards
    assert {t.name for t in threading.enumerate() if t.name.startswith("vostream")} <= before


@pytest.mark.slow
def test_output_reconnects_when_the_server_goes_away(tmp_path: Path) -> None:
    port = free_port()
    url = f"rtsp://127.0.0.1:{port}/out"
    first = Listener(url, tmp_path / "a.json")
    sink = RtspSinkSpec(url, fps=30, lost_after_s=5.0, reconnect=FAST).build()
    sink.open()
    image = np.zeros((120, 160, 3), np.uint8)
    second: Listener | None = None
    try:
        for i in range(30):
            sink.write(Frame(i, image))
            time.sleep(1 / 30)
        first.kill()
        for i in range(30, 45):  # writes fail: the sink notices and backs off
            sink.write(Frame(i, image))
            time.sleep(1 / 30)
        second = Listener(url, tmp_path / "b.json")
        deadline = time.monotonic() + 10
        i = 45
        while sink.stats()["reconnects"] < 1 and time.monotonic() < deadline:
            sink.write(Frame(i, image))
            i += 1
            time.sleep(1 / 30)
        for _ in range(30):
            sink.write(Frame(i, image))
            i += 1
            time.sleep(1 / 30)
    finally:
        sink.close()
        first.kill()
    assert second is not None
    res = second.result()
    stats = sink.stats()
    assert stats["reconnects"] == 1 and stats["dropped_offline"] >= 1
    assert res["error"] is None and res["frames"] >= 30


@needs_server
def test_cli_track_rtsp_in_rtsp_out(
    listener: Listener, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vostream.apps.cli import main

    x, y = deform_scene().click(1)
    with RtspServer(deform_clip()) as server:
        server.start()
        rc = main(
            [
                "track",
                server.url,
                "--point",
                f"{x:.0f},{y:.0f}",
                "--rtsp-out",
                listener.url,
                "--max-frames",
                "45",
                "--out",
                str(tmp_path / "run"),
                "--save",
                "mot",
                "-q",
            ]
        )
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    nodes = {n["name"]: n for n in summary["metrics"]["nodes"]}
    source = summary["metrics"]["nodes"][0]
    assert source["name"].startswith("source:rtsp://") and source["kind"] == "source"
    assert source["extra"]["frames"] == 45 and source["extra"]["reconnects"] == 0
    assert nodes["track"]["queue_capacity"] == 1 and nodes["track"]["policy"] == "latest"
    out = nodes["rtsp"]["extra"]
    res = listener.result()
    assert res["error"] is None and res["frames"] == out["sent"] + out["stub_frames"] and out["sent"] >= 1
    rc = main(["track", "rtsp://127.0.0.1:1/x", "--point", "1,1", "--rtsp-out", "rtsp://127.0.0.1:2/y"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 3 and err[-1].startswith("vostream: error: cannot connect to rtsp://127.0.0.1:1/x")
