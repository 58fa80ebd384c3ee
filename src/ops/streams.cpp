// Qwen2-VL's M-RoPE stream positions as a dispatcher operator (python/posenc/streams.py gives it
// transformers' get_rope_index signature):
//
// posenc::qwen2_vl_rope_index(token_types, attention_mask, image_grid_thw, video_grid_thw,
//                             second_per_grid_ts, spatial_merge_size, tokens_per_second,
//                             resume_at_grid_side) -> (Tensor position_ids, Tensor deltas)
//   token_types [B, L] int (0 text, 1 image, 2 video; transformers' mm_token_type_ids),
//   attention_mask [B, L] (0: padding, left or right; an empty tensor: none),
//   image_grid_thw [I, 3], video_grid_thw [V, 3] (t, h, w before spatial merging; consumed in
//   order across the batch, as transformers' iterators), second_per_grid_ts [V] (Qwen2.5-VL; empty:
//   none) -> position_ids [3, B, L] int64 (padding 0), deltas [B, 1] int64 = max + 1 - tokens.
//   Each run of equal token types is a segment: text runs are 1D, image/video runs take the next
//   grid, whose t*h*w/merge^2 tokens must be the run's length. The positions are build_stream's
//   (posenc/core/stream.h states both rules; resume_at_grid_side: transformers 5.24's resume after
//   a vision segment at start + max(h, w)/merge; otherwise (max so far) + 1, transformers 4's).
//
// Integer bookkeeping on the CPU, no gradient (CompositeExplicitAutograd: any device's inputs are
// read on the CPU, the results go back to the token types' device).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "posenc/core/stream.h"

