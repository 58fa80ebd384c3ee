// Attention over short sequences (N <= 64 tokens: a ViT's patch grid, a window), fused with
// RoPE, forward and backward in one pass per (batch, head):
//
//   q'_i = R(p_i) q_i,  k'_j = R(p_j) k_j                    (Su et al. 2021; optional)
//   S_ij = q'_i . k'_j * scale   (j <= i when causal),  P = softmax_j(S),  out_i = sum_j P_ij v_j
//   backward (P kept from the forward when gradients are needed and P is no larger than q, see
//   attention_short_saves_probabilities; else recomputed from the saved log-sum-exp, as
//   FlashAttention-2):
//   dv_j = sum_i P_ij dout_i,  dS_ij = P_ij (dout_i . v_j - dout_i . out_i)
//   dq_i = R(p_i)^T sum_j dS_ij k'_j * scale,  dk_j = R(p_j)^T sum_i dS_ij q'_i * scale
//
// Why: at N = 16 the general kernels pay for machinery sized for long sequences (LibTorch's CPU
// flash attention tiles 32 x 512; posenc's tiled kernel 128 x 256 with ATen matmuls per tile);
// here a head's whole N x N score matrix and its rotated q and k live in one thread's scratch
// (N * N + 4 N D floats), the inputs are read in place through their strides (the q, k, v views
// of one qkv projection) and the rotation costs no pass of its own. Measured in
// bench/bench_short_attention.cpp against SDPA and the tiled kernel.
//
//   q, k, v: float32 [B, N, H, D] (any strides with a contiguous last dim)   -> [B, N, H, D]
//   rotary: per-pair tables [N, F] (2F <= D), q and k at the same positions; layouts as
//           rope_apply (half: pairs (i, i + F), interleaved: (2i, 2i + 1)); constants.
// The specification and test oracle: rope_apply on q and k, then attention_reference.
#pragma once

#include <ATen/core/Tensor.h>

#include "posenc/kernels/attention_fused.h"

namespace posenc {

/// The limits of the short kernel (its per-thread scratch is sized by them).
constexpr int64_t kShortAttentionMaxTokens = 64;
constexpr int64_t kShortAttentionMaxHeadDim = 256;

/// Whether attention_short's forward, when gradients are needed, keeps the probabilities P of
/// each (batch, head) for the backward (else the backward recomputes them from the log-sum-exp):
/// when Np^2 <= N * D (Np = N rounded up to 8), i.e. P is no larger than the head's q, so the
/// memory the node holds (q, k, v, out) grows by at most a quarter. The main job's N = 16, D = 32:
/// kept (1 KiB per head, 384 KiB per layer at B = 128, H = 3); N = 36, D = 32: recomputed; N = 64
/// kept from D = 64 on. Inference (no gradients needed) never keeps them.
bool attention_short_saves_probabilities(int64_t n, int64_t d);

/// Whether attention_short takes these inputs: CPU float32 [B, N, H, D] with N <=
/// kShortAttentionMaxTokens, the same N for q, k, v, D <= kShortAttentionMaxHeadDim, and
/// rotary tables (if any) that are constant [N, F] with q's and k's the same tensors.
bool attention_short_supported(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionRotary& rotary = {});

/// Short-sequence attention with RoPE inside, autograd-aware (gradients for q, k, v).
at::Tensor attention_short(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const AttentionRotary& rotary = {}, bool causal = false);

/// The same with q, k, v the parts of one projection qkv [B, N, 3, H, D] (q = qkv[:, :, 0]):
/// the gradient is written straight into one [B, N, 3, H, D] tensor (no stack of dq, dk, dv).
at::Tensor attention_short_packed(const at::Tensor& qkv, double scale,
                                  const AttentionRotary& rotary = {}, bool causal = false);

}  // namespace posenc
