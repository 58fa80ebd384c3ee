#!/usr/bin/env bash
# The resolution experiment (docs/experiments.md, "1b"): the main job's ViT trained at 28 px on
# Fashion-MNIST with axial 2D RoPE, RoPE-Mixed, DINOv3's RoPE without and with its coordinate
# augmentation, a learned table and 2D sin-cos (seeds 0, 1, 2; 4 epochs), each evaluated at 1x,
# 1.5x and 2x (configs/vit_resolution.yaml). Writes runs/vit_resolution/ (each run's folder,
# results.md/.csv/.png of `posenc compare`), then prints the table of seed means and writes its
# chart to runs/vit_resolution/resolution.svg.
#   bash scripts/resolution_experiment.sh                    # 18 runs, 2-7 min each (2 cores)
#   bash scripts/resolution_experiment.sh --set train.threads=1   # extra arguments: posenc compare
# --resume continues stopped runs; finished ones are only evaluated again.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
posenc_configure
cmake --build "${POSENC_BUILD_DIR}" -j "$(nproc)" --target posenc_cli
cd "${POSENC_ROOT}"
"${POSENC_BUILD_DIR}/posenc" compare configs/vit_resolution.yaml "$@"
PYTHON="${HOME}/.cache/posenc/venv/bin/python"
[ -x "${PYTHON}" ] || PYTHON=python3
"${PYTHON}" tools/resolution_table.py runs/vit_resolution --svg runs/vit_resolution/resolution.svg
