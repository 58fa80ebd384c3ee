// Mixed text–image–video streams: segments laid into one sequence with M-RoPE positions the way
// Qwen2-VL assigns them (Wang et al. 2024, "Qwen2-VL"; HF get_rope_index, transformers 4.x rule):
//   text token       (s, s, s) with s the running index: every axis the same, so M-RoPE
//                    reduces to 1D RoPE on text
//   vision segment   its token grid t x h x w (after spatial merging; t outer, then h, then w)
//                    gets (t * interval, h, w) + start, start = (max position so far) + 1
//   text after it    resumes at (max position so far) + 1
//   interval         1, or for video seconds_per_frame * tokens_per_second (Qwen2.5-VL), floored
//                    to an integer as HF does unless floor_time is false (real-time axis)
//   left padding     pad slots get position 0 (as transformers 5.x); real tokens get the
//                    positions of the unpadded stream
// rope_delta = max + 1 - real tokens: the next generated token sits at cache_length + rope_delta.
// Note: transformers 5.24 resumes text after a video at start + max(h, w) instead (ignoring the
// time extent); images agree under both rules.
#pragma once

#include <string>
#include <vector>

#include "posenc/core/positions.h"

namespace posenc {

enum class SegmentKind { kText, kImage, kVideo, kPadding };
std::string to_string(SegmentKind kind);

struct Segment {
  SegmentKind kind = SegmentKind::kText;
  int64_t tokens = 0;                         ///< text and padding: number of tokens
  int64_t frames = 1, height = 0, width = 0;  ///< vision: the patch grid (grid_thw)
  double seconds_per_frame = 0.0;             ///< video: > 0 puts real time on the t axis

  static Segment text(int64_t tokens);
  static Segment padding(int64_t tokens);
  static Segment image(int64_t height, int64_t width);
  static Segment video(int64_t frames, int64_t height, int64_t width,
                       double seconds_per_frame = 0.0);
};

struct StreamOptions {
  int64_t spatial_merge_size = 1;  ///< vision grids shrink by this in h and w (Qwen2-VL: 2)
  double tokens_per_second = 4.0;  ///< Qwen2.5-VL: t-axis units per second of video
  bool floor_time = true;          ///< HF floors t * interval to an integer
};

struct StreamLayout {
  Positions positions;             ///< [N, 3], axes (t, h, w)
  std::vector<SegmentKind> kinds;  ///< per token
  int64_t rope_delta = 0;
};

/// Lays the segments out in order and assigns their positions.
StreamLayout build_stream(const std::vector<Segment>& segments, const StreamOptions& options = {});

}  // namespace posenc
