#!/usr/bin/env bash
# GPU build and checks, for a machine with only CUDA, CMake and Python's (CUDA-enabled) torch:
# builds the core, the CUDA kernels and the glue against the LibTorch inside Python's torch
# (TorchConfig.cmake, POSENC_TORCH_USE_CONFIG=ON) in build-gpu/, then runs posenc_cuda_tests,
# posenc_tests, the Python attention operators and apply_rotary on CUDA
# (tests/python/test_attention_cuda.py, test_apply_rotary_cuda.py, where pytest is there), posenc_cuda_tests under compute-sanitizer (memcheck, racecheck, synccheck) and
# bench_cuda. What it needs besides (GoogleTest, Google Benchmark, yaml-cpp,
# nlohmann-json) it builds from the sources scripts/pack_gpu_deps.sh packs into
# .gpu-deps/ (no apt, no internet needed here).
#
# Through the device `run` tool (pack first, on the dev machine: bash scripts/pack_gpu_deps.sh):
#   run(command="bash scripts/gpu.sh", carry=[".gpu-deps"], timeout_s=600)
# Logs go to $OUT (the run tool's fetched folder) or build-gpu/logs. Knobs (environment):
#   POSENC_GPU_STEPS     which steps, default "deps configure build test sanitize bench"
#   POSENC_GPU_SANITIZERS         compute-sanitizer tools, default "memcheck racecheck synccheck"
#   POSENC_GPU_SANITIZER_FILTER   gtest filter for them, default * (all of posenc_cuda_tests)
#   POSENC_GPU_ARCH      CMAKE_CUDA_ARCHITECTURES, default 90 (H100/H200)
#   POSENC_GPU_TORCH_USE_CONFIG  ON (default); OFF links a LibTorch folder directly
#   POSENC_GPU_TORCH_ROOT        the torch folder, default Python torch's (import torch)
#   POSENC_GPU_BUILD     the build folder, default build-gpu
#   POSENC_GPU_BENCH_ARGS         default --benchmark_min_time=0.1
#   POSENC_GPU_JOBS      parallel jobs, default nproc
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "${ROOT}"
BUILD="${POSENC_GPU_BUILD:-build-gpu}"
LOGS="${OUT:-${ROOT}/${BUILD}/logs}"
DEPS="${ROOT}/.gpu-deps"
PREFIX="${ROOT}/${BUILD}/deps"
STEPS="${POSENC_GPU_STEPS:-deps configure build test sanitize bench}"
JOBS="${POSENC_GPU_JOBS:-$(nproc 2>/dev/null || echo 4)}"
mkdir -p "${LOGS}" "${PREFIX}"
say() { echo "gpu.sh: $*" | tee -a "${LOGS}/gpu.log" >&2; }
step() { [[ " ${STEPS} " == *" $1 "* ]]; }
# Runs a command with its output in ${LOGS}/$1.log; on failure prints the log's tail and exits.
logged() {
  local name="$1"; shift
  local t0=$SECONDS
  if "$@" > "${LOGS}/${name}.log" 2>&1; then
    say "${name}: ok ($((SECONDS - t0)) s)"
  else
    local rc=$?
    say "${name}: FAILED (exit ${rc}); tail of ${LOGS}/${name}.log:"
    tail -40 "${LOGS}/${name}.log" >&2
    exit "${rc}"
  fi
}
GENERATOR=()
command -v ninja > /dev/null && GENERATOR=(-G Ninja)
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"

say "host $(hostname), ${JOBS} cores; $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "nvcc: $(${NVCC} --version 2>/dev/null | tail -1); cmake: $(cmake --version | head -1)"

