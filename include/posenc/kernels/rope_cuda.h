// CUDA RoPE kernel, raw-pointer interface (no LibTorch): rotates x in place by angles
// p_token * inv_freq_i, in the half or interleaved pairing (posenc/functional/rope.h is the
// specification; rope_apply is the oracle). One block per token: the block computes the token's
// F (cos, sin) pairs once into shared memory (angles in float64, reduced, then float32) and
// every head reuses them.
//
//   x:         [B, N, H, Dh] with the given element strides (the last dim contiguous)
//   positions: float64, [B * N] when positions_batched, else [N]
//   inv_freq:  float32 [F], 2F <= Dh; dims 2F..Dh-1 pass through
//   sign:      +1 forward, -1 the inverse rotation (the backward pass)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace posenc::cuda {

enum class Storage { kFloat32, kBFloat16, kFloat16 };

struct RopeLaunch {
  void* x = nullptr;
  Storage storage = Storage::kFloat32;
  int64_t batch = 0, tokens = 0, heads = 0, head_dim = 0;
  int64_t stride_batch = 0, stride_token = 0, stride_head = 0;  ///< in elements
  const double* positions = nullptr;
  bool positions_batched = false;
  const float* inv_freq = nullptr;
  int64_t pairs = 0;  ///< F
  bool interleaved = false;
  float scaling = 1.0f;  ///< attention scaling, multiplies cos and sin
  float sign = 1.0f;
};

/// Launches the kernel on `stream`; returns the launch error (cudaSuccess when fine).
cudaError_t rope_rotate_inplace(const RopeLaunch& launch, cudaStream_t stream);

}  // namespace posenc::cuda
