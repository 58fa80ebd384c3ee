// Internal: the glue between tensors and the raw CUDA kernels (rope_cuda.h, attention_cuda.h),
// built only when the LibTorch has CUDA (POSENC_HAS_CUDA_GLUE). The rotation is the CUDA kernel of
// the operators posenc::rope_rotate* (registered per dispatch key in src/ops/rope_rotate.cpp);
// attention_fused routes CUDA tensors here at its one dispatch point (attention_autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "posenc/kernels/attention.h"
#include "posenc/kernels/rope.h"

namespace posenc::detail {

/// rope_rotate_cpu's contract on CUDA tensors (fp32/bf16/fp16; cos/sin moved to the device).
void rope_rotate_cuda(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout,
                      bool inverse);

/// Whether the CUDA attention kernel takes q (device, dtype, head dim).
bool attention_cuda_supported(const at::Tensor& q);

/// attention_fused on CUDA tensors (arguments already checked by attention_fused): the CUDA
/// forward and backward kernels (gradients for q, k, v and a T5 table).
at::Tensor attention_fused_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const BiasSpec& bias, const at::Tensor& q_positions,
                                const at::Tensor& k_positions, const AttentionMasks& masks,
                                double scale);

}  // namespace posenc::detail