# ---- dependencies from .gpu-deps (each built once into ${PREFIX}) --------------------------------
build_dep() {  # name, source dir, cmake args...
  local name="$1" src="$2"; shift 2
  [[ -f "${PREFIX}/.${name}" ]] && return 0
  logged "dep-${name}" sh -c "cmake -S '${src}' -B '${ROOT}/${BUILD}/deps-build/${name}' ${GENERATOR[*]} \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX='${PREFIX}' \
      -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF $* && \
    cmake --build '${ROOT}/${BUILD}/deps-build/${name}' -j ${JOBS} && \
    cmake --install '${ROOT}/${BUILD}/deps-build/${name}'"
  touch "${PREFIX}/.${name}"
}
unpack() {  # name -> prints the unpacked source dir
  local dir="${ROOT}/${BUILD}/deps-src/$1"
  if [[ ! -d "${dir}" ]]; then
    mkdir -p "${dir}"
    tar -xf "${DEPS}"/tarballs/"$1".orig.tar.* -C "${dir}" --strip-components=1
  fi
  echo "${dir}"
}
if step deps; then
  [[ -f "${DEPS}/.complete" ]] || { say "no ${DEPS}: run scripts/pack_gpu_deps.sh on the dev machine and carry .gpu-deps"; exit 2; }
  build_dep googletest "${DEPS}/googletest" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON
  build_dep benchmark "$(unpack benchmark)" -DBENCHMARK_ENABLE_TESTING=OFF \
    -DBENCHMARK_ENABLE_GTEST_TESTS=OFF -DBENCHMARK_ENABLE_WERROR=OFF -DBENCHMARK_ENABLE_LTO=OFF
  build_dep yaml-cpp "$(unpack yaml-cpp)" -DYAML_CPP_BUILD_TESTS=OFF -DYAML_CPP_BUILD_TOOLS=OFF \
    -DYAML_CPP_BUILD_CONTRIB=OFF -DYAML_BUILD_SHARED_LIBS=OFF
  build_dep nlohmann-json "$(unpack nlohmann-json3)" -DJSON_BuildTests=OFF -DJSON_Install=ON
fi

# ---- configure against Python's torch --------------------------------------------------------------
if step configure; then
  USE_CONFIG="${POSENC_GPU_TORCH_USE_CONFIG:-ON}"
  TORCH_ROOT="${POSENC_GPU_TORCH_ROOT:-$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')}"
  TORCH_PREFIX="${TORCH_ROOT}/share/cmake"
  say "torch: ${TORCH_ROOT} ($(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null || echo '?'))"
  # TorchConfig otherwise detects the GPUs with a CUDA try_run, which CMake < 3.26 cannot build
  # (TorchConfig asks for the CUDA20 dialect before the project enables CUDA)
  arch="${POSENC_GPU_ARCH:-90}"
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-${arch%?}.${arch: -1}}"
  logged configure cmake -S . -B "${BUILD}" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="${PREFIX};${TORCH_PREFIX}" \
    -DPOSENC_TORCH_USE_CONFIG="${USE_CONFIG}" -DPOSENC_TORCH_ROOT="${TORCH_ROOT}" \
    -DPOSENC_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="${NVCC}" \
    -DCMAKE_CUDA_ARCHITECTURES="${POSENC_GPU_ARCH:-90}" \
    -DPOSENC_BUILD_CLI=OFF -DPOSENC_BUILD_MODALITIES=OFF -DPOSENC_BUILD_EXAMPLES=OFF \
    -DPOSENC_BUILD_TESTS=ON -DPOSENC_BUILD_BENCH=ON
  grep -E "posenc:|Torch|CUDA" "${LOGS}/configure.log" | head -20 >&2
fi

# ---- build, test, bench ------------------------------------------------------------------------------
if step build; then
  targets=(posenc_cuda_tests posenc_tests)
  grep -q "glue to CUDA tensors ON" "${LOGS}/configure.log" 2>/dev/null && targets+=(bench_cuda posenc_ops)
  logged build cmake --build "${BUILD}" -j "${JOBS}" --target "${targets[@]}"
