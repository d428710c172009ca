"""The browser viewer at 480p and 720p: drawn fps, glass-to-glass latency (decode → drawn in a real headless
Chromium) and where the CPU goes (per server thread, and the browser's processes), classic tracker, one object,
a 30 fps clip played from its first frame to its last.

    python benchmarks/bench_viewer.py [--sizes 854x480,1280x720] [--frames 150] [--rounds 1]
                                      [--baseline REV] [--json PATH] [--screenshot PNG]
    python benchmarks/bench_viewer.py --components [--sizes ...]

``--components``: no browser; the CPU time (this thread, ms per frame) of each step of the media path on the
scene's frames: JPEG encoders (OpenCV, and simplejpeg / Pillow when installed), scaling to a display size, COCO
RLE (pycocotools' encode vs ``rle_counts``), packing the frame message.

``--baseline REV`` also runs the server *and the page* of git revision REV (extracted with ``git archive`` into a
temporary folder) on the same clips, interleaved with this tree's (the order alternates per round), so the two are
compared side by side under the same load; the table ends with the ratios.  Each server runs in its own process
(this script, ``--child``), so per-thread CPU figures are that server's alone.

Figures per run: ``drawn_fps`` (first-time draws per second of playing), ``played_fps`` (source frames per
second: below the clip's 30 fps the viewer plays slower than real time), ``g2g_p50/p95`` (ms, draw time minus
capture time on the server's clock), ``drops`` (frames not drawn: server slot + client), server CPU ms per played
frame (whole process, and per thread: source/decoder, preprocess, track, postprocess, viewer sink, the event
loop that sends), browser CPU ms per drawn frame (renderer, GPU process, browser process), and ``sink_ms_p50``
(the viewer sink's own per-frame time).  Two cores are shared by the server and the browser, so every figure is
for that whole machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench_viewer")
ROOT = Path(__file__).resolve().parents[1]

# revisions before the vostream/ folder mapped pipeline/api to `vostream` (package-dir); a namespace folder of links
# makes such an unpacked tree importable
_OLD_LAYOUT = ("pipeline", "stages", "sinks", "web", "samples")


# -- the server child ---------------------------------------------------------------------------------------------
def _thread_cpu_s() -> dict[str, float]:
    """CPU seconds per thread of this process, keyed by the Python thread name (native threads: their comm,
    e.g. libav's decoder threads), summed over threads of the same name; ``NAME (runq)``: seconds the thread
    was runnable but waiting for a core (``/proc/.../schedstat``)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                ns, rq = (int(v) for v in f.read().split()[:2])
            name = names.get(int(task))
            if name is None:
                with open(f"/proc/self/task/{task}/comm") as f:
                    name = "native:" + f.read().strip()
        except (OSError, ValueError):
            continue
        name = re.sub(r"session-[A-Za-z0-9_-]{8}", "session", name)
        out[name] = out.get(name, 0.0) + ns / 1e9
        out[name + " (runq)"] = out.get(name + " (runq)", 0.0) + rq / 1e9
    return out


def child_main(media_root: str, source: str) -> int:
    """Serve ``media_root`` and answer ``mark`` / ``report`` / ``quit`` lines on stdin with JSON on stdout.
    ``VOSTREAM_BENCH_CV_THREADS``: OpenCV's thread count in this process (an experiment knob)."""
    if os.environ.get("VOSTREAM_BENCH_CV_THREADS"):
        import cv2

        cv2.setNumThreads(int(os.environ["VOSTREAM_BENCH_CV_THREADS"]))
    from vostream.apps.serve.server import ServerConfig, ServerThread

    with ServerThread(ServerConfig(port=0, media_root=media_root, default_source=source)) as server:
        print(json.dumps({"url": server.url}), flush=True)
        mark = _thread_cpu_s()
        cpu0 = time.process_time()
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "mark":
                mark, cpu0 = _thread_cpu_s(), time.process_time()
                print(json.dumps({"ok": True}), flush=True)
            elif cmd == "report":
                now = _thread_cpu_s()
                threads = {k: v - mark.get(k, 0.0) for k, v in now.items()}

                def node_stats() -> dict[str, Any]:
                    session = next(iter(server.server.sessions.values()))
                    assert session.pipeline is not None
                    snap = session.pipeline.metrics()
                    out = {n.name.split(":")[0]: n.latency_ms_p50 for n in snap.nodes}
                    out["age at viewer"] = snap["viewer"].age_ms_p50  # capture → viewer sink
                    return out

                print(
                    json.dumps(
                        {
                            "cpu_s": time.process_time() - cpu0,
                            "threads": {k: v for k, v in threads.items() if v > 0.005},
                            "node_ms": server.call(node_stats),
                        }
                    ),
                    flush=True,
                )
            elif cmd == "quit":
                break
    return 0


class ServerProc:
    """A server child running the package found at ``pythonpath``."""

    def __init__(
        self, pythonpath: str, media_root: Path, source: str, env: dict[str, str] | None = None
    ) -> None:
        env = dict(os.environ, PYTHONPATH=pythonpath, **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(media_root), source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.url = self._read()["url"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the server child ended early; see its output above")
        return dict(json.loads(line))

    def ask(self, cmd: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(20)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def unpack_revision(rev: str, dest: Path) -> str:
    """``git archive`` revision ``rev`` into ``dest/tree``; returns the PYTHONPATH that imports it as ``vostream``
    (for a revision of the old layout, through a namespace folder ``dest/ns/vostream`` of links)."""
    tree = dest / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    tar_path = dest / "tree.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(tree, filter="data")
    tar_path.unlink()
    if (tree / "vostream" / "__init__.py").exists():
        return str(tree)
    ns = dest / "ns" / "vostream"
    ns.mkdir(parents=True)
    for name in _OLD_LAYOUT:
        (ns / name).symlink_to(tree / name)
    (ns / "__init__.py").symlink_to(tree / "pipeline" / "api" / "__init__.py")
    return str(dest / "ns")


# -- the browser side -----------------------------------------------------------------------------------------------
def _browser_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of the Chromium processes under ``pid`` by kind (renderer, gpu-process, browser, ...)."""
    import psutil

    out: dict[str, float] = {}
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if "chrom" not in p.name():
                continue
            kind = "browser"
            for arg in p.cmdline():
                if arg.startswith("--type="):
                    kind = arg[7:]
                    if kind == "utility":
                        kind = "utility"
            t = p.cpu_times()
            out[kind] = out.get(kind, 0.0) + t.user + t.system
        except psutil.Error:
            continue
    return out


def run_one(
    ctx: Any, server: ServerProc, scene: Any, size: tuple[int, int], frames: int, shot: str | None
) -> dict:
    w, h = size
    page = ctx.new_page()
    try:
        page.goto(server.url)
        page.wait_for_function("window.__vostream && window.__vostream.frames >= 1", timeout=60000)
        box = page.locator("#view").bounding_box()
        x, y = scene.click(1)
        page.mouse.click(box["x"] + x * box["width"] / w, box["y"] + y * box["height"] / h)
        page.wait_for_function("window.__vostream.masksDrawn >= 1", timeout=60000)
        page.wait_for_function("window.__vostream.pongs >= 3", timeout=10000)  # a settled clock estimate
        page.evaluate("window.__vostream.lat.length = 0")
        frames0 = page.evaluate("window.__vostream.frames")
        server.ask("mark")
        b0 = _browser_cpu(os.getpid())
        t0 = time.monotonic()
        page.keyboard.press("Space")
        page.wait_for_function(f"window.__vostream.lastIndex >= {frames - 1}", timeout=300000, polling=50)
        wall = time.monotonic() - t0
        b1 = _browser_cpu(os.getpid())
        rep = server.ask("report")
        st = page.evaluate("window.__vostream")
        if shot:
            page.screenshot(path=shot)
    finally:
        page.close()
    import numpy as np

    lat = np.asarray(st["lat"], float)
    drawn = st["frames"] - frames0
    played = frames - 1  # frame 0 was on screen before play
    browser = {k: 1000 * (v - b0.get(k, 0.0)) / max(drawn, 1) for k, v in b1.items()}
    threads = {k: 1000 * v / played for k, v in rep["threads"].items() if not k.endswith("(runq)")}
    runq = {
        k[: -len(" (runq)")]: 1000 * v / played for k, v in rep["threads"].items() if k.endswith("(runq)")
    }
    return {
        "drawn": drawn,
        "drawn_fps": drawn / wall,
        "played_fps": played / wall,
        "g2g_p50": float(np.percentile(lat, 50)) if len(lat) else float("nan"),
        "g2g_p95": float(np.percentile(lat, 95)) if len(lat) else float("nan"),
        "drops": played - drawn,
        "server_cpu_ms": 1000 * rep["cpu_s"] / played,
        "browser_cpu_ms": sum(browser.values()),
        "sink_ms_p50": rep["node_ms"].get("viewer", float("nan")),
        "node_wall_ms": rep["node_ms"],
        "runq_ms": runq,
        "threads_ms": dict(sorted(threads.items(), key=lambda kv: -kv[1])),
        "browser_ms": dict(sorted(browser.items(), key=lambda kv: -kv[1])),
        "wall_s": wall,
    }


def components(sizes: list[tuple[int, ...]], reps: int = 16) -> None:
    """Per-step CPU ms per frame of the media path, on the translate scene's frames and tracked-size masks."""
    import cv2
    import numpy as np
    from pycocotools import mask as mask_utils

    from vostream.pipeline.types import rle_counts
    from vostream.samples.scenes import render_scene
    from vostream.sinks.websocket import PackedFrame, scale_image

    def cpu_ms(fn: Any, items: list[Any]) -> float:
        """The lowest of 5 batches (other jobs on the machine only ever add time)."""
        fn(items[0])
        best = float("inf")
        for _ in range(5):
            t0 = time.thread_time()
            for i in range(reps):
                fn(items[i % len(items)])
            best = min(best, 1000 * (time.thread_time() - t0) / reps)
        return best

    steps: dict[str, Any] = {
        "jpeg opencv (RGB->BGR + imencode)": lambda im: cv2.imencode(
            ".jpg", cv2.cvtColor(im, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 80]
        )[1],
    }
    try:
        import simplejpeg

        steps["jpeg simplejpeg (RGB, 4:2:0)"] = lambda im: simplejpeg.encode_jpeg(
            im, 80, colorspace="RGB", colorsubsampling="420"
        )
    except ImportError:
        logger.info("simplejpeg not installed: not compared")
    try:
        import io

        from PIL import Image

        def pil(im: Any) -> bytes:
            buf = io.BytesIO()
            Image.fromarray(im).save(buf, "JPEG", quality=80)
            return buf.getvalue()

        steps["jpeg Pillow"] = pil
    except ImportError:
        pass
    build = cv2.getBuildInformation()
    jpeg_line = next((ln.strip() for ln in build.splitlines() if ln.strip().startswith("JPEG:")), "?")
    print(f"OpenCV {cv2.__version__} {jpeg_line}")
    print(f"{'step':44s} " + " ".join(f"{w}x{h:<8}" for w, h in sizes))
    rows: dict[str, list[float]] = {}
    for w, h in sizes:
        scene = render_scene("translate", width=w, height=h, frames=8)
        frames = [np.ascontiguousarray(f) for f in scene.frames]
        masks = [np.ascontiguousarray(lab == 1) for lab in scene.labels]
        for name, fn in steps.items():
            rows.setdefault(name, []).append(cpu_ms(fn, frames))
        for frac in (0.79, 0.5):
            tw, th = round(w * frac), round(h * frac)
            rows.setdefault(f"scale_image to {frac:.2f} + jpeg opencv", []).append(
                cpu_ms(
                    lambda im, tw=tw, th=th: steps["jpeg opencv (RGB->BGR + imencode)"](
                        scale_image(im, tw, th)
                    ),
                    frames,
                )
            )
        rows.setdefault("rle pycocotools encode (1 object)", []).append(
            cpu_ms(lambda m: mask_utils.encode(np.asfortranarray(m[:, :, None].astype(np.uint8))), masks)
        )
        rows.setdefault("rle rle_counts (1 object)", []).append(cpu_ms(rle_counts, masks))
        jpeg = bytes(steps["jpeg opencv (RGB->BGR + imencode)"](frames[0]))
        objs = [
            {
                "id": 1,
                "score": 0.9,
                "present": True,
                "box": [0.0] * 4,
                "rle": {"counts": rle_counts(masks[0])},
            }
        ]
        rows.setdefault("msgpack frame message", []).append(
            cpu_ms(
                lambda j, objs=objs: PackedFrame.pack(
                    {"t": "frame", "seq": 1, "index": 1, "jpeg": j, "objs": objs}
                ),
                [jpeg],
            )
        )
    for name, vals in rows.items():
        print(f"{name:44s} " + " ".join(f"{v:8.2f} ms" for v in vals))


def _median_runs(runs: list[dict]) -> dict:
    import numpy as np

    out: dict[str, Any] = {}
    for key in runs[0]:
        if isinstance(runs[0][key], dict):
            keys = {k for r in runs for k in r[key]}
            out[key] = {k: float(np.median([r[key].get(k, 0.0) for r in runs])) for k in keys}
        else:
            out[key] = float(np.median([r[key] for r in runs]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="854x480,1280x720")
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument(
        "--rounds", type=int, default=1, help="runs per size and variant (the median is reported)"
    )
    ap.add_argument("--baseline", metavar="REV", help="also run git revision REV, interleaved")
    ap.add_argument(
        "--viewport",
        default="1600x900",
        help="browser window WxH (default: a 720p canvas shows at full size)",
    )
    ap.add_argument(
        "--env-current",
        action="append",
        default=[],
        metavar="K=V",
        help="environment of this tree's server only",
    )
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--screenshot", metavar="PNG", help="save a page screenshot of the last run here")
    ap.add_argument("--components", action="store_true", help="per-step CPU of the media path, no browser")
    ap.add_argument("--child", nargs=2, metavar=("ROOT", "SOURCE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(*args.child)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.components:
        components([tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")])
        return 0
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, "")
    from vostream.samples.scenes import render_scene, write_scene

    work = Path(tempfile.mkdtemp(prefix="vostream-bench-viewer-"))
    variants = {"current": str(ROOT)}  # the checkout imports as vostream from its root
    if args.baseline:
        variants = {"baseline": unpack_revision(args.baseline, work / "baseline"), **variants}
    vw, vh = (int(v) for v in args.viewport.split("x"))
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        with sync_playwright() as p:
            profile = tempfile.mkdtemp(dir=work)
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
                viewport={"width": vw, "height": vh},
            )
            for w, h in sizes:
                label = f"{w}x{h}"
                media = work / label
                scene = render_scene("translate", width=w, height=h, frames=args.frames)
                write_scene(scene, media / "scene.mp4")
                for r in range(args.rounds):
                    order = list(variants) if r % 2 == 0 else list(reversed(variants))
                    for name in order:
                        env = dict(kv.split("=", 1) for kv in args.env_current) if name == "current" else {}
                        server = ServerProc(variants[name], media, "scene.mp4", env)
                        try:
                            res = run_one(ctx, server, scene, (w, h), args.frames, args.screenshot)
                        finally:
                            server.close()
                        results.setdefault(label, {}).setdefault(name, []).append(res)
                        logger.info(
                            "%s %-8s round %d: drawn %.1f fps, played %.1f fps, g2g p50 %.0f p95 %.0f ms, "
                            "server %.1f ms/frame, browser %.1f ms/frame",
                            label, name, r, res["drawn_fps"], res["played_fps"], res["g2g_p50"],
                            res["g2g_p95"], res["server_cpu_ms"], res["browser_cpu_ms"],
                        )  # fmt: skip
            ctx.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {size: {name: _median_runs(runs) for name, runs in by.items()} for size, by in results.items()}
    cols = [
        "drawn_fps",
        "played_fps",
        "g2g_p50",
        "g2g_p95",
        "drops",
        "server_cpu_ms",
        "browser_cpu_ms",
        "sink_ms_p50",
    ]
    print(f"\n{'size':10s} {'variant':9s} " + " ".join(f"{c:>14s}" for c in cols))
    for size, by in summary.items():
        for name, m in by.items():
            print(f"{size:10s} {name:9s} " + " ".join(f"{m[c]:14.1f}" for c in cols))
        if "baseline" in by:
            b, c = by["baseline"], by["current"]
            print(
                f"{size:10s} {'ratio':9s} "
                + " ".join(f"{c[k] / b[k] if b[k] else float('nan'):14.2f}" for k in cols)
            )
    print("\nCPU ms per played frame by server thread / per drawn frame by browser process:")
    for size, by in summary.items():
        for name, m in by.items():
            top = ", ".join(
                f"{k.replace('vostream-session-', '')} {v:.1f} (+{m['runq_ms'].get(k, 0.0):.1f} waiting)"
                for k, v in list(sorted(m["threads_ms"].items(), key=lambda kv: -kv[1]))[:8]
            )
            brw = ", ".join(f"{k} {v:.1f}" for k, v in sorted(m["browser_ms"].items(), key=lambda kv: -kv[1]))
            nodes = ", ".join(f"{k} {v:.1f}" for k, v in m["node_wall_ms"].items())
            print(f"{size} {name}: server [{top}]; browser [{brw}]; wall ms per call [{nodes}]")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "summary": summary, "runs": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
