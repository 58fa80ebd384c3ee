// Self-attention over the encoder interface; see posenc/nn/attention.h.
#include "posenc/nn/attention.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/attention.h"

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
}

at::Tensor SelfAttentionImpl::forward(const at::Tensor& x, const Positions& positions,
                                      const at::Tensor& key_padding) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == options.dim(), "attention: x must be [B, N, ",
              options.dim(), "], got shape ", x.sizes());
  TORCH_CHECK(positions.size() == x.size(1), "attention: x has N=", x.size(1), " but ",
              positions.size(), " positions were given");
  const int64_t b = x.size(0), n = x.size(1), h = options.num_heads();
  const int64_t dh = options.dim() / h;
  auto parts = qkv->forward(x).view({b, n, 3, h, dh}).unbind(2);  // 3 x [B, N, H, Dh]
  auto [q, k] = encoder->rotate(parts[0], parts[1], positions, positions);
  auto v = parts[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const auto spec = encoder->bias_spec();
  // The fused kernel computes the bias from its description; an encoder that biases without
  // describing it (form kNone) keeps the materialized path.
  const bool describable = spec.form != BiasForm::kNone || encoder->kind() != EncodingKind::kBias;
  if (options.fused() && describable && positions.num_axes() == 1 && !positions.batched()) {
    auto p = positions.axis(0);
    if (attention_fused_supported(spec, q, p, p)) {
      AttentionMasks masks;
      masks.causal = options.causal();
      masks.key_padding = key_padding;
      auto y = attention_fused(q, k, v, spec, p, p, masks, scale);
      return out->forward(y.reshape({b, n, options.dim()}));
    }
  }
  auto logits = torch::einsum("bqhd,bkhd->bhqk", {q, k}) / std::sqrt(static_cast<double>(dh));
  auto bias = encoder->bias(positions, positions, q);
  if (bias.defined()) {
    TORCH_CHECK(bias.size(-3) == h, "attention: the encoder's bias has ", bias.size(-3),
                " heads but the attention has ", h);
    logits = logits + bias.to(logits.scalar_type());
  }
  if (options.causal()) {
    auto mask = torch::ones({n, n}, torch::dtype(torch::kBool).device(x.device())).triu(1);
    logits = logits.masked_fill(mask, -std::numeric_limits<float>::infinity());
  }
  if (key_padding.defined()) {
    TORCH_CHECK(key_padding.sizes() == torch::IntArrayRef({b, n}),
                "attention: key_padding must be [B, N] = [", b, ", ", n, "], got ",
                key_padding.sizes());
    logits = logits.masked_fill(~key_padding.to(torch::kBool).view({b, 1, 1, n}),
                                -std::numeric_limits<float>::infinity());
  }
  auto weights = torch::softmax(logits, -1);
  auto y = torch::einsum("bhqk,bkhd->bqhd", {weights, v}).reshape({b, n, options.dim()});
  return out->forward(y);
}

}  // namespace posenc
