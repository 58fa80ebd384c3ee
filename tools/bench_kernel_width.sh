#!/usr/bin/env bash
# Runs bench/bench_kernel_width.cpp (the element-wise fused CPU kernels against copy_ of their
# bytes and against ATen, issue 49) at each posenc CPU level the machine has (avx2, avx512), with
# ATen at its own level and at avx2, for 1 and 2 threads; each process repeats every case
# (random interleaving) and its ratio table uses the medians. Prints the CPU and the load before
# and after each process, and each process's ratio table.
#   bash tools/bench_kernel_width.sh [repetitions, default 5] [extra benchmark flags...]
# Output: one block per (posenc level, ATen level, threads); logs under ${OUT_DIR:-/tmp}.
# Every case writes into outputs allocated before its loop (no page faults of fresh outputs in the
# timed loop) but ATen's layer norm, which has no out= kernel: GLIBC_TUNABLES below keeps its
# freed outputs in the heap, so fresh pages from mmap on every call are not measured there either.
# The per-level GELU cases (avx2/gelu, avx512/gelu, ...) run both vector levels in every process.
# The "paired" rows time copy_ and the fused pass back to back in every iteration (alternating
# which goes first) and take the median of the per-iteration ratios: on a shared machine both
# halves of a pair see the same load, where cases run 0.2 s apart do not. 2-thread figures need a
# quiet machine (an OpenMP team waiting for a busy core swings them by 100x).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${BIN:-${ROOT}/build/bench/bench_kernel_width}
REPS=${1:-5}
shift || true
OUT_DIR=${OUT_DIR:-/tmp}
[[ -x ${BIN} ]] || { echo "bench_kernel_width: build it first (cmake --build build --target bench_kernel_width)" >&2; exit 2; }
grep -m1 'model name' /proc/cpuinfo || true
# outputs below 32 MiB come from the heap and stay there when freed (no page faults per call)
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296
levels=(avx2)
grep -qw avx512f /proc/cpuinfo && levels+=(avx512)
for threads in 1 2; do
  for level in "${levels[@]}"; do
    atens=("${level}")
    [[ ${level} == avx2 ]] || atens+=(avx2)
    for aten in "${atens[@]}"; do
      log=${OUT_DIR}/bench_kernel_width_${level}_aten-${aten}_t${threads}.log
      echo "== posenc ${level}, ATen ${aten}, ${threads} thread(s); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
      POSENC_CPU_CAPABILITY=${level} ATEN_CPU_CAPABILITY=${aten} "${BIN}" \
        --threads="${threads}" --benchmark_repetitions="${REPS}" \
        --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=false \
        "$@" >"${log}" 2>&1
      echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); log: ${log}"
      sed -n '/^threads:/p;/^CPU kernels/,$p' "${log}"
    done
  done
done
