#!/usr/bin/env bash
# Shows that the emulated CUDA suite (ctest cuda_emu) can fail: each mutation below is applied to
# a temporary copy of src/kernels/cuda, the emulator binary is relinked with that copy's kernels
# (the build's own commands, from build/compile_commands.json and ninja), and the suite must fail
# under the lockstep or the reverse schedule, or, for the ThreadSanitizer row, under the thread
# engine (POSENC_CUDA_EMU_SCHEDULE=threads) with the mutated kernels instrumented by
# -fsanitize=thread and TSan halting on its first report. Prints a table; exit 1 if a mutant
# survives.
#   scripts/cuda_emu_mutants.sh [BUILD_DIR]     (default: build; posenc_cuda_emu_tests built there)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ninja -C "$build" -t commands tests/posenc_cuda_emu_tests >"$tmp/commands" 2>/dev/null ||
  { echo "cuda_emu_mutants: build posenc_cuda_emu_tests in $build first (ninja)"; exit 2; }
link=$(tail -n 1 "$tmp/commands" | sed 's/^: && //; s/ && :$//')

# name | file | python literal to find | replacement | extra flags (compile and link) | schedules
# (default: lockstep reverse)
mutations=(
  "wrong tile index: a lane reads key row lane of the unpadded stride|attention_cuda.cu|const float* krow = ks + lane * ldk;|const float* krow = ks + lane * dim;|"
  "__syncthreads removed after loading a tile (read before write)|attention_cuda.cu|    __syncthreads();\n\n    const int64_t j = j0 + lane;\n    const bool key_real|\n    const int64_t j = j0 + lane;\n    const bool key_real|"
  "__syncthreads removed before overwriting a tile (write after read)|attention_cuda.cu|    __syncthreads();  // the previous tile is consumed (and qs, the ids written, the first time)\n|    // (barrier removed)\n|"
  "divergent __shfl_xor_sync: half a warp at another call site|attention_cuda.cu|  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));|  for (int o = 16; o > 0; o /= 2) {\n    if (threadIdx.x % 32 < 16)\n      x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));\n    else\n      x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));\n  }|"
  "forward shared memory one value row short|attention_cuda.cu|kBlockK * (a.dim + 1) + kBlockK * a.dim_v);|kBlockK * (a.dim + 1) + (kBlockK - 1) * a.dim_v);|"
  "dK/dV shared memory one dO row short|attention_cuda.cu|kBlockQ * (a.dim + 1 + a.dim_v + 1) +|kBlockQ * (a.dim + 1 + a.dim_v + 1) - (a.dim_v + 1) +|"
  "missing >48 KiB opt-in|attention_cuda.cu|  if (shared <= 48 * 1024) return cudaSuccess;|  return cudaSuccess;|"
  "misaligned 16-byte RoPE loads: pointer alignment unchecked (UBSan)|rope_cuda.cu|      ok = reinterpret_cast<uintptr_t>(u.x) % bytes == 0 &&\n           reinterpret_cast<uintptr_t>(u.y) % bytes == 0;|      ok = true;|-fsanitize=alignment -fno-sanitize-recover=alignment"
  "packed samples: the forward's sample check dropped (keys of other samples visible)|attention_cuda.cu|qsample_s[row] == ksample);  // same sample|true);  // same sample|"
  "packed samples: a query tile's key range one key short (the last sample's last key skipped)|attention_cuda.cu|  const int64_t last = static_cast<int64_t>(a.sample_last[row + i_last + offset]) + 1;|  const int64_t last = static_cast<int64_t>(a.sample_last[row + i_last + offset]);|"
  "packed samples: no tile skipping in the forward (every key tile read; the results stay right)|attention_cuda.cu|  if (kIds) packed_key_range(a, b, i0, &j_begin, &j_end);|  // (no tile skipping)|"
  "variate bias gradient: warp 0's partial sum left out of the block's reduce|attention_cuda.cu|      for (int w = 0; w < kWarps; ++w) sum += lse_s[2 * w + threadIdx.x];|      for (int w = 1; w < kWarps; ++w) sum += lse_s[2 * w + threadIdx.x];|"
  "RoPE wrong pair index: b = a + F - 1|rope_cuda.cu|reinterpret_cast<const Pack<T, V>*>(xr + i0 + a.pairs);|reinterpret_cast<const Pack<T, V>*>(xr + i0 + a.pairs - (a.pairs > V ? V : 0));|"
  "__syncthreads removed before overwriting a tile (write after read), ThreadSanitizer|attention_cuda.cu|    __syncthreads();  // the previous tile is consumed (and qs, the ids written, the first time)\n|    // (barrier removed)\n|-fsanitize=thread -g1|threads"
)

