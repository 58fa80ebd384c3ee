#!/usr/bin/env bash
# Packs the sources that scripts/gpu.sh builds on a GPU machine that has only CUDA, CMake and
# Python's torch (no apt, no internet) into .gpu-deps/ (git-ignored; ~15 MB), for the device
# `run` tool to carry: run(command="bash scripts/gpu.sh", carry=[".gpu-deps"]).
#   googletest    /usr/src/googletest (Debian's libgtest-dev, installed by scripts/setup.sh)
#   benchmark, yaml-cpp, nlohmann-json3
#                 Debian's upstream source tarballs (*.orig.tar.*), fetched with `apt-get source
#                 --download-only` through a private deb-src list: the system's apt config and
#                 package state are left as they are.
# Idempotent: a present .gpu-deps/.complete skips everything (delete .gpu-deps to repack).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEPS="${ROOT}/.gpu-deps"
[[ -f "${DEPS}/.complete" ]] && { echo "${DEPS}"; exit 0; }
mkdir -p "${DEPS}"
say() { echo "pack_gpu_deps: $*" >&2; }

[[ -d /usr/src/googletest ]] || { say "no /usr/src/googletest (apt-get install libgtest-dev)"; exit 1; }
rm -rf "${DEPS}/googletest"
cp -r /usr/src/googletest "${DEPS}/googletest"

apt_dir="$(mktemp -d)"
trap 'rm -rf "${apt_dir}"' EXIT
mkdir -p "${apt_dir}/lists/partial" "${apt_dir}/cache/archives/partial"
. /etc/os-release
cat > "${apt_dir}/src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${VERSION_CODENAME}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
apt_opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=${apt_dir}"
          -o "Dir::State::Lists=${apt_dir}/lists" -o "Dir::Cache=${apt_dir}/cache"
          -o "APT::Sandbox::User=root")
say "fetching the deb-src index"
apt-get "${apt_opts[@]}" update -qq >&2
mkdir -p "${DEPS}/tarballs"
( cd "${apt_dir}" && apt-get "${apt_opts[@]}" source --download-only -qq \
    benchmark yaml-cpp nlohmann-json3 >&2 )
rm -f "${DEPS}"/tarballs/*
for name in benchmark yaml-cpp nlohmann-json3; do
  src=$(ls "${apt_dir}/${name}"_*.orig.tar.* | head -1)
  cp "${src}" "${DEPS}/tarballs/${name}.orig.tar.${src##*.orig.tar.}"
done
touch "${DEPS}/.complete"
say "packed: $(du -sh "${DEPS}" | cut -f1) in ${DEPS}"
echo "${DEPS}"
