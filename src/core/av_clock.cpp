// LTX-2's audio-video clock; the math and its source are in posenc/core/av_clock.h. Every step is
// the ATen op diffusers runs, on float32, so the values are its bits: +, -, *, / and clamp are
// correctly rounded whatever the vector width, so they hold on every CPU.
#include "posenc/core/av_clock.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

namespace posenc {

namespace {
// A token count past posenc's positions limit, refused before anything is allocated.
constexpr double kMaxClockTokens = 1 << 26;
}  // namespace

void Ltx2VideoClock::validate() const {
  TORCH_CHECK(patch_size_t >= 1 && patch_size >= 1,
              "ltx2 clock: patch sizes must be >= 1, got patch_size_t=", patch_size_t,
              ", patch_size=", patch_size);
  TORCH_CHECK(scale_factors[0] >= 1 && scale_factors[1] >= 1 && scale_factors[2] >= 1,
              "ltx2 clock: scale_factors must be >= 1, got (", scale_factors[0], ", ",
              scale_factors[1], ", ", scale_factors[2], ")");
  TORCH_CHECK(causal_offset >= 0, "ltx2 clock: causal_offset must be >= 0, got ", causal_offset);
  TORCH_CHECK(fps > 0 && std::isfinite(fps) && static_cast<float>(fps) > 0 &&
                  std::isfinite(static_cast<float>(fps)),
              "ltx2 clock: fps must be positive and finite in float32 (diffusers divides float32 "
              "times by it), got ",
              fps);
}

void Ltx2AudioClock::validate() const {
  TORCH_CHECK(patch_size_t >= 1 && scale_factor >= 1,
              "ltx2 clock: audio patch_size_t and scale_factor must be >= 1, got ", patch_size_t,
              " and ", scale_factor);
  TORCH_CHECK(causal_offset >= 0, "ltx2 clock: causal_offset must be >= 0, got ", causal_offset);
  TORCH_CHECK(sampling_rate >= 1 && hop_length >= 1,
              "ltx2 clock: sampling_rate and hop_length must be >= 1, got ", sampling_rate, " and ",
              hop_length);
  TORCH_CHECK(shift >= 0, "ltx2 clock: shift must be >= 0, got ", shift);
}

double Ltx2AudioClock::latents_per_second() const {
  return static_cast<double>(sampling_rate) / static_cast<double>(hop_length) /
         static_cast<double>(scale_factor);
}

at::Tensor ltx2_video_bounds(int64_t frames, int64_t height, int64_t width,
                             const Ltx2VideoClock& clock) {
  clock.validate();
  TORCH_CHECK(frames >= 1 && height >= 1 && width >= 1,
              "ltx2 clock: the latent video must be at least 1x1x1, got ", frames, "x", height, "x",
              width);
  auto patches = [](int64_t size, int64_t patch) { return (size + patch - 1) / patch; };
  const double tokens = static_cast<double>(patches(frames, clock.patch_size_t)) *
                        static_cast<double>(patches(height, clock.patch_size)) *
                        static_cast<double>(patches(width, clock.patch_size));
  TORCH_CHECK(tokens <= kMaxClockTokens, "ltx2 clock: a ", frames, "x", height, "x", width,
              " latent video is ", tokens, " tokens; the limit is ", kMaxClockTokens);
  const auto f32 = torch::kFloat32;
  // grid_f/h/w = arange(0, size, step=patch, float32); meshgrid ij; stack -> [3, Nf, Nh, Nw]
  auto grids = torch::meshgrid({torch::arange(0, frames, clock.patch_size_t, f32),
                                torch::arange(0, height, clock.patch_size, f32),
                                torch::arange(0, width, clock.patch_size, f32)},
                               "ij");
  auto grid = torch::stack(grids, 0);
  auto delta = torch::tensor({clock.patch_size_t, clock.patch_size, clock.patch_size}, f32);
  auto ends = grid + delta.view({3, 1, 1, 1});
  auto latent = torch::stack({grid, ends}, -1).flatten(1, 3);  // [3, N, 2]
  // pixel_coords = latent_coords * tensor(scale_factors) (int64 tensor: float32 result)
  auto scale = torch::tensor(
      std::vector<int64_t>(clock.scale_factors.begin(), clock.scale_factors.end()), torch::kLong);
  auto pixels = latent * scale.view({3, 1, 1});
  // time: (pixels + causal_offset - scale_factors[0]).clamp(min=0) / fps
  auto time = pixels[0].add(clock.causal_offset).sub(clock.scale_factors[0]).clamp_min(0);
  pixels[0].copy_(time.div(clock.fps));
  return pixels.permute({1, 0, 2}).contiguous();  // [N, 3, 2]
}

Positions ltx2_video_positions(int64_t frames, int64_t height, int64_t width,
                               const Ltx2VideoClock& clock) {
  auto bounds = ltx2_video_bounds(frames, height, width, clock);
  // coords = (coords_start + coords_end) / 2.0   (float32)
  auto mid = bounds.select(-1, 0).add(bounds.select(-1, 1)).div(2.0);
  return Positions(mid.to(torch::kFloat64), {"t", "h", "w"});
}

at::Tensor ltx2_audio_bounds(int64_t latent_frames, const Ltx2AudioClock& clock) {
  clock.validate();
  TORCH_CHECK(latent_frames >= 1, "ltx2 clock: the audio needs at least one latent frame, got ",
              latent_frames);
  TORCH_CHECK(static_cast<double>(latent_frames) <= kMaxClockTokens, "ltx2 clock: ", latent_frames,
              " audio latent frames; the limit is ", kMaxClockTokens);
  const auto f32 = torch::kFloat32;
  // grid_f = arange(shift, num_frames + shift, step=patch_size_t, float32)
  auto grid = torch::arange(clock.shift, latent_frames + clock.shift, clock.patch_size_t, f32);
  auto seconds = [&](const at::Tensor& latent) {
    // mel = (latent * scale + causal_offset - scale).clip(min=0); mel * hop_length / sampling_rate
    auto mel = latent.mul(clock.scale_factor)
                   .add(clock.causal_offset)
                   .sub(clock.scale_factor)
                   .clamp_min(0);
    return mel.mul(clock.hop_length).div(clock.sampling_rate);
  };
  auto start = seconds(grid);
  auto end = seconds(grid.add(clock.patch_size_t));
  return torch::stack({start, end}, -1).unsqueeze(1);  // [N, 1, 2]
}

Positions ltx2_audio_positions(int64_t latent_frames, const Ltx2AudioClock& clock) {
  auto bounds = ltx2_audio_bounds(latent_frames, clock);
  auto mid = bounds.select(-1, 0).add(bounds.select(-1, 1)).div(2.0);
  return Positions(mid.to(torch::kFloat64), {"t"});
}

int64_t ltx2_audio_latent_frames(double seconds, const Ltx2AudioClock& clock) {
  clock.validate();
  TORCH_CHECK(std::isfinite(seconds) && seconds >= 0,
              "ltx2 clock: audio seconds must be finite and >= 0, got ", seconds);
  const double frames = seconds * clock.latents_per_second();
  TORCH_CHECK(frames <= kMaxClockTokens, "ltx2 clock: ", seconds, " s of audio is ", frames,
              " latent frames; the limit is ", kMaxClockTokens);
  return static_cast<int64_t>(std::nearbyint(frames));  // round half to even, as Python's round
}

Positions ltx2_clock(const Positions& video, const Positions& audio) {
  TORCH_CHECK(!video.batched() && !audio.batched() && video.num_axes() >= 1 &&
                  audio.num_axes() >= 1 && video.axes()[0] == "t" && audio.axes()[0] == "t",
              "ltx2 clock: expects unbatched video and audio positions whose first axis is t, got ",
              video.describe(), " and ", audio.describe());
  auto time = torch::cat({video.axis(0), audio.axis(0)}).unsqueeze(1);
  return Positions(time, {"t"});
}

}  // namespace posenc
