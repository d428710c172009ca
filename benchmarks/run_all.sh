#!/usr/bin/env bash
# Runs every benchmark and keeps the JSON results in OUT (default bench-out/); the README's figures come from these.
#
#   benchmarks/run_all.sh [OUT]            full settings: about 45 minutes on 2 cores; run it on an idle machine
#   QUICK=1 benchmarks/run_all.sh [OUT]    short settings (about 5 minutes): checks that every benchmark still
#                                          runs end to end; its figures mean nothing
#
# Needs what the tests need (GStreamer's RTSP server for the live/streams benchmarks, Chromium for the viewer,
# torch + transformers for the SAM-2 ones).  The DAVIS benchmark runs when its data has been extracted
# (docs/davis.md); the real-footage one fetches Debian's opencv-doc once (apt-get download) into its cache.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out}
mkdir -p "$out"

if [ "${QUICK:-0}" = 1 ]; then
  tracker="--size 320x180 --scene translate --speed-scene translate"
  pipeline="--frames 60 --warmup 5 --alone-frames 20 --repeats 1 --media-dir $out"
  annotate="--videos 2 --frames 10 --rounds 1"
  hotpath="--repeats 20"
  decode="--frames 60 --frames-1080 0 --repeat 1 --dir $out"
  rss="--frames 600 --warmup 100 --every 100"
  streams="--streams 1 --seconds 3"
  live="--seconds 2 --away 1"
  viewer="--frames 30"
  sam2="--frames 10 --rounds 1 --threads 1 --families sam2"
  attention="--queries 256 --keys 1024 --threads 1 --repeats 1"
  batching="--size 256 --repeats 1"
  davis="--limit 1 --modes click"
else
  tracker="" pipeline="--frames 300 --media-dir $out" annotate="" hotpath="" decode="--dir $out" rss="--frames 10000"
  streams="" live="" viewer="" sam2="--large" attention="" batching="" davis="--seeds 3"
fi

run() {
  echo "== $*" >&2
  python "$@"
}

run benchmarks/bench_tracker.py $tracker --json "$out/tracker.json"
# the pipeline: the real stages, then the same with a cheap stand-in tracker (does the rest overlap?), with and
# without the file sinks, then the engine alone; --profile adds per-stage CPU and GIL-held time (py-spy)
run benchmarks/bench_pipeline.py --workload track $pipeline --profile --json "$out/pipeline_track.json"
run benchmarks/bench_pipeline.py --workload track $pipeline --outputs files --profile \
  --json "$out/pipeline_track_files.json"
run benchmarks/bench_pipeline.py --workload track-lite --track-ms 4 --track-gil 0 $pipeline --profile \
  --json "$out/pipeline_lite.json"
run benchmarks/bench_pipeline.py --workload track-lite --track-ms 4 --track-gil 0.5 $pipeline --profile \
  --json "$out/pipeline_lite_gil.json"
run benchmarks/bench_pipeline.py --workload track-lite --track-ms 4 --track-gil 0 $pipeline --outputs files \
  --profile --json "$out/pipeline_lite_files.json"
run benchmarks/bench_pipeline.py --workload synthetic $pipeline --json "$out/pipeline_synthetic.json"
run benchmarks/bench_pipeline.py --workload sleep $pipeline --json "$out/pipeline_sleep.json"
run benchmarks/bench_pipeline.py --workload null $pipeline --json "$out/pipeline_null.json"
run benchmarks/bench_hotpath.py $hotpath --json "$out/hotpath.json"
run benchmarks/bench_annotate.py $annotate --json "$out/annotate.json"
run benchmarks/bench_decode.py $decode --json "$out/decode.json"
run benchmarks/bench_rss.py $rss --json "$out/rss.json"
run benchmarks/bench_real.py --json "$out/real.json" --sheets "$out"
run benchmarks/bench_streams.py $streams --json "$out/streams.json"
run benchmarks/bench_streams.py $streams --backend onnx --json "$out/streams_onnx.json"
run benchmarks/bench_live.py $live --json "$out/live.json"
run benchmarks/bench_viewer.py $viewer --json "$out/viewer.json"
run benchmarks/bench_sam2.py $sam2 --json "$out/sam2.json"
run benchmarks/bench_attention_ops.py $attention > "$out/attention_ops.txt"
run benchmarks/bench_object_batching.py $batching > "$out/object_batching.txt"
# the DAVIS-2016 dev split, when it has been extracted (docs/davis.md)
if [ -d "${XDG_CACHE_HOME:-$HOME/.cache}/vostream/davis2016-dev" ]; then
  run benchmarks/bench_davis.py $davis --json "$out/davis.json"
fi
