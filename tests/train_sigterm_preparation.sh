#!/usr/bin/env bash
# SIGTERM to `posenc train` before its first step: here rank 0 of a 2-rank run waiting at the
# rendezvous for a rank 1 that never comes (train.rank_timeout_s=600), as a run waits while it
# reads its data, builds its model or waits for its ranks. The process stops at once, with one
# line and exit 130 as a stop in training, instead of dying without a word (exit 143, as it did)
# or running on until the preparation ends; the run folder (an earlier run stopped at step 3) is
# as it was, and --resume finishes the run.
#   tests/train_sigterm_preparation.sh POSENC_BINARY CONFIG WORK_DIR
set -euo pipefail
posenc=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "train_sigterm_preparation: $*" >&2; cat "$work/log" >&2; exit 1; }
run="$work/run"
# the run's files and their hashes (the lock file holds the PID of the last run: left out)
files() { (cd "$run" && find . -type f ! -name .posenc.lock | sort | xargs sha256sum); }

"$posenc" train "$config" --out "$run" --quiet --stop-after 3 > "$work/log" 2>&1 ||
  fail "the first run did not stop after 3 steps"
before=$(files)

store="$work/store"
RANK=0 WORLD_SIZE=2 POSENC_STORE_FILE="$store" "$posenc" train "$config" --out "$run" --quiet \
  --resume --set train.rank_timeout_s=600 > "$work/log" 2>&1 &
pid=$!
# the store file exists once rank 0 is at the rendezvous (its signal handlers are in place)
for _ in $(seq 1200); do
  [[ -e "$store" ]] && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
[[ -e "$store" ]] || fail "rank 0 did not reach the rendezvous within 120 s"
kill -TERM "$pid"
# a bound against a hang (the rendezvous would wait 600 s), not a measure of speed
for _ in $(seq 600); do
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2> /dev/null; then
  kill -KILL "$pid"
  fail "still running 60 s after SIGTERM"
fi
set +e
wait "$pid"
code=$?
set -e
[[ $code -eq 130 ]] || fail "exit $code, expected 130 (stopped by a signal)"
[[ $(wc -l < "$work/log") -eq 1 ]] || fail "expected one line"
grep -q '^posenc: stopped: SIGTERM before the first step; nothing was trained or saved' "$work/log" ||
  fail "not the stop line"
[[ "$(files)" == "$before" ]] || fail "the run folder changed"

"$posenc" train "$config" --out "$run" --quiet --resume > "$work/log" 2>&1 || fail "--resume failed"
grep -q '"steps": 32' "$run/summary.json" || fail "--resume did not finish the run"
echo "train_sigterm_preparation: SIGTERM at the rendezvous: exit 130 with one line, the run folder as it was, --resume finished the run"
