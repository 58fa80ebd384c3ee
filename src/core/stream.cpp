// Mixed-stream M-RoPE positions; rules in include/posenc/core/stream.h (Qwen2-VL / Qwen2.5-VL
// get_rope_index, and Qwen2.5-Omni's TMRoPE get_rope_index, transformers 5.24
// modeling_qwen2_5_omni.py; the Omni rule is checked against tests/fixtures/tmrope.json).
#include "posenc/core/stream.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace posenc {

std::string to_string(SegmentKind kind) {
  switch (kind) {
    case SegmentKind::kText:
      return "text";
    case SegmentKind::kImage:
      return "image";
    case SegmentKind::kVideo:
      return "video";
    case SegmentKind::kPadding:
      return "padding";
    case SegmentKind::kAudio:
      return "audio";
    case SegmentKind::kVisionBos:
      return "vision_bos";
    case SegmentKind::kVisionEos:
      return "vision_eos";
    case SegmentKind::kAudioBos:
      return "audio_bos";
    case SegmentKind::kAudioEos:
      return "audio_eos";
  }
  return "unknown";
}

std::string to_string(StreamRule rule) {
  switch (rule) {
    case StreamRule::kQwen2VL:
      return "qwen2_vl";
    case StreamRule::kQwen25Omni:
      return "qwen2_5_omni";
  }
  return "unknown";
}

Segment Segment::text(int64_t tokens) {
  Segment s;
  s.tokens = tokens;
  return s;
}

Segment Segment::padding(int64_t tokens) {
  Segment s;
  s.kind = SegmentKind::kPadding;
  s.tokens = tokens;
  return s;
}

Segment Segment::image(int64_t height, int64_t width) {
  Segment s;
  s.kind = SegmentKind::kImage;
  s.height = height;
  s.width = width;
  return s;
}

Segment Segment::video(int64_t frames, int64_t height, int64_t width, double seconds_per_frame) {
  Segment s;
  s.kind = SegmentKind::kVideo;
  s.frames = frames;
  s.height = height;
  s.width = width;
  s.seconds_per_frame = seconds_per_frame;
  return s;
}

Segment Segment::audio(int64_t tokens) {
  Segment s;
  s.kind = SegmentKind::kAudio;
  s.tokens = tokens;
  return s;
}

Segment Segment::video_with_audio(int64_t frames, int64_t height, int64_t width,
                                  double seconds_per_grid, int64_t audio_tokens) {
  Segment s = video(frames, height, width, seconds_per_grid);
  s.audio_tokens = audio_tokens;
  return s;
}

StreamOptions StreamOptions::qwen2_5_omni() {
  StreamOptions options;
  options.rule = StreamRule::kQwen25Omni;
  options.spatial_merge_size = 2;
  options.position_id_per_seconds = 25.0;
  options.seconds_per_chunk = 2.0;
  return options;
}

namespace {

// Omni t offsets and chunk sizes are kept below 2^52 so that every position is an exact
// integer in float64 (and in int64 with room to add the stream's start).
constexpr double kMaxOmniPosition = 4503599627370496.0;  // 2^52

// Python's a // b for b > 0 (floor division), as in HF's length formulas.
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && a < 0) --q;
  return q;
}

bool is_marker(SegmentKind kind) {
  return kind == SegmentKind::kVisionBos || kind == SegmentKind::kVisionEos ||
         kind == SegmentKind::kAudioBos || kind == SegmentKind::kAudioEos;
}

// Per-token output in stream order: coordinates (t, h, w), kind and segment index.
struct Tokens {
  std::vector<double> t, h, w;
  std::vector<SegmentKind> kinds;
  std::vector<int64_t> segment_index;

  void push(double tt, double hh, double ww, SegmentKind kind, size_t segment) {
    t.push_back(tt);
    h.push_back(hh);
    w.push_back(ww);
    kinds.push_back(kind);
    segment_index.push_back(static_cast<int64_t>(segment));
  }
};

