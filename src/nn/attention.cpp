// Self-attention over the encoder interface; see posenc/nn/attention.h.
#include "posenc/nn/attention.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/linear.h"
#include "posenc/kernels/short_attention.h"
#include "posenc/nn/attention_backend.h"

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
  TORCH_CHECK(std::isfinite(options.scale()) && options.scale() >= 0,
              "attention: scale must be finite and >= 0 (0: 1/sqrt(Dh)), got ", options.scale());
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

// The plan's RoPE on q and k [B, N, H, Dh], prefix tokens left as they are.
std::pair<at::Tensor, at::Tensor> rotate(const EncodingPlan& plan, const at::Tensor& q,
                                         const at::Tensor& k, int64_t prefix) {
  if (prefix == 0) return plan.apply_rotary(q, k);
  const int64_t n = q.size(1);
  auto [q_rest, k_rest] =
      plan.apply_rotary(q.narrow(1, prefix, n - prefix), k.narrow(1, prefix, n - prefix));
  return {torch::cat({q.narrow(1, 0, prefix), q_rest}, 1),
          torch::cat({k.narrow(1, 0, prefix), k_rest}, 1)};
}

// The specification every backend is tested against: logits, the materialized bias, the causal
// mask (aligned bottom-right over cached keys), key padding, softmax; a query that sees no key
// gives 0. y [B, N, H, Dh].
at::Tensor attention_reference_path(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const EncodingPlan& plan, const at::Tensor& key_padding,
                                    double scale, bool causal, int64_t prefix) {
  const int64_t b = q.size(0), n = q.size(1), h = q.size(2), nk = k.size(1);
  auto logits = torch::einsum("bqhd,bkhd->bhqk", {q, k}) * scale;  // [B, H, N, Nk]
  auto bias = plan.materialize_bias(h, prefix == 0 ? q : q.narrow(1, prefix, n - prefix));
  if (bias.defined()) {
    TORCH_CHECK(bias.size(-3) == h, "attention: the encoder's bias has ", bias.size(-3),
                " heads but the attention has ", h);
    logits = logits + pad_prefix(bias, prefix).to(logits.scalar_type());
  }
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (causal) {
    auto mask =
        torch::ones({n, nk}, torch::dtype(torch::kBool).device(q.device())).triu(1 + nk - n);
    logits = logits.masked_fill(mask, minus_inf);
  }
  if (key_padding.defined())
    logits = logits.masked_fill(~key_padding.to(torch::kBool).view({b, 1, 1, nk}), minus_inf);
  if (plan.has_sample_mask()) {  // packed samples: keys of the query's own sample only
    const auto& ids = plan.sample_ids().to(q.device());   // [N] or [B, N]
    auto other = ids.unsqueeze(-1) != ids.unsqueeze(-2);  // [(B,) N, N]
    logits = logits.masked_fill(other.dim() == 3 ? other.unsqueeze(1) : other, minus_inf);
  }
  // a query that sees no key (every logit -inf: masked) gives 0, as the fused kernel and
  // attention_reference do; its logits are made finite first so that softmax's backward does not
  // turn the row's NaN weights into NaN gradients
  const auto none = (logits == minus_inf).all(-1, /*keepdim=*/true);
  auto weights = torch::softmax(logits.masked_fill(none, 0.0), -1).masked_fill(none, 0.0);
  return torch::einsum("bhqk,bkhd->bqhd", {weights, v});
}

// Runs the route's backend on rotated (or, with RoPE inside, unrotated) q, k, v. y [B, N, H, Dh].
at::Tensor attend(const AttentionRoute& route, const at::Tensor& q, const at::Tensor& k,
                  const at::Tensor& v, const EncodingPlan& plan, const at::Tensor& key_padding,
                  double scale, bool causal, int64_t prefix) {
  switch (route.backend) {
    case AttentionBackend::kShortRotary:
    case AttentionBackend::kShort:
      return attention_short(q, k, v, scale, route.rotary, causal);
    case AttentionBackend::kSdpa:
      return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), {}, 0.0, causal, scale)
          .transpose(1, 2);
    case AttentionBackend::kFused: {
      AttentionMasks masks;
      masks.causal = causal;
      // true where the key is real, as the reference path reads it (.to(bool): nonzero)
      masks.key_padding = key_padding.defined() && key_padding.scalar_type() != torch::kBool
                              ? key_padding.to(torch::kBool)
                              : key_padding;
      // the plan's ids per batch row [B, Nk] (a plan over unbatched positions holds [Nk])
      auto per_row = [&](const at::Tensor& ids) {
        return ids.to(q.device()).expand({q.size(0), k.size(1)}).contiguous();
      };
      if (plan.has_sample_mask()) masks.sample_ids = per_row(plan.sample_ids());
      if (plan.has_variate_bias()) {
        masks.variate_ids = per_row(plan.variate_ids());
        masks.variate_bias = plan.variate_table();
      }
      return attention_fused(q, k, v, route.fused, masks, scale, route.rotary);
    }
    case AttentionBackend::kReference:
      break;
  }
  return attention_reference_path(q, k, v, plan, key_padding, scale, causal, prefix);
}

}  // namespace

