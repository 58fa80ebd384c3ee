// Positions of audio tokens, on a clock in seconds so that clips of different lengths and sample
// rates share one time axis.
//
// AST patches (Gong et al. 2021, "AST: Audio Spectrogram Transformer", section 2.1): the log-mel
// spectrogram [frames, mels] is cut into patch x patch squares every `stride` bands and frames
// (16 x 16, stride 10: neighbouring patches overlap by 6), flattened frequency-major as AST's
// Conv2d over [mels, frames] does: token i = f * time_patches + t, with
//   freq_patches = (mels - patch) / stride + 1          (128 mels -> 12)
//   time_patches = (frames - patch) / stride + 1        (1024 frames -> 101)
// Positions: axes ("freq", "time"):
//   freq = f                                            (the patch row: a pitch band)
//   time = t * stride * frame_seconds + offset          (seconds: when the patch starts) or
//          t                                            (TimeUnit::kIndex, for learned tables)
// Whisper-style frames (Radford et al. 2022): one token per encoder frame, axis ("time"),
//   time = i * seconds_per_token + offset  or  i       (Whisper: 2 mel frames of 10 ms = 20 ms)
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "posenc/core/positions.h"

namespace posenc::audio {

enum class TimeUnit { kSeconds, kIndex };
TimeUnit time_unit_from_string(const std::string& name);  ///< seconds | index

struct AstPatchOptions {
  int64_t patch = 16;
  int64_t stride = 10;
  void validate() const;
};

struct PatchGridSize {
  int64_t freq = 0, time = 0;
  int64_t tokens() const { return freq * time; }
};

/// The patch grid over a [frames, mels] spectrogram; an error when it is smaller than a patch.
PatchGridSize ast_patch_grid(int64_t mels, int64_t frames, const AstPatchOptions& options = {});

/// log_mel [frames, mels] or [B, frames, mels] -> patches [(B,) F' T', patch * patch]: patch
/// (f, t) at token f T' + t, its pixels band-major (the band inside the patch outer, the frame
/// inner), as AST's Conv2d weight over [mels, frames] reads them.
at::Tensor ast_patches(const at::Tensor& log_mel, const AstPatchOptions& options = {});

/// Positions of the grid's patches: [F' T', 2], axes ("freq", "time"); see the header.
Positions ast_positions(const PatchGridSize& grid, const AstPatchOptions& options,
                        double frame_seconds, TimeUnit unit = TimeUnit::kSeconds,
                        double offset_seconds = 0.0);

/// Positions of `tokens` consecutive frames: [tokens, 1], axis "time"; see the header.
Positions frame_positions(int64_t tokens, double seconds_per_token,
                          TimeUnit unit = TimeUnit::kSeconds, double offset_seconds = 0.0);

}  // namespace posenc::audio
