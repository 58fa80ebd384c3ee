#!/usr/bin/env bash
# A read-only filesystem: a training run whose folder would be created on a read-only tmpfs fails
# with one line naming the folder and the cause, exit code 1 (the environment, not bad input).
# Needs root to mount the tmpfs: skipped (77) otherwise.
#   tests/read_only.sh POSENC_BINARY CONFIG WORK_DIR
set -uo pipefail
posenc=$1 config=$2 work=$3
source "$(dirname "$0")/tmpfs.sh"
mount_tmpfs read_only "$work" size=64k,ro
err=$("$posenc" train "$config" --out "$work/run" --quiet 2>&1 >/dev/null)
code=$?
echo "exit=$code"
echo "$err"
[[ $code -eq 1 && $(echo "$err" | wc -l) -eq 1 && "$err" == *"Read-only file system"* ]]
