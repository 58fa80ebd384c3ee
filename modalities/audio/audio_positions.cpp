// AST patch grids and audio token positions; rules in audio_positions.h.
#include "audio/audio_positions.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc::audio {

TimeUnit time_unit_from_string(const std::string& name) {
  if (name == "seconds") return TimeUnit::kSeconds;
  if (name == "index") return TimeUnit::kIndex;
  TORCH_CHECK(false, "audio: unknown time unit '", name, "'; expected one of: seconds, index");
}

void AstPatchOptions::validate() const {
  TORCH_CHECK(patch >= 1 && patch <= 256, "ast: patch must be in [1, 256], got ", patch);
  TORCH_CHECK(stride >= 1 && stride <= patch, "ast: stride must be in [1, patch = ", patch,
              "] (patches may overlap, never leave gaps), got ", stride);
}

PatchGridSize ast_patch_grid(int64_t mels, int64_t frames, const AstPatchOptions& options) {
  options.validate();
  TORCH_CHECK(mels >= options.patch && frames >= options.patch, "ast: a ", frames, " x ", mels,
              " (frames x mels) spectrogram is smaller than one ", options.patch, " x ",
              options.patch, " patch");
  return {(mels - options.patch) / options.stride + 1,
          (frames - options.patch) / options.stride + 1};
}

at::Tensor ast_patches(const at::Tensor& log_mel, const AstPatchOptions& options) {
  TORCH_CHECK(log_mel.dim() == 2 || log_mel.dim() == 3,
              "ast: log_mel must be [frames, mels] or [B, frames, mels], got shape ",
              log_mel.sizes());
  const bool batched = log_mel.dim() == 3;
  auto x = batched ? log_mel : log_mel.unsqueeze(0);  // [B, T, M]
  const auto grid = ast_patch_grid(x.size(2), x.size(1), options);
  const int64_t p = options.patch, s = options.stride;
  // [B, M, T] -> unfold bands then frames: [B, F', T', p (band), p (frame)]
  auto patches = x.transpose(1, 2).unfold(1, p, s).unfold(2, p, s);
  patches = patches.reshape({x.size(0), grid.tokens(), p * p});  // [B, F' T', p p]
  return batched ? patches : patches.squeeze(0);
}

Positions ast_positions(const PatchGridSize& grid, const AstPatchOptions& options,
                        double frame_seconds, TimeUnit unit, double offset_seconds) {
  options.validate();
  TORCH_CHECK(grid.freq >= 1 && grid.time >= 1, "ast: the patch grid must be non-empty, got ",
              grid.freq, " x ", grid.time);
  TORCH_CHECK(std::isfinite(frame_seconds) && frame_seconds > 0,
              "ast: frame_seconds must be finite and > 0, got ", frame_seconds);
  TORCH_CHECK(std::isfinite(offset_seconds), "ast: offset_seconds must be finite, got ",
              offset_seconds);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto f = torch::arange(grid.freq, f64).repeat_interleave(grid.time);  // [F' T']
  auto t = torch::arange(grid.time, f64).repeat({grid.freq});           // [F' T']
  if (unit == TimeUnit::kSeconds)
    t = t * (static_cast<double>(options.stride) * frame_seconds) + offset_seconds;
  return Positions(torch::stack({f, t}, 1), {"freq", "time"});
}

Positions frame_positions(int64_t tokens, double seconds_per_token, TimeUnit unit,
                          double offset_seconds) {
  TORCH_CHECK(tokens >= 1, "audio: frame_positions needs at least one token, got ", tokens);
  TORCH_CHECK(std::isfinite(seconds_per_token) && seconds_per_token > 0,
              "audio: seconds_per_token must be finite and > 0, got ", seconds_per_token);
  TORCH_CHECK(std::isfinite(offset_seconds), "audio: offset_seconds must be finite, got ",
              offset_seconds);
  auto t = torch::arange(tokens, torch::dtype(torch::kDouble));
  if (unit == TimeUnit::kSeconds) t = t * seconds_per_token + offset_seconds;
  return Positions(t.unsqueeze(1), {"time"});
}

}  // namespace posenc::audio
