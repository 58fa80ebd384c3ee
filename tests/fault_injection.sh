#!/usr/bin/env bash
# Fault injection: a training run killed (as by kill -9) at every rename of every file it saves,
# then resumed, ends exactly as an uninterrupted run: weights.pt byte-identical, metrics.csv and
# summary.json identical but for wall-clock columns. The kill comes from the trainer itself at a
# named point (POSENC_FAULT_AT, see src/train/line_chart.cpp), so it lands between the same two
# instructions every time.
#   tests/fault_injection.sh POSENC_BINARY CONFIG WORK_DIR
set -euo pipefail
posenc=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
# metrics.csv without its elapsed_s column; summary.json without "seconds"
strip_csv() { awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i != "elapsed_s") keep[i] = 1 }
  { line = ""; for (i = 1; i <= NF; i++) if (keep[i]) line = line $i ","; print line }' "$1"; }
strip_summary() { grep -v '"seconds"' "$1"; }

"$posenc" train "$config" --out "$work/straight" --quiet > /dev/null
checked=0
for file in metrics.csv checkpoint.pt weights.pt curves.png; do
  for when in before_rename after_rename; do
    for k in 1 2; do
      run="$work/${file%.*}_${when}_$k"
      set +e
      POSENC_FAULT_AT="$when:$file:$k" "$posenc" train "$config" --out "$run" --quiet > /dev/null 2>&1
      code=$?
      set -e
      if [[ $code -ne 137 ]]; then
        echo "fault $when:$file:$k: expected the run to die (137), got exit $code" >&2
        exit 1
      fi
      "$posenc" train "$config" --out "$run" --quiet --resume > /dev/null
      cmp "$work/straight/weights.pt" "$run/weights.pt"
      diff <(strip_csv "$work/straight/metrics.csv") <(strip_csv "$run/metrics.csv")
      diff <(strip_summary "$work/straight/summary.json") <(strip_summary "$run/summary.json")
      [[ ! -e "$run/checkpoint.pt.tmp" || -e "$run/checkpoint.pt" ]]
      checked=$((checked + 1))
    done
  done
done
echo "fault injection: $checked kills (before and after each rename of metrics.csv, checkpoint.pt, weights.pt, curves.png), each resumed to the uninterrupted run's weights, metrics and summary"
