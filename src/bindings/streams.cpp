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
// posenc::qwen2_5_omni_rope_index(token_types, attention_mask, image_grid_thw, video_grid_thw,
//                                 audio_seqlens, second_per_grids, use_audio_in_video,
//                                 spatial_merge_size, position_id_per_seconds, seconds_per_chunk)
//   Qwen2.5-Omni's TMRoPE (transformers 5.24 Qwen2_5OmniThinkerModel.get_rope_index; python:
//   posenc.get_rope_index_omni). token_types [B, L]: 0 other (text and the <|vision_bos|> ...
//   markers), 1 image, 2 video, 3 audio; audio_seqlens [A] mel frames, second_per_grids [V]
//   (read as float64; the builder narrows to float32 as transformers does). Per row, as
//   transformers scans it: the next image/video/audio token j at or after st, text before it
//   (j - st - 1 tokens, - 2 for a video with audio: two start markers), the item (its grid's or
//   audio's token count, which its tokens must match, then its end marker(s)); items draw on the
//   grid and audio lists in order across the batch. Positions from build_stream(segments,
//   StreamOptions::qwen2_5_omni()); padding 1; deltas = max + 1 - real tokens. Without any grid:
//   transformers' other branch, 1D positions (padding 1), delta = (max over the row's slots,
//   padding included) + 1 - real tokens.
//
// Integer bookkeeping on the CPU, no gradient (CompositeExplicitAutograd: any device's inputs are
// read on the CPU, the results go back to the token types' device; a meta tensor, which holds no
// values, is one line). Token types, grids and audio lengths are integers, masks bool or integer
// (a float mask is refused: an additive 0 / -inf one would read inverted), seconds real numbers.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "../kernels/dispatch/operator_checks.h"
#include "posenc/core/stream.h"
#include "registration.h"