// positions [N, 3] (t, h, w) in float64.
StreamLayout finish(Tokens& out, int64_t rope_delta) {
  StreamLayout layout;
  const auto n = static_cast<int64_t>(out.t.size());
  auto coords =
      torch::stack({torch::tensor(out.t, torch::kFloat64), torch::tensor(out.h, torch::kFloat64),
                    torch::tensor(out.w, torch::kFloat64)},
                   1)
          .view({n, 3});
  layout.positions = Positions(coords, {"t", "h", "w"});
  layout.kinds = std::move(out.kinds);
  layout.segment_index = std::move(out.segment_index);
  layout.rope_delta = rope_delta;
  return layout;
}

// Checks both rules share: counts, grids, merge divisibility, which kinds carry which fields.
void check_segment(size_t index, const Segment& s, const StreamOptions& options) {
  TORCH_CHECK(!is_marker(s.kind), "stream: segment ", index, " has kind ", to_string(s.kind),
              ", a marker token kind; markers come with their image, video or audio segment");
  if (s.kind == SegmentKind::kText || s.kind == SegmentKind::kPadding) {
    TORCH_CHECK(s.tokens >= 0, "stream: segment ", index, " (", to_string(s.kind), ") has ",
                s.tokens, " tokens");
  }
  if (s.kind == SegmentKind::kAudio) {
    TORCH_CHECK(s.tokens >= 1, "stream: segment ", index, " (audio) has ", s.tokens,
                " audio tokens; an audio needs at least 1 (3 mel frames, see omni_audio_tokens)");
  }
  if (s.kind == SegmentKind::kImage || s.kind == SegmentKind::kVideo) {
    const int64_t m = options.spatial_merge_size;
    TORCH_CHECK(s.frames >= 1 && s.height >= 1 && s.width >= 1, "stream: segment ", index, " (",
                to_string(s.kind), ") has grid ", s.frames, "x", s.height, "x", s.width);
    TORCH_CHECK(s.height % m == 0 && s.width % m == 0, "stream: segment ", index, " grid ",
                s.height, "x", s.width, " is not divisible by spatial_merge_size ", m);
  }
  if (s.kind == SegmentKind::kVideo) {
    TORCH_CHECK(std::isfinite(s.seconds_per_frame) && s.seconds_per_frame >= 0, "stream: segment ",
                index, " (video) has seconds per grid ", s.seconds_per_frame,
                "; expected a finite value >= 0");
    TORCH_CHECK(s.audio_tokens >= 0, "stream: segment ", index, " (video) has ", s.audio_tokens,
                " audio tokens");
  } else {
    TORCH_CHECK(s.audio_tokens == 0, "stream: segment ", index, " (", to_string(s.kind),
                ") has audio_tokens ", s.audio_tokens, "; only a video carries an audio track");
  }
}

// ---- StreamRule::kQwen2VL ------------------------------------------------------------------
StreamLayout build_stream_qwen2_vl(const std::vector<Segment>& segments,
                                   const StreamOptions& options) {
  Tokens out;
  double next = 0;      // where the next segment starts: (max position so far) + 1, by default
  double highest = -1;  // the largest position of a real token so far
  int64_t real = 0;
  for (size_t index = 0; index < segments.size(); ++index) {
    const auto& s = segments[index];
    check_segment(index, s, options);
    TORCH_CHECK(s.kind != SegmentKind::kAudio && s.audio_tokens == 0, "stream: segment ", index,
                " (", to_string(s.kind), s.audio_tokens > 0 ? " with audio" : "", ") needs rule ",
                to_string(StreamRule::kQwen25Omni), "; rule ", to_string(options.rule),
                " has no audio");
    switch (s.kind) {
      case SegmentKind::kPadding:
      case SegmentKind::kText: {
        for (int64_t i = 0; i < s.tokens; ++i) {
          const double p = s.kind == SegmentKind::kText ? next + static_cast<double>(i) : 0.0;
          out.push(p, p, p, s.kind, index);
        }
        if (s.kind == SegmentKind::kText) {
          next += static_cast<double>(s.tokens);
          real += s.tokens;
          if (s.tokens > 0) highest = std::max(highest, next - 1);
        }
        break;
      }
      case SegmentKind::kImage:
      case SegmentKind::kVideo: {
        const int64_t m = options.spatial_merge_size;
        const int64_t gh = s.height / m, gw = s.width / m;
        const double interval = s.kind == SegmentKind::kVideo && s.seconds_per_frame > 0
                                    ? s.seconds_per_frame * options.tokens_per_second
                                    : 1.0;
        const double start = next;
        double top = start;
        // HF's arithmetic in float32: (arange(t) * fl32(tokens_per_second * seconds)).long(),
        // so 25 fps (0.08 s per grid step, 2 tokens per second) puts grid step 25 at 4, where
        // exact arithmetic gives 3.99999... -> 3; the real-time axis (floor_time false) is exact
        const float interval32 = s.kind == SegmentKind::kVideo && s.seconds_per_frame > 0
                                     ? static_cast<float>(options.tokens_per_second) *
                                           static_cast<float>(s.seconds_per_frame)
                                     : 1.0f;
        for (int64_t f = 0; f < s.frames; ++f) {
          double ft = static_cast<double>(f) * interval;
          if (options.floor_time)
            ft = std::trunc(static_cast<double>(static_cast<float>(f) * interval32));
          for (int64_t r = 0; r < gh; ++r)
            for (int64_t c = 0; c < gw; ++c) {
              out.push(start + ft, start + static_cast<double>(r), start + static_cast<double>(c),
                       s.kind, index);
              top = std::max({top, start + ft, start + r, start + c});
            }
        }
        highest = std::max(highest, top);
        next =
            options.resume_at_grid_side ? start + static_cast<double>(std::max(gh, gw)) : top + 1;
        real += s.frames * gh * gw;
        break;
      }
      case SegmentKind::kAudio:
      case SegmentKind::kVisionBos:
      case SegmentKind::kVisionEos:
      case SegmentKind::kAudioBos:
      case SegmentKind::kAudioEos:
        break;  // rejected above
    }
  }
  return finish(out, static_cast<int64_t>(std::max(next, highest + 1)) - real);
}

