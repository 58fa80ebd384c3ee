#!/usr/bin/env bash
# Long fuzz runs of every input reader (tests/fuzz/fuzz_inputs.cpp), SECONDS each (default 600).
#   bash scripts/fuzz.sh [SECONDS] [BUILD_DIR]
# A crash leaves its input in fuzz-current.bin in the working folder: that is the reproducer.
set -euo pipefail
source "$(dirname "$0")/env.sh"
seconds=${1:-600}
build=${2:-${POSENC_BUILD_DIR}}
cmake --build "$build" --target fuzz_inputs >/dev/null
for target in config hf positions csv idx; do
  "$build/tests/fuzz_inputs" "$target" "$seconds" "$RANDOM"
done
