#!/usr/bin/env bash
# posenc setup: installs what the build needs and is quiet when everything is there.
#
#   bash scripts/setup.sh          # idempotent; prints only what it installs
#
# - Debian packages: compiler tools, OpenCV, zlib, CLI11, yaml-cpp, nlohmann-json,
#   spdlog/fmt, GoogleTest and Google Benchmark, Gloo, libsndfile and libsamplerate (audio),
#   espeak-ng (spoken words for experiment 8); data: Fashion-MNIST (dataset-fashion-mnist).
# - LibTorch: the C++ libraries, headers and CMake config inside PyPI's `torch` wheel (pinned
#   below), unpacked into ${POSENC_DEPS:-~/.cache/posenc}. Only the CPU libraries are taken
#   (libtorch_cpu, libc10, libgomp) plus the two small CUDA runtime libraries that libtorch_cpu
#   links against (libcudart, libcupti, from their own pinned PyPI wheels); the 500 MB CUDA
#   kernel library is left out. Prints the LibTorch root on stdout with --print-torch-root.
# - Data from Debian packages that are downloaded and unpacked, not installed
#   (python3-vega-datasets' CSVs; statsmodels' CO2 series; Gutenberg books from two Go packages' test data; pymecavideo's example videos; Asterisk's spoken prompts in five languages) into ${POSENC_DEPS:-~/.cache/posenc}/data (--print-data-dir).
set -euo pipefail

TORCH_VERSION=2.15.0
CUDA_WHEEL_VERSION=13.2.86 # nvidia-cuda-runtime / nvidia-cuda-cupti, as torch 2.15.0 requires
DEPS=${POSENC_DEPS:-${HOME}/.cache/posenc}
TORCH_ROOT=${DEPS}/libtorch-${TORCH_VERSION}

if [[ "${1:-}" == "--print-data-dir" ]]; then
  echo "${DEPS}/data"
  exit 0
fi
if [[ "${1:-}" == "--print-venv" ]]; then
  echo "${DEPS}/venv"
  exit 0
fi
if [[ "${1:-}" == "--print-torch-root" ]]; then
  echo "${TORCH_ROOT}/torch"
  exit 0
fi

say() { echo "[setup] $*" >&2; }

# ---- Debian packages ------------------------------------------------------------------------
APT_PACKAGES=(cmake ninja-build g++ ccache unzip python3 python3-pip
  libopencv-dev libcli11-dev libyaml-cpp-dev nlohmann-json3-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  dataset-fashion-mnist libgloo-dev libsndfile1-dev libsamplerate0-dev espeak-ng)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# ---- LibTorch from the PyPI wheel --------------------------------------------------------------
if [[ ! -f "${TORCH_ROOT}/.complete" ]]; then
  say "fetching LibTorch ${TORCH_VERSION} (PyPI torch wheel) into ${TORCH_ROOT}"
  rm -rf "${TORCH_ROOT}"
  mkdir -p "${TORCH_ROOT}"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_25_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$tmp" \
    "torch==${TORCH_VERSION}" "nvidia-cuda-runtime==${CUDA_WHEEL_VERSION}" \
    "nvidia-cuda-cupti==${CUDA_WHEEL_VERSION}" 2>&1 | grep -v -i "notice" >&2 || true
  ls "$tmp"/torch-*.whl >/dev/null
  unzip -q -o "$tmp"/torch-*.whl -d "${TORCH_ROOT}" 'torch/lib/libc10.so' \
    'torch/lib/libtorch_cpu.so' 'torch/lib/libgomp.so.1' 'torch/include/*' 'torch/share/cmake/*' \
    'torch/version.py'
  unzip -q -o "$tmp"/nvidia_cuda_runtime-*.whl -d "${TORCH_ROOT}" 'nvidia/cu13/lib/libcudart.so.13'
  unzip -q -o "$tmp"/nvidia_cuda_cupti-*.whl -d "${TORCH_ROOT}" 'nvidia/cu13/lib/libcupti.so.13'
  # libtorch_cpu's RPATH is $ORIGIN/../../nvidia/cu13/lib: the layout above satisfies it.
  touch "${TORCH_ROOT}/.complete"
fi

