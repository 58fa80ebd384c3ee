// Multi-head self-attention over a position plan (posenc/core/plan.h): it rotates q and k by
// the plan's rotary part and adds its bias parts to the scaled logits, choosing the kernel by
// what the plan holds, never by which encoder built it. Additive parts act on the embeddings
// before the first layer, which the model does.
//
//   q, k, v = x W_q, x W_k, x W_v                     x: [B, N, D] -> [B, N, H, Dh]
//   q, k    = plan.rotary(q, k)
//   logits  = τ_i,h q k^T s + plan.bias(q)          [B, H, N, N], s = 1/sqrt(Dh) or options.scale
//   out     = softmax(logits + masks) v W_o          [B, N, D]
//   masks: causal, key padding, and the plan's packed samples (keys of the query's sample only)
// Kernels: no bias and no padding -> torch's scaled_dot_product_attention; describable bias
// parts (and padding, cached keys; on the CPU the variate part's ids and the packed samples'
// sample ids, read per row in O(N)) -> posenc's fused kernel (RoPE applied inside its tiles on
// the CPU when there is no cache); anything else -> the materialized reference.
//
// The temperature τ scales the content logits of query i in head h (the bias parts are not
// scaled), applied to q before any kernel, so every path (SDPA, the short and fused kernels, the
// materialized reference) sees the same: kNone τ = 1; kLogN τ_i = max(1, log n_i / log L), n_i
// the keys query i sees (its 1-based position when causal, counting cached keys; all keys
// otherwise) and L the training length — Qwen's use_logn_attn (Qwen-7B modeling_qwen.py:
// logn_list = [log_L(i) if i > L else 1]), the "length-aware temperature" of NoPE length
// generalization (Wang et al. 2024) and scalable softmax; kLearned τ_h = exp(t_h), one learned
// scalar per head (t = 0 at initialization).
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

#include <string>

#include "posenc/core/encoder.h"
#include "posenc/nn/attention_backend.h"

namespace posenc {

/// A length- or head-dependent scale of the content logits (see above).
enum class AttentionTemperature { kNone, kLogN, kLearned };
/// "none" / "logn" / "learned"; anything else is an error naming the value.
AttentionTemperature attention_temperature_from_string(const std::string& name);

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
  /// posenc/kernels/attention_fused.h) when it takes the encoder's bias; false always materializes.
  TORCH_ARG(bool, fused) = true;
  /// Leading tokens without a position (CLS, registers; default 0).
  TORCH_ARG(int64_t, num_prefix_tokens) = 0;
  /// Scale of the content logits (default kNone).
  TORCH_ARG(AttentionTemperature, temperature) = AttentionTemperature::kNone;
  /// kLogN: the training length L (>= 2); queries that see more keys than L are sharpened.
  TORCH_ARG(int64_t, logn_length) = 0;
  /// The logits' scale s in q k^T * s (default 0: 1/sqrt(Dh)); 1.0 is Chronos-2's unscaled
  /// attention (chronos2/layers.py: scaled_dot_product_attention(..., scale=1.0)).
  TORCH_ARG(double, scale) = 0.0;
};

/// Keys and values of earlier steps, for incremental decoding. Starts empty.
struct KVCache {
  at::Tensor k, v;      ///< [B, Nc, H, Dh], keys already rotated
  Positions positions;  ///< the cached keys' positions (Nc)
  int64_t size() const { return k.defined() ? k.size(1) : 0; }
  /// Appends new keys (rotated) and values [B, N, H, Dh] at `fresh` positions; returns all the
  /// keys and values [B, Nc + N, H, Dh]. The one place a cache changes.
  std::pair<at::Tensor, at::Tensor> append(const at::Tensor& k_new, const at::Tensor& v_new,
                                           const Positions& fresh);
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
  /// The same with a plan built by the caller (plan_request: the cache's key positions too).
  at::Tensor forward_plan(const at::Tensor& x, const EncodingPlan& plan,
                          const at::Tensor& key_padding = {}, KVCache* cache = nullptr);
  /// The backend a call with these projected q, k, v [B, N, H, Dh] runs, and why the ones above
  /// it were passed over (posenc/nn/attention_backend.h).
  AttentionRoute route(const EncodingPlan& plan, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& key_padding = {},
                       const KVCache* cache = nullptr) const;

  AttentionOptions options;
  PositionalEncoding encoder{nullptr};
  torch::nn::Linear qkv{nullptr}, out{nullptr};
  at::Tensor temperature;  ///< kLearned: [H], τ_h = exp(temperature_h)

 private:
  void check_inputs(const at::Tensor& x, const EncodingPlan& plan, const KVCache* cache) const;
};
TORCH_MODULE(SelfAttention);

/// Attention with a plan's positions over q [B, Nq, H, Dh], k [B, Nk, H, Dh], v [B, Nk, H, Dv]
/// as projected (unrotated; the plan's request covers the Nq queries and Nk keys, e.g. keys given
/// apart for cross or cached attention, queries at the last Nq keys for the causal mask): the
/// backend select_attention admits first (short kernel, SDPA, the fused bias kernel, else the
/// materialized reference), the plan's RoPE applied inside its tiles or before, its bias
/// computed on the fly or materialized. key_padding [B, Nk] bool (true: a real key). The one
/// call SelfAttention makes after its projections, for callers with their own (Python's
/// Plan.attention). `taken` (optional) receives the route.
at::Tensor plan_attention(const EncodingPlan& plan, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, bool causal, const at::Tensor& key_padding,
                          double scale, AttentionRoute* taken = nullptr);

/// The route plan_attention takes for these q, k, v (shapes checked, one line each): the
/// backend and why, without running it. key_padding: whether a [B, Nk] mask will be given.
AttentionRoute plan_attention_route(const EncodingPlan& plan, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v, bool causal,
                                    bool key_padding);

/// τ for the queries [cached, cached + n) of a layer with these options, shaped to multiply
/// q [B, n, H, Dh]: [1, n, 1, 1] (kLogN), [1, 1, H, 1] (kLearned: `learned` [H]), or undefined
/// (kNone: nothing to scale). nk: the keys each query may see in total (non-causal kLogN).
at::Tensor attention_temperature(const AttentionOptions& options, int64_t cached, int64_t n,
                                 int64_t nk, const at::Tensor& learned,
                                 const at::TensorOptions& like);

/// Positions of cached keys followed by the new ones.
Positions append_positions(const Positions& cached, const Positions& fresh);
/// The plan request for a forward over x at `positions`: with a cache, every key position
/// (cached + new) for the bias and the new ones for the rotation; tables on x's device.
PlanRequest plan_request(const at::Tensor& x, const Positions& positions,
                         const KVCache* cache = nullptr);

}  // namespace posenc
