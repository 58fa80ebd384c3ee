#!/usr/bin/env bash
# A posenc that started others and then dies without a word (kill -9, the OOM killer): the
# processes it started must not train on unseen. `posenc train --nproc 2` and `posenc compare
# --jobs 2` give each child POSENC_PARENT_PID, and a child asks the kernel for SIGHUP when its
# parent dies (PR_SET_PDEATHSIG; it may arrive more than once): every rank / run then saves its
# checkpoint and stops.
#   tests/parent_death.sh POSENC_BINARY LM_CONFIG COMPARE_CONFIG WORK_DIR
set -euo pipefail
posenc=$1 lm=$2 compare=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail() { echo "parent_death: $*" >&2; cat "$work/log" >&2; exit 1; }

# kill -9 the parent once both children run and the run folder has a log row; then every child
# must be gone within 30 s, and the folder hold a checkpoint
kill_and_check() {  # what, parent pid, file that shows training is under way, checkpoints...
  local what=$1 parent=$2 busy=$3
  shift 3
  local children=""
  for _ in $(seq 300); do
    children=$(pgrep -P "$parent" || true)
    [[ $(echo "$children" | grep -c .) -ge 2 ]] && break
    sleep 0.1
  done
  [[ $(echo "$children" | grep -c .) -ge 2 ]] || fail "$what: the two children did not start"
  for _ in $(seq 1200); do [[ -s "$busy" ]] && break; sleep 0.1; done
  [[ -s "$busy" ]] || fail "$what: no log row within 120 s"
  kill -KILL "$parent"
  wait "$parent" 2>/dev/null || true
  for _ in $(seq 300); do
    local alive=0
    for child in $children; do kill -0 "$child" 2>/dev/null && alive=1; done
    [[ $alive -eq 0 ]] && break
    sleep 0.1
  done
  for child in $children; do
    if kill -0 "$child" 2>/dev/null; then
      kill -KILL $children 2>/dev/null || true
      fail "$what: child $child still running 30 s after its parent was killed"
    fi
  done
  for checkpoint in "$@"; do
    [[ -s "$checkpoint" ]] || fail "$what: no checkpoint '$checkpoint'"
  done
}

"$posenc" train "$lm" --nproc 2 --quiet --out "$work/ranks" --set train.epochs=400 \
  --set train.log_every=1 > "$work/log" 2>&1 &
kill_and_check "train --nproc 2" $! "$work/ranks/metrics.csv" "$work/ranks/checkpoint.pt"
grep -q "continue with --resume" "$work/log" || fail "rank 0 did not say it saved a checkpoint"

"$posenc" compare "$compare" --jobs 2 --quiet --out "$work/c" --set train.epochs=400 \
  --set train.log_every=1 > "$work/log" 2>&1 &
kill_and_check "compare --jobs 2" $! "$work/c/learned_2d/metrics.csv" \
  "$work/c/rope_2d/checkpoint.pt" "$work/c/learned_2d/checkpoint.pt"
echo "parent_death: ranks and compare runs stopped with checkpoints after kill -9 of their parent"
