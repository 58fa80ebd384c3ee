// Mixed-stream M-RoPE positions; rules in include/posenc/core/stream.h.
#include "posenc/core/stream.h"

#include <torch/torch.h>

#include <cmath>

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

StreamLayout build_stream(const std::vector<Segment>& segments, const StreamOptions& options) {
  TORCH_CHECK(options.spatial_merge_size >= 1, "stream: spatial_merge_size must be >= 1, got ",
              options.spatial_merge_size);
  std::vector<double> t, h, w;
  StreamLayout layout;
  double next = 0;  // (max position so far) + 1
  int64_t real = 0;
  for (size_t index = 0; index < segments.size(); ++index) {
    const auto& s = segments[index];
    switch (s.kind) {
      case SegmentKind::kPadding:
      case SegmentKind::kText: {
        TORCH_CHECK(s.tokens >= 0, "stream: segment ", index, " has ", s.tokens, " tokens");
        for (int64_t i = 0; i < s.tokens; ++i) {
          const double p = s.kind == SegmentKind::kText ? next + static_cast<double>(i) : 0.0;
          t.push_back(p);
          h.push_back(p);
          w.push_back(p);
          layout.kinds.push_back(s.kind);
        }
        if (s.kind == SegmentKind::kText) {
          next += static_cast<double>(s.tokens);
          real += s.tokens;
        }
        break;
      }
      case SegmentKind::kImage:
      case SegmentKind::kVideo: {
        const int64_t m = options.spatial_merge_size;
        TORCH_CHECK(s.frames >= 1 && s.height >= 1 && s.width >= 1, "stream: segment ", index, " (",
                    to_string(s.kind), ") has grid ", s.frames, "x", s.height, "x", s.width);
        TORCH_CHECK(s.height % m == 0 && s.width % m == 0, "stream: segment ", index, " grid ",
                    s.height, "x", s.width, " is not divisible by spatial_merge_size ", m);
        const int64_t gh = s.height / m, gw = s.width / m;
        const double interval = s.kind == SegmentKind::kVideo && s.seconds_per_frame > 0
                                    ? s.seconds_per_frame * options.tokens_per_second
                                    : 1.0;
        const double start = next;
        double top = start;
        for (int64_t f = 0; f < s.frames; ++f) {
          double ft = static_cast<double>(f) * interval;
          if (options.floor_time) ft = std::floor(ft);
          for (int64_t r = 0; r < gh; ++r)
            for (int64_t c = 0; c < gw; ++c) {
              t.push_back(start + ft);
              h.push_back(start + static_cast<double>(r));
              w.push_back(start + static_cast<double>(c));
              layout.kinds.push_back(s.kind);
              top = std::max({top, start + ft, start + r, start + c});
            }
        }
        next = top + 1;
        real += s.frames * gh * gw;
        break;
      }
    }
  }
  const auto n = static_cast<int64_t>(t.size());
  auto coords = torch::stack({torch::tensor(t, torch::kFloat64), torch::tensor(h, torch::kFloat64),
                              torch::tensor(w, torch::kFloat64)},
                             1)
                    .view({n, 3});
  layout.positions = Positions(coords, {"t", "h", "w"});
  layout.rope_delta = static_cast<int64_t>(next) - real;
  return layout;
}

}  // namespace posenc
