#!/usr/bin/env bash
# A run trained with train.precision: bf16, read where bf16 training is refused (issue 49): the
# refusal belongs to training alone (src/train/precision.h). The smoke ViT is trained in bf16 at
# this CPU's level (native bfloat16 needed: skipped, exit 77, on a CPU without it, where no bf16
# run can be made), then, with POSENC_CPU_CAPABILITY=avx2 (this CPU run as an AVX2 one, where
# bf16 training is refused):
#   - training the same config in bf16 is refused in one line (exit 2),
#   - `posenc eval` of the run's config.json and weights.pt works (exit 0) and prints the run's
#     own numbers: evaluation is float32 (float32 master weights, as the run's own evaluation at
#     the end of training), so summary.json's accuracies equal the run's exactly and its losses
#     within 1e-5 relative (the fused kernels' 8- and 16-lane rows may round a sum differently).
#   tests/eval_bf16_run.sh POSENC_BINARY CONFIG WORK_DIR
set -uo pipefail
posenc=$1 config=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
fail() { echo "eval_bf16_run: $*" >&2; exit 1; }
if ! "$posenc" train "$config" --out "$work/run" --quiet --set train.precision=bf16 \
  > "$work/train.log" 2>&1; then
  if grep -q "needs a CPU with native bfloat16" "$work/train.log"; then
    echo "eval_bf16_run: skipped: this CPU cannot train in bf16, so there is no bf16 run to read"
    exit 77
  fi
  cat "$work/train.log" >&2
  fail "training in bf16 failed"
fi
grep -q '"precision": "bf16"' "$work/run/summary.json" || fail "the run's summary.json does not say bf16"
POSENC_CPU_CAPABILITY=avx2 "$posenc" train "$config" --out "$work/refused" --quiet \
  --set train.precision=bf16 > "$work/refused.log" 2>&1
code=$?
[[ $code -eq 2 ]] || fail "bf16 training at the avx2 level exited $code, expected 2 (refused)"
[[ $(wc -l < "$work/refused.log") -eq 1 ]] && grep -q "needs a CPU with native bfloat16" \
  "$work/refused.log" || fail "the refusal is not one line: $(cat "$work/refused.log")"
POSENC_CPU_CAPABILITY=avx2 "$posenc" eval "$work/run/config.json" \
  --weights "$work/run/weights.pt" --out "$work/eval" > "$work/eval.log" 2>&1 ||
  { cat "$work/eval.log" >&2; fail "posenc eval of the bf16 run at the avx2 level failed"; }
python3 - "$work/run/summary.json" "$work/eval/summary.json" <<'EOF' || exit 1
import json, sys

run, ev = (json.load(open(path)) for path in sys.argv[1:3])
rows = [("final", run["final"], ev["final"])] + [
    (a["setting"], a["metrics"], b["metrics"])
    for a, b in zip(run["generalization"], ev["generalization"])
]
assert len(run["generalization"]) == len(ev["generalization"]) > 0, "generalization rows differ"
for setting, a, b in rows:
    assert a.keys() == b.keys(), (setting, a, b)
    for name in a:
        same = a[name] == b[name] if name == "accuracy" else abs(a[name] - b[name]) <= 1e-5 * abs(a[name])
        if not same:
            sys.exit(f"eval_bf16_run: {setting} {name}: the run says {a[name]}, eval {b[name]}")
print(f"eval_bf16_run: the bf16 run evaluated at the avx2 level: accuracy {ev['final']['accuracy']}"
      f" = the run's, {len(rows)} rows equal")
EOF
