// Multi-head self-attention that takes any positional encoding through the interface
// (posenc/core/encoder.h): it calls rotate() on q and k and adds bias() to the scaled logits,
// never asking which encoder it holds. Additive encoders act on the embeddings before the first
// layer (encoder->add), which the model does.
//
//   q, k, v = x W_q, x W_k, x W_v                     x: [B, N, D] -> [B, N, H, Dh]
//   q, k    = encoder.rotate(q, k, p, p)
//   logits  = q k^T / sqrt(Dh) + encoder.bias(p, p, q) [B, H, N, N]
//   out     = softmax(logits + masks) v W_o          [B, N, D]
//
// Prefix tokens (a ViT's CLS, registers): the first P tokens carry no position. Positions cover
// the N - P others; rotation skips the prefix and the bias is zero in the prefix rows and columns
// (as RoPE-ViT, Heo et al. 2024, leaves CLS unrotated).
// Key-value cache (generation): rotated keys and values of earlier tokens are kept with their
// positions; a step's queries attend to cache + new keys, the causal mask offset by the cache
// length (key j visible to query i when j <= i + Nk - Nq).
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
  /// Use a fused attention kernel (default true): torch's scaled_dot_product_attention when
  /// there is no bias and no key padding, else posenc's (bias computed on the fly,
  /// posenc/kernels/attention.h) when it takes the encoder's bias; false always materializes.
  TORCH_ARG(bool, fused) = true;
  /// Leading tokens without a position (CLS, registers; default 0).
  TORCH_ARG(int64_t, num_prefix_tokens) = 0;
};

/// Keys and values of earlier steps, for incremental decoding. Starts empty.
struct KVCache {
  at::Tensor k, v;      ///< [B, Nc, H, Dh], keys already rotated
  Positions positions;  ///< the cached keys' positions (Nc)
  int64_t size() const { return k.defined() ? k.size(1) : 0; }
};

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(AttentionOptions options, PositionalEncoding encoder);
  void reset();
  /// x [B, N, D]; positions of the N - num_prefix_tokens positioned tokens; key_padding [B, Nk]
  /// bool, true where a key is real (optional; Nk = cache size + N). With a cache, the new keys
  /// and values are appended to it.
  at::Tensor forward(const at::Tensor& x, const Positions& positions,
                     const at::Tensor& key_padding = {}, KVCache* cache = nullptr);

  AttentionOptions options;
  PositionalEncoding encoder{nullptr};
  torch::nn::Linear qkv{nullptr}, out{nullptr};
};
TORCH_MODULE(SelfAttention);

}  // namespace posenc
