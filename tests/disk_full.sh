#!/usr/bin/env bash
# Disk full: a training run whose folder sits on a 600 KiB tmpfs fails with one line naming the
# file and the cause, exit code 1 (an environment failure, not bad input), and leaves no
# temporary file. Needs root to mount the tmpfs: skipped (77) otherwise.
#   tests/disk_full.sh POSENC_BINARY CONFIG WORK_DIR
set -uo pipefail
posenc=$1 config=$2 work=$3
source "$(dirname "$0")/tmpfs.sh"
mount_tmpfs disk_full "$work" size=600k
"$posenc" train "$config" --out "$work/run" --quiet > "$work/../disk_full.out" 2> "$work/../disk_full.err"
code=$?
err=$(cat "$work/../disk_full.err")
echo "exit=$code"
echo "$err"
leftover=$(find "$work" -name '*.tmp' | wc -l)
echo "tmp files left: $leftover"
[[ $code -eq 1 && $(echo "$err" | wc -l) -eq 1 && $leftover -eq 0 ]]
