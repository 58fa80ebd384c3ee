// Multi-head self-attention that takes any positional encoding through the interface
// (posenc/core/encoder.h): it calls rotate() on q and k and adds bias() to the scaled logits,
// never asking which encoder it holds. Additive encoders act on the embeddings before the first
// layer (encoder->add), which the model does.
//
//   q, k, v = x W_q, x W_k, x W_v                     x: [B, N, D] -> [B, N, H, Dh]
//   q, k    = encoder.rotate(q, k, p, p)
//   logits  = q k^T / sqrt(Dh) + encoder.bias(p, p, q) [B, H, N, N]
//   out     = softmax(logits + masks) v W_o          [B, N, D]
#pragma once

#include <torch/arg.h>
#include <torch/nn/modules/linear.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct AttentionOptions {
  AttentionOptions(int64_t dim, int64_t num_heads) : dim_(dim), num_heads_(num_heads) {}
  /// Model width D (divisible by num_heads).
  TORCH_ARG(int64_t, dim);
  /// Heads H; Dh = D / H.
  TORCH_ARG(int64_t, num_heads);
  /// Mask keys after each query (default false).
  TORCH_ARG(bool, causal) = false;
  /// Use the fused attention kernel (bias computed on the fly, posenc/kernels/attention.h) when
  /// it takes the encoder's bias (default true); false always materializes the bias.
  TORCH_ARG(bool, fused) = true;
};

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(AttentionOptions options, PositionalEncoding encoder);
  void reset();
  /// x [B, N, D]; key_padding [B, N] bool, true where a token is real (optional).
  at::Tensor forward(const at::Tensor& x, const Positions& positions,
                     const at::Tensor& key_padding = {});

  AttentionOptions options;
  PositionalEncoding encoder{nullptr};
  torch::nn::Linear qkv{nullptr}, out{nullptr};
};
TORCH_MODULE(SelfAttention);

}  // namespace posenc
