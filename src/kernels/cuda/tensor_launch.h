// Internal: tensors into the raw CUDA kernels' launch structs (rope_cuda.h, attention_cuda.h),
// with no CUDA runtime call of its own: the kernels' entry points are the only CUDA it names, and
// the caller gives the stream. cuda_glue.cpp calls it on CUDA tensors (device guard and current
// stream there); the CPU emulator's tests (tests/cuda_emu) call the same code on CPU tensors, so
// the strides, positions, T5 bucket lookup, padding mask, delta = dO . O and the dtype casts of
// the glue run in CI without a GPU.
//   rope:      q [B, N, Hq, Dh], k [B, N, Hk, Dh] (last dim contiguous), cos/sin [N, F] | [B, N, F]
//   attention: q [B, Nq, H, D], k [B, Nk, H, D], v [B, Nk, H, Dv] -> out [B, Nq, H, Dv],
//              lse [B, H, Nq] float32; backward -> dq, dk, dv in the inputs' dtypes, dtable,
//              dvariate; masks.sample_ids into per-token sample bounds (sample_first/last),
//              masks.variate_ids / variate_bias as they are (values checked by the operator)
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <tuple>
#include <vector>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"

namespace posenc::detail {

/// rope_rotate_cpu's contract (posenc/kernels/rope_fused.h) through cuda::rope_rotate_tables: every
/// tensor on one device (cos/sin moved there as float32), fp32/bf16/fp16; per-pair tables [N, F]
/// or [B, N, F].
void rope_rotate_launch(const std::vector<at::Tensor>& inputs,
                        const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                        const at::Tensor& sin, RopeLayout layout, bool inverse,
                        cudaStream_t stream);
/// posenc::apply_rotary's formula through the kernel's eager mode (rope_cuda.h): the same views of
/// q and k, but the whole tables cos, sin [N, W] or [B, N, W] (W = 2F even, in x's layout; moved
/// to the inputs' device as float32, exact for the float tables apply_rotary passes), every output
/// element reading its own entries, each product and the sum rounded to the storage type: eager's
/// `x * cos + rotate_half(x) * sin` to the bit, whatever the tables hold (no value is read here).
void rope_rotate_launch_eager(const std::vector<at::Tensor>& inputs,
                              const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                              const at::Tensor& sin, RopeLayout layout, cudaStream_t stream);

/// posenc::_attention_fused_forward's contract through cuda::attention_forward (arguments checked
/// by the operator; q, k, v share a device and a dtype; head dims <= cuda::kAttentionMaxDim).
std::tuple<at::Tensor, at::Tensor> attention_forward_launch(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    const BiasSpec& bias, const at::Tensor& q_positions, const at::Tensor& k_positions,
    const AttentionMasks& masks, double scale, cudaStream_t stream);

/// posenc::_attention_fused_backward's through cuda::attention_backward (tiles recomputed from
/// the saved log-sum-exp): (dq, dk, dv, dtable: the T5 table's gradient or undefined);
/// *dvariate (when given): masks.variate_bias's gradient [2, H] float32, or undefined without a
/// variate bias (the kernel's per-key-tile partial sums added up here: deterministic).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_launch(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, const at::Tensor& table, const BiasSpec& bias,
    const at::Tensor& q_positions, const at::Tensor& k_positions, const AttentionMasks& masks,
    double scale, cudaStream_t stream, at::Tensor* dvariate = nullptr);

}  // namespace posenc::detail
