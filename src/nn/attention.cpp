// Self-attention over the encoder interface; see posenc/nn/attention.h.
#include "posenc/nn/attention.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/attention.h"
#include "posenc/kernels/short_attention.h"

namespace posenc {

SelfAttentionImpl::SelfAttentionImpl(AttentionOptions options_, PositionalEncoding encoder_)
    : options(std::move(options_)), encoder(std::move(encoder_)) {
  reset();
}

void SelfAttentionImpl::reset() {
  TORCH_CHECK(options.num_heads() >= 1 && options.dim() % options.num_heads() == 0,
              "attention: dim (", options.dim(), ") must be divisible by num_heads (",
              options.num_heads(), ")");
  TORCH_CHECK(!encoder.is_empty(), "attention: an encoder is required (use Nope for none)");
  qkv = register_module("qkv", torch::nn::Linear(options.dim(), 3 * options.dim()));
  out = register_module("out", torch::nn::Linear(options.dim(), options.dim()));
  register_module("encoder", encoder);
  if (options.temperature() == AttentionTemperature::kLogN) {
    TORCH_CHECK(options.logn_length() >= 2,
                "attention: the logn temperature needs the training length (logn_length >= 2), "
                "got ",
                options.logn_length());
  }
  if (options.temperature() == AttentionTemperature::kLearned)
    temperature = register_parameter("temperature", torch::zeros({options.num_heads()}));
}

AttentionTemperature attention_temperature_from_string(const std::string& name) {
  if (name == "none") return AttentionTemperature::kNone;
  if (name == "logn") return AttentionTemperature::kLogN;
  if (name == "learned") return AttentionTemperature::kLearned;
  TORCH_CHECK(false, "attention temperature must be 'none', 'logn' or 'learned', got '", name, "'");
}

at::Tensor attention_temperature(const AttentionOptions& options, int64_t cached, int64_t n,
                                 int64_t nk, const at::Tensor& learned,
                                 const at::TensorOptions& like) {
  switch (options.temperature()) {
    case AttentionTemperature::kNone:
      return {};
    case AttentionTemperature::kLogN: {
      // keys seen by query i: cached + i + 1 when causal, all nk otherwise
      auto seen = options.causal()
                      ? torch::arange(cached + 1, cached + n + 1, like.dtype(torch::kDouble))
                      : torch::full({n}, static_cast<double>(nk), like.dtype(torch::kDouble));
      auto tau = (seen.log() / std::log(static_cast<double>(options.logn_length()))).clamp_min(1.0);
      return tau.to(like.dtype()).view({1, n, 1, 1});
    }
    case AttentionTemperature::kLearned:
      return learned.exp().to(like.dtype()).view({1, 1, -1, 1});
  }
  return {};
}

Positions append_positions(const Positions& cached, const Positions& fresh) {
  if (!cached.defined()) return fresh;
  TORCH_CHECK(cached.axes() == fresh.axes() && cached.batched() == fresh.batched(),
              "attention: cached positions ", cached.describe(), " do not match the new ",
              fresh.describe());
  return Positions(torch::cat({cached.coords(), fresh.coords()}, -2), fresh.axes());
}

PlanRequest plan_request(const at::Tensor& x, const Positions& positions, const KVCache* cache) {
  PlanRequest request{positions};
  request.device = x.device();
  if (cache != nullptr && cache->positions.defined()) {
    request.keys = append_positions(cache->positions, positions);
    request.rotated_keys = positions;  // cached keys are stored rotated
  }
  return request;
}

namespace {

// [.., H, Nq - P, Nk - P] -> [.., H, Nq, Nk]: zero bias in the prefix rows and columns.
at::Tensor pad_prefix(const at::Tensor& bias, int64_t prefix) {
  if (prefix == 0) return bias;
  return torch::constant_pad_nd(bias, {prefix, 0, prefix, 0}, 0.0);
}

// RoPE inside the fused kernel's tiles: CPU, constant [N, F] tables, no Shaw table.
bool rotary_inside(const EncodingPlan& plan, const at::Tensor& q, const FusedBias& bias) {
  const auto& r = plan.rotary();
  return r.defined() && r.fused && !r.per_head && q.device().is_cpu() && r.q_cos.dim() == 2 &&
         r.k_cos.dim() == 2 && !r.q_cos.requires_grad() && !r.k_cos.requires_grad() &&
         (r.head_dim <= 0 || r.head_dim == q.size(3)) &&
         bias.table.form != BiasForm::kRelativeTable;
}

// The plan's rotary tables for the short kernel: constant [N, F], one pair for q and k.
AttentionRotary short_rotary(const EncodingPlan& plan, const at::Tensor& q) {
  const auto& r = plan.rotary();
  if (!r.defined() || !r.fused || r.per_head || !r.shared || r.q_cos.dim() != 2 ||
      r.q_cos.requires_grad() || r.q_sin.requires_grad() ||
      (r.head_dim > 0 && r.head_dim != q.size(3)))
    return {};
  return {r.q_cos, r.q_sin, r.k_cos, r.k_sin, r.layout};
}

}  // namespace

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x, const Positions& positions,
                                      const at::Tensor& key_padding, KVCache* cache) {
  return forward_plan(x, encoder->plan(plan_request(x, positions, cache)), key_padding, cache);
}

