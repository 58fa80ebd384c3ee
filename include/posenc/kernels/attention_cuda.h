// CUDA attention forward and backward with the position bias computed on the fly, raw-pointer
// interface (no LibTorch). Same contract as the CPU kernel
// (include/posenc/kernels/attention_fused.h; oracle: attention_reference): FlashAttention-style
// tiling with an online softmax (Dao et al. 2022), fp32 accumulation, fp32/bf16/fp16 storage; no
// [H, Nq, Nk] tensor is materialized.
//
//   out_i = sum_j softmax_j(q_i . k_j * scale + b_h(p_i, p_j) + mask_ij) v_j
//   b_h:  kNone         0
//         kAlibi        -slope_h (p_i - p_j)   or  -slope_h |p_i - p_j|  (symmetric)
//         kBucketTable  table[bucket(p_j - p_i), h]   (T5), with bucket() read from
//                       bucket_of_offset[(p_j - p_i) - offset_min]: the glue fills it with
//                       t5_relative_position_bucket (src/functional/relative.cpp), the one formula
//   masks: causal (key j visible to query i when j <= i + Nk - Nq) and key_keep [B, Nk] (0 = pad)
//   packed samples (Moirai's sample_id): key j visible to query i only when j lies in the sample
//          of token t = i + Nk - Nq (the queries take the last Nq tokens), given as each token's
//          sample bounds sample_first/sample_last [B, Nk] (each sample one contiguous run of
//          tokens; the glue derives them from sample_ids). A query tile visits only the key tiles
//          in [sample_first of its first query, sample_last of its last], a key tile only the
//          query tiles whose samples meet it: a packed batch costs the sum of its samples' squares.
//   binary variate bias (Moirai's BinaryAttentionBias): + variate_bias[1, h] when
//          variate_ids[b, j] == variate_ids[b, t], variate_bias[0, h] otherwise, added after the
//          position bias (unscaled), as the CPU kernel adds it
//
//   q: [B, Nq, H, D]  k: [B, Nk, H, D]  v: [B, Nk, H, Dv]   element strides, last dim contiguous
//   out: [B, Nq, H, Dv] contiguous, the storage type of q
//   lse: [B, H, Nq] float32 contiguous: m + log(l) of each row, -inf where a row sees no key
//        (a row with no visible key outputs 0, as the reference)
//   q_positions [Nq], k_positions [Nk]: float64 (T5: integer-valued)
// Limits: D <= 256 and Dv <= 256 (a query tile and a key/value tile live in shared memory).
// Block: 4 warps, 32 query rows (8 per warp, each row's softmax state in registers), key tiles of
// 32 (one key per lane); P V uses warp shuffles. This is a SIMT first version (no tensor cores).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "posenc/kernels/rope_cuda.h"  // Storage