// Appends the new keys (rotated) and values; returns all of them. The one place the cache moves.
std::pair<at::Tensor, at::Tensor> KVCache::append(const at::Tensor& k_new, const at::Tensor& v_new,
                                                  const Positions& fresh) {
  positions = append_positions(positions, fresh);
  if (k.defined()) {
    k = torch::cat({k, k_new.detach()}, 1);
    v = torch::cat({v, v_new.detach()}, 1);
  } else {
    k = k_new.detach();
    v = v_new.detach();
  }
  return {k, v};
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x, const Positions& positions,
                                      const at::Tensor& key_padding, KVCache* cache) {
  return forward_plan(x, encoder->plan(plan_request(x, positions, cache)), key_padding, cache);
}

AttentionRoute SelfAttentionImpl::route(const EncodingPlan& plan, const at::Tensor& q,
                                        const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& key_padding, const KVCache* cache) const {
  return select_attention({options, plan, q, k, v, key_padding.defined(), cache != nullptr,
                           cache != nullptr ? cache->size() : 0, options.num_prefix_tokens()});
}

at::Tensor SelfAttentionImpl::forward_plan(const at::Tensor& x, const EncodingPlan& plan,
                                           const at::Tensor& key_padding, KVCache* cache) {
  const auto& positions = plan.request().queries;
  check_inputs(x, plan, cache);
  const int64_t b = x.size(0), n = x.size(1), h = options.num_heads(), dh = options.dim() / h;
  const int64_t cached = cache != nullptr ? cache->size() : 0, prefix = options.num_prefix_tokens();
  // fused: one autograd node per projection (posenc/kernels/linear.h); otherwise at::linear
  // (one addmm with the bias, as Python's F.linear; transformer.cpp's mlp)
  const auto project = [&](const at::Tensor& in, const torch::nn::Linear& layer) {
    return options.fused() ? linear_fused(in, layer->weight, layer->bias)
                           : at::linear(in, layer->weight, layer->bias);
  };
  auto packed = project(x, qkv).view({b, n, 3, h, dh});  // [B, N, 3, H, Dh]
  // Under CPU autocast to bfloat16 (train.precision: bf16) the projection comes out bf16; the
  // short kernel reads float32 (its scratch and arithmetic are float32), so a short sequence's
  // q, k, v are widened (exact) and attended there, not by SDPA's bf16 flash kernel (at N = 16
  // its backward took ~20x the short kernel's time); its float32 output goes on to `out`, which
  // autocast casts back to bf16.
  if (n <= kShortAttentionMaxTokens && x.is_cpu() && packed.scalar_type() == at::kBFloat16 &&
      at::autocast::is_autocast_enabled(at::kCPU))
    packed = packed.to(at::kFloat);
  auto parts = packed.unbind(2);  // 3 x [B, N, H, Dh]
  at::Tensor q = parts[0], k = parts[1], v = parts[2];
  // τ on q scales q k^T alone (rotations are linear, so before or after RoPE is the same)
  if (auto tau = attention_temperature(options, cached, n, cached + n, temperature,
                                       q.options().device(torch::kCPU));
      tau.defined())
    q = q * tau.to(q.device());
  const AttentionRoute chosen = route(plan, q, k, v, key_padding, cache);
  if (!chosen.rotary_inside) std::tie(q, k) = rotate(plan, q, k, prefix);
  if (cache != nullptr) std::tie(k, v) = cache->append(k, v, positions);
  TORCH_CHECK(!key_padding.defined() || key_padding.sizes() == torch::IntArrayRef({b, k.size(1)}),
              "attention: key_padding must be [B, Nk] = [", b, ", ", k.size(1), "], got ",
              key_padding.sizes());
  const double scale =
      options.scale() > 0 ? options.scale() : 1.0 / std::sqrt(static_cast<double>(dh));
  // the short kernel on q, k, v as projected (no temperature, rotation or cache applied
  // outside it): their gradient written as one, without unbind's stack
  const bool short_backend = chosen.backend == AttentionBackend::kShortRotary ||
                             chosen.backend == AttentionBackend::kShort;
  auto y = short_backend && q.is_same(parts[0]) && k.is_same(parts[1]) && v.is_same(parts[2])
               ? attention_short_packed(packed, scale, chosen.rotary, options.causal())
               : attend(chosen, q, k, v, plan, key_padding, scale, options.causal(), prefix);
  return project(y.reshape({b, n, options.dim()}), out);
}

