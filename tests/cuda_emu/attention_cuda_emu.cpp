// src/kernels/cuda/attention_cuda.cu compiled by g++ as C++ for the CPU emulator; cuda_emu.h is
// force-included before it (-include, see tests/CMakeLists.txt).
#include "../../src/kernels/cuda/attention_cuda.cu"
