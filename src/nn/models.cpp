// Task heads; see posenc/nn/models.h.
#include "posenc/nn/models.h"

#include <torch/torch.h>

#include "posenc/kernels/linear.h"

namespace posenc {

std::string to_string(Pooling pooling) { return pooling == Pooling::kCls ? "cls" : "mean"; }

Pooling pooling_from_string(const std::string& name) {
  if (name == "mean") return Pooling::kMean;
  if (name == "cls") return Pooling::kCls;
  TORCH_CHECK(false, "pooling must be 'mean' or 'cls', got '", name, "'");
}

namespace {

void check_encoder(const PositionalEncoding& encoder, const char* who) {
  TORCH_CHECK(!encoder.is_empty(), who, ": an encoder is required (use Nope for none)");
}

}  // namespace

TokenClassifierImpl::TokenClassifierImpl(TokenClassifierOptions options_,
                                         PositionalEncoding encoder)
    : options(std::move(options_)) {
  check_encoder(encoder, "classifier");
  TORCH_CHECK(options.token_dim() > 0 && options.num_classes() > 1,
              "classifier: token_dim must be > 0 and num_classes > 1, got ", options.token_dim(),
              " and ", options.num_classes());
  auto t = options.transformer();
  t.num_prefix_tokens(options.pooling() == Pooling::kCls ? 1 : 0);
  embed = register_module("embed", torch::nn::Linear(options.token_dim(), t.dim()));
  if (options.pooling() == Pooling::kCls) {
    cls = register_parameter("cls", torch::randn({1, 1, t.dim()}) * 0.02);
  }
  transformer = register_module("transformer", Transformer(t, std::move(encoder)));
  head = register_module("head", torch::nn::Linear(t.dim(), options.num_classes()));
}

at::Tensor TokenClassifierImpl::forward(const at::Tensor& tokens, const Positions& positions) {
  TORCH_CHECK(tokens.dim() == 3 && tokens.size(2) == options.token_dim(),
              "classifier: tokens must be [B, N, ", options.token_dim(), "], got ", tokens.sizes());
  // [B, N, D]: fused, one autograd node (posenc/kernels/linear.h); otherwise at::linear, one
  // addmm with the bias (transformer.cpp's mlp says why)
  const bool fused = options.transformer().fused();
  const auto project = [&](const at::Tensor& in, const torch::nn::Linear& layer) {
    return fused ? linear_fused(in, layer->weight, layer->bias)
                 : at::linear(in, layer->weight, layer->bias);
  };
  auto x = project(tokens, embed);
  if (options.pooling() == Pooling::kCls) {
    x = torch::cat({cls.expand({x.size(0), 1, x.size(2)}), x}, 1);
  }
  auto y = transformer->forward(x, positions);
  auto pooled = options.pooling() == Pooling::kCls ? y.select(1, 0) : y.mean(1);
  return project(pooled, head);
}

LanguageModelImpl::LanguageModelImpl(LanguageModelOptions options_, PositionalEncoding encoder)
    : options(std::move(options_)) {
  check_encoder(encoder, "language model");
  auto t = options.transformer();
  t.causal(true);
  options.transformer(t);
  embed = register_module("embed", torch::nn::Embedding(options.vocab_size(), t.dim()));
  transformer = register_module("transformer", Transformer(t, std::move(encoder)));
  head = register_module("head", torch::nn::Linear(t.dim(), options.vocab_size()));
}

at::Tensor LanguageModelImpl::forward(const at::Tensor& tokens, const Positions& positions,
                                      std::vector<KVCache>* caches) {
  TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
              "language model: tokens must be int64 [B, N], got ", tokens.scalar_type(), " ",
              tokens.sizes());
  return head(transformer->forward(embed(tokens), positions, at::Tensor(), caches));
}

at::Tensor LanguageModelImpl::generate(const at::Tensor& prompt, int64_t steps) {
  torch::NoGradGuard no_grad;
  std::vector<KVCache> caches;
  auto logits = forward(prompt, Positions::sequence(prompt.size(1)), &caches);
  std::vector<at::Tensor> produced;
  auto next = logits.select(1, -1).argmax(-1, true);  // [B, 1]
  for (int64_t i = 0; i < steps; ++i) {
    produced.push_back(next);
    if (i + 1 == steps) break;
    const double offset = static_cast<double>(prompt.size(1) + i);
    logits = forward(next, Positions::sequence(1, offset), &caches);
    next = logits.select(1, -1).argmax(-1, true);
  }
  return torch::cat(produced, 1);
}

ForecasterImpl::ForecasterImpl(ForecasterOptions options_, PositionalEncoding encoder)
    : options(std::move(options_)) {
  check_encoder(encoder, "forecaster");
  const int64_t d = options.transformer().dim();
  embed = register_module("embed", torch::nn::Linear(options.channels(), d));
  query = register_parameter("query", torch::randn({d}) * 0.02);
  transformer = register_module("transformer", Transformer(options.transformer(), encoder));
  head = register_module("head", torch::nn::Linear(d, options.channels()));
}

