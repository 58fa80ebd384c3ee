#!/usr/bin/env bash
# What the CPU emulator (tests/cuda_emu) cannot see, read from the compiler: register spills and
# local memory in the CUDA kernels. Compiles src/kernels/cuda/{rope,attention}_cuda.cu with
# `nvcc -Xptxas -v` for each architecture the build targets (sm_80, sm_90) and reads, per kernel,
# "N bytes stack frame, N bytes spill stores, N bytes spill loads" and "Used N registers".
#
# Policy: any spill store/load or any stack frame (local memory: a spill or a dynamically indexed
# per-thread array, both ~100x slower than a register) fails, for every kernel. The exceptions
# are the kernels listed in scripts/ptxas_baseline.txt with their figures as of the nvcc that
# wrote them; a listed kernel fails when any figure grows. A listed kernel that no longer spills
# prints a note (another nvcc may allocate differently) so the entry can be dropped.
#
#   scripts/check_ptxas.sh            exit 0: nothing beyond the baseline; 1: a new or grown spill
#                                     (one line per kernel); 77: no nvcc
#   scripts/check_ptxas.sh --table    also prints the markdown table of docs/library.md
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), POSENC_PTXAS_ARCHS
# (default "80 90"), POSENC_PTXAS_FLAGS (extra nvcc flags: -maxrregcount=32 forces spills, which
# is how this check is shown to fail), POSENC_PTXAS_BASELINE (default scripts/ptxas_baseline.txt).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
  echo "check_ptxas: no nvcc (set NVCC): skipped"
  exit 77
fi
table=0
[ "${1:-}" = --table ] && table=1
archs=${POSENC_PTXAS_ARCHS:-80 90}
baseline=${POSENC_PTXAS_BASELINE:-$root/scripts/ptxas_baseline.txt}
read -r -a extra <<<"${POSENC_PTXAS_FLAGS:-}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gencode=()
for arch in $archs; do
  gencode+=("--generate-code=arch=compute_$arch,code=sm_$arch")
done
# The two files in parallel (attention_cuda.cu is ~30 s of ptxas on one core).
pids=()
for cu in rope_cuda attention_cuda; do
  "$nvcc" -c -std=c++17 -O3 -DNDEBUG -I"$root/include" "${gencode[@]}" -Xptxas -v ${extra[@]+"${extra[@]}"} \
    -o /dev/null "$root/src/kernels/cuda/$cu.cu" >"$tmp/$cu.log" 2>&1 &
  pids+=($!)
done
i=0
for cu in rope_cuda attention_cuda; do
  if ! wait "${pids[$i]}"; then
    echo "check_ptxas: nvcc failed on $cu.cu; its output:"
    cat "$tmp/$cu.log"
    exit 1
  fi
  i=$((i + 1))
done
# One row per (architecture, kernel): arch regs stack spill_stores spill_loads name (tab-separated;
# the name demangled, its namespace and parameter list dropped).
cat "$tmp/rope_cuda.log" "$tmp/attention_cuda.log" |
  awk -v q="'" '
    /Compiling entry function/ { split($0, f, q); name = f[2]; arch = f[4] }
    /bytes stack frame/ { stack = $1; stores = $5; loads = $9 }
    /Used [0-9]+ registers/ { printf "%s\t%s\t%s\t%s\t%s\t%s\n", arch, $5, stack, stores, loads, name }' |
  c++filt | sed -E 's/\tvoid posenc::cuda::\(anonymous namespace\)::/\t/; s/\([^()]*\)$//' \
  >"$tmp/kernels.tsv"
kernels=$(wc -l <"$tmp/kernels.tsv")
if [ "$kernels" -eq 0 ]; then
  echo "check_ptxas: read no kernel from ptxas -v (has its output format changed?); logs:"
  cat "$tmp/rope_cuda.log" "$tmp/attention_cuda.log"
  exit 1
fi
grep -v '^#' "$baseline" | grep -v '^$' >"$tmp/baseline.tsv" || true
awk -F '\t' -v baseline="$tmp/baseline.tsv" -v archs="$(echo $archs | sed -E 's/[0-9]+/sm_&/g')" -v kernels="$kernels" '
  BEGIN {
    while ((getline line < baseline) > 0) {
      split(line, b, "\t")  # arch name stack stores loads
      key = b[1] "\t" b[2]; known[key] = 1; bstack[key] = b[3]; bstores[key] = b[4]; bloads[key] = b[5]
    }
    status = 0; listed = 0; maxregs = 0
  }
  {
    key = $1 "\t" $6; seen[key] = 1
    if ($2 + 0 > maxregs) maxregs = $2 + 0
    if ($3 + 0 == 0 && $4 + 0 == 0 && $5 + 0 == 0) { if (key in known) improved[key] = 1; next }
    figures = sprintf("%s %s: %s registers, %s bytes stack frame, %s bytes spill stores, %s bytes spill loads", $1, $6, $2, $3, $4, $5)
    if (key in known && $3 <= bstack[key] && $4 <= bstores[key] && $5 <= bloads[key]) { listed++; next }
    if (key in known)
      printf "check_ptxas: SPILL GREW %s (baseline %s/%s/%s)\n", figures, bstack[key], bstores[key], bloads[key]
    else
      printf "check_ptxas: SPILL %s\n", figures
    status = 1
  }
  END {
    for (key in known) {
      split(key, k, "\t")
      if (!(key in seen)) printf "check_ptxas: note: baseline kernel %s %s was not compiled\n", k[1], k[2]
      else if (key in improved) printf "check_ptxas: note: %s %s no longer spills; drop it from the baseline\n", k[1], k[2]
    }
    if (status == 0)
      printf "check_ptxas: %d kernels (%s): no spill or local memory beyond the %d known in the baseline; at most %d registers\n", kernels, archs, listed, maxregs
    exit status
  }' "$tmp/kernels.tsv" || status=$?
if [ "$table" = 1 ]; then
  # One row per kernel: registers and stack/spill-store/spill-load bytes for each architecture.
  echo "| kernel |$(for a in $archs; do printf ' sm_%s registers | sm_%s stack/spill st/ld |' "$a" "$a"; done)"
  echo "|---|$(for _ in $archs; do printf -- '---:|---:|'; done)"
  awk -F '\t' -v archs="$archs" '
    BEGIN { n = split(archs, a, " ") }
    { regs[$1, $6] = $2; spill[$1, $6] = $3 "/" $4 "/" $5; if (!($6 in order)) { order[$6] = ++count; names[count] = $6 } }
    END {
      for (i = 1; i <= count; i++) {
        row = "| `" names[i] "` |"
        for (j = 1; j <= n; j++) row = row " " regs["sm_" a[j], names[i]] " | " spill["sm_" a[j], names[i]] " |"
        print row
      }
    }' "$tmp/kernels.tsv"
fi
exit "${status:-0}"
