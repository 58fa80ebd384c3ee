// Pre-norm transformer blocks; see posenc/nn/transformer.h.
#include "posenc/nn/transformer.h"

#include <torch/torch.h>

#include "posenc/kernels/gelu.h"
#include "posenc/kernels/layer_norm.h"
#include "posenc/kernels/linear.h"

namespace posenc {

TransformerBlockImpl::TransformerBlockImpl(const TransformerOptions& o,
                                           PositionalEncoding encoder) {
  TORCH_CHECK(o.mlp_ratio() > 0, "transformer: mlp_ratio must be > 0, got ", o.mlp_ratio());
  TORCH_CHECK(o.dropout() >= 0 && o.dropout() < 1, "transformer: dropout must be in [0, 1), got ",
              o.dropout());
  const auto hidden = static_cast<int64_t>(o.mlp_ratio() * static_cast<double>(o.dim()));
  norm1 = register_module(
      "norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim()}).eps(o.norm_eps())));
  attention =
      register_module("attention", SelfAttention(AttentionOptions(o.dim(), o.num_heads())
                                                     .causal(o.causal())
                                                     .fused(o.fused())
                                                     .num_prefix_tokens(o.num_prefix_tokens())
                                                     .temperature(o.temperature())
                                                     .logn_length(o.logn_length())
                                                     .scale(o.attention_scale()),
                                                 std::move(encoder)));
  // The stack registers the shared encoder once; registered in every block too, its parameters
  // would be listed (and stepped by an optimizer) once per block.
  attention->unregister_module("encoder");
  norm2 = register_module(
      "norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim()}).eps(o.norm_eps())));
  fc1 = register_module("fc1", torch::nn::Linear(o.dim(), hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, o.dim()));
  dropout = register_module("dropout", torch::nn::Dropout(o.dropout()));
  fused_ = o.fused();
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x, const EncodingPlan& plan,
                                         const at::Tensor& key_padding, KVCache* cache) {
  auto y = x + dropout(attention->forward_plan(norm1(x), plan, key_padding, cache));
  return y + mlp(norm2(y));
}

at::Tensor TransformerBlockImpl::mlp(const at::Tensor& normed) {
  // fused: linear -> GELU -> linear as one autograd node (posenc/kernels/linear.h: the bias
  // rows filled before MKL accumulates into them, dh in place, the fused GELU's passes inside).
  // Otherwise at::linear, as Python's F.linear: a contiguous [B, N, D] input is one addmm with
  // the bias (LibTorch's torch::nn::Linear takes matmul + a separate bias add_ for inputs above
  // 2D: one more pass and two more autograd nodes per layer)
  if (fused_)
    return dropout(mlp_gelu_fused(normed, fc1->weight, fc1->bias, fc2->weight, fc2->bias));
  const auto hidden = at::linear(normed, fc1->weight, fc1->bias);
  return dropout(at::linear(torch::gelu(hidden), fc2->weight, fc2->bias));
}

std::pair<at::Tensor, at::Tensor> TransformerBlockImpl::forward_normed(
    const at::Tensor& x, const at::Tensor& normed, const EncodingPlan& plan,
    const at::Tensor& key_padding, KVCache* cache, const torch::nn::LayerNorm& next) {
  // h = x + attention(norm1(x)) and norm2(h) in one pass; then out = h + mlp and next(out)
  auto [h, normed2] =
      add_layer_norm(x, dropout(attention->forward_plan(normed, plan, key_padding, cache)),
                     norm2->weight, norm2->bias, norm2->options.eps());
  auto [out, normed_out] =
      add_layer_norm(h, mlp(normed2), next->weight, next->bias, next->options.eps());
  return {out, normed_out};
}

TransformerImpl::TransformerImpl(TransformerOptions options_, PositionalEncoding encoder_)
    : options(std::move(options_)), encoder(std::move(encoder_)) {
  TORCH_CHECK(options.num_layers() >= 1, "transformer: num_layers must be >= 1, got ",
              options.num_layers());
  TORCH_CHECK(!encoder.is_empty(), "transformer: an encoder is required (use Nope for none)");
  register_module("encoder", encoder);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < options.num_layers(); ++i) {
    blocks->push_back(TransformerBlock(options, encoder));
  }
  norm = register_module(
      "norm",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({options.dim()}).eps(options.norm_eps())));
}

at::Tensor TransformerImpl::forward(const at::Tensor& x, const Positions& positions,
                                    const at::Tensor& key_padding, std::vector<KVCache>* caches) {
  const KVCache* cache = caches != nullptr && !caches->empty() ? &caches->front() : nullptr;
  return forward_plan(x, encoder->plan(plan_request(x, positions, cache)), key_padding, caches);
}

at::Tensor TransformerImpl::forward_plan(const at::Tensor& x, const EncodingPlan& plan,
                                         const at::Tensor& key_padding,
                                         std::vector<KVCache>* caches) {
  TORCH_CHECK(caches == nullptr || options.causal(),
              "transformer: a key-value cache is for causal (decoder) stacks");
  if (caches != nullptr && caches->size() != blocks->size()) caches->resize(blocks->size());
  // one plan for every block: tables, buckets and the additive embedding computed once
  auto y = plan.apply_additive(x, options.num_prefix_tokens());
  if (options.fused()) {  // residual adds fused with the layer norms after them
    auto normed = blocks->at<TransformerBlockImpl>(0).norm1(y);
    for (size_t i = 0; i < blocks->size(); ++i) {
      const auto& next =
          i + 1 < blocks->size() ? blocks->at<TransformerBlockImpl>(i + 1).norm1 : norm;
      std::tie(y, normed) = blocks->at<TransformerBlockImpl>(i).forward_normed(
          y, normed, plan, key_padding, caches ? &(*caches)[i] : nullptr, next);
    }
    return normed;
  }
  for (size_t i = 0; i < blocks->size(); ++i) {
    y = blocks->at<TransformerBlockImpl>(i).forward(y, plan, key_padding,
                                                    caches ? &(*caches)[i] : nullptr);
  }
  return norm(y);
}

}  // namespace posenc
