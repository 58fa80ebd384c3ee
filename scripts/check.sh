#!/usr/bin/env bash
# Sanitized test runs (not part of scripts/test.sh: a sanitized build takes ~20+ minutes on 2 cores).
#   bash scripts/check.sh            # AddressSanitizer + UndefinedBehaviorSanitizer: unit suite
#   bash scripts/check.sh thread     # ThreadSanitizer: the kernel tests (fused RoPE, attention),
#                                    # then the CUDA kernels on the emulator's thread engine
#   bash scripts/check.sh distributed  # ThreadSanitizer: the data-parallel tests (c10d Gloo ranks
#                                      # as processes of the sanitized tool; a report fails a rank)
# Builds into build-asan/ or build-tsan/ (LibTorch itself is not instrumented: reports come from
# posenc's code and what it calls), runs the GoogleTest binary, fails on the first report.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
mode=${1:-address}
case "$mode" in
  address)
    dir="${POSENC_ROOT}/build-asan"
    flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g1"
    filter="*"
    target=posenc_tests
    export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:detect_odr_violation=0"
    export LSAN_OPTIONS="suppressions=${POSENC_ROOT}/scripts/lsan.supp:print_suppressions=0"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    ;;
  thread)
    dir="${POSENC_ROOT}/build-tsan"
    flags="-fsanitize=thread -fno-omit-frame-pointer -g1"
    filter="*"
    target=posenc_kernel_tests  # and posenc_cuda_emu_tests where configured (below)
    export TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:suppressions=${POSENC_ROOT}/scripts/tsan.supp"
    ;;
  distributed)
    dir="${POSENC_ROOT}/build-tsan"
    flags="-fsanitize=thread -fno-omit-frame-pointer -g1"
    filter="Smoke/TwoRanks.*:DataParallel.*-DataParallel.Nccl*"
    target="posenc_tests posenc"
    # report_mutex_bugs=0: LibTorch's Gloo threads wait on condition variables whose mutex was
    # locked inside uninstrumented libtorch_cpu ("unlock of an unlocked mutex" in every rank);
    # tsan_distributed.supp: the objects Gloo's workers hand to a rank's main thread (see there)
    mkdir -p "$dir"
    cat "${POSENC_ROOT}/scripts/tsan.supp" "${POSENC_ROOT}/scripts/tsan_distributed.supp" \
      >"$dir/tsan_distributed_all.supp"
    export TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:report_mutex_bugs=0:suppressions=$dir/tsan_distributed_all.supp"
    ;;
  *)
    echo "usage: bash scripts/check.sh [address|thread|distributed]" >&2
    exit 2
    ;;
esac
start=$(date +%s)
POSENC_BUILD_DIR="$dir" posenc_configure -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
  -DPOSENC_BUILD_BENCH=OFF -DPOSENC_BUILD_EXAMPLES=OFF -DPOSENC_WITH_CUDA=OFF
# the CUDA emulator's tests exist where the CUDA headers are (tests/CMakeLists.txt decides)
if [ "$mode" = thread ] &&
  grep -qs '/posenc_cuda_emu_tests.dir$' "$dir/CMakeFiles/TargetDirectories.txt"; then
  target="$target posenc_cuda_emu_tests"
fi
# shellcheck disable=SC2086  # target may name two targets
cmake --build "$dir" -j "${POSENC_JOBS:-$(nproc)}" --target $target
built=$(date +%s)
"$dir/tests/${target%% *}" --gtest_filter="$filter"
end=$(date +%s)
echo "check ($mode): build $((built - start)) s, tests $((end - built)) s, no sanitizer report"
if [ "$mode" = thread ]; then
  if [[ "$target" == *posenc_cuda_emu_tests* ]]; then
    # The CUDA kernels on the emulator's thread engine (tests/cuda_emu/cuda_emu.cpp: one OS thread
    # per CUDA thread, happens-before only where a GPU gives it), so a missing __syncthreads is a
    # reported race (scripts/cuda_emu_mutants.sh shows it). The emulator's self-tests but the
    # thread engine's are left out: they switch to the fiber schedules, whose stack switches TSan
    # cannot follow. 85 tests (18 with packed samples and the variate bias), several minutes on 2
    # cores.
    POSENC_CUDA_EMU_SCHEDULE=threads "$dir/tests/posenc_cuda_emu_tests" \
      --gtest_filter='CudaEmu.ThreadEngine*:*CudaRaw*:*TensorLaunch*'
    echo "check (thread): the CUDA kernels on the emulator's thread engine:" \
      "$(($(date +%s) - end)) s, no sanitizer report"
  else
    echo "check (thread): no CUDA headers, so no CUDA emulator tests under TSan"
  fi
fi
