// Fused rotary kernels (CPU; CUDA in rope_cuda.h): q and k rotated in one pass over memory.
//
// Same math as the reference rope_apply (posenc/functional/rope.h), which is their
// specification and test oracle:
//   (x_a, x_b) -> (x_a c - x_b s, x_b c + x_a s),  pairs (i, i+F) [half] or (2i, 2i+1)
//   [interleaved], dims 2F..Dh-1 copied. The backward pass is the same kernel with s negated
//   (the inverse rotation).
// cos/sin are per-pair tables computed once per token (positions x inv_freq, float64 angles,
// float32 values; attention scaling and xPos folded in) and reused across heads and q/k.
//
//   q: [B, Nq, H, Dh]  k: [B, Nk, H, Dh]  (any strides; the last dim contiguous is fastest)
//   cos, sin: [N, F] or [B, N, F] float32, F <= Dh/2
// Storage fp32/fp64/bf16/fp16; reduced types are rotated in fp32.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>

#include "posenc/functional/rope.h"

namespace posenc {

// The three below call the operators posenc::rope_rotate, rope_rotate_qk and rope_rotate_ through
// PyTorch's dispatcher (src/kernels/dispatch/rope_rotate_operator.h): CPU and CUDA kernels per
// dispatch key, autograd whose backward is the operator again (differentiable). cos/sin: float32.

/// Autograd-aware fused rotation of one tensor (out of place).
at::Tensor rope_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeLayout layout);
/// Autograd-aware fused rotation of q and k sharing positions (one parallel pass).
std::pair<at::Tensor, at::Tensor> rope_fused_qk(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                RopeLayout layout);
/// In place, no autograd (inference; KV-cache writes).
void rope_fused_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout);
/// Whether the fused path takes these inputs: float32 tables that need no gradient, on x's device
/// (CPU) or anywhere (CUDA, where the CUDA kernel is registered).
bool rope_fused_supported(const at::Tensor& x, const at::Tensor& cos);

/// The raw CPU kernel: rotates each x[i] into out[i] (out[i] may be x[i]); all share B, N and
/// cos/sin. inverse: rotate by -angle. Products and sums round separately (no fused
/// multiply-add): float32/float64 results equal eager `x * cos + rotate_half(x) * sin` to the bit.
/// round_each_op: bfloat16/float16 products are rounded to the storage type before the sum, as
/// eager PyTorch rounds them (bit-exact with it); otherwise they round once, from float32.
void rope_rotate_cpu(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout, bool inverse,
                     bool round_each_op = false);

}  // namespace posenc
