// Glue from CUDA tensors to the raw CUDA kernels (include/posenc/kernels/{rope_cuda,
// attention_cuda}.h), compiled only when the LibTorch has CUDA (POSENC_HAS_CUDA_GLUE): the inputs'
// device made current, their current stream taken, and the rest (tensors into launch structs,
// outputs, casts) left to tensor_launch.cpp, which the CPU emulator's tests also run. Contracts
// are the public ones (posenc/kernels/rope_fused.h, attention_fused.h); the references rope_apply /
// attention_reference are the specification.
//   rope:      q [B, N, Hq, Dh], k [B, N, Hk, Dh] (last dim contiguous), cos/sin [N, F] | [B, N, F]
//   attention: q [B, Nq, H, D], k [B, Nk, H, D], v [B, Nk, H, Dv] -> [B, Nq, H, Dv]
// Attention's backward runs the CUDA backward kernels (no [H, Nq, Nk] tensor either way).
#include "cuda_glue.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "posenc/kernels/attention_cuda.h"
#include "tensor_launch.h"

namespace posenc::detail {

void rope_rotate_cuda(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout,
                      bool inverse) {
  TORCH_CHECK(!inputs.empty(), "rope_fused (CUDA): no input");
  const auto device = inputs[0].device();
  TORCH_CHECK(device.is_cuda(), "rope_fused (CUDA): q is on ", device, ", expected a CUDA device");
  c10::cuda::CUDAGuard guard(device);
  rope_rotate_launch(inputs, outputs, cos, sin, layout, inverse, c10::cuda::getCurrentCUDAStream());
}

void rope_rotate_cuda_eager(const std::vector<at::Tensor>& inputs,
                            const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                            const at::Tensor& sin, RopeLayout layout) {
  TORCH_CHECK(!inputs.empty(), "apply_rotary (CUDA): no input");
  const auto device = inputs[0].device();
  TORCH_CHECK(device.is_cuda(), "apply_rotary (CUDA): q is on ", device,
              ", expected a CUDA device");
  c10::cuda::CUDAGuard guard(device);
  rope_rotate_launch_eager(inputs, outputs, cos, sin, layout, c10::cuda::getCurrentCUDAStream());
}

bool attention_cuda_supported(const at::Tensor& q) {
  const auto dtype = q.scalar_type();
  return q.is_cuda() && (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) &&
         q.dim() == 4 && q.size(3) <= cuda::kAttentionMaxDim;
}

std::tuple<at::Tensor, at::Tensor> attention_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    const BiasSpec& bias, const at::Tensor& q_positions, const at::Tensor& k_positions,
    const AttentionMasks& masks, double scale) {
  c10::cuda::CUDAGuard guard(q.device());
  return attention_forward_launch(q, k, v, table, bias, q_positions, k_positions, masks, scale,
                                  c10::cuda::getCurrentCUDAStream());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& table, const BiasSpec& bias,
    const at::Tensor& q_positions, const at::Tensor& k_positions, const AttentionMasks& masks,
    double scale, at::Tensor* dvariate) {
  c10::cuda::CUDAGuard guard(q.device());
  return attention_backward_launch(grad_out, out, lse, q, k, v, table, bias, q_positions,
                                   k_positions, masks, scale, c10::cuda::getCurrentCUDAStream(),
                                   dvariate);
}

}  // namespace posenc::detail
