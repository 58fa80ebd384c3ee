#!/usr/bin/env bash
# The CUDA kernels' device code is unchanged by the launch macros (src/kernels/cuda/launch.cuh):
# nvcc -ptx of src/kernels/cuda/*.cu at REF and at AFTER, byte for byte, for each architecture the
# build targets (sm_80, sm_90). Without arguments: the commit that introduced POSENC_LAUNCH against
# its parent, the macros' change alone (later changes to the kernels are meant to change the PTX);
# with REF and no AFTER: REF against the working tree.
#   scripts/check_ptx.sh [REF [AFTER]]   exit 0: identical; 1: differs; 77: no nvcc
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
  echo "check_ptx: no nvcc (set NVCC): skipped"
  exit 77
fi
ref=${1:-}
after_ref=${2:-}
if [ -z "$ref" ]; then
  introduced=$(git -C "$root" log --format=%H -S'POSENC_LAUNCH' -- src/kernels/cuda/rope_cuda.cu |
    tail -n 1)
  ref=${introduced:+$introduced^}
  ref=${ref:-HEAD}
  after_ref=$introduced
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Both sides compile at the same path: nvcc names the anonymous namespace after the file's path.
tree="$tmp/tree"
status=0
for side in before after; do
  rm -rf "$tree"
  mkdir -p "$tree/src/kernels" "$tree/include/posenc" "$tmp/$side"
  if [ $side = before ]; then
    git -C "$root" archive "$ref" src/kernels/cuda include/posenc/kernels | tar -x -C "$tree"
  elif [ -n "$after_ref" ]; then
    git -C "$root" archive "$after_ref" src/kernels/cuda include/posenc/kernels | tar -x -C "$tree"
  else
    cp -r "$root/src/kernels/cuda" "$tree/src/kernels/"
    cp -r "$root/include/posenc/kernels" "$tree/include/posenc/"
  fi
  for cu in rope_cuda attention_cuda; do
    for arch in 80 90; do
      "$nvcc" -ptx -std=c++17 -O3 -DNDEBUG -arch=sm_$arch -I"$tree/include" \
        -o "$tmp/$side/$cu.sm_$arch.ptx" "$tree/src/kernels/cuda/$cu.cu"
    done
  done
done
for cu in rope_cuda attention_cuda; do
  for arch in 80 90; do
    after="$tmp/after/$cu.sm_$arch.ptx"
    entries=$(grep -c '\.entry ' "$after" || true)
    if cmp -s "$tmp/before/$cu.sm_$arch.ptx" "$after"; then
      echo "check_ptx: $cu.cu sm_$arch: ${after_ref:-the working tree} identical to $ref" \
        "($(wc -c <"$after") bytes, $entries kernels)"
    else
      echo "check_ptx: $cu.cu sm_$arch: ${after_ref:-the working tree} DIFFERS from $ref"
      diff "$tmp/before/$cu.sm_$arch.ptx" "$after" | head -20
      status=1
    fi
  done
done
exit $status
