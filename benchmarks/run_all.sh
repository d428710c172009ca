#!/usr/bin/env bash
# Runs every benchmark and keeps the JSON results in bench-out/ (the README's figures come from these).
# About 20 minutes on 2 cores; run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out}
mkdir -p "$out"
python benchmarks/bench_tracker.py --json "$out/tracker.json"
python benchmarks/bench_pipeline.py --workload track --frames 300 --json "$out/pipeline_track.json"
python benchmarks/bench_pipeline.py --workload synthetic --json "$out/pipeline_synthetic.json"
python benchmarks/bench_pipeline.py --workload sleep --json "$out/pipeline_sleep.json"
python benchmarks/bench_decode.py --json "$out/decode.json"
python benchmarks/bench_rss.py --frames 10000 --json "$out/rss.json"
python benchmarks/bench_real.py --json "$out/real.json" --sheets "$out"
python benchmarks/bench_streams.py --json "$out/streams.json"
python benchmarks/bench_streams.py --backend onnx --json "$out/streams_onnx.json"
# the DAVIS-2016 dev split, when it has been extracted (docs/davis.md)
if [ -d "${XDG_CACHE_HOME:-$HOME/.cache}/vostream/davis2016-dev" ]; then
  python benchmarks/bench_davis.py --json "$out/davis.json"
fi
