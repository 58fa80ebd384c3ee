// tests/test_cuda_raw.cpp, unchanged, against the CPU emulator. The shim comes after the LibTorch
// and GoogleTest headers (precompiled; a -include of it would come before them and void the PCH),
// so they never see its macros.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "cuda_emu.h"

// after the shim: cudaMalloc and the rest are the emulator's
#include "../test_cuda_raw.cpp"