namespace posenc::ops {

namespace {

std::vector<std::array<int64_t, 3>> grids(const at::Tensor& thw, const char* name,
                                          const char* who = "posenc.get_rope_index: ") {
  std::vector<std::array<int64_t, 3>> out;
  if (!thw.defined() || thw.numel() == 0) return out;
  TORCH_CHECK(thw.dim() == 2 && thw.size(1) == 3, who, name,
              " must be [n, 3] (t, h, w), got shape ", thw.sizes());
  TORCH_CHECK(at::isIntegralType(thw.scalar_type(), /*includeBool=*/false), who, name,
              " must hold integers, got ", thw.scalar_type());
  const auto cpu = thw.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = cpu.data_ptr<int64_t>();
  for (int64_t i = 0; i < cpu.size(0); ++i) out.push_back({p[3 * i], p[3 * i + 1], p[3 * i + 2]});
  return out;
}

// transformers' 2-D attention_mask: bool or integer (1 = a real token, 0 = padding); a float mask
// (an additive 0 / -inf one would be read inverted) is refused.
void check_mask_dtype(const char* who, const at::Tensor& mask) {
  if (!mask.defined() || mask.numel() == 0) return;
  TORCH_CHECK(mask.scalar_type() == at::kBool || at::isIntegralType(mask.scalar_type(), false), who,
              "attention_mask must be bool or integer (1 = a real token, 0 = padding), got ",
              mask.scalar_type());
}

// Qwen2.5-VL's temporal positions, (arange(t) * tokens_per_second * seconds).long(): finite,
// non-negative seconds whose last grid step stays within 2^52 (a float past int64 became
// int64's minimum, silently, in posenc as in transformers' .long()).
void check_temporal_reach(double seconds, double tokens_per_second, int64_t frames, size_t video) {
  constexpr double kMaxPosition = 4503599627370496.0;  // 2^52: every integer exact in a double
  TORCH_CHECK(std::isfinite(seconds) && seconds >= 0, "posenc.get_rope_index: second_per_grid_ts[",
              video, "] must be finite and >= 0, got ", seconds);
  TORCH_CHECK(std::isfinite(tokens_per_second) && tokens_per_second >= 0,
              "posenc.get_rope_index: tokens_per_second must be finite and >= 0, got ",
              tokens_per_second);
  const double last =
      static_cast<double>(std::max<int64_t>(frames - 1, 0)) * seconds * tokens_per_second;
  TORCH_CHECK(last <= kMaxPosition, "posenc.get_rope_index: video ", video, "'s last grid step (",
              frames - 1, " x ", seconds, " s x ", tokens_per_second, " per second = ", last,
              ") is past the position limit 2^52");
}

// Seconds per temporal grid step: real numbers (an imaginary part would be dropped).
void check_real(const char* who, const char* name, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  TORCH_CHECK(at::isFloatingType(t.scalar_type()) || at::isIntegralType(t.scalar_type(), false),
              who, name, " must hold real numbers, got ", t.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> qwen2_vl_rope_index_op(
    const at::Tensor& token_types, const at::Tensor& attention_mask,
    const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
    const at::Tensor& second_per_grid_ts, int64_t spatial_merge_size, double tokens_per_second,
    bool resume_at_grid_side) {
  // the values are read on the host: any real device, not meta (the documented exception: inputs
  // on different devices are read there alike)
  check_has_values("posenc.get_rope_index", {{"token_types", token_types},
                                             {"attention_mask", attention_mask},
                                             {"image_grid_thw", image_grid_thw},
                                             {"video_grid_thw", video_grid_thw},
                                             {"second_per_grid_ts", second_per_grid_ts}});
  check_mask_dtype("posenc.get_rope_index: ", attention_mask);
  check_real("posenc.get_rope_index: ", "second_per_grid_ts", second_per_grid_ts);
  TORCH_CHECK(token_types.dim() == 2, "posenc.get_rope_index: token types must be [batch, length]",
              ", got shape ", token_types.sizes());
  TORCH_CHECK(
      at::isIntegralType(token_types.scalar_type(), /*includeBool=*/false),
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
    for (size_t v = 0; v < seconds.size(); ++v)
      check_temporal_reach(seconds[v], tokens_per_second, videos[v][0], v);
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

// ---- Qwen2.5-Omni ------------------------------------------------------------------------------

const char* omni_kind_name(int64_t kind) {
  switch (kind) {
    case 1:
      return "image";
    case 2:
      return "video";
    case 3:
      return "audio";
    default:
      return "other";
  }
}

std::vector<int64_t> integers(const at::Tensor& values, const char* name) {
  constexpr const char* kWho = "posenc.get_rope_index_omni: ";
  std::vector<int64_t> out;
  if (!values.defined() || values.numel() == 0) return out;
  TORCH_CHECK(values.dim() == 1, kWho, name, " must be 1-D, got shape ", values.sizes());
  TORCH_CHECK(at::isIntegralType(values.scalar_type(), /*includeBool=*/false), kWho, name,
              " must hold integers, got ", values.scalar_type());
  const auto cpu = values.to(at::kCPU, at::kLong).contiguous();
  out.assign(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel());
  return out;
}

std::tuple<at::Tensor, at::Tensor> qwen2_5_omni_rope_index_op(
    const at::Tensor& token_types, const at::Tensor& attention_mask,
    const at::Tensor& image_grid_thw, const at::Tensor& video_grid_thw,
    const at::Tensor& audio_seqlens, const at::Tensor& second_per_grids, bool use_audio_in_video,
    int64_t spatial_merge_size, double position_id_per_seconds, double seconds_per_chunk) {
  constexpr const char* kWho = "posenc.get_rope_index_omni: ";
  check_has_values("posenc.get_rope_index_omni", {{"token_types", token_types},
                                                  {"attention_mask", attention_mask},
                                                  {"image_grid_thw", image_grid_thw},
                                                  {"video_grid_thw", video_grid_thw},
                                                  {"audio_seqlens", audio_seqlens},
                                                  {"second_per_grids", second_per_grids}});
  check_mask_dtype(kWho, attention_mask);
  check_real(kWho, "second_per_grids", second_per_grids);
  TORCH_CHECK(token_types.dim() == 2, kWho, "token types must be [batch, length], got shape ",
              token_types.sizes());
  TORCH_CHECK(at::isIntegralType(token_types.scalar_type(), /*includeBool=*/false), kWho,
              "token types must be integers (0 other, 1 image, 2 video, 3 audio), got ",
              token_types.scalar_type());
  TORCH_CHECK(spatial_merge_size >= 1, kWho, "spatial_merge_size must be >= 1, got ",
              spatial_merge_size);
  const int64_t batch = token_types.size(0), length = token_types.size(1);
  const bool masked = attention_mask.defined() && attention_mask.numel() > 0;
  TORCH_CHECK(!masked || attention_mask.sizes() == token_types.sizes(), kWho,
              "attention_mask must be ", token_types.sizes(), ", got ", attention_mask.sizes());
  const auto types = token_types.to(at::kCPU, at::kLong).contiguous();
  const auto mask = masked ? attention_mask.to(at::kCPU, at::kLong).contiguous() : at::Tensor();
  const int64_t* t = types.data_ptr<int64_t>();
  const int64_t* m = masked ? mask.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; i < batch * length; ++i) {
    TORCH_CHECK(t[i] >= 0 && t[i] <= 3, kWho, "token type ", t[i], " at [", i / length, ", ",
                i % length, "]; expected 0 (other), 1 (image), 2 (video) or 3 (audio)");
    TORCH_CHECK(m == nullptr || m[i] == 0 || m[i] == 1, kWho, "attention_mask holds ", m[i],
                " at [", i / length, ", ", i % length, "]; expected 0 or 1");
  }
  const auto images = grids(image_grid_thw, "image_grid_thw", kWho);
  const auto videos = grids(video_grid_thw, "video_grid_thw", kWho);
  const auto mels = integers(audio_seqlens, "audio_seqlens");
  std::vector<double> seconds;
  if (second_per_grids.defined() && second_per_grids.numel() > 0) {
    TORCH_CHECK(second_per_grids.dim() == 1, kWho, "second_per_grids must be 1-D, got shape ",
                second_per_grids.sizes());
    const auto s = second_per_grids.to(at::kCPU, at::kDouble).contiguous();
    seconds.assign(s.data_ptr<double>(), s.data_ptr<double>() + s.numel());
    TORCH_CHECK(seconds.size() == videos.size(), kWho, "second_per_grids has ", seconds.size(),
                " values for ", videos.size(), " videos (video_grid_thw rows)");
  }
  auto positions = at::ones({3, batch, length}, at::kLong);
  auto deltas = at::zeros({batch, 1}, at::kLong);
  auto pos = positions.accessor<int64_t, 3>();
  auto delta = deltas.accessor<int64_t, 2>();

  if (images.empty() && videos.empty()) {
    // transformers' branch without grids: 1D positions over the real tokens (padding 1), and
    // delta = (max over the row's slots, padding's 1 included) + 1 - real tokens
    for (int64_t b = 0; b < batch; ++b) {
      int64_t real = 0, top = -1;
      for (int64_t j = 0; j < length; ++j) {
        if (m != nullptr && m[b * length + j] == 0) continue;
        TORCH_CHECK(t[b * length + j] <= 1 || t[b * length + j] == 3, kWho, "row ", b,
                    " has a video token at column ", j, " but video_grid_thw is empty");
        TORCH_CHECK(t[b * length + j] != 1, kWho, "row ", b, " has an image token at column ", j,
                    " but image_grid_thw is empty");
        for (int a = 0; a < 3; ++a) pos[a][b][j] = real;
        top = std::max(top, real);
        ++real;
      }
      if (real < length) top = std::max<int64_t>(top, 1);  // a padding slot holds 1
      delta[b][0] = top + 1 - real;
    }
    return {positions.to(token_types.device()), deltas.to(token_types.device())};
  }

  StreamOptions options = StreamOptions::qwen2_5_omni();
  options.spatial_merge_size = spatial_merge_size;
  options.position_id_per_seconds = position_id_per_seconds;
  options.seconds_per_chunk = seconds_per_chunk;
  size_t next_image = 0, next_video = 0, next_audio = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> slots;  // the real tokens' columns
    for (int64_t j = 0; j < length; ++j)
      if (m == nullptr || m[b * length + j] != 0) slots.push_back(j);
    TORCH_CHECK(!slots.empty(), kWho, "row ", b,
                " has no real token (attention_mask all 0); transformers fails on such a row when "
                "grids are given");
    const auto n = static_cast<int64_t>(slots.size());
    auto kind_at = [&](int64_t k) { return t[b * length + slots[static_cast<size_t>(k)]]; };
    auto column = [&](int64_t k) { return slots[static_cast<size_t>(std::min(k, n - 1))]; };
    auto check_markers = [&](int64_t item, int64_t end, int64_t markers, const char* what) {
      for (int64_t k = end; k < end + markers; ++k)
        TORCH_CHECK(k < n && kind_at(k) == 0, kWho, "row ", b, ": the ", what, " at column ",
                    column(item), " is not followed by its ", markers, " end marker",
                    markers > 1 ? "s" : "", " (",
                    k < n ? "a token of type " + std::to_string(kind_at(k)) : "the row ends",
                    " at its end marker slot ", k - end, ")");
    };
    // the item's tokens [begin, begin + count) must all be of one kind, then `markers` end
    // markers (other tokens) must follow
    auto check_span = [&](int64_t begin, int64_t count, int64_t markers, const char* what,
                          size_t item, const char* source) {
      int64_t run = 0;
      while (begin + run < n && kind_at(begin + run) == kind_at(begin)) ++run;
      TORCH_CHECK(run == count, kWho, "row ", b, ": a run of ", run, " ", what,
                  " tokens at column ", column(begin), ", but ", source, "[", item, "] makes ",
                  count);
      check_markers(begin, begin + count, markers, what);
    };
    auto grid_tokens = [&](const std::array<int64_t, 3>& g, const char* name, size_t item) {
      const auto [gt, gh, gw] = g;
      TORCH_CHECK(gt > 0 && gh > 0 && gw > 0 && gh % spatial_merge_size == 0 &&
                      gw % spatial_merge_size == 0,
                  kWho, name, "[", item, "] = (", gt, ", ", gh, ", ", gw,
                  ") must be positive with h and w divisible by spatial_merge_size ",
                  spatial_merge_size);
      // each factor within the row (so the product cannot overflow before the span check)
      const int64_t rows = gh / spatial_merge_size, cols = gw / spatial_merge_size;
      TORCH_CHECK(gt <= n && rows <= n && cols <= n && rows * cols <= n, kWho, name, "[", item,
                  "] = (", gt, ", ", gh, ", ", gw, ") makes more tokens than row ", b, "'s ", n);
      return gt * rows * cols;
    };
    auto audio_tokens = [&](int64_t j) {
      TORCH_CHECK(next_audio < mels.size(), kWho, "row ", b, " has an audio at column ", column(j),
                  " but audio_seqlens has ", mels.size(),
                  " values (transformers needs the mel length of every audio)");
      const int64_t mel = mels[next_audio];
      const int64_t tokens = mel >= 0 ? omni_audio_tokens(mel) : 0;
      TORCH_CHECK(tokens > 0, kWho, "audio_seqlens[", next_audio, "] = ", mel, " mel frames make ",
                  tokens, " audio tokens; an audio needs at least 3 frames");
      return tokens;
    };
    auto seconds_of = [&](int64_t j) {
      TORCH_CHECK(!seconds.empty(), kWho, "row ", b, " has a video at column ", column(j),
                  " but no second_per_grids (seconds per temporal grid step, one per video)");
      const double s = seconds[next_video];
      TORCH_CHECK(std::isfinite(s) && s > 0, kWho, "second_per_grids[", next_video, "] = ", s,
                  "; expected a positive finite value");
      return s;
    };

    std::vector<Segment> segments;
    int64_t st = 0;
    for (;;) {
      int64_t j = st;
      while (j < n && kind_at(j) == 0) ++j;
      if (j == n) break;
      const int64_t kind = kind_at(j);
      const bool with_audio = kind == 2 && use_audio_in_video;
      const int64_t before = j - st - (with_audio ? 2 : 1);
      TORCH_CHECK(before >= 0, kWho, "row ", b, ": the ", omni_kind_name(kind), " token at column ",
                  column(j), " has no ",
                  with_audio ? "<|vision_bos|> <|audio_bos|> markers" : "start marker",
                  " before it");
      if (before > 0) segments.push_back(Segment::text(before));
      if (kind == 3) {
        const int64_t tokens = audio_tokens(j);
        check_span(j, tokens, 1, "audio", next_audio, "audio_seqlens (mel frames)");
        segments.push_back(Segment::audio(tokens));
        st = j + tokens + 1;
        ++next_audio;
        continue;
      }
      const bool image = kind == 1;
      const auto& list = image ? images : videos;
      auto& used = image ? next_image : next_video;
      const char* name = image ? "image_grid_thw" : "video_grid_thw";
      TORCH_CHECK(used < list.size(), kWho, "row ", b, " has ", image ? "an image" : "a video",
                  " at column ", column(j), " but ", name, " has only ", list.size(), " rows");
      const auto g = list[used];
      const int64_t tokens = grid_tokens(g, name, used);
      if (image) {
        check_span(j, tokens, 1, "image", used, name);
        segments.push_back(Segment::image(g[1], g[2]));
        segments.back().frames = g[0];
        st = j + tokens + 1;
        ++used;
        continue;
      }
      const double s = seconds_of(j);
      int64_t run = 0, audio = 0;  // the video's tokens: video and audio ones, up to its end marker
      while (j + run < n && (kind_at(j + run) == 2 || kind_at(j + run) == 3))
        audio += kind_at(j + run++) == 3;
      if (!with_audio) {
        TORCH_CHECK(audio == 0, kWho, "row ", b, ": the video at column ", column(j),
                    " holds audio tokens; a video with its audio needs use_audio_in_video=True");
        check_span(j, tokens, 1, "video", used, name);
        segments.push_back(Segment::video(g[0], g[1], g[2], s));
        st = j + tokens + 1;
      } else {
        TORCH_CHECK(audio > 0, kWho, "row ", b, ": the video at column ", column(j),
                    " has no audio tokens, but use_audio_in_video is set (transformers would give "
                    "it text positions); every video of the call must carry its audio");
        const int64_t audio_count = audio_tokens(j);
        TORCH_CHECK(run - audio == tokens && audio == audio_count, kWho, "row ", b,
                    ": the video with audio at column ", column(j), " holds ", run - audio,
                    " video and ", audio, " audio tokens, but ", name, "[", used, "] makes ",
                    tokens, " and audio_seqlens[", next_audio, "] ", audio_count);
        check_markers(j, j + run, 2, "video with audio");
        segments.push_back(Segment::video_with_audio(g[0], g[1], g[2], s, audio_count));
        st = j + run + 2;
        ++next_audio;
      }
      ++used;
    }
    if (st < n) segments.push_back(Segment::text(n - st));
    const StreamLayout layout = build_stream(segments, options);
    const auto p = layout.positions.coords().to(at::kLong).contiguous();  // [N, 3]
    TORCH_CHECK(p.size(0) == n, kWho, "internal: ", p.size(0), " positions for ", n, " tokens");
    const int64_t* q = p.data_ptr<int64_t>();
    for (int64_t k = 0; k < n; ++k)
      for (int a = 0; a < 3; ++a) pos[a][b][slots[static_cast<size_t>(k)]] = q[3 * k + a];
    delta[b][0] = layout.rope_delta;
  }
  return {positions.to(token_types.device()), deltas.to(token_types.device())};
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "qwen2_vl_rope_index(Tensor token_types, Tensor attention_mask, Tensor image_grid_thw, "
      "Tensor video_grid_thw, Tensor second_per_grid_ts, int spatial_merge_size=2, "
      "float tokens_per_second=2., bool resume_at_grid_side=True) -> (Tensor, Tensor)");
  m.impl("qwen2_vl_rope_index", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(qwen2_vl_rope_index_op));
  m.def(
      "qwen2_5_omni_rope_index(Tensor token_types, Tensor attention_mask, Tensor image_grid_thw, "
      "Tensor video_grid_thw, Tensor audio_seqlens, Tensor second_per_grids, "
      "bool use_audio_in_video=False, int spatial_merge_size=2, "
      "float position_id_per_seconds=25., float seconds_per_chunk=2.) -> (Tensor, Tensor)");
  m.impl("qwen2_5_omni_rope_index", c10::DispatchKey::CompositeExplicitAutograd,
         TORCH_FN(qwen2_5_omni_rope_index_op));
}

}  // namespace posenc::ops
