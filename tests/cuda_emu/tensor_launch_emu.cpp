// src/kernels/cuda/tensor_launch.cpp (the glue from tensors to the CUDA kernels) compiled against
// the CPU emulator: the LibTorch headers first (precompiled; they never see the shim's macros),
// then the shim, so the glue's cudaGetErrorString and the kernels it launches are the emulator's.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include "cuda_emu.h"

// after the shim
#include "../../src/kernels/cuda/tensor_launch.cpp"
