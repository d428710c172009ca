"""Several live streams on one machine: one ``vostream run`` process sharing one tracker vs N separate
``vostream track`` processes, side by side in one run (``docs/deploy.md``).

Each stream is a real RTSP feed (GStreamer's RTSP server on loopback, ``tests/fakes/rtsp_server.py``) of a 854x480 30 fps
H.264 clip.  For N = 1..4 streams, both ways run for ``--seconds`` and are stopped with SIGINT; each stream's
``summary.json`` gives its frames, fps and the frame age (capture to the end of postprocess) p50/p95.  Reported:
aggregate fps (sum over streams) and the mean over streams of the age percentiles.  The RTSP servers run in both
ways alike.

    python benchmarks/bench_streams.py [--streams 1,2,3,4] [--seconds 10] [--backend classic|onnx] [--json out.json]

``--backend onnx`` exports a tiny random SAM 2 model first (torch + transformers needed, as for the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fakes.media import make_video, square_frames  # noqa: E402
from fakes.rtsp_server import RtspServer, server_available  # noqa: E402

CLI = [sys.executable, "-m", "vostream.apps.cli"]
W, H, FPS = 854, 480, 30


def clip(tmp: Path) -> Path:
    return make_video(
        tmp / "feed.mp4",
        square_frames(FPS * 20, W, H, size=120, step=2),
        fps=FPS,
        options={"g": "30", "bf": "0"},
    )


def tracker_lines(backend: str, model: Path | None) -> list[str]:
    lines = [f'backend = "{backend}"']
    if model is not None:
        lines.append(f'model = "{model}"')
    return lines


def stream_table(name: str, url: str, out: Path) -> list[str]:
    return [
        "[[streams]]",
        f'name = "{name}"',
        f'source = "{url}"',
        f'out = "{out}"',
        'save = ["json"]',
        "[[streams.prompts]]",
        "obj = 1",
        "points = [[68, 240]]",
        "",
    ]


def stop_after(procs: list[subprocess.Popen[bytes]], seconds: float) -> None:
    time.sleep(seconds)
    for p in procs:
        p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()


def read(out: Path) -> dict[str, float]:
    s = json.loads((out / "summary.json").read_text())
    post = next((n for n in s["metrics"]["nodes"] if n["name"] == "postprocess"), {})
    return {
        "frames": s["frames"],
        "fps": s["fps"],
        "age_p50": post.get("age_ms_p50", float("nan")),
        "age_p95": post.get("age_ms_p95", float("nan")),
    }


def one_way(
    mode: str, urls: list[str], tmp: Path, seconds: float, backend: str, model: Path | None
) -> dict[str, Any]:
    outs = [tmp / f"{mode}-{len(urls)}-{i}" for i in range(len(urls))]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if mode == "shared":
        cfg = tmp / f"deploy-{len(urls)}.toml"
        lines = ["[tracker]", *tracker_lines(backend, model), ""]
        for i, (url, out) in enumerate(zip(urls, outs)):
            lines += stream_table(f"s{i}", url, out)
        cfg.write_text("\n".join(lines))
        procs = [subprocess.Popen([*CLI, "run", "--config", str(cfg), "-q"], env=env)]
    else:
        procs = []
        for url, out in zip(urls, outs):
            args = [
                *CLI,
                "track",
                url,
                "--out",
                str(out),
                "--save",
                "json",
                "--point",
                "68,240",
                "-q",
                "--backend",
                backend,
            ]
            if model is not None:
                args += ["--model", str(model)]
            procs.append(subprocess.Popen(args, env=env))
    stop_after(procs, seconds)
    per = [read(o) for o in outs]
    n = len(per)
    return {
        "aggregate_fps": round(sum(p["fps"] for p in per), 1),
        "age_p50_ms": round(sum(p["age_p50"] for p in per) / n, 1),
        "age_p95_ms": round(sum(p["age_p95"] for p in per) / n, 1),
        "per_stream_fps": [p["fps"] for p in per],
    }


def tiny_model(tmp: Path) -> Path:
    from fakes import sam2_reference as ref

    from vostream.apps.export import export_model

    ckpt = ref.save_tiny("sam2", tmp / "ckpt")
    export_model(str(ckpt), tmp / "export")
    return tmp / "export"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", default="1,2,3,4")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--backend", default="classic", choices=("classic", "onnx"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if server_available() is not None:
        print(f"needs GStreamer's RTSP server: {server_available()}", file=sys.stderr)
        return 2
    counts = [int(x) for x in args.streams.split(",")]
    results: dict[str, Any] = {
        "backend": args.backend,
        "seconds": args.seconds,
        "size": f"{W}x{H}@{FPS}",
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        feed = clip(tmp)
        model = tiny_model(tmp) if args.backend == "onnx" else None
        servers = [RtspServer(feed).start() for _ in range(max(counts))]
        try:
            print(
                f"{'streams':>7} | {'way':<9} | {'agg fps':>7} | {'age p50':>7} | {'age p95':>7} | per-stream fps"
            )
            for n in counts:
                urls = [s.url for s in servers[:n]]
                row = {}
                for mode in ("shared", "separate"):
                    r = one_way(mode, urls, tmp, args.seconds, args.backend, model)
                    row[mode] = r
                    print(
                        f"{n:>7} | {mode:<9} | {r['aggregate_fps']:>7} | {r['age_p50_ms']:>7} | "
                        f"{r['age_p95_ms']:>7} | {r['per_stream_fps']}"
                    )
                row["shared_over_separate_fps"] = round(
                    row["shared"]["aggregate_fps"] / max(1e-9, row["separate"]["aggregate_fps"]), 3
                )
                results["runs"][str(n)] = row
        finally:
            for s in servers:
                s.close()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