# ---- the Python test environment (tests/python: posenc's operators against transformers/timm/diffusers)
# A venv with the pinned set in python/requirements-test.txt (torch 2.15.0 with its CUDA
# libraries as PyPI ships them: ~5 GB). Skipped with POSENC_NO_PYTHON=1; --print-venv prints it.
# A changed requirements file updates an existing venv in place (pip replaces what is pinned
# otherwise and adds new lines; torch is not downloaded again when its pin is unchanged).
VENV=${DEPS}/venv
REQUIREMENTS="$(cd "$(dirname "$0")/.." && pwd)/python/requirements-test.txt"
if [[ "${POSENC_NO_PYTHON:-0}" != 1 ]]; then
  stamp="${VENV}/.complete-$(sha256sum "${REQUIREMENTS}" | cut -c1-16)"
  if [[ ! -f "$stamp" ]]; then
    say "installing the Python test environment (torch ${TORCH_VERSION}, transformers, timm, diffusers) into ${VENV}"
    [[ -x "${VENV}/bin/python" ]] || python3 -m venv "${VENV}"
    "${VENV}/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      -r "${REQUIREMENTS}" 2>&1 | grep -v -i "notice" >&2 || true
    "${VENV}/bin/python" -c "import torch, transformers, timm, diffusers, pytest" 2>/dev/null ||
      { echo "setup: the Python test environment in ${VENV} does not import torch/transformers/timm/diffusers/pytest" >&2; exit 1; }
    [[ -x "${VENV}/bin/ruff" ]] ||
      { echo "setup: the Python test environment in ${VENV} has no ruff (python/requirements-test.txt pins it)" >&2; exit 1; }
    touch "$stamp"
  fi
fi

# ---- real data shipped inside Debian packages (taken out, not installed) ------------------------
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO=sudo
# unpack_debs PKG...: downloads the packages without installing them and unpacks them into a
# temporary folder; prints the unpacked root (the caller copies what it needs, then removes it).
unpack_debs() {
  local tmp
  tmp=$(mktemp -d)
  chmod 755 "$tmp"  # apt's download user must be able to write there
  if ! (cd "$tmp" && apt-get download -q "$@" >/dev/null 2>&1); then
    $SUDO apt-get update -qq >/dev/null
    (cd "$tmp" && apt-get download -q "$@" >/dev/null)
  fi
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/x"; done
  echo "$tmp/x"
}
DATA=${DEPS}/data
# python3-vega-datasets: hourly 2010 temperatures (seattle-temps.csv, sf-temps.csv).
if [[ ! -f "${DATA}/vega/.complete" ]]; then
  say "extracting the vega-datasets CSVs into ${DATA}/vega"
  x=$(unpack_debs python3-vega-datasets)
  mkdir -p "${DATA}/vega"
  cp "$x"/usr/lib/python3/dist-packages/vega_datasets/_data/{seattle-temps,sf-temps}.csv "${DATA}/vega/"
  rm -rf "$(dirname "$x")"
  touch "${DATA}/vega/.complete"
fi
# python3-statsmodels: the weekly Mauna Loa CO2 series (co2.csv).
if [[ ! -f "${DATA}/statsmodels/.complete" ]]; then
  say "extracting the statsmodels CO2 series into ${DATA}/statsmodels"
  x=$(unpack_debs python3-statsmodels)
  mkdir -p "${DATA}/statsmodels"
  cp "$x/usr/lib/python3/dist-packages/statsmodels/datasets/co2/co2.csv" "${DATA}/statsmodels/"
  rm -rf "$(dirname "$x")"
  touch "${DATA}/statsmodels/.complete"
fi
# Project Gutenberg books from two Go packages' test data.
if [[ ! -f "${DATA}/gutenberg/.complete" ]]; then
  say "extracting Project Gutenberg books into ${DATA}/gutenberg"
  x=$(unpack_debs golang-github-colinmarc-hdfs-dev golang-github-pierrec-lz4-dev)
  mkdir -p "${DATA}/gutenberg"
  go="$x/usr/share/gocode/src/github.com"
  cp "$go/colinmarc/hdfs/testdata/mobydick.txt" "${DATA}/gutenberg/moby-dick.txt"
  cp "$go/pierrec/lz4/testdata/pg1661.txt" "${DATA}/gutenberg/sherlock-holmes.txt"
  cp "$go/pierrec/lz4/testdata/Mark.Twain-Tom.Sawyer.txt" "${DATA}/gutenberg/tom-sawyer.txt"
  rm -rf "$(dirname "$x")"
  touch "${DATA}/gutenberg/.complete"