fi
status=0
if step test; then
  say "posenc_cuda_tests:"
  "${BUILD}/tests/posenc_cuda_tests" > "${LOGS}/cuda_tests.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|Failure|error" "${LOGS}/cuda_tests.log" | head -60 >&2
  say "posenc_tests:"
  "${BUILD}/tests/posenc_tests" --gtest_brief=1 > "${LOGS}/cpu_tests.log" 2>&1 || status=1
  tail -5 "${LOGS}/cpu_tests.log" >&2
  # the Python attention operators on CUDA tensors (their CUDA kernel) against the same on the CPU
  ops_library="$(find "${BUILD}" -name libposenc_ops.so 2>/dev/null | head -1)"
  if [[ -n "${ops_library}" ]] && python3 -c "import pytest" 2> /dev/null; then
    say "python attention operators and apply_rotary on CUDA (tests/python/test_attention_cuda.py, test_apply_rotary_cuda.py):"
    POSENC_OPS_LIBRARY="${ops_library}" python3 -m pytest -q -p no:cacheprovider \
      tests/python/test_attention_cuda.py tests/python/test_apply_rotary_cuda.py \
      > "${LOGS}/python_cuda.log" 2>&1 || status=1
    tail -3 "${LOGS}/python_cuda.log" >&2
  else
    say "python attention operators on CUDA: skipped (no libposenc_ops.so with CUDA glue, or no pytest)"
  fi
fi
# ---- compute-sanitizer: what the CPU emulator cannot see (device out-of-bounds and misaligned
# accesses, shared-memory hazards between warps under the real scheduler, illegal barriers) -----
# Each tool over the raw-kernel and glue tests of posenc_cuda_tests; a report fails the run
# (--error-exitcode). Only on a machine with a GPU and compute-sanitizer (CUDA toolkit's bin/).
if step sanitize; then
  SANITIZER="$(command -v compute-sanitizer || echo "$(dirname "${NVCC}")/compute-sanitizer")"
  if ! nvidia-smi -L > /dev/null 2>&1; then
    say "compute-sanitizer: skipped (no GPU: nvidia-smi -L fails)"
  elif ! command -v "${SANITIZER}" > /dev/null 2>&1; then
    say "compute-sanitizer: skipped (not found on PATH nor beside ${NVCC})"
  elif [[ ! -x "${BUILD}/tests/posenc_cuda_tests" ]]; then
    say "compute-sanitizer: FAILED: no ${BUILD}/tests/posenc_cuda_tests (run the build step)"
    status=1
  else
    for tool in ${POSENC_GPU_SANITIZERS:-memcheck racecheck synccheck}; do
      if "${SANITIZER}" --tool "${tool}" --error-exitcode 86 --print-limit 20 \
          "${BUILD}/tests/posenc_cuda_tests" --gtest_brief=1 \
          --gtest_filter="${POSENC_GPU_SANITIZER_FILTER:-*}" > "${LOGS}/sanitizer_${tool}.log" 2>&1; then
        say "compute-sanitizer ${tool}: ok ($(grep -m1 -E 'ERROR SUMMARY' "${LOGS}/sanitizer_${tool}.log" || echo 'no summary'))"
      else
        say "compute-sanitizer ${tool}: FAILED; tail of ${LOGS}/sanitizer_${tool}.log:"
        tail -30 "${LOGS}/sanitizer_${tool}.log" >&2
        status=1
      fi
    done
  fi
fi
if step bench && [[ -x "${BUILD}/bench/bench_cuda" ]]; then
  say "bench_cuda:"
  # shellcheck disable=SC2086
  "${BUILD}/bench/bench_cuda" ${POSENC_GPU_BENCH_ARGS:---benchmark_min_time=0.1} \
    > "${LOGS}/bench_cuda.log" 2>&1 || status=1
  cat "${LOGS}/bench_cuda.log" >&2
fi
say "done (status ${status}); logs in ${LOGS}"
exit "${status}"
