#!/usr/bin/env bash
# The main job: train a small ViT with 2D axial RoPE on Fashion-MNIST on the CPU (90.2% in 5 to
# 10 minutes on 2 cores, AVX-512 or AVX2 only, alone on the machine), then evaluate it at the
# training resolution and at 1.5x. Writes
# runs/vit_fashion/rope_2d/ (metrics.csv, curves.png, summary.json, weights.pt, checkpoint.pt).
#   bash scripts/run.sh              # extra arguments go to `posenc train`, e.g. --resume
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
posenc_configure
cmake --build "${POSENC_BUILD_DIR}" -j "$(nproc)" --target posenc_cli
cd "${POSENC_ROOT}"
"${POSENC_BUILD_DIR}/posenc" train configs/vit_fashion.yaml "$@"
