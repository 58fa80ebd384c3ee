#!/usr/bin/env bash
# Data-parallel training measured side by side: the main job (configs/vit_fashion.yaml) for one
# epoch as 1 process with 2 threads, 1 process with 1 thread, and `--nproc 2` ranks of 1 thread
# each with the gradient all-reduce overlapped with backward (c10d's Reducer) and after backward
# (one flat all-reduce); then a profile of the after-backward variant for the all-reduce's share
# of a step. Prints a Markdown table. Run it alone on a quiet machine (uptime is printed).
#   bash tools/bench_data_parallel.sh [build/posenc] [out folder] [epochs]
set -euo pipefail
POSENC=${1:-build/posenc}
OUT=${2:-/tmp/posenc_bench_dp}
EPOCHS=${3:-1}
CONFIG=configs/vit_fashion.yaml
rm -rf "$OUT"
mkdir -p "$OUT"
echo "load before: $(uptime)"
row() {  # name, then arguments to posenc train
  local name=$1
  shift
  "$POSENC" train "$CONFIG" --quiet --out "$OUT/$name" --set train.epochs="$EPOCHS" "$@" \
    > "$OUT/$name.log" 2>&1
  python3 - "$OUT/$name" "$name" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(f"| {sys.argv[2]} | {s['steps'] / s['seconds']:.2f} | {s['seconds']:.1f} | "
      f"{100 * s['final']['accuracy']:.2f}% |")
PY
}
echo "| run (1 epoch of the main job) | steps/s | training s | test accuracy |"
echo "|---|---|---|---|"
row "1 process, 2 threads" --set train.threads=2
row "1 process, 1 thread" --set train.threads=1
row "2 ranks x 1 thread, overlap (Reducer)" --nproc 2 --set train.gradient_sync=overlap
row "2 ranks x 1 thread, after backward" --nproc 2 --set train.gradient_sync=after_backward
"$POSENC" train "$CONFIG" --quiet --out "$OUT/profile" --nproc 2 --profile 60 \
  --set train.gradient_sync=after_backward > "$OUT/profile.log" 2>&1
echo
grep -m1 "data-parallel:" "$OUT/2 ranks x 1 thread, overlap (Reducer).log" || true
echo "profile of 60 steps, rank 0, after backward ($OUT/profile/profile.md):"
cat "$OUT/profile/profile.md"
echo "load after: $(uptime)"