namespace posenc::cuda {

enum class AttentionBias { kNone, kAlibi, kBucketTable };

struct AttentionLaunch {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;
  Storage storage = Storage::kFloat32;
  int64_t batch = 0, heads = 0, nq = 0, nk = 0, dim = 0, dim_v = 0;
  int64_t q_stride_batch = 0, q_stride_token = 0, q_stride_head = 0;  ///< in elements
  int64_t k_stride_batch = 0, k_stride_token = 0, k_stride_head = 0;
  int64_t v_stride_batch = 0, v_stride_token = 0, v_stride_head = 0;
  float scale = 1.0f;
  AttentionBias bias = AttentionBias::kNone;
  const double* q_positions = nullptr;  ///< [Nq] (needed by kAlibi, kBucketTable)
  const double* k_positions = nullptr;  ///< [Nk]
  const float* slopes = nullptr;        ///< kAlibi: [H]
  bool symmetric = false;               ///< kAlibi: |p_i - p_j|
  const float* table = nullptr;         ///< kBucketTable: [num_buckets, H] contiguous
  int64_t num_buckets = 0;
  const int32_t* bucket_of_offset = nullptr;  ///< kBucketTable: [offset_count]
  int64_t offset_min = 0, offset_count = 0;   ///< offsets p_j - p_i in [min, min + count)
  bool causal = false;
  const uint8_t* key_keep = nullptr;  ///< [B, Nk], nonzero = a real key; nullptr = all real
  // packed samples (both or neither; needs Nq <= Nk): key j visible to token t's query when
  // sample_first[b, j] == sample_first[b, t]
  const int32_t* sample_first = nullptr;  ///< [B, Nk]: first token of the sample holding j
  const int32_t* sample_last = nullptr;   ///< [B, Nk]: last token of the sample holding j
  // binary variate bias (both or neither; needs Nq <= Nk)
  const int64_t* variate_ids = nullptr;  ///< [B, Nk]
  const float* variate_bias = nullptr;   ///< [2, H] contiguous: row 0 different ids, row 1 same
};

/// Largest D and Dv the kernel takes.
constexpr int64_t kAttentionMaxDim = 256;
/// Keys per tile of the dK/dV backward (one block each): dvariate_partial has
/// ceil(Nk / kAttentionKeyTile) entries per (b, h).
constexpr int64_t kAttentionKeyTile = 32;

/// Launches the forward kernel on `stream`; returns the launch error (cudaSuccess when fine).
cudaError_t attention_forward(const AttentionLaunch& launch, cudaStream_t stream);

/// Backward (FlashAttention-2, Dao 2023, Alg. 2): each score tile is recomputed from q, k and the
/// saved log-sum-exp, so again no [H, Nq, Nk] tensor exists:
///   P_ij  = exp(s_ij - lse_i)   (0 where masked; s_ij the biased logit of the forward)
///   dV_j  = sum_i P_ij dO_i                  dP_ij = dO_i . v_j
///   dS_ij = P_ij (dP_ij - delta_i)           delta_i = dO_i . O_i  (given, [B, H, Nq])
///   dQ_i  = scale sum_j dS_ij k_j            dK_j  = scale sum_i dS_ij q_i
///   dtable[bucket(p_j - p_i), h] += dS_ij    (kBucketTable, when dtable is given)
///   dvariate_bias[s, h] = sum_{b, i, j: [variate ids equal] = s} dS_ij   (variate bias)
/// Two kernels, so that each gradient element has one writer: one block per (b, h, key tile)
/// computes dK, dV (and sums dtable in shared memory, then one atomicAdd per bucket and block)
/// looping over query tiles; one block per (b, h, query tile) computes dQ looping over key tiles.
/// The variate bias's gradient is a deterministic two-pass reduce, no atomics: each dK/dV block
/// writes its two sums of dS (per thread, then over the warps in a fixed order) to
/// dvariate_partial[b, h, key tile, s]; the caller sums over b and the key tiles (the glue: one
/// at::sum), so the result does not depend on the blocks' order.
struct AttentionBackwardLaunch {
  AttentionLaunch forward;       ///< the forward's launch; its lse is read, its out unused
  const void* dout = nullptr;    ///< [B, Nq, H, Dv] contiguous, the storage type of q
  const float* delta = nullptr;  ///< [B, H, Nq] contiguous
  float* dq = nullptr;           ///< [B, Nq, H, D] float32 contiguous (written)
  float* dk = nullptr;           ///< [B, Nk, H, D] float32 contiguous (written)
  float* dv = nullptr;           ///< [B, Nk, H, Dv] float32 contiguous (written)
  float* dtable = nullptr;       ///< [num_buckets, H] float32, added to; nullptr: not wanted
  /// [B, H, ceil(Nk / kAttentionKeyTile), 2] float32 (written, every entry): per key tile the sums
  /// of dS over the pairs of different (0) and equal (1) variate ids; nullptr: not wanted (needs
  /// the forward's variate_ids)
  float* dvariate_partial = nullptr;
};

/// Launches the two backward kernels on `stream`; returns the first launch error.
cudaError_t attention_backward(const AttentionBackwardLaunch& launch, cudaStream_t stream);

}  // namespace posenc::cuda
