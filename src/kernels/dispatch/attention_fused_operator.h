// posenc::attention_fused — the C++ library's fused attention as an operator in PyTorch's
// dispatcher: scaled dot-product attention with the position bias computed inside the tiles and
// RoPE applied to the tiles' q and k rows (Press et al. 2022, ALiBi; Raffel et al. 2020, T5;
// Shaw et al. 2018; Su et al. 2021, RoPE):
//
//   logits_h(i, j) = (R(p_i) q_i,h) . (R(p_j) k_j,h) * scale + b_h(p_i, p_j)   (+ -inf masked)
//   b_h(i, j) = -slope_h (p_i - p_j)  or  -slope_h |p_i - p_j|                 (ALiBi)
//             + table[bucket(p_j - p_i), h]                                     (T5)
//             | q_i,h . table[clip(p_j - p_i, -K, K) + K] / sqrt(D)             (Shaw)
//   out_i,h = softmax_j(logits_h(i, .)) v_j,h ;  lse_h(i) = log sum_j exp(logits_h(i, j))
//
//   q [B, Nq, H, D], k [B, Nk, H, D], v [B, Nk, H, Dv] (float32/bfloat16/float16; any strides)
//   q_positions [Nq], k_positions [Nk]: any real positions (one axis; T5 and Shaw need integers)
//   slopes [H] (ALiBi, the parts folded), table [num_buckets, H] (T5) or [2K+1, D] (Shaw)
//   key_padding [B, Nk] bool (true: a real key), causal: key j visible to query i when
//   j <= i + Nk - Nq; q_cos .. k_sin per-pair float32 tables [Nq, F], [Nk, F] (RoPE inside)
//   sample_ids [B, Nk] int64 (packed samples: attend within equal ids, one run each), variate_ids
//   [B, Nk] int64 >= 0 with variate_bias [2, H] (+ variate_bias[ids equal, h]; Moirai's binary
//   bias); causal_ids [B, Nk] int64 (key j visible to query i when causal_ids[b, j] <=
//   causal_ids[b, i + Nk - Nq]: causal in these ids, e.g. Moirai-2's time_id; not with causal);
//   the queries take the last Nq ids. Sample and variate ids: both kernels; causal_ids: the CPU
//   kernel (CUDA refuses them).
//   -> out [B, Nq, H, Dv] in q's dtype (contiguous); lse [B, H, Nq] float32
//   _attention_fused_forward -> (out, lse), out on the CPU in float32: the accumulator's values,
//   which the backward reads for delta = dO . O (unrounded: bfloat16 dq, dk land on float64's
//   rounded values); on CUDA in q's dtype, as its kernel writes and reads it
//
// The dispatcher is the one dispatch point between devices: CPU -> the tiled kernel
// (src/kernels/cpu/attention_cpu.cpp), CUDA -> the CUDA kernel's glue (src/kernels/cuda/, where the
// LibTorch has CUDA; RoPE as one rotation pass before it, posenc::rope_rotate), Autograd ->
// ../autograd/attention_fused_autograd.cpp (forward: _attention_fused_forward, backward:
// _attention_fused_backward, each with a CPU and a CUDA kernel; gradients for q, k, v, the
// table and variate_bias). The specification is attention_reference with bias_from_spec
// (posenc/kernels/attention_fused.h). The C++ library's attention_fused (that header) calls this
// operator; fakes: python/posenc/_meta.py.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <tuple>

namespace posenc::ops {

// The operators' parameters after (q, k, v), in the schema's order (attention_fused_operator.cpp).
#define POSENC_ATTENTION_FUSED_PARAMS                                                            \
  const at::Tensor &q_positions, const at::Tensor &k_positions,                                  \
      const std::optional<at::Tensor>&slopes, bool symmetric,                                    \
      const std::optional<at::Tensor>&table, c10::string_view table_form, int64_t num_buckets,   \
      int64_t max_distance, bool bidirectional, int64_t max_relative_position, bool causal,      \
      const std::optional<at::Tensor>&key_padding, double scale,                                 \
      const std::optional<at::Tensor>&q_cos, const std::optional<at::Tensor>&q_sin,              \
      const std::optional<at::Tensor>&k_cos, const std::optional<at::Tensor>&k_sin,              \
      c10::string_view rope_layout, const std::optional<at::Tensor>&sample_ids,                  \
      const std::optional<at::Tensor>&variate_ids, const std::optional<at::Tensor>&variate_bias, \
      const std::optional<at::Tensor>&causal_ids
#define POSENC_ATTENTION_FUSED_ARGS                                                          \
  q_positions, k_positions, slopes, symmetric, table, table_form, num_buckets, max_distance, \
      bidirectional, max_relative_position, causal, key_padding, scale, q_cos, q_sin, k_cos, \
      k_sin, rope_layout, sample_ids, variate_ids, variate_bias, causal_ids

/// _attention_fused_forward's out as attention_fused returns it, in q's dtype: a copy only
/// where the dtypes differ (an operator below autograd must not hand back its input).
at::Tensor attention_out_in_dtype(const at::Tensor& out, const at::Tensor& q);

using AttentionFusedSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           POSENC_ATTENTION_FUSED_PARAMS);
using AttentionFusedForwardSignature = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, POSENC_ATTENTION_FUSED_PARAMS);
/// (grad_out, out, lse, q, k, v, ...) -> (dq, dk, dv, dtable: the table's shape, or [0] without
/// one, dvariate_bias: [2, H] in variate_bias's dtype, or [0] without one)
using AttentionFusedBackwardSignature =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
        const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
        const at::Tensor&, const at::Tensor&, POSENC_ATTENTION_FUSED_PARAMS);

/// q [B, Nq, H, D], k [B, Nk, H, D], v [B, Nk, H, Dv] agree (one line naming the sizes); the
/// reference attention checks the same.
void check_attention_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

/// The operators' typed handles (looked up once).
const c10::TypedOperatorHandle<AttentionFusedSignature>& attention_fused_op();
const c10::TypedOperatorHandle<AttentionFusedForwardSignature>& attention_fused_forward_op();
const c10::TypedOperatorHandle<AttentionFusedBackwardSignature>& attention_fused_backward_op();

/// The Autograd kernel (../autograd/attention_fused_autograd.cpp), registered in
/// attention_fused_operator.cpp.
at::Tensor attention_fused_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    POSENC_ATTENTION_FUSED_PARAMS);

}  // namespace posenc::ops