// ---- StreamRule::kQwen25Omni ---------------------------------------------------------------
using Coord = std::array<int64_t, 3>;  // (t, h, w)

// The merged token grid of an image or video with time origin v: (v + t_off[f], v + r, v + c),
// f outer, then r, then c: frames * (height / m) * (width / m) coordinates.
std::vector<Coord> omni_vision_grid(const Segment& s, int64_t v, double seconds_per_grid,
                                    const StreamOptions& options) {
  const int64_t m = options.spatial_merge_size;
  const int64_t gh = s.height / m, gw = s.width / m;
  std::vector<Coord> grid;
  grid.reserve(static_cast<size_t>(s.frames * gh * gw));
  for (int64_t f = 0; f < s.frames; ++f) {
    const int64_t offset = omni_time_offset(f, seconds_per_grid, options.position_id_per_seconds);
    for (int64_t r = 0; r < gh; ++r)
      for (int64_t c = 0; c < gw; ++c) grid.push_back({v + offset, v + r, v + c});
  }
  return grid;
}

// HF get_chunked_index: [begin, end) ranges over `values` (offsets >= 0 from the block's time
// origin, non-decreasing). The counter starts at 1; a value >= counter * per_chunk closes the
// current chunk before it and advances the counter by ONE (so after a jump over a whole chunk the
// next tokens close chunks too: fixture note "Oddity B"). Always at least one range.
std::vector<std::pair<size_t, size_t>> omni_chunks(const std::vector<int64_t>& values,
                                                   int64_t per_chunk) {
  std::vector<std::pair<size_t, size_t>> bounds;
  size_t begin = 0;
  int64_t chunk = 1;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] / per_chunk >= chunk) {  // = values[i] >= chunk * per_chunk, without overflow
      bounds.emplace_back(begin, i);
      begin = i;
      ++chunk;
    }
  }
  bounds.emplace_back(begin, values.size());
  return bounds;
}