fi
# python3-mecavideo: short real videos of mechanics experiments (pymecavideo's examples).
if [[ ! -f "${DATA}/mecavideo/.complete" ]]; then
  say "extracting pymecavideo's example videos into ${DATA}/mecavideo"
  x=$(unpack_debs python3-mecavideo)
  mkdir -p "${DATA}/mecavideo"
  cp "$x"/usr/share/pymecavideo/data/video/{Principe_inertie.avi,Effet_force_magnetique.ogv} \
    "${DATA}/mecavideo/"
  rm -rf "$(dirname "$x")"
  touch "${DATA}/mecavideo/.complete"
fi
# asterisk-core-sounds-{en,es,fr,it,ru}-wav: Asterisk's spoken prompts, 8 kHz mono 16-bit WAV
# (CC-BY-SA 3.0; each language's Debian copyright file is copied beside it). Speakers: en_US and
# es_MX Allison (the same voice), fr_CA June, it_IT Carlo, ru_RU IvrvoiceRU. Checked counts below.
if [[ ! -f "${DATA}/asterisk/.complete" ]]; then
  say "extracting Asterisk's spoken prompts (en, es, fr, it, ru) into ${DATA}/asterisk"
  x=$(unpack_debs asterisk-core-sounds-{en,es,fr,it,ru}-wav)
  rm -rf "${DATA}/asterisk"
  mkdir -p "${DATA}/asterisk"
  declare -A voice=([en]=en_US_f_Allison [es]=es_MX_f_Allison [fr]=fr_CA_f_June
    [it]=it_IT_m_Carlo [ru]=ru_RU_f_IvrvoiceRU)
  declare -A count=([en]=568 [es]=527 [fr]=561 [it]=599 [ru]=576)  # WAV files in 1.6.1-1
  for lang in en es fr it ru; do
    src="$x/usr/share/asterisk/sounds/${voice[$lang]}"
    [[ -d "$src" ]] || { echo "setup: asterisk-core-sounds-${lang}-wav has no ${src#"$x"}" >&2; exit 1; }
    n=$(find "$src" -name '*.wav' | wc -l)
    [[ "$n" == "${count[$lang]}" ]] ||
      { echo "setup: asterisk-core-sounds-${lang}-wav: expected ${count[$lang]} WAV files, found $n" >&2; exit 1; }
    cp -r "$src" "${DATA}/asterisk/${lang}"
    cp "$x/usr/share/doc/asterisk-core-sounds-${lang}-wav/copyright" "${DATA}/asterisk/${lang}/COPYRIGHT"
  done
  rm -rf "$(dirname "$x")"
  touch "${DATA}/asterisk/.complete"
fi
# Spoken direction words for experiment 8, synthesized with espeak-ng 1.51 (GPL-3; its output is
# free to use): "right", "left", "down", "up" in 8 English accents x 3 voice variants x 3 speeds =
# 72 voices, 288 WAV files (22050 Hz mono 16-bit), one folder per voice (<accent>+<variant>_s<wpm>).
if [[ ! -f "${DATA}/spoken_directions/.complete" ]]; then
  say "synthesizing spoken direction words with espeak-ng into ${DATA}/spoken_directions"
  rm -rf "${DATA}/spoken_directions"
  tmp="${DATA}/spoken_directions.tmp"
  rm -rf "$tmp"
  for accent in en-gb en-us en-gb-scotland en-gb-x-rp en-gb-x-gbclan en-gb-x-gbcwmd en-029 en-us-nyc; do
    for variant in m1 f2 m3; do
      for wpm in 150 180 210; do
        folder="$tmp/${accent}+${variant}_s${wpm}"
        mkdir -p "$folder"
        for word in right left down up; do
          espeak-ng -v "${accent}+${variant}" -s "$wpm" -w "$folder/$word.wav" "$word" ||
            { echo "setup: espeak-ng failed on voice ${accent}+${variant}, word '$word'" >&2; exit 1; }
        done
      done
    done
  done
  n=$(find "$tmp" -name '*.wav' -size +1k | wc -l)
  [[ "$n" == 288 ]] || { echo "setup: espeak-ng wrote $n non-empty WAV files, expected 288" >&2; exit 1; }
  mv "$tmp" "${DATA}/spoken_directions"
  touch "${DATA}/spoken_directions/.complete"
fi
