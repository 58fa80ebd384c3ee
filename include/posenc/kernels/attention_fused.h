// Attention with the position bias computed on the fly (FlashAttention-style tiling with an
// online softmax, Dao et al. 2022/2023), so no [H, Nq, Nk] tensor is ever materialized.
//
//   out_i = sum_j softmax_j(q_i . k_j * scale + b_h(p_i, p_j) + mask_ij) v_j
//   b_h from the plan's describable bias parts (FusedBias: ALiBi and at most one table form,
//   summed in one pass, e.g. ALiBi + T5), each a BiasSpec:
//     kNone         0
//     kAlibi        -slope_h (p_i - p_j)   or  -slope_h |p_i - p_j|      (Press et al. 2022)
//     kBucketTable  table[bucket(p_j - p_i), h]                          (T5; learnable table)
//     kRelativeTable q_i . table[clip(p_j - p_i, -K, K) + K] / sqrt(D)   (Shaw; learnable, CPU)
//   masks: causal (key j visible to query i when j <= i + Nk - Nq, i.e. cached keys come first)
//          and key padding [B, Nk] (true = a real token).
//   packed samples (Moirai-2, uni2ts' packed_attention_mask): sample_ids [B, Nk] int64, several
//          series packed in one sequence; key j visible to query i only when
//          sample_ids[b, j] == sample_ids[b, i + Nk - Nq] (the queries take the last Nq ids, as
//          the causal mask's cached keys). Each id one contiguous run per row, so the kernel
//          visits only the tiles whose runs meet (a packed batch costs the sum of its samples'
//          squares, not N^2) and never materializes [N, N].
//   binary variate bias (Moirai's BinaryAttentionBias, uni2ts/module/position/attn_bias.py):
//          + variate_bias[1, h] if variate_ids[b, j] == variate_ids[b, i + Nk - Nq]
//          + variate_bias[0, h] otherwise;  variate_ids [B, Nk] int64 >= 0, variate_bias [2, H]
//          learnable (Moirai's nn.Embedding(2, H).weight as is), its gradient two sums of dS per
//          head: d variate_bias[s, h] = sum_{b, i, j : [equal ids] = s} dS[b, h, i, j].
//          Packed samples and the variate bias: both kernels, CPU and CUDA (CUDA:
//          src/kernels/cuda/attention_cuda.cu, the same tile skipping; d variate_bias a
//          deterministic two-pass reduce, no atomics).
//   causal on ids (Moirai-2's packed_causal_attention_mask, uni2ts/common/torch_util.py):
//          causal_ids [B, Nk] int64; key j visible to query i only when
//          causal_ids[b, j] <= causal_ids[b, i + Nk - Nq] (causal in these ids, e.g. time ids,
//          instead of token order: a variate-major packing lists variate 1's time 0 after
//          variate 0's time 9). With sample_ids both hold. causal=true with causal_ids is refused
//          (two causal rules). The kernel skips a tile whose keys' smallest id exceeds its
//          queries' largest (CPU kernel only; CUDA refuses causal_ids).
//   A query row that sees no key (all its keys padded or masked) gives 0, lse -inf.
//   rotary (optional, CPU): q_i and k_j are rotated by their RoPE tables as each tile is loaded
//          (Su et al. 2021; layouts as rope_apply), so no rotated copy of q and k is written;
//          the backward rotates dq, dk back (the inverse rotation). On CUDA the rotation is one
//          rope_fused pass before the kernel.
// Extra memory: per thread one [Bq, Bk] tile, plus O(H (Nq + Nk)) for a T5 lookup table over
// the relative offsets that occur, or O(B H Nq K) for Shaw's q . table scores; backward
// recomputes tiles from the saved log-sum-exp.
//
//   q: [B, Nq, H, D]   k: [B, Nk, H, D]   v: [B, Nk, H, Dv]   -> [B, Nq, H, Dv]
//   positions: float64 [Nq] and [Nk]; the T5 form needs integer positions.
//   storage fp32/bf16/fp16, computed in fp32; fp64 inputs take the reference path.
// attention_reference is the plain-ATen specification (materialized bias + softmax) and the
// test oracle; it also takes any bias tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "posenc/core/plan.h"
#include "posenc/functional/rope.h"