tsan_options="halt_on_error=1:suppressions=$root/scripts/tsan.supp"
printf '| mutation | file | lockstep | reverse | threads (TSan) | caught by |\n|---|---|---|---|---|---|\n'
survivors=0
for m in "${mutations[@]}"; do
  IFS='|' read -r name file find replace flags schedules <<<"$m"
  rm -rf "$tmp/src" && mkdir -p "$tmp/src/kernels" && cp -r "$root/src/kernels/cuda" "$tmp/src/kernels/"
  python3 - "$tmp/src/kernels/cuda/$file" "$find" "$replace" <<'EOF'
import sys
path, find, replace = sys.argv[1], sys.argv[2].replace("\\n", "\n"), sys.argv[3].replace("\\n", "\n")
text = open(path).read()
if text.count(find) < 1:
    sys.exit(f"mutation target not found in {path}: {find!r}")
open(path, "w").write(text.replace(find, replace, 1))
EOF
  stem=${file%.cu}
  printf '// mutant\n#include "%s"\n' "$tmp/src/kernels/cuda/$file" >"$tmp/${stem}_emu.cpp"
  object="tests/CMakeFiles/posenc_cuda_emu_tests.dir/cuda_emu/${stem}_emu.cpp.o"
  compile=$(python3 - "$build" "$stem" <<'EOF'
import json, sys
for c in json.load(open(sys.argv[1] + "/compile_commands.json")):
    if c["file"].endswith("/cuda_emu/" + sys.argv[2] + "_emu.cpp"):
        print(c["command"])
EOF
)
  compile=${compile/ -o $object / -o $tmp/mutant.o }
  compile="${compile% -c *} -c $tmp/${stem}_emu.cpp $flags"
  (cd "$build" && eval "$compile") >"$tmp/compile.log" 2>&1 || { cat "$tmp/compile.log"; exit 2; }
  mutant_link=${link/ $object / $tmp/mutant.o }
  mutant_link="${mutant_link/ -o tests\/posenc_cuda_emu_tests / -o $tmp/mutant } $flags"
  (cd "$build" && eval "$mutant_link") >"$tmp/link.log" 2>&1 || { cat "$tmp/link.log"; exit 2; }
  declare -A results=([lockstep]="-" [reverse]="-" [threads]="-")
  caught=""
  for schedule in ${schedules:-lockstep reverse}; do
    # the kernel tests only: the emulator's self-tests print faults on purpose (and switch to the
    # fiber schedules, which TSan cannot follow)
    if (POSENC_CUDA_EMU_SCHEDULE=$schedule TSAN_OPTIONS="$tsan_options" timeout 600 \
      "$tmp/mutant" --gtest_filter=-CudaEmu.* >"$tmp/run.log" 2>&1; exit $?) 2>/dev/null; then
      results[$schedule]="passes"  # (no exec above: the shell's crash note)
    else
      results[$schedule]="fails"
      if [ -n "$caught" ]; then
        :
      elif grep -q 'WARNING: ThreadSanitizer: data race' "$tmp/run.log"; then
        # the two accesses (kind, file:line, function) and the test that was running
        race=$(awk '/^  (Write|Read|Atomic|Previous)/ {
            kind = $1 == "Previous" ? "previous " $2 : tolower($1); getline
            sub(/^ *#0 /, ""); sub(/ \([^ ]*\+0x[0-9a-f]+\)$/, "")
            n = split($0, f, " "); at = f[n]; sub(/.*\//, "", at); $NF = ""; sub(/ $/, "")
            printf "%s%s at %s in `%s`", (count++ ? ", " : ""), kind, at, $0
            if (count == 2) exit }' "$tmp/run.log")
        test=$(grep '^\[ RUN' "$tmp/run.log" | tail -n 1 | sed 's/.*\] //')
        caught="ThreadSanitizer: data race: $race; in $test"
      else
        caught=$(grep -m1 -o 'posenc cuda_emu: .*\|runtime error: .*' "$tmp/run.log" |
          head -c 240 | tr '|' '/' || true)
        failed=$(grep -c '^\[  FAILED  \] .*(' "$tmp/run.log" || true)
        first=$(grep -m1 -o '^\[  FAILED  \] [^ ,]*' "$tmp/run.log" | sed 's/.*\] //' || true)
        caught="${caught:+$caught; }$failed tests failed${first:+, first $first}"
      fi
    fi
  done
  if [[ " ${results[*]} " != *" fails "* ]]; then
    survivors=$((survivors + 1))
    caught="SURVIVED"
  fi
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$file" "${results[lockstep]}" \
    "${results[reverse]}" "${results[threads]}" "$caught"
done
[ $survivors -eq 0 ]
