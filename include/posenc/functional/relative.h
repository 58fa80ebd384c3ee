// Relative-position biases, as functions of p_k - p_q (key minus query, as HF T5).
//
// T5 buckets (Raffel et al. 2020; HF T5Attention._relative_position_bucket):
//   bidirectional: half the buckets per sign, +num_buckets/2 when rel > 0, n = |rel|;
//   unidirectional: n = max(-rel, 0). With e = buckets/2 (after halving): n < e is exact,
//   else e + trunc(ln(n/e) / ln(max_distance/e) * (buckets - e)), capped at buckets - 1.
//   Computed in float32 exactly as HF does, so boundaries match bit for bit.
// ALiBi slopes (Press et al. 2022, "Train Short, Test Long", get_slopes): for n a power of two
//   m_h = 2^(-8(h+1)/n); otherwise the 2^floor(log2 n) slopes, then every other slope of the
//   2 * 2^floor(log2 n) list. Bias -m_h (p_q - p_k) (causal) or -m_h |p_q - p_k| (symmetric).
// Shaw et al. 2018 ("Self-Attention with Relative Position Representations"):
//   index(q, k) = clip(p_k - p_q, -K, K) + K into a table [2K+1, Dh].
// Relative positions that are not integers (timestamps) are rounded to the nearest integer for
// the bucketed and table forms; ALiBi uses them as they are.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace posenc {

/// rel: integer-valued tensor (any dtype) -> buckets int64, same shape.
at::Tensor t5_relative_position_bucket(const at::Tensor& rel, bool bidirectional,
                                       int64_t num_buckets, int64_t max_distance);
/// The T5 bucket of every relative offset that occurs between these positions (rounded to
/// integers): offsets p_k - p_q in [offset_min, offset_min + buckets.numel()) -> buckets (int64,
/// CPU). The fused kernels look a pair's bucket up here instead of computing the formula per pair.
/// Empty positions give no offsets.
struct OffsetBuckets {
  int64_t offset_min = 0;
  at::Tensor buckets;  ///< [count] int64
};
OffsetBuckets t5_offset_buckets(const at::Tensor& q_positions, const at::Tensor& k_positions,
                                bool bidirectional, int64_t num_buckets, int64_t max_distance);
/// Press et al. slopes for any number of heads, float64 values.
std::vector<double> alibi_slopes(int64_t num_heads);
/// p_k - p_q: positions [..., Nq] and [..., Nk] -> [..., Nq, Nk] float64.
at::Tensor relative_positions(const at::Tensor& q_positions, const at::Tensor& k_positions);
/// Shaw table index: clip(round(rel), -K, K) + K, int64.
at::Tensor shaw_relative_index(const at::Tensor& rel, int64_t max_relative_position);

}  // namespace posenc