namespace posenc {

/// Masks and the per-pair id terms of one attention call (every tensor optional).
struct AttentionMasks {
  bool causal = false;
  at::Tensor key_padding;   ///< [B, Nk] bool, true where the key is a real token (optional)
  at::Tensor sample_ids;    ///< [B, Nk] int64: packed samples, attend within equal ids (runs)
  at::Tensor variate_ids;   ///< [B, Nk] int64 >= 0: the binary variate bias's ids
  at::Tensor variate_bias;  ///< [2, H] float: row 0 different variate ids, row 1 the same
  at::Tensor causal_ids;    ///< [B, Nk] int64: key j visible when its id <= the query's (not
                            ///< with causal = true)
};

/// Packed samples' mask, materialized (the reference's, and for tests): [B, Nq, Nk] bool, true
/// where key j is visible to query i (equal sample ids; queries at the last Nq ids).
at::Tensor sample_mask_from_ids(const at::Tensor& sample_ids, int64_t nq);
/// The causal mask on ids, materialized: [B, Nq, Nk] bool, true where key j is visible to query
/// i (causal_ids[b, j] <= causal_ids[b, i + Nk - Nq]; uni2ts' packed_causal_attention_mask's
/// time_id part).
at::Tensor causal_mask_from_ids(const at::Tensor& causal_ids, int64_t nq);
/// The binary variate bias, materialized and differentiable in variate_bias:
/// [B, H, Nq, Nk] = variate_bias[ids equal, h] (queries at the last Nq ids), as uni2ts'
/// BinaryAttentionBias computes ~ind * weight[0] + ind * weight[1].
at::Tensor variate_bias_from_ids(const at::Tensor& variate_ids, const at::Tensor& variate_bias,
                                 int64_t nq);

/// RoPE tables for attention_fused to apply inside its tiles: per-pair cos/sin [Nq, F] for the
/// queries and [Nk, F] for the keys (2F <= D; the rest of each head passes through), e.g. from
/// rope_cos_sin or RopeImpl::cos_sin. Constants: no gradient flows into the tables.
struct AttentionRotary {
  at::Tensor q_cos, q_sin, k_cos, k_sin;
  RopeLayout layout = RopeLayout::kHalf;
  bool defined() const { return q_cos.defined(); }
};

/// The describable bias parts of one forward, prepared once for the kernel (and shared by every
/// layer): ALiBi parts folded into one slope per head, at most one table part (T5 or Shaw), the
/// positions as the kernel reads them, T5's bucket for every relative offset that occurs.
struct FusedBias {
  bool alibi = false;
  bool symmetric = false;
  at::Tensor slopes;  ///< [H] float32: the ALiBi parts' slopes summed
  BiasSpec table;     ///< the kBucketTable or kRelativeTable part (form kNone: none)
  at::Tensor q_positions, k_positions;  ///< float64 [Nq], [Nk]
  std::vector<double> pq, pk;           ///< the same as vectors
  std::vector<int64_t> iq, ik;          ///< rounded, for the table forms
  int64_t rel_min = 0;                  ///< kBucketTable: smallest offset p_k - p_q
  at::Tensor buckets;                   ///< kBucketTable: [R] int64, bucket of offset rel_min + r
  std::string unsupported;  ///< why the fused kernel cannot take these parts ("" = it can)
};

/// Prepares parts (describable biases, any number) at 1D positions q_positions [Nq] and
/// k_positions [Nk] for attention_fused. What the kernel cannot take (two table parts, ALiBi
/// parts of different forms, non-integer positions for a table) is recorded in `unsupported`.
std::shared_ptr<const FusedBias> fused_bias(const std::vector<BiasSpec>& parts,
                                            const at::Tensor& q_positions,
                                            const at::Tensor& k_positions);

/// Whether attention_fused takes this bias and these positions (else use the reference).
bool attention_fused_supported(const FusedBias& bias, const at::Tensor& q);
/// The same with the call's masks (sample ids and the variate bias: both kernels).
bool attention_fused_supported(const FusedBias& bias, const at::Tensor& q,
                               const AttentionMasks& masks);
bool attention_fused_supported(const BiasSpec& bias, const at::Tensor& q,
                               const at::Tensor& q_positions, const at::Tensor& k_positions);
/// Fused attention, autograd-aware (gradients for q, k, v, a T5 or Shaw table and
/// masks.variate_bias).
at::Tensor attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::shared_ptr<const FusedBias>& bias,
                           const AttentionMasks& masks, double scale,
                           const AttentionRotary& rotary = {});
/// The same for one bias part (prepared on each call).
at::Tensor attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const BiasSpec& bias, const at::Tensor& q_positions,
                           const at::Tensor& k_positions, const AttentionMasks& masks, double scale,
                           const AttentionRotary& rotary = {});
/// The specification: logits = q k^T * scale + bias (materialized) + the variate bias + masks
/// (causal, key padding, sample ids, causal ids), softmax, times v; a row that sees no key gives 0.
/// bias: [H, Nq, Nk], [B, H, Nq, Nk] or undefined. Autograd-able (q, k, v, bias, variate_bias).
at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& bias, const AttentionMasks& masks, double scale);
/// The bias a BiasSpec describes, materialized: [H, Nq, Nk] (the fallback, and for tests);
/// kRelativeTable depends on q [B, Nq, H, D] and gives [B, H, Nq, Nk].
at::Tensor bias_from_spec(const BiasSpec& bias, const at::Tensor& q_positions,
                          const at::Tensor& k_positions, int64_t heads, const at::Tensor& q = {});

}  // namespace posenc