namespace posenc::ops {

namespace {

std::vector<std::array<int64_t, 3>> grids(const at::Tensor& thw, const char* name) {
  std::vector<std::array<int64_t, 3>> out;
  if (!thw.defined() || thw.numel() == 0) return out;
  TORCH_CHECK(thw.dim() == 2 && thw.size(1) == 3, "posenc.get_rope_index: ", name,
              " must be [n, 3] (t, h, w), got shape ", thw.sizes());
  TORCH_CHECK(!at::isFloatingType(thw.scalar_type()), "posenc.get_rope_index: ", name,
              " must hold integers, got ", thw.scalar_type());
  const auto cpu = thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = cpu.data_ptr<int64_t>();
  for (int64_t i = 0; i < cpu.size(0); ++i) out.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
  return out;
}

std::tuple<at::Tensor, at::Tensor> qwen2_vl_rope_index_op(
    const at::Tensor& token_types, const at::Tensor& attention_mask,
    const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
    const at::Tensor& second_per_grid_ts, int64_t spatial_merge_size, double tokens_per_second,
    bool resume_at_grid_side) {
  TORCH_CHECK(token_types.dim() == 2, "posenc.get_rope_index: token types must be [batch, length]",
              ", got shape ", token_types.sizes());
  TORCH_CHECK(
      !at::isFloatingType(token_types.scalar_type()),
      "posenc.get_rope_index: token types must be integers (0 text, 1 image, 2 video), got ",
      token_types.scalar_type());
  TORCH_CHECK(spatial_merge_size >= 1,
              "posenc.get_rope_index: spatial_merge_size must be >= 1, got ", spatial_merge_size);
  const int64_t batch = token_types.size(0), length = token_types.size(1);
  const bool masked = attention_mask.defined() && attention_mask.numel() > 0;
  TORCH_CHECK(!masked || attention_mask.sizes() == token_types.sizes(),
              "posenc.get_rope_index: attention_mask must be ", token_types.sizes(), ", got ",
              attention_mask.sizes());
  const auto types = token_types.to(at::kCPU, at::kLong).contiguous();
  const auto mask = masked ? attention_mask.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const auto images = grids(image_grid_thw, "image_grid_thw");
  const auto videos = grids(video_grid_thw, "video_grid_thw");
  std::vector<double> seconds;
  if (second_per_grid_ts.defined() && second_per_grid_ts.numel() > 0) {
    const auto s = second_per_grid_ts.to(at::kCPU, at::kDouble).contiguous().view(-1);
    seconds.assign(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
    TORCH_CHECK(seconds.size() == videos.size(), "posenc.get_rope_index: second_per_grid_ts has ",
                seconds.size(), " values for ", videos.size(), " videos");
  }
  StreamOptions options;
  options.spatial_merge_size = spatial_merge_size;
  options.tokens_per_second = tokens_per_second;
  options.resume_at_grid_side = resume_at_grid_side;

  auto positions = at::zeros({3, batch, length}, at::kLong);
  auto deltas = at::zeros({batch, 1}, at::kLong);
  auto pos = positions.accessor<int64_t, 3>();
  const int64_t* t = types.data_ptr<int64_t>();
  const int64_t* m = masked ? mask.data_ptr<int64_t>() : nullptr;
  size_t next_image = 0, next_video = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> slots;  // the real tokens' columns
    for (int64_t j = 0; j < length; ++j)
      if (m == nullptr || m[b * length + j] != 0) slots.push_back(j);
    std::vector<Segment> segments;
    for (size_t k = 0; k < slots.size();) {
      const int64_t kind = t[b * length + slots[k]];
      TORCH_CHECK(kind >= 0 && kind <= 2, "posenc.get_rope_index: token type ", kind, " at [", b,
                  ", ", slots[k], "]; expected 0 (text), 1 (image) or 2 (video)");
      size_t end = k;
      while (end < slots.size() && t[b * length + slots[end]] == kind) ++end;
      const auto run = static_cast<int64_t>(end - k);
      if (kind == 0) {
        segments.push_back(Segment::text(run));
      } else {
        const bool image = kind == 1;
        auto& used = image ? next_image : next_video;
        const auto& list = image ? images : videos;
        TORCH_CHECK(used < list.size(), "posenc.get_rope_index: row ", b, " has more ",
                    image ? "image" : "video", " runs than ", image ? "image" : "video",
                    "_grid_thw has rows (", list.size(), ")");
        const auto [gt, gh, gw] = list[used];
        TORCH_CHECK(gt > 0 && gh > 0 && gw > 0 && gh % spatial_merge_size == 0 &&
                        gw % spatial_merge_size == 0,
                    "posenc.get_rope_index: ", image ? "image" : "video", "_grid_thw[", used,
                    "] = (", gt, ", ", gh, ", ", gw,
                    ") must be positive with h and w divisible by spatial_merge_size ",
                    spatial_merge_size);
        const int64_t tokens = gt * (gh / spatial_merge_size) * (gw / spatial_merge_size);
        TORCH_CHECK(tokens == run, "posenc.get_rope_index: row ", b, ": a run of ", run, " ",
                    image ? "image" : "video", " tokens at column ", slots[k], ", but ",
                    image ? "image" : "video", "_grid_thw[", used, "] = (", gt, ", ", gh, ", ", gw,
                    ") makes ", tokens, " (t*h*w / ", spatial_merge_size * spatial_merge_size, ")");
        segments.push_back(image
                               ? Segment::image(gh, gw)
                               : Segment::video(gt, gh, gw, seconds.empty() ? 0.0 : seconds[used]));
        if (image) segments.back().frames = gt;
        ++used;
      }
      k = end;
    }
    if (segments.empty()) continue;
    const StreamLayout layout = build_stream(segments, options);
    const auto p = layout.positions.coords().to(at::kLong).contiguous();  // [N, 3]
    TORCH_CHECK(p.size(0) == static_cast<int64_t>(slots.size()),
                "posenc.get_rope_index: internal: ", p.size(0), " positions for ", slots.size(),
                " tokens");
    const int64_t* q = p.data_ptr<int64_t>();
    for (size_t k = 0; k < slots.size(); ++k)
      for (int a = 0; a < 3; ++a) pos[a][b][slots[k]] = q[3 * k + a];
    deltas[b][0] = layout.rope_delta;
  }
  return {positions.to(token_types.device()), deltas.to(token_types.device())};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(posenc, m) {
  m.def(
      "qwen2_vl_rope_index(Tensor token_types, Tensor attention_mask, Tensor image_grid_thw, "
      "Tensor video_grid_thw, Tensor second_per_grid_ts, int spatial_merge_size=2, "
      "float tokens_per_second=2., bool resume_at_grid_side=True) -> (Tensor, Tensor)");
  m.impl("qwen2_vl_rope_index", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(qwen2_vl_rope_index_op));
}

}  // namespace posenc::ops