StreamLayout build_stream_omni(const std::vector<Segment>& segments, const StreamOptions& options) {
  const double per_second = options.position_id_per_seconds;
  TORCH_CHECK(std::isfinite(per_second) && per_second > 0,
              "stream: position_id_per_seconds must be positive and finite, got ", per_second);
  TORCH_CHECK(std::isfinite(options.seconds_per_chunk) && options.seconds_per_chunk > 0,
              "stream: seconds_per_chunk must be positive and finite, got ",
              options.seconds_per_chunk);
  const double chunk_positions = per_second * options.seconds_per_chunk;
  TORCH_CHECK(chunk_positions >= 1 && chunk_positions <= kMaxOmniPosition,
              "stream: position_id_per_seconds * seconds_per_chunk = ", per_second, " * ",
              options.seconds_per_chunk, " = ", chunk_positions,
              " positions per chunk; expected at least 1 and at most 2^52");
  const auto per_chunk = static_cast<int64_t>(chunk_positions);  // Python int(): truncation

  Tokens out;
  int64_t next = 0;  // HF st_idx: (max over t, h, w of the previously appended block) + 1
  int64_t top = -1;  // max over the real tokens so far, all axes (for rope_delta)
  int64_t real = 0;
  auto emit = [&](int64_t t, int64_t h, int64_t w, SegmentKind kind, size_t segment) {
    out.push(static_cast<double>(t), static_cast<double>(h), static_cast<double>(w), kind, segment);
    top = std::max({top, t, h, w});
    ++real;
  };
  // `count` tokens on the running line, t = h = w (text, a marker, an audio's tokens)
  auto line = [&](int64_t count, SegmentKind kind, size_t segment) {
    for (int64_t i = 0; i < count; ++i) emit(next + i, next + i, next + i, kind, segment);
    next += count;
  };

  for (size_t index = 0; index < segments.size(); ++index) {
    const auto& s = segments[index];
    check_segment(index, s, options);
    if (s.kind == SegmentKind::kVideo) {
      TORCH_CHECK(s.seconds_per_frame > 0, "stream: segment ", index,
                  " (video) has no seconds per grid (seconds_per_frame ", s.seconds_per_frame,
                  "); rule ", to_string(options.rule),
                  " needs it (HF: second_per_grids = temporal_patch_size / fps)");
      const double last_offset =
          static_cast<double>(s.frames - 1) * s.seconds_per_frame * per_second;
      TORCH_CHECK(last_offset <= kMaxOmniPosition, "stream: segment ", index, " (video) reaches t ",
                  "offset ", last_offset, " (", s.frames, " frames x ", s.seconds_per_frame,
                  " s per grid x ", per_second, " per second); the limit is 2^52");
    }
    switch (s.kind) {
      case SegmentKind::kPadding:
        for (int64_t i = 0; i < s.tokens; ++i) out.push(1, 1, 1, s.kind, index);  // HF: ones
        break;
      case SegmentKind::kText:
        line(s.tokens, SegmentKind::kText, index);
        break;
      case SegmentKind::kAudio:
        line(1, SegmentKind::kAudioBos, index);
        line(s.tokens, SegmentKind::kAudio, index);
        line(1, SegmentKind::kAudioEos, index);
        break;
      case SegmentKind::kImage:
      case SegmentKind::kVideo: {
        if (s.kind == SegmentKind::kVideo && s.audio_tokens > 0) {
          // <|vision_bos|> <|audio_bos|> share one position; video and audio share origin v
          const int64_t start = next;
          emit(start, start, start, SegmentKind::kVisionBos, index);
          emit(start, start, start, SegmentKind::kAudioBos, index);
          const int64_t v = start + 1;
          const auto video = omni_vision_grid(s, v, s.seconds_per_frame, options);
          std::vector<int64_t> video_offsets(video.size());
          std::vector<int64_t> audio_offsets(static_cast<size_t>(s.audio_tokens));
          for (size_t i = 0; i < video.size(); ++i) video_offsets[i] = video[i][0] - v;
          for (size_t k = 0; k < audio_offsets.size(); ++k)
            audio_offsets[k] = static_cast<int64_t>(k);
          const auto video_chunks = omni_chunks(video_offsets, per_chunk);
          const auto audio_chunks = omni_chunks(audio_offsets, per_chunk);
          // video chunk j then audio chunk j; e = (max of the LAST appended chunk) + 1
          int64_t last_max = std::numeric_limits<int64_t>::min();
          size_t last_size = 0;
          for (size_t j = 0; j < std::max(video_chunks.size(), audio_chunks.size()); ++j) {
            if (j < video_chunks.size()) {
              const auto [begin, end] = video_chunks[j];
              last_max = std::numeric_limits<int64_t>::min();
              for (size_t i = begin; i < end; ++i) {
                const auto& p = video[i];
                emit(p[0], p[1], p[2], SegmentKind::kVideo, index);
                last_max = std::max({last_max, p[0], p[1], p[2]});
              }
              last_size = end - begin;
            }
            if (j < audio_chunks.size()) {
              const auto [begin, end] = audio_chunks[j];
              for (size_t k = begin; k < end; ++k) {
                const int64_t p = v + static_cast<int64_t>(k);
                emit(p, p, p, SegmentKind::kAudio, index);
              }
              last_max = v + static_cast<int64_t>(end) - 1;
              last_size = end - begin;
            }
          }
          // chunks are never empty when both sides have tokens (checked above)
          TORCH_INTERNAL_ASSERT(last_size > 0, "stream: segment ", index,
                                " ended on an empty chunk");
          const int64_t end_position = last_max + 1;
          emit(end_position, end_position, end_position, SegmentKind::kAudioEos, index);
          emit(end_position, end_position, end_position, SegmentKind::kVisionEos, index);
          next = end_position + 1;
          break;
        }
        line(1, SegmentKind::kVisionBos, index);
        const int64_t v = next;
        // an image's t step is 1 s (HF: arange(grid_t) * 1 * position_id_per_seconds)
        const double seconds_per_grid = s.kind == SegmentKind::kImage ? 1.0 : s.seconds_per_frame;
        int64_t block_max = v;
        for (const auto& p : omni_vision_grid(s, v, seconds_per_grid, options)) {
          emit(p[0], p[1], p[2], s.kind, index);
          block_max = std::max({block_max, p[0], p[1], p[2]});
        }
        next = block_max + 1;
        line(1, SegmentKind::kVisionEos, index);
        break;
      }
      case SegmentKind::kVisionBos:
      case SegmentKind::kVisionEos:
      case SegmentKind::kAudioBos:
      case SegmentKind::kAudioEos:
        break;  // rejected by check_segment
    }
  }
  return finish(out, top + 1 - real);
}

}  // namespace

