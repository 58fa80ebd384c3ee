#!/usr/bin/env bash
# The style checks, failing (exit 1) on any finding:
#   clang-format (.clang-format) on the C++ and CUDA files, clang-tidy (.clang-tidy: bugprone,
#   performance, modernize subsets) on the .cpp files with the build's compile_commands.json
#   (configure first: bash scripts/test.sh or posenc_configure), and ruff (ruff.toml: lint and
#   format) on the Python of python/, tools/ and tests/python/.
#   bash scripts/tidy.sh                 # the files changed since origin/main (or HEAD~1)
#   bash scripts/tidy.sh src/a.cpp x.py  # these files
#   POSENC_TIDY_SKIP=clang-tidy bash scripts/tidy.sh   # leave a check out (comma-separated:
#                                                      # clang-format, clang-tidy, ruff)
# Each LibTorch translation unit takes ~20-40 s in clang-tidy; the whole tree is ~150 of them.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "${POSENC_ROOT}"
skip=",${POSENC_TIDY_SKIP:-},"

files=("$@")
if ((${#files[@]} == 0)); then
  base=$(git rev-parse --verify -q origin/main || git rev-parse HEAD~1)
  mapfile -t files < <(git diff --name-only "$base" -- '*.cpp' '*.h' '*.cu' '*.cuh' '*.py' |
    grep -v '^tests/fuzz/' || true)
fi
existing=()
for f in "${files[@]}"; do [[ -f "$f" ]] && existing+=("$f"); done
((${#existing[@]})) || { echo "tidy: no changed files"; exit 0; }
cxx=() cpp=() py=()
for f in "${existing[@]}"; do
  case "$f" in
    *.cpp) cxx+=("$f"); cpp+=("$f") ;;
    *.h | *.cu | *.cuh) cxx+=("$f") ;;
    python/*.py | tools/*.py | tests/python/*.py) py+=("$f") ;;
  esac
done
status=0

# ---- clang-format: what `clang-format -i FILE` would change
if [[ "$skip" != *,clang-format,* ]] && ((${#cxx[@]})); then
  command -v clang-format >/dev/null ||
    { echo "tidy: clang-format is not installed (apt-get install clang-format)" >&2; exit 1; }
  echo "== clang-format (${#cxx[@]} files)"
  clang-format --dry-run --Werror "${cxx[@]}" || status=1
fi

# ---- clang-tidy: a warning in posenc's own code is a finding
if [[ "$skip" != *,clang-tidy,* ]] && ((${#cpp[@]})); then
  [[ -f "${POSENC_BUILD_DIR}/compile_commands.json" ]] ||
    { echo "tidy: no ${POSENC_BUILD_DIR}/compile_commands.json; configure the build first" >&2; exit 2; }
  command -v clang-tidy >/dev/null ||
    { echo "tidy: clang-tidy is not installed (apt-get install clang-tidy)" >&2; exit 1; }
  # clang cannot read GCC's precompiled headers: a copy of the compile commands without them
  db="${POSENC_BUILD_DIR}/tidy"
  mkdir -p "$db"
  python3 - "${POSENC_BUILD_DIR}/compile_commands.json" "$db/compile_commands.json" <<'PY'
import json, re, sys
entries = json.load(open(sys.argv[1]))
for e in entries:
    command = re.sub(r"-Xclang -include-pch -Xclang \S+|-include \S*cmake_pch\.hxx|-Winvalid-pch", "",
                     e["command"])
    e["command"] = command.replace("-fopenmp", "-fopenmp=libgomp")
json.dump(entries, open(sys.argv[2], "w"))
PY
  for f in "${cpp[@]}"; do
    echo "== clang-tidy $f"
    out=$(clang-tidy -p "$db" --quiet "$f" 2>/dev/null | grep -v "^[0-9]* warnings generated" || true)
    if [[ -n "$out" ]]; then
      printf '%s\n' "$out"
      grep -qE "(warning|error):" <<<"$out" && status=1
    fi
  done
fi

# ---- ruff: lint and format (the venv's pinned ruff, else one on PATH)
if [[ "$skip" != *,ruff,* ]] && ((${#py[@]})); then
  ruff="${POSENC_DEPS:-${HOME}/.cache/posenc}/venv/bin/ruff"
  [[ -x "$ruff" ]] || ruff=$(command -v ruff || true)
  [[ -n "$ruff" ]] ||
    { echo "tidy: ruff is not installed (scripts/setup.sh puts it in the venv)" >&2; exit 1; }
  echo "== ruff (${#py[@]} files)"
  "$ruff" check --no-cache "${py[@]}" || status=1
  "$ruff" format --no-cache --check "${py[@]}" || status=1
fi
((status == 0)) && echo "tidy: clean" || echo "tidy: findings above" >&2
exit $status