AttentionRoute plan_attention_route(const EncodingPlan& plan, const at::Tensor& q,
                                    const at::Tensor& k, const at::Tensor& v, bool causal,
                                    bool key_padding) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(0) == q.size(0) &&
                  v.size(0) == q.size(0) && k.size(2) == q.size(2) && v.size(2) == q.size(2) &&
                  k.size(3) == q.size(3) && v.size(1) == k.size(1),
              "attention: q [B, Nq, H, Dh], k [B, Nk, H, Dh] and v [B, Nk, H, Dv] disagree: ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  const int64_t nq = q.size(1), nk = k.size(1);
  TORCH_CHECK(plan.request().queries.size() == nq && plan.request().key_positions().size() == nk,
              "attention: the plan covers ", plan.request().queries.size(), " queries and ",
              plan.request().key_positions().size(), " keys, but q has Nq=", nq, " and k Nk=", nk);
  TORCH_CHECK(!causal || nk >= nq, "attention: a causal mask needs Nk >= Nq (the queries are the ",
              "last Nq keys), got Nq=", nq, " and Nk=", nk);
  AttentionOptions options(q.size(2) * q.size(3), q.size(2));
  options.causal(causal);
  // keys before the queries: what a cache would hold (the causal mask aligns bottom-right), but
  // unrotated here (the plan rotates every key)
  return select_attention(
      {options, plan, q, k, v, key_padding, /*cache=*/false, nk - nq, /*prefix=*/0});
}

at::Tensor plan_attention(const EncodingPlan& plan, const at::Tensor& q, const at::Tensor& k,
                          const at::Tensor& v, bool causal, const at::Tensor& key_padding,
                          double scale, AttentionRoute* taken) {
  AttentionRoute route = plan_attention_route(plan, q, k, v, causal, key_padding.defined());
  const int64_t nk = k.size(1);
  TORCH_CHECK(!key_padding.defined() || key_padding.sizes() == torch::IntArrayRef({q.size(0), nk}),
              "attention: key_padding must be [B, Nk] = [", q.size(0), ", ", nk, "], got ",
              key_padding.sizes());
  TORCH_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", scale);
  at::Tensor qr = q, kr = k;
  if (!route.rotary_inside) std::tie(qr, kr) = plan.apply_rotary(q, k);
  auto y = attend(route, qr, kr, v, plan, key_padding, scale, causal, 0);
  if (taken != nullptr) *taken = std::move(route);
  return y;
}

void SelfAttentionImpl::check_inputs(const at::Tensor& x, const EncodingPlan& plan,
                                     const KVCache* cache) const {
  const auto& positions = plan.request().queries;
  TORCH_CHECK(x.dim() == 3 && x.size(2) == options.dim(), "attention: x must be [B, N, ",
              options.dim(), "], got shape ", x.sizes());
  const int64_t prefix = options.num_prefix_tokens();
  TORCH_CHECK(positions.size() == x.size(1) - prefix, "attention: x has N=", x.size(1), " with ",
              prefix, " prefix tokens, so ", x.size(1) - prefix, " positions are needed, but ",
              positions.size(), " were given");
  TORCH_CHECK(cache == nullptr || prefix == 0,
              "attention: a key-value cache cannot be used with prefix tokens");
  TORCH_CHECK(!plan.has_sample_mask() || (prefix == 0 && cache == nullptr),
              "attention: packed samples (sample_ids) cannot be used with prefix tokens or a "
              "key-value cache");
  const int64_t cached = cache != nullptr ? cache->size() : 0;
  TORCH_CHECK(plan.request().key_positions().size() == cached + positions.size(),
              "attention: the plan covers ", plan.request().key_positions().size(),
              " key positions but the layer has ", cached, " cached + ", positions.size(),
              " new keys (build the plan with the cache's positions)");
}

}  // namespace posenc
