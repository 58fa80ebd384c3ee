// Internal: the short-sequence attention kernel (public contract in
// include/posenc/kernels/short_attention.h). Raw pointers and element strides.
#pragma once

#include <cstdint>

namespace posenc::detail {

struct ShortAttentionProblem {
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_stride[3] = {0, 0, 0};  ///< elements between batches, tokens, heads (last dim: 1)
  int64_t k_stride[3] = {0, 0, 0};
  int64_t v_stride[3] = {0, 0, 0};
  int64_t batch = 0, n = 0, heads = 0, dim = 0;
  float scale = 1.0f;
  bool causal = false;
  const float *cos = nullptr, *sin = nullptr;  ///< [N, pairs] contiguous; null: no rotation
  int64_t pairs = 0;
  bool interleaved = false;
  /// elements between batches, tokens, heads of dq, dk, dv (last dim: 1); all 0: contiguous
  /// [B, N, H, D]; the three may be parts of one [B, N, 3, H, D] gradient
  int64_t grad_stride[3] = {0, 0, 0};
  /// Each head's probabilities P = softmax(S) as [B * H, Np, Np] (Np = short_attention_padded(N);
  /// 0 above the causal diagonal and in the padding rows and columns), or null. The forward
  /// writes them when not null (the P its output was computed from); the backward then reads
  /// them instead of recomputing S = Q'K'^T and its exponentials from the log-sum-exp.
  float* probabilities = nullptr;
};

/// N rounded up to the kernel's 8-row blocks: the probabilities' rows and columns per head.
constexpr int64_t short_attention_padded(int64_t n) { return (n + 7) / 8 * 8; }

/// out: [B, N, H, D] contiguous; lse: [B, H, N] (log-sum-exp of each row of S), or null (not
/// written: the backward of a forward that kept p.probabilities does not read it); and
/// p.probabilities when not null.
void short_attention_forward_cpu(const ShortAttentionProblem& p, float* out, float* lse);
/// grad_out, out: [B, N, H, D] contiguous; dq, dk, dv: [B, N, H, D] with p.grad_strides,
/// overwritten. P from p.probabilities when not null (the forward's; lse not read, may be null),
/// else from lse.
void short_attention_backward_cpu(const ShortAttentionProblem& p, const float* out,
                                  const float* lse, const float* grad_out, float* dq, float* dk,
                                  float* dv);

}  // namespace posenc::detail
