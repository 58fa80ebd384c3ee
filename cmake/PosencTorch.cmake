# PosencTorch.cmake — defines the imported target posenc::torch for a LibTorch tree.
#
# POSENC_TORCH_ROOT: the `torch` folder of a LibTorch (lib/, include/, share/cmake/). By default
# the one scripts/setup.sh unpacks from PyPI's torch wheel (~/.cache/posenc/libtorch-*/torch).
#
# Two ways in:
#  - CPU LibTorch (the default here): link libtorch_cpu + libc10 directly. The wheel's own
#    TorchConfig.cmake would pull in libtorch_cuda (500 MB, and a CUDA runtime to run it),
#    which a CPU build neither needs nor ships.
#  - POSENC_TORCH_USE_CONFIG=ON: find_package(Torch) through the tree's TorchConfig.cmake, e.g.
#    a CUDA-enabled LibTorch inside Python's torch on a GPU machine.
if(TARGET posenc::torch)
  return()
endif()

set(POSENC_TORCH_ROOT "" CACHE PATH "LibTorch root (the folder holding lib/ and include/)")
option(POSENC_TORCH_USE_CONFIG "Use the LibTorch's TorchConfig.cmake (full, CUDA-capable)" OFF)

if(NOT POSENC_TORCH_ROOT AND DEFINED ENV{POSENC_TORCH_ROOT})
  set(POSENC_TORCH_ROOT "$ENV{POSENC_TORCH_ROOT}" CACHE PATH "LibTorch root" FORCE)
endif()
if(NOT POSENC_TORCH_ROOT)
  file(GLOB _posenc_torch_candidates "$ENV{HOME}/.cache/posenc/libtorch-*/torch")
  if(DEFINED ENV{POSENC_DEPS})
    file(GLOB _posenc_torch_env "$ENV{POSENC_DEPS}/libtorch-*/torch")
    list(PREPEND _posenc_torch_candidates ${_posenc_torch_env})
  endif()
  if(_posenc_torch_candidates)
    list(GET _posenc_torch_candidates 0 _posenc_first)
    set(POSENC_TORCH_ROOT "${_posenc_first}" CACHE PATH "LibTorch root" FORCE)
  endif()
endif()

if(POSENC_TORCH_USE_CONFIG)
  find_package(Torch REQUIRED CONFIG HINTS "${POSENC_TORCH_ROOT}/share/cmake/Torch")
  add_library(posenc::torch INTERFACE IMPORTED)
  set_target_properties(posenc::torch PROPERTIES INTERFACE_LINK_LIBRARIES "${TORCH_LIBRARIES}")
  # Python's torch finds its CUDA libraries (NCCL, cuDNN, cuBLAS, ...) in the nvidia/*/lib wheels
  # beside it, through libtorch_cuda's RPATH $ORIGIN/../../nvidia/...; at link time ld would
  # rather take a same-named library from a -rpath folder such as /usr/local/cuda/lib (an older
  # NCCL there fails the link with undefined ncclComm* symbols). -rpath-link is searched first.
  file(GLOB _posenc_nvidia_libs "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib")
  foreach(_dir IN LISTS _posenc_nvidia_libs)
    get_filename_component(_dir "${_dir}" REALPATH)
    set_property(TARGET posenc::torch APPEND PROPERTY INTERFACE_LINK_OPTIONS "-Wl,-rpath-link,${_dir}")
  endforeach()
  return()
endif()

find_library(POSENC_TORCH_CPU_LIB torch_cpu PATHS "${POSENC_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
find_library(POSENC_C10_LIB c10 PATHS "${POSENC_TORCH_ROOT}/lib" NO_DEFAULT_PATH)
if(NOT POSENC_TORCH_CPU_LIB OR NOT POSENC_C10_LIB OR NOT EXISTS "${POSENC_TORCH_ROOT}/include/torch")
  message(FATAL_ERROR
    "posenc: no LibTorch found at POSENC_TORCH_ROOT='${POSENC_TORCH_ROOT}' "
    "(expected lib/libtorch_cpu.so, lib/libc10.so and include/torch). "
    "Run scripts/setup.sh, or pass -DPOSENC_TORCH_ROOT=<path to the torch folder>.")
endif()

add_library(posenc::torch INTERFACE IMPORTED)
set_target_properties(posenc::torch PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES
    "${POSENC_TORCH_ROOT}/include;${POSENC_TORCH_ROOT}/include/torch/csrc/api/include"
  INTERFACE_LINK_LIBRARIES "${POSENC_TORCH_CPU_LIB};${POSENC_C10_LIB}"
  # LibTorch 2.x wheels are built with the C++11 ABI; its headers need C++20 since 2.10.
  INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=1"
  INTERFACE_COMPILE_FEATURES "cxx_std_20"
  INTERFACE_LINK_OPTIONS "-Wl,-rpath,${POSENC_TORCH_ROOT}/lib")
