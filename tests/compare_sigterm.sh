#!/usr/bin/env bash
# `posenc compare --jobs 2` stopped by SIGTERM sent to the compare process alone (`kill PID`, as a
# scheduler or a script does; Ctrl-C reaches the whole process group instead): the signal is
# passed on to both running children, each saves its checkpoint and exits 130, compare exits 130,
# and no child is left training on its own. --resume then finishes the comparison.
#   tests/compare_sigterm.sh POSENC_BINARY CONFIG WORK_DIR
set -euo pipefail
posenc=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "compare_sigterm: $*" >&2; cat "$work/log" >&2; exit 1; }
"$posenc" compare "$config" --jobs 2 --quiet --out "$work/c" --set train.epochs=40 > "$work/log" 2>&1 &
parent=$!
children=""
for _ in $(seq 300); do  # up to 30 s for both children to start
  children=$(pgrep -P "$parent" || true)
  [[ $(echo "$children" | grep -c .) -ge 2 ]] && break
  sleep 0.1
done
[[ $(echo "$children" | grep -c .) -ge 2 ]] || fail "the two children did not start"
# until both have trained a step (their first log row: metrics.csv), up to 120 s
for _ in $(seq 1200); do
  [[ -s "$work/c/rope_2d/metrics.csv" && -s "$work/c/learned_2d/metrics.csv" ]] && break
  sleep 0.1
done
kill -TERM "$parent"
set +e
wait "$parent"
code=$?
set -e
[[ $code -eq 130 ]] || fail "compare exited with $code, expected 130"
for child in $children; do
  if kill -0 "$child" 2>/dev/null; then fail "child $child still running after compare exited"; fi
done
grep -q "continue with --resume" "$work/log" || fail "no child said it stopped with a checkpoint"
for run in rope_2d learned_2d; do
  [[ -s "$work/c/$run/checkpoint.pt" ]] || fail "$run saved no checkpoint"
done
"$posenc" compare "$config" --jobs 2 --quiet --out "$work/c" --set train.epochs=40 --resume \
  > "$work/log" 2>&1 || fail "--resume did not finish"
[[ -s "$work/c/results.md" ]] || fail "no results.md after --resume"
echo "compare_sigterm: SIGTERM passed on to 2 children, compare exited 130, none left running, resumed to results.md"