at::Tensor SelfAttentionImpl::forward_plan(const at::Tensor& x, const EncodingPlan& plan,
                                           const at::Tensor& key_padding, KVCache* cache) {
  const auto& positions = plan.request().queries;
  TORCH_CHECK(x.dim() == 3 && x.size(2) == options.dim(), "attention: x must be [B, N, ",
              options.dim(), "], got shape ", x.sizes());
  const int64_t prefix = options.num_prefix_tokens();
  TORCH_CHECK(positions.size() == x.size(1) - prefix, "attention: x has N=", x.size(1), " with ",
              prefix, " prefix tokens, so ", x.size(1) - prefix, " positions are needed, but ",
              positions.size(), " were given");
  TORCH_CHECK(cache == nullptr || prefix == 0,
              "attention: a key-value cache cannot be used with prefix tokens");
  const int64_t b = x.size(0), n = x.size(1), h = options.num_heads();
  const int64_t dh = options.dim() / h;
  const int64_t cached = cache != nullptr ? cache->size() : 0;
  TORCH_CHECK(plan.request().key_positions().size() == cached + positions.size(),
              "attention: the plan covers ", plan.request().key_positions().size(),
              " key positions but the layer has ", cached, " cached + ", positions.size(),
              " new keys (build the plan with the cache's positions)");
  auto parts = qkv->forward(x).view({b, n, 3, h, dh}).unbind(2);  // 3 x [B, N, H, Dh]
  at::Tensor q = parts[0], k = parts[1], v = parts[2];
  // τ on q scales q k^T alone (rotations are linear, so before or after RoPE is the same)
  if (auto tau = attention_temperature(options, cached, n, cached + n, temperature,
                                       q.options().device(torch::kCPU));
      tau.defined())
    q = q * tau.to(q.device());
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  // Short sequences (a ViT's patch grid) without bias, padding or cache: the short kernel, with
  // the plan's RoPE inside it when it can take the tables; measured 2-3x faster than SDPA's CPU
  // flash kernel at N = 16 (bench/bench_short_attention.cpp).
  const bool short_path = options.fused() && !plan.has_bias() && !key_padding.defined() &&
                          cache == nullptr && q.device().is_cpu();
  if (short_path && prefix == 0 && plan.rotary().defined()) {
    const auto rotary = short_rotary(plan, q);
    if (rotary.defined() && attention_short_supported(q, k, v, rotary)) {
      auto y = attention_short(q, k, v, scale, rotary, options.causal());
      return out->forward(y.reshape({b, n, options.dim()}));
    }
  }
  // Fused kernel with the bias (and RoPE) computed inside it: the plan's describable parts.
  const bool fusable_bias = !plan.has_bias() || plan.bias_describable();
  std::shared_ptr<const FusedBias> fused;
  if (options.fused() && prefix == 0 && fusable_bias &&
      (plan.has_bias() || key_padding.defined() || (options.causal() && cached > 0))) {
    fused = plan.fused_bias();
    if (!attention_fused_supported(*fused, q)) fused.reset();
  }
  const bool inside = fused && cache == nullptr && rotary_inside(plan, q, *fused);
  if (!inside) {
    if (prefix == 0) {
      std::tie(q, k) = plan.apply_rotary(q, k);
    } else {
      auto [q_rest, k_rest] =
          plan.apply_rotary(q.narrow(1, prefix, n - prefix), k.narrow(1, prefix, n - prefix));
      q = torch::cat({q.narrow(1, 0, prefix), q_rest}, 1);
      k = torch::cat({k.narrow(1, 0, prefix), k_rest}, 1);
    }
  }
  if (cache != nullptr) {
    cache->positions = append_positions(cache->positions, positions);
    if (cache->k.defined()) {
      k = torch::cat({cache->k, k}, 1);
      v = torch::cat({cache->v, v}, 1);
    }
    cache->k = k.detach();
    cache->v = v.detach();
  }
  const int64_t nk = k.size(1);
  if (key_padding.defined()) {
    TORCH_CHECK(key_padding.sizes() == torch::IntArrayRef({b, nk}),
                "attention: key_padding must be [B, Nk] = [", b, ", ", nk, "], got ",
                key_padding.sizes());
  }
  // No bias and no key padding: torch's fused attention (at::scaled_dot_product_attention),
  // whose CPU flash kernel measured 1.4-1.75x faster than ours for forward + backward at
  // training sizes ([32, 128, 4, 32]: 29.5 vs 45.3 ms). Its causal mask is aligned top-left,
  // so with cached keys (Nk > Nq) ours takes over; prefix tokens need no care without a bias.
  if (short_path && attention_short_supported(q, k, v)) {
    auto y = attention_short(q, k, v, scale, {}, options.causal());
    return out->forward(y.reshape({b, n, options.dim()}));
  }
  if (options.fused() && !plan.has_bias() && !key_padding.defined() &&
      (!options.causal() || n == nk)) {
    auto y = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), {}, 0.0, options.causal(), scale);
    return out->forward(y.transpose(1, 2).reshape({b, n, options.dim()}));
  }
  if (fused) {
    AttentionMasks masks;
    masks.causal = options.causal();
    masks.key_padding = key_padding;
    AttentionRotary rotary;
    if (inside) {
      const auto& r = plan.rotary();
      rotary = {r.q_cos, r.q_sin, r.k_cos, r.k_sin, r.layout};
    }
    auto y = attention_fused(q, k, v, fused, masks, scale, rotary);
    return out->forward(y.reshape({b, n, options.dim()}));
  }
  auto logits = torch::einsum("bqhd,bkhd->bhqk", {q, k}) * scale;  // [B, H, N, Nk]
  auto bias = plan.materialize_bias(h, prefix == 0 ? q : q.narrow(1, prefix, n - prefix));
  if (bias.defined()) {
    TORCH_CHECK(bias.size(-3) == h, "attention: the encoder's bias has ", bias.size(-3),
                " heads but the attention has ", h);
    logits = logits + pad_prefix(bias, prefix).to(logits.scalar_type());
  }
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (options.causal()) {
    auto mask =
        torch::ones({n, nk}, torch::dtype(torch::kBool).device(x.device())).triu(1 + nk - n);
    logits = logits.masked_fill(mask, minus_inf);
  }
  if (key_padding.defined()) {
    logits = logits.masked_fill(~key_padding.to(torch::kBool).view({b, 1, 1, nk}), minus_inf);
  }
  auto weights = torch::softmax(logits, -1);
  auto y = torch::einsum("bhqk,bkhd->bqhd", {weights, v}).reshape({b, n, options.dim()});
  return out->forward(y);
}

}  // namespace posenc
