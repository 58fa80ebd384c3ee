// Internal: the glue between tensors and the raw CUDA kernels (rope_cuda.h, attention_cuda.h),
// built only when the LibTorch has CUDA (POSENC_HAS_CUDA_GLUE). The rotation is the CUDA kernel of
// the operators posenc::rope_rotate* (registered per dispatch key in
// src/kernels/dispatch/rope_rotate_operator.cpp); so are the forward and backward of
// posenc::attention_fused (src/kernels/dispatch/attention_fused_operator.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>
#include <vector>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"

namespace posenc::detail {

/// rope_rotate_cpu's contract on CUDA tensors (fp32/bf16/fp16; cos/sin moved to the device).
void rope_rotate_cuda(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout,
                      bool inverse);
/// posenc::apply_rotary on CUDA: the kernel's eager mode (detail::rope_rotate_launch_eager, the
/// whole tables [N, W] or [B, N, W] read per element): eager's `x * cos + rotate_half(x) * sin` to
/// the bit, enqueued on the current stream with no read of any value (no device wait).
void rope_rotate_cuda_eager(const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                            const at::Tensor& sin, RopeLayout layout);

/// Whether the CUDA attention kernel takes q (device, dtype, head dim).
bool attention_cuda_supported(const at::Tensor& q);

/// The CUDA kernels of posenc::_attention_fused_forward / _attention_fused_backward
/// (src/kernels/dispatch/attention_fused_operator.cpp: arguments checked there, RoPE applied
/// before): q, k, v [B, N, H, D] on one device; table: the T5 table or [0]; bias: one part (ALiBi
/// or T5). masks: causal, key padding, packed samples and the binary variate bias. Forward -> (out
/// [B, Nq, H, Dv] in q's dtype, lse [B, H, Nq] float32); backward -> (dq, dk, dv, dtable: the T5
/// table's gradient, or undefined), *dvariate (when given): the variate bias's [2, H] float32.
std::tuple<at::Tensor, at::Tensor> attention_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    const BiasSpec& bias, const at::Tensor& q_positions, const at::Tensor& k_positions,
    const AttentionMasks& masks, double scale);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& table, const BiasSpec& bias,
    const at::Tensor& q_positions, const at::Tensor& k_positions, const AttentionMasks& masks,
    double scale, at::Tensor* dvariate = nullptr);
}  // namespace posenc::detail
