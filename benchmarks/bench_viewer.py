"""Glass-to-glass latency of the viewer (decode → drawn in a real Chromium) and server CPU per frame for the
WebSocket path (JPEG + RLE + msgpack in the viewer sink), at 854x480, 30 fps, classic tracker, one object.

    python benchmarks/bench_viewer.py [--frames 150] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger("bench_viewer")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--screenshot", metavar="PNG", help="save a page screenshot here")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from playwright.sync_api import sync_playwright

    from vostream.pipeline.apps.serve.server import ServerConfig, ServerThread
    from vostream.samples.scenes import render_scene, write_scene

    root = Path(tempfile.mkdtemp(prefix="vostream-bench-viewer-"))
    scene = render_scene("translate", width=854, height=480, frames=args.frames)
    write_scene(scene, root / "scene.mp4")
    cpu0 = time.process_time()
    with (
        ServerThread(ServerConfig(port=0, media_root=str(root), default_source="scene.mp4")) as server,
        sync_playwright() as p,
    ):
        profile = tempfile.mkdtemp()
        ctx = p.chromium.launch_persistent_context(
            profile,
            executable_path="/usr/bin/chromium",
            headless=True,
            bypass_csp=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
            viewport={"width": 1100, "height": 560},
        )
        page = ctx.new_page()
        page.goto(server.url)
        page.wait_for_function("window.__vostream && window.__vostream.frames >= 1", timeout=30000)
        box = page.locator("#view").bounding_box()
        x, y = scene.click(1)
        page.mouse.click(box["x"] + x * box["width"] / 854, box["y"] + y * box["height"] / 480)
        page.wait_for_function("window.__vostream.masksDrawn >= 1", timeout=30000)
        page.evaluate("window.__vostream.lat.length = 0")
        t0 = time.monotonic()
        cpu0 = time.process_time()
        page.keyboard.press("Space")
        page.wait_for_function(f"window.__vostream.lastIndex >= {args.frames - 1}", timeout=120000)
        wall = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        st = page.evaluate("window.__vostream")
        if args.screenshot:
            page.screenshot(path=args.screenshot)
        session = server.call(lambda: next(iter(server.server.sessions.values())))
        viewer = session.pipeline.metrics()["viewer"]
        ctx.close()
        shutil.rmtree(profile, ignore_errors=True)
    lat = np.asarray(st["lat"])
    out = {
        "frames": args.frames,
        "size": "854x480",
        "fps_source": 30,
        "drawn": st["frames"],
        "client_drops": st["clientDrops"],
        "server_drops": st["serverDrops"],
        "glass_to_glass_ms_p50": float(np.percentile(lat, 50)),
        "glass_to_glass_ms_p95": float(np.percentile(lat, 95)),
        "viewer_sink_ms_p50": viewer.latency_ms_p50,
        "viewer_sink_ms_p95": viewer.latency_ms_p95,
        "server_process_cpu_ms_per_frame": 1000 * cpu / args.frames,
        "wall_s": wall,
    }
    for k, v in out.items():
        logger.info("%-34s %s", k, f"{v:.2f}" if isinstance(v, float) else v)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
