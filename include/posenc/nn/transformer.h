// Pre-norm transformer blocks over the encoder interface (Xiong et al. 2020, "On Layer
// Normalization in the Transformer Architecture"; GPT-2 / ViT layout):
//
//   plan = encoder.plan(p)                      once per forward (posenc/core/plan.h)
//   x = plan.additive(x)                        additive parts, once, before the first block
//   x = x + Attention(LN(x), plan)              rotary / bias parts inside every attention
//   x = x + W2 GELU(W1 LN(x))                   MLP of width mlp_ratio * D
//   y = LN(x)                                   final norm
//
// An encoder stack (bidirectional) or a decoder stack (causal, with a key-value cache for
// generation: each step passes the new tokens' positions, e.g. Positions::sequence(1, offset)).
// One encoder instance is shared by all blocks (its parameters, e.g. a T5 table, are shared as in
// T5 itself).
//
//   x: [B, N, D]   positions: Positions for the N - num_prefix_tokens positioned tokens
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <vector>

#include "posenc/nn/attention.h"

namespace posenc {

struct TransformerOptions {
  TransformerOptions(int64_t dim = 128, int64_t num_heads = 4, int64_t num_layers = 4)
      : dim_(dim), num_heads_(num_heads), num_layers_(num_layers) {}
  /// Model width D.
  TORCH_ARG(int64_t, dim);
  /// Attention heads H (D divisible by H).
  TORCH_ARG(int64_t, num_heads);
  /// Blocks (default 4).
  TORCH_ARG(int64_t, num_layers);
  /// MLP width as a multiple of D (default 4).
  TORCH_ARG(double, mlp_ratio) = 4.0;
  /// Dropout after attention and MLP (default 0).
  TORCH_ARG(double, dropout) = 0.0;
  /// Causal self-attention: a decoder stack (default false).
  TORCH_ARG(bool, causal) = false;
  /// Fused kernels: attention where the encoder allows it, the MLP's GELU, each residual add with
  /// the layer norm after it (default true).
  TORCH_ARG(bool, fused) = true;
  /// Leading tokens without a position, e.g. CLS (default 0).
  TORCH_ARG(int64_t, num_prefix_tokens) = 0;
  /// Scale of the attention's content logits (posenc/nn/attention.h; default kNone).
  TORCH_ARG(AttentionTemperature, temperature) = AttentionTemperature::kNone;
  /// kLogN: the training length.
  TORCH_ARG(int64_t, logn_length) = 0;
  /// The attention logits' scale (default 0: 1/sqrt(Dh); 1.0: unscaled, as Chronos-2).
  TORCH_ARG(double, attention_scale) = 0.0;
  /// Every LayerNorm's epsilon (default 1e-5, torch's; 1e-6: timm's ViT and EVA, which
  /// `posenc export --to timm` needs).
  TORCH_ARG(double, norm_eps) = 1e-5;
};

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(const TransformerOptions& options, PositionalEncoding encoder);
  at::Tensor forward(const at::Tensor& x, const EncodingPlan& plan,
                     const at::Tensor& key_padding = {}, KVCache* cache = nullptr);
  /// The same block given norm1(x) already computed, returning (x_out, next(x_out)): each residual
  /// add and the layer norm after it as one fused pass (posenc/kernels/layer_norm.h), the stack's
  /// path when fused.
  std::pair<at::Tensor, at::Tensor> forward_normed(const at::Tensor& x, const at::Tensor& normed,
                                                   const EncodingPlan& plan,
                                                   const at::Tensor& key_padding, KVCache* cache,
                                                   const torch::nn::LayerNorm& next);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  SelfAttention attention{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  /// dropout(W2 GELU(W1 normed)): the MLP on the normed stream.
  at::Tensor mlp(const at::Tensor& normed);
  bool fused_ = true;  // the MLP as mlp_gelu_fused's one node (TransformerOptions::fused)
};
TORCH_MODULE(TransformerBlock);

class TransformerImpl : public torch::nn::Module {
 public:
  TransformerImpl(TransformerOptions options, PositionalEncoding encoder);
  /// x [B, N, D] -> [B, N, D]. key_padding [B, Nk] (true = real token); caches: one per block
  /// (resized on first use), only for causal stacks.
  at::Tensor forward(const at::Tensor& x, const Positions& positions,
                     const at::Tensor& key_padding = {}, std::vector<KVCache>* caches = nullptr);
  /// The same with a plan built by the caller (e.g. with token kinds for per-modality parts:
  /// encoder->plan(request)); with caches, plan_request(x, positions, &caches->front()).
  at::Tensor forward_plan(const at::Tensor& x, const EncodingPlan& plan,
                          const at::Tensor& key_padding = {},
                          std::vector<KVCache>* caches = nullptr);

  TransformerOptions options;
  PositionalEncoding encoder{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Transformer);

}  // namespace posenc
