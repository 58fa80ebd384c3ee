#!/usr/bin/env bash
# The irregular-sampling experiment (docs/experiments.md, "3c"): two real sensors (hourly 2010
# temperatures of Seattle and San Francisco, vega-datasets) each losing readings on its own (30%
# at random and in bursts of 2-24), forecast by the same small packed forecaster (tokens (patch,
# variate), binary variate bias, samples packed 128 tokens per row) with the field's patch-index
# RoPE, with RoPE on the real timestamps, and with Time2Vec on the real timestamps; seeds 0, 1, 2
# (configs/forecast_irregular.yaml). Writes runs/forecast_irregular/ (each run's folder,
# results.md/.csv/.png of `posenc compare`), then prints the seed tables (MAE, MASE; MAE by the
# largest gap) and writes the chart of MAE by gap to runs/forecast_irregular/irregular.svg.
#   bash scripts/irregular_experiment.sh                         # 9 runs, ~2 min each (2 cores)
#   bash scripts/irregular_experiment.sh --set train.max_steps=300   # extra arguments: posenc compare
# --resume continues stopped runs; finished ones are only evaluated again.
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
posenc_configure
cmake --build "${POSENC_BUILD_DIR}" -j "$(nproc)" --target posenc_cli
cd "${POSENC_ROOT}"
"${POSENC_BUILD_DIR}/posenc" compare configs/forecast_irregular.yaml "$@"
PYTHON="${HOME}/.cache/posenc/venv/bin/python"
[ -x "${PYTHON}" ] || PYTHON=python3
"${PYTHON}" tools/irregular_table.py runs/forecast_irregular --svg runs/forecast_irregular/irregular.svg
