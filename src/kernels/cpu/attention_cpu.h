// Internal: the tiled CPU attention kernel's problem description and entry points
// (public contract in include/posenc/kernels/attention_fused.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "posenc/core/plan.h"

namespace posenc::detail {

struct AttentionProblem {
  at::Tensor q, k, v;  ///< float32 [B, H, N, D], unit stride in D (attention_cpu_reads_in_place)
  int64_t batch = 0, heads = 0, nq = 0, nk = 0, dim = 0, dim_v = 0;
  float scale = 1.0f;
  // Bias parts, summed: ALiBi (alibi) plus at most one table form (T5 or Shaw).
  bool alibi = false;
  BiasForm table_form = BiasForm::kNone;  ///< kNone, kBucketTable or kRelativeTable
  bool symmetric = false;
  std::vector<float> slopes;  ///< alibi: [H]
  // Position data read from the forward's FusedBias (prepared once per forward, alive for the call)
  const double* pq = nullptr;   ///< [Nq] positions
  const double* pk = nullptr;   ///< [Nk]
  const int64_t* iq = nullptr;  ///< kBucketTable, kRelativeTable: integer positions [Nq]
  const int64_t* ik = nullptr;  ///< [Nk]
  int64_t rel_min = 0, rel_count = 0;
  std::vector<float> lut;           ///< kBucketTable: [H, rel_count] bias per relative offset
  const int64_t* bucket = nullptr;  ///< kBucketTable: [rel_count] bucket per relative offset
  int64_t num_buckets = 0;
  // kRelativeTable (Shaw): bias(i, j) = qr[b, h, i, clip(ik_j - iq_i, -K, K) + K], where
  // qr = q . table^T / sqrt(D) is [B, H, Nq, 2K+1]: O(Nq K) per head instead of O(Nq Nk).
  at::Tensor qr;         ///< [B, H, Nq, 2K+1] float32 contiguous
  at::Tensor rel_table;  ///< [2K+1, D] float32 contiguous
  int64_t max_relative = 0;
  float rel_scale = 1.0f;  ///< 1 / sqrt(D)
  bool causal = false;
  std::vector<uint8_t> key_keep;  ///< [B, Nk], empty = all keys real
  // RoPE inside the tiles (q, k above stay unrotated): per-pair tables, float32 contiguous
  bool rotary = false;
  at::Tensor q_cos, q_sin;  ///< [Nq, F]
  at::Tensor k_cos, k_sin;  ///< [Nk, F]
  int64_t rotary_pairs = 0;
  bool rotary_interleaved = false;
  // Packed samples (Moirai's sample_id): key j visible to query i only when
  // sample[b, j] == sample[b, i + Nk - Nq]; each id one contiguous run per row, so a query block
  // sees keys [run_first of its first query, run_last of its last] and the other tiles are skipped.
  bool packed = false;
  at::Tensor sample_ids;           ///< [B, Nk] int64 contiguous
  std::vector<int64_t> run_first;  ///< [B, Nk]: first index of the run holding j
  std::vector<int64_t> run_last;   ///< [B, Nk]: last index of the run holding j
  // Binary variate bias (Moirai's BinaryAttentionBias): + variate_bias[same, h], same =
  // (variate[b, j] == variate[b, i + Nk - Nq]); row 0 different ids, row 1 the same.
  bool variate = false;
  at::Tensor variate_ids;           ///< [B, Nk] int64 contiguous
  std::vector<float> variate_bias;  ///< [2, H]
  // Causal on ids (Moirai-2's time_id): key j visible to query i only when
  // causal_ids[b, j] <= causal_ids[b, i + Nk - Nq]; a tile whose keys' smallest id exceeds its
  // queries' largest is skipped.
  bool causal_by_ids = false;
  at::Tensor causal_ids;  ///< [B, Nk] int64 contiguous
};

/// Checks sample_ids / variate_ids [B, Nk] (integer, on any device) and variate_bias [2, H]
/// (floating point; given exactly when variate_ids is): shapes, sample ids in contiguous runs per
/// row, variate ids >= 0; `op` names the operator. One line naming the tensor and the first bad
/// index.
void check_packed_ids(const char* op, const at::Tensor& sample_ids, const at::Tensor& variate_ids,
                      const at::Tensor& variate_bias, int64_t batch, int64_t nk, int64_t heads);
/// Sets the problem's packed-sample mask and variate bias (undefined tensors: none); p's sizes
/// must be set. Checks as check_packed_ids.
void set_packed(AttentionProblem& p, const char* op, const at::Tensor& sample_ids,
                const at::Tensor& variate_ids, const at::Tensor& variate_bias);

/// Checks causal_ids [B, Nk] (integer, on any device; undefined: none) and that `causal` is not
/// set with it (two causal rules); one line naming the tensor.
void check_causal_ids(const char* op, const at::Tensor& causal_ids, bool causal, int64_t batch,
                      int64_t nq, int64_t nk);
/// Sets the problem's causal mask on ids (undefined: none); p's sizes and causal must be set.
void set_causal_ids(AttentionProblem& p, const char* op, const at::Tensor& causal_ids);

/// Whether the kernels read (or write) a float32 [B, H, N, D] tensor in place: unit stride in D,
/// rows at least D apart, strides that fit in int (MKL's LP64 sgemm); else the caller passes a
/// contiguous copy. An empty tensor's strides are never read.
inline bool attention_cpu_reads_in_place(const at::Tensor& t) {
  if (t.scalar_type() != at::kFloat || t.dim() != 4) return false;
  if (t.numel() == 0) return true;
  const int64_t rows = t.size(2), width = t.size(3);
  const int64_t row_stride = rows > 1 ? t.stride(2) : width;
  return (width <= 1 || t.stride(3) == 1) && row_stride >= width && row_stride <= 2147483647 &&
         rows <= 2147483647;
}

/// The problem's tensors and sizes from float32 qh, kh [B, H, N, D] and vh [B, H, Nk, Dv] that
/// attention_cpu_reads_in_place (the bias, masks and rotary parts are the caller's).
inline void set_tensors(AttentionProblem& p, const at::Tensor& qh, const at::Tensor& kh,
                        const at::Tensor& vh, double scale) {
  p.q = qh;
  p.k = kh;
  p.v = vh;
  p.batch = qh.size(0);
  p.heads = qh.size(1);
  p.nq = qh.size(2);
  p.nk = kh.size(2);
  p.dim = qh.size(3);
  p.dim_v = vh.size(3);
  p.scale = static_cast<float>(scale);
}

/// out: [B, H, Nq, Dv] float32 (any view attention_cpu_reads_in_place, e.g. a [B, Nq, H, Dv]
/// tensor's transpose), lse: [B, H, Nq] float32 contiguous (log-sum-exp of each row; -inf when a
/// row sees no key).
void attention_forward_cpu(const AttentionProblem& p, at::Tensor& out, at::Tensor& lse);
/// Gradients dq, dk, dv: zero-filled [B, H, N, D] float32 views as out (out and grad_out may be
/// any such views too); dtable only for a table form (kBucketTable: [num_buckets, H];
/// kRelativeTable: [2K+1, D]; float32), else undefined. dq includes the relative table's q . a
/// term. dvariate: [2, H] float32 with a variate bias (sum of dS over the pairs of different / same
/// ids), else undefined.
void attention_backward_cpu(const AttentionProblem& p, const at::Tensor& out, const at::Tensor& lse,
                            const at::Tensor& grad_out, at::Tensor& dq, at::Tensor& dk,
                            at::Tensor& dv, at::Tensor& dtable, at::Tensor* dvariate = nullptr);

/// For tests (tests/test_attention_tiles.cpp): while on, the tiled kernels fill their scratch
/// memory (score tiles and strips, accumulators before use, the packed operands and their padding
/// keys and rows) with a quiet NaN where it starts as zeros or uninitialized, so that a lane read
/// outside the problem's rows and keys that reached an output would show there. Off by default;
/// returns the previous setting. Not for calls in flight on other threads.
bool set_attention_cpu_poison_for_tests(bool on);

}  // namespace posenc::detail
