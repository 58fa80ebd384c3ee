// Video into tokens + Positions (ViViT's tubelet embedding, Arnab et al. 2021; VideoMAE, Tong et
// al. 2022): a [B, T, C, H, W] clip is cut into non-overlapping t x p x p tubelets, frame-block
// outer then row-major, each flattened to t*p*p*C values, with volume positions (t, h, w).
// Video files come through OpenCV's VideoCapture / VideoWriter (FFmpeg backend when OpenCV has
// it), RGB (or gray) frames with values in [0, 1].
//
// Token layout: (dt, dy, dx, c), channel fastest, as VideoMAE's
//   rearrange('b c (t p0) (h p1) (w p2) -> b (t h w) (p0 p1 p2 c)')
// so a token is the tubelet's pixels in channel-last order; vision::patchify's image tokens are
// (c, dy, dx) instead (torchvision's conv-weight order) — a model that mixes the two reshapes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "posenc/core/positions.h"

namespace posenc::video {

struct Clip {
  at::Tensor frames;  ///< [T, C, H, W] float32 in [0, 1], C = 3 (RGB) or 1 (gray)
  double fps = 0;     ///< frames per second the container declares; 0 when it declares none
};

/// Reads a video file with cv::VideoCapture: up to `max_frames` frames (< 0: all), RGB or, with
/// `grayscale`, one channel. Errors name the file: missing, not a video OpenCV can open
/// (unreadable or corrupt container), no frame decoded, frames changing size mid-stream, and
/// fewer frames decoded than the container declares (a truncated or damaged file; with
/// `allow_short` a warning instead, and the decoded frames are returned).
Clip read_video(const std::string& path, int64_t max_frames = -1, bool grayscale = false,
                bool allow_short = false);

/// Writes frames [T, C, H, W] float in [0, 1] (clamped; C = 1 or 3) as Motion-JPEG in an AVI
/// container at `fps`. Atomic: writes `path` + ".tmp.avi", then renames it to `path`. Gray
/// frames are stored as three equal channels (read them back with grayscale = true).
/// The error names the path when the file cannot be opened for writing.
void write_video(const std::string& path, const at::Tensor& frames, double fps);

struct Tubelets {
  at::Tensor tokens;    ///< [B, N, t * p * p * C], N = (T / t) * (H / p) * (W / p); (dt, dy, dx, c)
  Positions positions;  ///< Positions::volume(T / t, H / p, W / p), axes (t, h, w)
};

/// frames [B, T, C, H, W] (or [T, C, H, W], taken as B = 1): non-overlapping t x p x p tubelets,
/// ordered t-major then row-major (h, w). T must be a multiple of t, H and W of p.
Tubelets tubeletize(const at::Tensor& frames, int64_t t, int64_t p);

}  // namespace posenc::video
