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
// Two modes:
//   default  per-pair tables as above (one cos/sin per pair, the members of a pair share it);
//            float32 products and sums rounded once to the storage type (nvcc may fuse a product
//            and the sum)
//   eager    eager PyTorch's `x * cos + rotate_half(x) * sin` to the bit (posenc::apply_rotary on
//            CUDA tensors): cos, sin float32 [N, 2F] or [B, N, 2F] contiguous in x's own layout,
//            every output element reading its own entries (pair members may differ),
//              half:        y_i = x_i c_i - x_{i+F} s_i,   y_{i+F} = x_{i+F} c_{i+F} + x_i s_{i+F}
//              interleaved: y_2j = x_2j c_2j - x_2j+1 s_2j, y_2j+1 = x_2j+1 c_2j+1 + x_2j s_2j+1
//            each product and the sum rounded to the storage type with no fused multiply-add;
//            no inverse (sign must be 1)
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
  /// The eager mode (above): tables [.., 2F] read per element, each product and the sum rounded to
  /// the storage type (no FMA); false: per-pair tables [.., F], a pair computed in float32 and
  /// rounded once.
  bool eager = false;
};

/// Rotates every tensor of `launch` on `stream`; returns the launch error.
cudaError_t rope_rotate_tables(const RopeTableLaunch& launch, cudaStream_t stream);

}  // namespace posenc::cuda
