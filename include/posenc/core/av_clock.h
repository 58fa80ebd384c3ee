// LTX-2's audio-video clock: video patches and audio latent frames on one time axis in seconds,
// each token at the midpoint of its [start, end) interval (diffusers 0.42.1
// LTX2AudioVideoRotaryPosEmbed.prepare_video_coords / prepare_audio_coords and the midpoints its
// forward takes, models/transformers/transformer_ltx2.py; the pipeline's audio length
// round(seconds * sampling_rate / hop_length / scale_factor), pipelines/ltx2/pipeline_ltx2.py).
//
// Video, a latent grid frames x height x width cut into patch_size_t x patch_size x patch_size
// patches (frame outer, then row-major), per axis [start, end) in pixels:
//   latent     [i p, i p + p)               i the patch index, p the patch size on that axis
//   pixels     latent * scale_factors       (8, 32, 32): the VAE's temporal and spatial strides
//   time       max(pixels_t + causal_offset - scale_factors[0], 0) / fps      (seconds; the
//              first latent frame covers one pixel frame, causal_offset 1)
// Audio, latent frames k = shift, shift + patch_size_t, ... (one axis):
//   mel        max(k scale_factor + causal_offset - scale_factor, 0), end at k + patch_size_t
//   time       mel * hop_length / sampling_rate                              (seconds)
// Position = (start + end) / 2. All of it in float32 as diffusers computes it (its bits; the
// Positions hold them exactly in float64), so a video at 24 fps and its audio at 25 latent frames
// per second share one time axis: LTX-2's cross-attention rotates both by it (axis "t").
#pragma once

#include <array>
#include <cstdint>

#include "posenc/core/positions.h"

namespace posenc {

/// The video side of LTX-2's clock (defaults: LTX-2's transformer and pipeline).
struct Ltx2VideoClock {
  int64_t patch_size_t = 1;
  int64_t patch_size = 1;
  std::array<int64_t, 3> scale_factors{8, 32, 32};  ///< vae_scale_factors (t, h, w)
  int64_t causal_offset = 1;
  double fps = 24.0;  ///< frames per second (the pipeline's frame_rate)
  /// Checks every field (positive sizes, causal_offset >= 0, fps positive and finite).
  void validate() const;
};

/// The audio side (defaults: LTX-2's audio VAE: 16 kHz, hop 160, 4 mel frames per latent).
struct Ltx2AudioClock {
  int64_t patch_size_t = 1;
  int64_t scale_factor = 4;  ///< audio_scale_factor: mel frames per latent frame
  int64_t causal_offset = 1;
  int64_t sampling_rate = 16000;
  int64_t hop_length = 160;
  int64_t shift = 0;  ///< the first latent frame's index (an overlapping window's offset)
  void validate() const;
  /// sampling_rate / hop_length / scale_factor (25 latent frames per second by default).
  double latents_per_second() const;
};

/// Video positions: [N, 3] (t seconds, h pixels, w pixels), axes (t, h, w), for a latent grid of
/// frames x height x width (N = ceil(frames / patch_size_t) ceil(height / patch_size) ...).
Positions ltx2_video_positions(int64_t frames, int64_t height, int64_t width,
                               const Ltx2VideoClock& clock = {});
/// The [start, end) bounds behind them: [N, 3, 2] float32 (diffusers' coords, [B, 3, N, 2],
/// for one sequence and with the axes last but one).
at::Tensor ltx2_video_bounds(int64_t frames, int64_t height, int64_t width,
                             const Ltx2VideoClock& clock = {});

/// Audio positions: [N, 1] (t seconds), axis t, for `latent_frames` latent frames.
Positions ltx2_audio_positions(int64_t latent_frames, const Ltx2AudioClock& clock = {});
/// The bounds: [N, 1, 2] float32.
at::Tensor ltx2_audio_bounds(int64_t latent_frames, const Ltx2AudioClock& clock = {});
/// The pipeline's audio length for `seconds` of audio: round(seconds * latents_per_second()),
/// Python's round (half to even). Checks seconds finite and >= 0.
int64_t ltx2_audio_latent_frames(double seconds, const Ltx2AudioClock& clock = {});

/// The shared clock of a video and its audio, as the cross-attention reads it: the video's t
/// then the audio's t, [Nv + Na, 1], axis t.
Positions ltx2_clock(const Positions& video, const Positions& audio);

}  // namespace posenc
