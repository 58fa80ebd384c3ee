// The positional-encoding interface: three ways into attention, one contract.
//
// Self-attention is permutation invariant; an encoder breaks the symmetry in one of three places:
//   additive  x_n + E(p_n)                       added to token embeddings (sinusoidal, learned)
//   rotary    q_m -> R(p_m) q_m, k_n -> R(p_n) k_n  rotates queries and keys (RoPE and scalings)
//   bias      logits_mn + b(p_m, p_n)            biases attention logits (T5, Shaw, ALiBi)
// An encoder compiles positions into its part of a plan (posenc/core/plan.h): an embedding, the
// rotary tables, a bias (describable: ALiBi slopes, a T5 bucket table, a clipped relative table,
// so a fused kernel computes it on the fly; or materialized [H, Nq, Nk]). Encoders compose (the
// "compose" encoder: several additive and bias parts, one rotary part). The model builds the plan
// once per forward and every block reads it; nothing asks which encoder it holds.
//
// Layout conventions (as flash-attention / flashinfer):
//   x: [B, N, D]   q: [B, Nq, H, Dh]   k: [B, Nk, H, Dh]   bias: [H, Nq, Nk] or [B, H, Nq, Nk]
// A bias is added to the *scaled* logits q.k / sqrt(Dh).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "posenc/core/plan.h"
#include "posenc/core/positions.h"

namespace posenc {

/// Named tensors describing what an encoder computes at given positions (`posenc inspect`).
using Description = std::vector<std::pair<std::string, at::Tensor>>;

struct DescribeOptions {
  int64_t seq_len = -1;  ///< for dynamic scalings; -1: max position + 1
};

/// What a model evaluated on new positions asks of its encoder: the extent the positions reach
/// on each axis (e.g. {length} for text, {rows, columns} for a patch grid).
using Extent = std::vector<int64_t>;
/// Puts an adapted encoder back as it was.
using Restore = std::function<void()>;

/// How to undo a change to an encoder whose position-bound state is its `weight` table and its
/// `options` (the learned tables' adapt): take it before resizing.
template <typename Impl>
Restore restore_weight_and_options(Impl& encoder) {
  auto saved = encoder.weight.detach().clone();
  auto before = encoder.options;
  return [&encoder, saved, before] {
    encoder.weight.set_data(saved);
    encoder.options = before;
  };
}

class PositionalEncodingImpl : public torch::nn::Module {
 public:
  /// The registry name ("sinusoidal", "rope", "compose", ...).
  virtual std::string type() const = 0;
  /// Writes this encoder's part of the plan for the positions in `request` (once per forward).
  virtual void contribute(EncodingPlan& plan, const PlanRequest& request) = 0;
  /// What the encoder computes at `positions`, for inspection and cross-checks.
  virtual Description describe(const Positions& positions, const DescribeOptions& options);
  /// Adapts position-bound tables to positions reaching `extent` (learned tables resampled,
  /// relative tables resized; formulas need nothing). Returns how to undo it. Default: nothing.
  virtual Restore adapt(const Extent& extent);

  /// The plan for one forward: every part this encoder contributes.
  EncodingPlan plan(const PlanRequest& request);
  EncodingPlan plan(const Positions& positions) { return plan(PlanRequest{positions}); }

  // The three entry points, each through a plan (for use outside a model and in tests):
  /// x [B, N, D] or [N, D] -> x + E(positions) (an encoder with prefix rows, e.g. a learned
  /// grid's CLS row, takes x with those P tokens first: [B, P + N, D]).
  at::Tensor add(const at::Tensor& x, const Positions& positions);
  /// q [B, Nq, H, Dh], k [B, Nk, H, Dh] rotated (unchanged without a rotary part).
  std::pair<at::Tensor, at::Tensor> rotate(const at::Tensor& q, const at::Tensor& k,
                                           const Positions& q_positions,
                                           const Positions& k_positions);
  /// The bias [H, Nq, Nk] or [B, H, Nq, Nk], or undefined without one; q [B, Nq, H, Dh] for
  /// query-dependent biases (Shaw). heads: the attention's heads (-1: the encoder's own).
  at::Tensor bias(const Positions& q_positions, const Positions& k_positions,
                  const at::Tensor& q = {}, int64_t heads = -1);
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
  void contribute(EncodingPlan&, const PlanRequest&) override {}
};
TORCH_MODULE(Nope);

}  // namespace posenc
