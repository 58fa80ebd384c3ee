#!/usr/bin/env bash
# A tour of the tool: build `posenc`, then show what encoders compute
# with `posenc inspect` and draw them with `posenc plot` into out/.
#   bash scripts/demo.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
posenc_configure
cmake --build "${POSENC_BUILD_DIR}" -j "$(nproc)" --target posenc_cli example_dog_bit_man
posenc="${POSENC_BUILD_DIR}/posenc"
out="${POSENC_ROOT}/out"
mkdir -p "$out"
set -x
"$posenc" inspect --config '{"type": "sinusoidal"}' --positions 0:3 --dim 8
"$posenc" inspect --config "${POSENC_ROOT}/configs/encoders/llama3.yaml" --positions '[0, 1, 8191]' --dim 128
"$posenc" inspect --config '{"type": "alibi", "num_heads": 6}' --positions 0:4
"$posenc" plot --config '{"type": "sinusoidal"}' --positions 0:100 --dim 128 --out "$out/sinusoidal.png"
"$posenc" plot --config '{"type": "sinusoidal"}' --positions 0:100 --dim 128 --similarity-to 50 --out "$out/sinusoidal_similarity.png"
"$posenc" plot --config "${POSENC_ROOT}/configs/encoders/rope_yarn.yaml" --positions 0:256 --dim 64 --out "$out/rope_yarn_cos.png"
"$posenc" plot --config '{"type": "axial_sincos"}' --positions grid:14x14 --dim 128 --similarity-to 100 --out "$out/axial_similarity.png"
"$posenc" plot --config '{"type": "alibi", "num_heads": 8}' --positions 0:32 --out "$out/alibi.png"
"$posenc" plot --config "${POSENC_ROOT}/configs/encoders/t5.yaml" --positions 0:64 --heads 4 --out "$out/t5.png"
"${POSENC_BUILD_DIR}/examples/example_dog_bit_man"
