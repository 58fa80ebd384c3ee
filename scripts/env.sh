# Sourced by the scripts: build folder, ccache settings that work with precompiled headers.
POSENC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
POSENC_BUILD_DIR=${POSENC_BUILD_DIR:-${POSENC_ROOT}/build}
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
posenc_configure() {
  local launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake -S "${POSENC_ROOT}" -B "${POSENC_BUILD_DIR}" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    "${launcher[@]}" "$@" >/dev/null
}