at::Tensor ForecasterImpl::forward(const at::Tensor& values, const at::Tensor& observed,
                                   const Positions& positions) {
  TORCH_CHECK(values.dim() == 3 && values.size(2) == options.channels(),
              "forecaster: values must be [B, N, ", options.channels(), "], got ", values.sizes());
  TORCH_CHECK(observed.sizes() == values.sizes().slice(0, 2),
              "forecaster: observed must be [B, N] = ", values.sizes().slice(0, 2), ", got ",
              observed.sizes());
  auto seen = observed.to(torch::kBool).unsqueeze(-1);  // [B, N, 1]
  auto x = torch::where(seen, embed(values.masked_fill(~seen, 0.0)), query.view({1, 1, -1}));
  return head(transformer->forward(x, positions));
}

at::Tensor ForecasterImpl::forward_packed(const at::Tensor& values, const at::Tensor& observed,
                                          const Positions& positions,
                                          const at::Tensor& sample_ids) {
  TORCH_CHECK(values.dim() == 3 && values.size(2) == options.channels(),
              "forecaster: values must be [B, N, ", options.channels(), "], got ", values.sizes());
  TORCH_CHECK(observed.sizes() == values.sizes().slice(0, 2),
              "forecaster: observed must be [B, N] = ", values.sizes().slice(0, 2), ", got ",
              observed.sizes());
  TORCH_CHECK(sample_ids.defined() && sample_ids.sizes() == values.sizes().slice(0, 2),
              "forecaster: sample_ids must be [B, N] = ", values.sizes().slice(0, 2), ", got ",
              sample_ids.defined() ? sample_ids.sizes() : at::IntArrayRef{});
  auto seen = observed.to(torch::kBool).unsqueeze(-1);  // [B, N, 1]
  auto x = torch::where(seen, embed(values.masked_fill(~seen, 0.0)), query.view({1, 1, -1}));
  PlanRequest request(positions);
  request.device = x.device();
  request.sample_ids = sample_ids;
  auto plan = transformer->encoder->plan(request);
  return head(transformer->forward_plan(x, plan));
}

TextVideoMatcherImpl::TextVideoMatcherImpl(TextVideoMatcherOptions options_,
                                           PositionalEncoding stream_encoder,
                                           PositionalEncoding text_encoder_,
                                           PositionalEncoding video_encoder_)
    : options(std::move(options_)),
      text_encoder(std::move(text_encoder_)),
      video_encoder(std::move(video_encoder_)) {
  check_encoder(stream_encoder, "text-video matcher");
  const int64_t d = options.transformer().dim();
  text_embed = register_module("text_embed", torch::nn::Embedding(options.vocab_size(), d));
  video_embed = register_module("video_embed", torch::nn::Linear(options.tubelet_dim(), d));
  modality_embed = register_module("modality_embed", torch::nn::Embedding(2, d));
  if (!text_encoder.is_empty()) register_module("text_encoder", text_encoder);
  if (!video_encoder.is_empty()) register_module("video_encoder", video_encoder);
  transformer =
      register_module("transformer", Transformer(options.transformer(), std::move(stream_encoder)));
  head = register_module("head", torch::nn::Linear(d, 1));
}

at::Tensor TextVideoMatcherImpl::forward(const MatchInput& in) {
  TORCH_CHECK(in.video.dim() == 3 && in.video.size(2) == options.tubelet_dim(),
              "text-video matcher: video must be [B, Nv, ", options.tubelet_dim(), "], got ",
              in.video.sizes());
  TORCH_CHECK(in.text.dim() == 2 && in.text.size(0) == in.video.size(0),
              "text-video matcher: text must be [B, Nt] with B = ", in.video.size(0), ", got ",
              in.text.sizes());
  const int64_t b = in.video.size(0), nv = in.video.size(1), nt = in.text.size(1);
  auto video = video_embed(in.video) + modality_embed->weight[0];
  auto text = text_embed(in.text) + modality_embed->weight[1];
  if (!video_encoder.is_empty()) video = video_encoder->add(video, in.video_positions);
  if (!text_encoder.is_empty()) text = text_encoder->add(text, in.text_positions);
  auto real = torch::ones({b, nv + nt}, torch::dtype(torch::kBool).device(video.device()));
  if (in.text_padding.defined()) real.narrow(1, nv, nt).copy_(in.text_padding);
  // One plan for the stream: with token kinds, so per-modality parts of a composite find theirs.
  auto x = torch::cat({video, text}, 1);
  PlanRequest request(in.stream_positions);
  request.device = x.device();
  request.token_kinds = in.stream_kinds;
  if (request.token_kinds.empty()) {
    request.token_kinds.assign(static_cast<size_t>(nv), SegmentKind::kVideo);
    request.token_kinds.insert(request.token_kinds.end(), static_cast<size_t>(nt),
                               SegmentKind::kText);
  }
  auto y = transformer->forward_plan(x, transformer->encoder->plan(request), real);
  auto weight = real.unsqueeze(-1).to(y.scalar_type());
  auto pooled = (y * weight).sum(1) / weight.sum(1);
  return head(pooled).squeeze(-1);
}

}  // namespace posenc
