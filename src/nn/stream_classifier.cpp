// The stream classifier of experiment 8; see posenc/nn/stream_classifier.h.
#include "posenc/nn/stream_classifier.h"

#include <torch/torch.h>

namespace posenc {

namespace {

// Marker kinds in the order of marker_embed's rows.
constexpr SegmentKind kMarkers[4] = {SegmentKind::kVisionBos, SegmentKind::kVisionEos,
                                     SegmentKind::kAudioBos, SegmentKind::kAudioEos};

int64_t marker_row(SegmentKind kind) {
  for (int64_t i = 0; i < 4; ++i)
    if (kMarkers[i] == kind) return i;
  return -1;
}

}  // namespace

StreamClassifierImpl::StreamClassifierImpl(StreamClassifierOptions options_,
                                           PositionalEncoding encoder)
    : options(std::move(options_)) {
  TORCH_CHECK(!encoder.is_empty(), "stream classifier: an encoder is required (use Nope for none)");
  TORCH_CHECK(options.video_dim() > 0 && options.audio_dim() > 0 && options.num_outputs() > 0 &&
                  options.vocab_size() > 0 && options.head_hidden() >= 0,
              "stream classifier: video_dim, audio_dim, num_outputs and vocab_size must be > 0 "
              "and head_hidden >= 0, got ",
              options.video_dim(), ", ", options.audio_dim(), ", ", options.num_outputs(), ", ",
              options.vocab_size(), ", ", options.head_hidden());
  const int64_t d = options.transformer().dim();
  video_embed = register_module("video_embed", torch::nn::Linear(options.video_dim(), d));
  audio_embed = register_module("audio_embed", torch::nn::Linear(options.audio_dim(), d));
  text_embed = register_module("text_embed", torch::nn::Embedding(options.vocab_size(), d));
  modality_embed = register_module("modality_embed", torch::nn::Embedding(3, d));
  marker_embed = register_module("marker_embed", torch::nn::Embedding(4, d));
  transformer =
      register_module("transformer", Transformer(options.transformer(), std::move(encoder)));
  const int64_t h = options.head_hidden();
  if (h > 0) head_hidden = register_module("head_hidden", torch::nn::Linear(d, h));
  head = register_module("head", torch::nn::Linear(h > 0 ? h : d, options.num_outputs()));
}

at::Tensor StreamClassifierImpl::forward(const StreamInput& in) {
  const std::string who = "stream classifier: ";
  TORCH_CHECK(in.video.defined() && in.video.dim() == 3 && in.video.size(2) == options.video_dim(),
              who, "video must be [B, Nv, ", options.video_dim(), "], got ",
              in.video.defined() ? in.video.sizes() : at::IntArrayRef{});
  const int64_t b = in.video.size(0), nv = in.video.size(1);
  TORCH_CHECK(in.audio.defined() && in.audio.dim() == 3 && in.audio.size(0) == b &&
                  in.audio.size(2) == options.audio_dim(),
              who, "audio must be [", b, ", Na, ", options.audio_dim(), "], got ",
              in.audio.defined() ? in.audio.sizes() : at::IntArrayRef{});
  TORCH_CHECK(in.text.defined() && in.text.dim() == 2 && in.text.size(0) == b, who,
              "text must be [", b, ", Nt] int64, got ",
              in.text.defined() ? in.text.sizes() : at::IntArrayRef{});
  const int64_t na = in.audio.size(1), nt = in.text.size(1);
  TORCH_CHECK(!in.text_padding.defined() || in.text_padding.sizes() == in.text.sizes(), who,
              "text_padding must be ", in.text.sizes(), ", got ", in.text_padding.sizes());
  const int64_t n = static_cast<int64_t>(in.kinds.size());
  TORCH_CHECK(in.positions.size() == n, who, "one position per stream token: ", n,
              " token kinds but ", in.positions.size(), " positions");
  // Where each stream token comes from in cat([video, audio, text, markers]).
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n));
  int64_t seen_v = 0, seen_a = 0, seen_t = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto kind = in.kinds[static_cast<size_t>(i)];
    if (kind == SegmentKind::kVideo) {
      order.push_back(seen_v++);
    } else if (kind == SegmentKind::kAudio) {
      order.push_back(nv + seen_a++);
    } else if (kind == SegmentKind::kText) {
      order.push_back(nv + na + seen_t++);
    } else {
      const int64_t row = marker_row(kind);
      TORCH_CHECK(row >= 0, who, "takes video, audio, text and marker tokens; stream token ", i,
                  " is '", to_string(kind), "'");
      order.push_back(nv + na + nt + row);
    }
  }
  TORCH_CHECK(seen_v == nv && seen_a == na && seen_t == nt, who, "the stream holds ", seen_v,
              " video, ", seen_a, " audio and ", seen_t, " text tokens, the inputs ", nv, ", ", na,
              " and ", nt);
  auto video = video_embed(in.video) + modality_embed->weight[0];  // [B, Nv, D]
  auto audio = audio_embed(in.audio) + modality_embed->weight[1];  // [B, Na, D]
  auto text = text_embed(in.text) + modality_embed->weight[2];     // [B, Nt, D]
  auto markers = marker_embed->weight.unsqueeze(0).expand({b, 4, -1});
  auto index = torch::tensor(order, torch::kLong).to(video.device());
  auto x = torch::cat({video, audio, text, markers}, 1).index_select(1, index);  // [B, N, D]
  auto options_bool = torch::dtype(torch::kBool).device(video.device());
  auto text_real = in.text_padding.defined() ? in.text_padding.to(torch::kBool)
                                             : torch::ones({b, nt}, options_bool);
  auto real = torch::cat({torch::ones({b, nv + na}, options_bool), text_real,
                          torch::ones({b, 4}, options_bool)},
                         1)
                  .index_select(1, index);  // [B, N]
  PlanRequest request(in.positions);
  request.device = x.device();
  request.token_kinds = in.kinds;
  auto y = transformer->forward_plan(x, transformer->encoder->plan(request), real);
  auto weight = real.unsqueeze(-1).to(y.scalar_type());
  auto pooled = (y * weight).sum(1) / weight.sum(1);  // [B, D]
  if (!head_hidden.is_empty()) pooled = torch::gelu(head_hidden(pooled));
  return head(pooled);
}

}  // namespace posenc
