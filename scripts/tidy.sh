#!/usr/bin/env bash
# clang-tidy (.clang-tidy: bugprone, performance, modernize subsets) over posenc's sources, with
# the build's compile_commands.json (configure first: bash scripts/test.sh or posenc_configure).
#   bash scripts/tidy.sh                 # the .cpp files changed since origin/main (or HEAD~1)
#   bash scripts/tidy.sh src/a.cpp ...   # these files
# Each LibTorch translation unit takes ~20-40 s; the whole tree is ~150 of them.
set -euo pipefail
source "$(dirname "$0")/env.sh"
cd "${POSENC_ROOT}"
[[ -f "${POSENC_BUILD_DIR}/compile_commands.json" ]] ||
  { echo "tidy: no ${POSENC_BUILD_DIR}/compile_commands.json; configure the build first" >&2; exit 2; }
command -v clang-tidy >/dev/null || { echo "tidy: clang-tidy is not installed (apt-get install clang-tidy)" >&2; exit 1; }
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
files=("$@")
if ((${#files[@]} == 0)); then
  base=$(git rev-parse --verify -q origin/main || git rev-parse HEAD~1)
  mapfile -t files < <(git diff --name-only "$base" -- '*.cpp' | grep -v '^tests/fuzz/' || true)
fi
((${#files[@]})) || { echo "tidy: no changed .cpp files"; exit 0; }
status=0
for f in "${files[@]}"; do
  [[ -f "$f" ]] || continue
  echo "== $f"
  clang-tidy -p "$db" --quiet "$f" 2>/dev/null | grep -v "^[0-9]* warnings generated" || true
done
exit $status
