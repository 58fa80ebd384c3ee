#!/usr/bin/env bash
# A read-only filesystem: a training run whose folder would be created on a read-only tmpfs fails
# with one line naming the folder and the cause, exit code 1 (the environment, not bad input;
# it was 2). Needs root to mount the tmpfs: skipped (77) otherwise.
#   tests/read_only.sh POSENC_BINARY CONFIG WORK_DIR
set -uo pipefail
posenc=$1 config=$2 work=$3
if [[ $(id -u) -ne 0 ]]; then
  echo "read_only: skipped: mounting a tmpfs needs root" >&2
  exit 77
fi
mkdir -p "$work"
umount "$work" 2>/dev/null
if ! mount -t tmpfs -o size=64k,ro tmpfs "$work" 2>/dev/null; then
  echo "read_only: skipped: cannot mount a tmpfs here" >&2
  exit 77
fi
trap 'umount "$work"' EXIT
err=$("$posenc" train "$config" --out "$work/run" --quiet 2>&1 >/dev/null)
code=$?
echo "exit=$code"
echo "$err"
[[ $code -eq 1 && $(echo "$err" | wc -l) -eq 1 && "$err" == *"Read-only file system"* ]]
