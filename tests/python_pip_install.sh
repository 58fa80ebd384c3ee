#!/usr/bin/env bash
# `pip install --no-build-isolation ./python` as a user runs it, into a folder (the venv itself is
# left alone), then the package imported from there, its operators loaded from the package.
#   bash tests/python_pip_install.sh PYTHON SOURCE_DIR WORK_DIR
set -euo pipefail
python=$1 source=$2 work=$3
"$python" -c 'import torch, scikit_build_core' 2>/dev/null ||
  { echo "no torch/scikit-build-core in $python (scripts/setup.sh installs them)"; exit 77; }
rm -rf "$work/target"
mkdir -p "$work"
# the build folder persists under python/build (ignored by git): a rerun builds what changed
"$python" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
  --target "$work/target" "$source/python" >"$work/pip.log" 2>&1 ||
  { tail -40 "$work/pip.log"; echo "pip install failed (full log: $work/pip.log)"; exit 1; }
cd "$work"
env -u POSENC_OPS_LIBRARY PYTHONPATH="$work/target" "$python" - <<'PY'
import torch, posenc
q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
cos, sin = posenc.rope_cos_sin(torch.arange(3.0)[None], 1.0 / 10000 ** (torch.arange(0, 8, 2) / 8))
q2, k2 = posenc.apply_rotary_pos_emb(q, k, cos, sin)
route = torch.ops.posenc.apply_rotary_route(q, k, cos, sin, 1, "half")
print(f"posenc from {posenc.__file__}: rotated q {list(q2.shape)} {route}")
PY
