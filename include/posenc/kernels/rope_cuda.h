// CUDA RoPE kernel, raw-pointer interface (no LibTorch); posenc/functional/rope.h is the
// specification and rope_apply the oracle.
//
// rope_rotate_tables is the path behind rope_fused* on CUDA tensors: the per-pair cos/sin tables
// of rope_cos_sin (any scaling, xPos or multi-axis sections already folded in), up to two
// tensors (q and k, which may differ in heads) in one launch, out of place or in place:
//   x, y:     [B, N, H_t, Dh_t] (element strides; the last dim contiguous)
//   cos, sin: float32 [N, F] or [B, N, F] contiguous, 2F <= Dh_t; dims 2F.. are copied to y
// One block per token; each thread rotates V consecutive pairs with one vector load per operand
// (16 bytes: V = 4 fp32 / 8 bf16 in the half layout) when pointers and strides allow, else V = 1.
// Rounding: float32 products and sums rounded once to the storage type (default; nvcc may fuse a
// product and the sum), or, with round_each_op, each product and the sum rounded to the storage
// type with no fused multiply-add: eager PyTorch's `x * cos + rotate_half(x) * sin` to the bit
// (posenc::apply_rotary on CUDA tensors; the CPU kernel's round_each_op,
// posenc/kernels/rope_fused.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace posenc::cuda {

enum class Storage { kFloat32, kBFloat16, kFloat16 };

struct RopeTableTensor {
  const void* x = nullptr;
  void* y = nullptr;  ///< may equal x (in place)
  int64_t heads = 0, head_dim = 0;
  int64_t x_stride_batch = 0, x_stride_token = 0, x_stride_head = 0;  ///< in elements
  int64_t y_stride_batch = 0, y_stride_token = 0, y_stride_head = 0;
};

struct RopeTableLaunch {
  RopeTableTensor tensors[2];
  int count = 1;  ///< 1 (x) or 2 (q and k)
  Storage storage = Storage::kFloat32;
  int64_t batch = 0, tokens = 0;
  const float* cos = nullptr;
  const float* sin = nullptr;
  bool table_batched = false;  ///< [B, N, F] instead of [N, F]
  int64_t pairs = 0;           ///< F
  bool interleaved = false;
  float sign = 1.0f;  ///< -1: the inverse rotation
  /// Round each product and the sum to the storage type, as eager PyTorch (no FMA); false: compute
  /// a pair in float32 and round once.
  bool round_each_op = false;
};

/// Rotates every tensor of `launch` on `stream`; returns the launch error.
cudaError_t rope_rotate_tables(const RopeTableLaunch& launch, cudaStream_t stream);

}  // namespace posenc::cuda
