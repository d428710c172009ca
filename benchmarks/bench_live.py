"""Live-feed figures against a real RTSP server on loopback (GStreamer, ``tests/fakes/rtsp_server.py``).

* frame age p50/p95 at the tracker's output on a 30 fps 320x240 feed, with the real classic tracker (preprocess +
  track + postprocess) and with a tracker slowed to ``--slow-ms`` per frame (live queues of 1: latest wins);
* reconnect time: the server is killed, restarted after ``--away`` s; time from its return to the source running;
* RTSP output: CPU time per encoded frame of the publisher thread (libx264 ultrafast/zerolatency), 320x240 and
  854x480, pictures published to a PyAV listener.

``python benchmarks/bench_live.py [--json PATH]``.  Needs /usr/bin/python3 with python3-gi and gst-rtsp-server.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakes.live_clips import FPS  # noqa: E402
from fakes.live_clips import deform_clip as scene_clip  # noqa: E402
from fakes.live_clips import deform_scene as scene  # noqa: E402
from fakes.rtsp_listener import Listener, free_port  # noqa: E402
from fakes.rtsp_server import RtspServer, server_available  # noqa: E402

from vostream.pipeline import Pipeline  # noqa: E402
from vostream.pipeline.reconnect import ReconnectPolicy  # noqa: E402
from vostream.pipeline.testing import ListSinkSpec, SlowStage  # noqa: E402
from vostream.pipeline.types import Frame, Prompt  # noqa: E402
from vostream.sinks.rtsp import RtspSinkSpec  # noqa: E402
from vostream.stages.sources.live import LiveSource  # noqa: E402

logger = logging.getLogger("bench_live")


def frame_age(url: str, slow_ms: float, seconds: float) -> dict[str, Any]:
    import cv2

    from vostream.stages.postprocess import PostprocessStage
    from vostream.stages.preprocess import PreprocessStage
    from vostream.stages.track import TrackStage
    from vostream.stages.trackers import load_tracker

    cv2.setNumThreads(1)
    sc = scene()
    tracker = load_tracker("classic")
    x, y = sc.click(1)
    stages: list[Any] = [
        PreprocessStage(tracker.input_spec, ring=6),
        TrackStage(tracker, [Prompt(1, 0, [[x, y]], [1])]),
    ]
    if slow_ms:
        stages.append(SlowStage(slow_ms / 1000, name="slowdown"))
    stages.append(PostprocessStage())
    pipe = Pipeline(LiveSource(url), stages, [ListSinkSpec(queue_size=1)], queue_size=1, name="age")
    pipe.start()
    time.sleep(seconds)
    pipe.stop()
    m = pipe.wait(10).metrics
    last = m["postprocess"]
    track_ms = m["track"].latency_ms_p50 + (m["slowdown"].latency_ms_p50 if slow_ms else 0.0)
    return {
        "tracker_ms_p50": round(track_ms, 1),
        "age_ms_p50": round(last.age_ms_p50, 1),
        "age_ms_p95": round(last.age_ms_p95, 1),
        "bound_ms": round(track_ms + 2000 / FPS, 1),
        "decoded": m.source.frames_out,
        "tracked": m["slowdown" if slow_ms else "track"].frames_out,
        "dropped_before_tracker": sum(
            m[n].drops for n in ("preprocess", "track", "slowdown") if n in m.names()
        ),
    }


def reconnect_time(server: RtspServer, away: float) -> dict[str, Any]:
    source = LiveSource(server.url, read_timeout=2, reconnect=ReconnectPolicy(initial_s=0.2, max_s=1.0))
    pipe = Pipeline(source, [], [ListSinkSpec(queue_size=1)], queue_size=1, name="reconnect")
    pipe.start()
    time.sleep(1.0)
    server.kill()
    time.sleep(away)
    server.start()
    back = time.time()
    deadline = time.monotonic() + 15
    while source.stats()["reconnects"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    running = [e.time for e in source.supervisor.events if e.state == "running"]
    pipe.stop()
    pipe.wait(10)
    return {
        "away_s": away,
        "server_back_to_running_s": round(running[-1] - back, 3) if len(running) > 1 else None,
        "loss_to_running_s": source.stats()["last_reconnect_s"],
    }


def rtsp_out_cost(width: int, height: int, frames: int, tmp: Path) -> dict[str, Any]:
    lis = Listener(f"rtsp://127.0.0.1:{free_port()}/out", tmp / f"out{width}.json")
    sink = RtspSinkSpec(lis.url, fps=30, lost_after_s=5).build()
    sink.open()
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    try:
        for i in range(frames):
            sink.write(Frame(i, np.roll(base, i * 4, axis=1)))
            time.sleep(1 / 30)
    finally:
        sink.close()
        res = lis.result()
        lis.kill()
    s = sink.stats()
    return {
        "size": f"{width}x{height}",
        "encode_cpu_ms_per_frame": s["encode_cpu_ms"],
        "sent": s["sent"],
        "decoded_by_client": res["frames"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="per frame-age run (default 6)")
    parser.add_argument("--slow-ms", type=float, default=100.0, help="added tracker time for the slow run")
    parser.add_argument("--away", type=float, default=2.0, help="seconds the server is down")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    missing = server_available()
    if missing:
        print(f"skipped: {missing}", file=sys.stderr)
        return 1
    import tempfile

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, RtspServer(scene_clip()) as server:
        server.start()
        results["age_fast"] = frame_age(server.url, 0.0, args.seconds)
        server.start()  # a fresh session from the start of the clip
        results["age_slow"] = frame_age(server.url, args.slow_ms, args.seconds)
        server.start()
        results["reconnect"] = reconnect_time(server, args.away)
        results["rtsp_out"] = [
            rtsp_out_cost(320, 240, 150, Path(tmp)),
            rtsp_out_cost(854, 480, 150, Path(tmp)),
        ]
    for key in ("age_fast", "age_slow"):
        r = results[key]
        print(
            f"{key:9s} tracker {r['tracker_ms_p50']:6.1f} ms  age p50 {r['age_ms_p50']:6.1f} ms  "
            f"p95 {r['age_ms_p95']:6.1f} ms (bound {r['bound_ms']:.1f})  decoded {r['decoded']}  "
            f"tracked {r['tracked']}  dropped before tracker {r['dropped_before_tracker']}"
        )
    r = results["reconnect"]
    print(
        f"reconnect: server away {r['away_s']} s; back -> running {r['server_back_to_running_s']} s; "
        f"loss -> running {r['loss_to_running_s']} s"
    )
    for r in results["rtsp_out"]:
        print(
            f"rtsp out {r['size']}: {r['encode_cpu_ms_per_frame']} ms CPU/frame, sent {r['sent']}, "
            f"client decoded {r['decoded_by_client']}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
