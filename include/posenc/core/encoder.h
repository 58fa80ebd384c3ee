// The positional-encoding interface: three ways into attention, one contract.
//
// Self-attention is permutation invariant; an encoder breaks the symmetry in one of three places:
//   additive  x_n + E(p_n)                       added to token embeddings (sinusoidal, learned)
//   rotary    q_m -> R(p_m) q_m, k_n -> R(p_n) k_n  rotates queries and keys (RoPE and scalings)
//   bias      logits_mn + b(p_m, p_n)            biases attention logits (T5, Shaw, ALiBi)
// The attention layer calls all three entry points on whatever encoder it holds; the defaults
// are identities, so it never switches on the encoder's type.
//
// Layout conventions (as flash-attention / flashinfer):
//   x: [B, N, D]   q: [B, Nq, H, Dh]   k: [B, Nk, H, Dh]   bias: [H, Nq, Nk] or [B, H, Nq, Nk]
// A bias is added to the *scaled* logits q.k / sqrt(Dh).
//
// A bias is also describable (BiasSpec: ALiBi slopes, a T5 bucket table, a clipped relative
// table) so that a fused attention kernel can compute it on the fly; bias() materializes
// [H, Nq, Nk] as the fallback.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "posenc/core/positions.h"

namespace posenc {

enum class EncodingKind { kNone, kAdditive, kRotary, kBias };
std::string to_string(EncodingKind kind);

/// What a bias is, so a kernel can compute b(p_m, p_n) without materializing it.
enum class BiasForm {
  kNone,
  kAlibi,          ///< b_h(m, n) = -slope_h * (p_m - p_n) (causal) or -slope_h * |p_m - p_n|
  kBucketTable,    ///< b_h(m, n) = table[bucket(p_n - p_m), h] (T5)
  kRelativeTable,  ///< b_h(m, n) = q_m,h . table[clip(p_n - p_m, -K, K) + K] / sqrt(Dh) (Shaw)
};
std::string to_string(BiasForm form);

struct BiasSpec {
  BiasForm form = BiasForm::kNone;
  at::Tensor slopes;          ///< kAlibi: [H], float32
  bool symmetric = false;     ///< kAlibi: |p_m - p_n| instead of (p_m - p_n)
  at::Tensor table;           ///< kBucketTable: [num_buckets, H]; kRelativeTable: [2K+1, Dh]
  int64_t num_buckets = 0;    ///< kBucketTable
  int64_t max_distance = 0;   ///< kBucketTable
  bool bidirectional = true;  ///< kBucketTable
  int64_t max_relative_position = 0;  ///< kRelativeTable: K
};

/// Named tensors describing what an encoder computes at given positions (`posenc inspect`).
using Description = std::vector<std::pair<std::string, at::Tensor>>;

struct DescribeOptions {
  int64_t seq_len = -1;  ///< for dynamic scalings; -1: max position + 1
};

class PositionalEncodingImpl : public torch::nn::Module {
 public:
  /// The registry name ("sinusoidal", "rope", ...).
  virtual std::string type() const = 0;
  virtual EncodingKind kind() const = 0;

  /// Additive entry: x [B, N, D] or [N, D] -> x + E(positions). Default: x unchanged.
  virtual at::Tensor add(const at::Tensor& x, const Positions& positions);
  /// Rotary entry: q [B, Nq, H, Dh], k [B, Nk, H, Dh]. Default: unchanged.
  virtual std::pair<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k,
                                                   const Positions& q_positions,
                                                   const Positions& k_positions);
  /// Bias entry: [H, Nq, Nk] or [B, H, Nq, Nk], or an undefined tensor for no bias.
  /// q [B, Nq, H, Dh] is passed for query-dependent biases (Shaw); others ignore it.
  virtual at::Tensor bias(const Positions& q_positions, const Positions& k_positions,
                          const at::Tensor& q);
  /// The bias in describable form (form kNone when there is none).
  virtual BiasSpec bias_spec() const;
  /// What the encoder computes at `positions`, for inspection and cross-checks.
  virtual Description describe(const Positions& positions, const DescribeOptions& options);
};
TORCH_MODULE(PositionalEncoding);

/// Any encoder module holder (Rope, Alibi, ...) as the interface holder the attention takes.
template <typename Holder>
PositionalEncoding as_encoding(const Holder& module) {
  return PositionalEncoding(std::static_pointer_cast<PositionalEncodingImpl>(module.ptr()));
}

/// NoPE: no positional information; order comes from the causal mask alone
/// (Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization").
class NopeImpl : public PositionalEncodingImpl {
 public:
  std::string type() const override { return "nope"; }
  EncodingKind kind() const override { return EncodingKind::kNone; }
};
TORCH_MODULE(Nope);

/// Sets LibTorch's intra-op threads to the cores available (LibTorch may start with 1).
void use_all_cores();

}  // namespace posenc
