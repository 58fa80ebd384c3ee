#!/usr/bin/env bash
# The test command: set up what is missing, build everything, run every test with CTest.
#   bash scripts/test.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
bash "${POSENC_ROOT}/scripts/setup.sh"
posenc_configure
cmake --build "${POSENC_BUILD_DIR}" -j "$(nproc)"
ctest --test-dir "${POSENC_BUILD_DIR}" --output-on-failure