StreamLayout build_stream(const std::vector<Segment>& segments, const StreamOptions& options) {
  TORCH_CHECK(options.spatial_merge_size >= 1, "stream: spatial_merge_size must be >= 1, got ",
              options.spatial_merge_size);
  TORCH_CHECK(options.rule == StreamRule::kQwen2VL || options.rule == StreamRule::kQwen25Omni,
              "stream: unknown rule ", static_cast<int>(options.rule));
  return options.rule == StreamRule::kQwen25Omni ? build_stream_omni(segments, options)
                                                 : build_stream_qwen2_vl(segments, options);
}

int64_t omni_audio_tokens(int64_t mel_frames) {
  TORCH_CHECK(mel_frames >= 0, "omni_audio_tokens: mel_frames must be >= 0, got ", mel_frames);
  // ((mel - 1) // 2 + 1 - 2) // 2 + 1: conv stride 2, then average pool stride 2
  return floor_div(floor_div(mel_frames - 1, 2) + 1 - 2, 2) + 1;
}

int64_t omni_time_offset(int64_t frame, double seconds_per_grid, double position_id_per_seconds) {
  TORCH_CHECK(frame >= 0, "omni_time_offset: frame must be >= 0, got ", frame);
  TORCH_CHECK(std::isfinite(seconds_per_grid) && seconds_per_grid >= 0,
              "omni_time_offset: seconds_per_grid must be finite and >= 0, got ", seconds_per_grid);
  TORCH_CHECK(std::isfinite(position_id_per_seconds) && position_id_per_seconds > 0,
              "omni_time_offset: position_id_per_seconds must be positive and finite, got ",
              position_id_per_seconds);
  // HF: (torch.arange(grid_t) * second_per_grids[i].float() * position_id_per_seconds).long():
  // int64 arange * float32 -> float32, * P in float32, then truncation toward zero
  const float step = static_cast<float>(seconds_per_grid);
  const float scale = static_cast<float>(position_id_per_seconds);
  const float seconds = static_cast<float>(frame) * step;
  const float offset = seconds * scale;
  TORCH_CHECK(std::isfinite(offset) && static_cast<double>(offset) <= kMaxOmniPosition,
              "omni_time_offset: frame ", frame, " x ", seconds_per_grid, " s per grid x ",
              position_id_per_seconds, " per second = ", offset, "; the limit is 2^52");
  return static_cast<int64_t>(offset);
}

}  // namespace posenc
