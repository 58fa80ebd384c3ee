// Fractional RoPE module (LTX-2's rotary embedding): q and k rotated by per-head tables built from
// positions taken as fractions of max_positions (math and source in
// posenc/functional/rope_fractional.h). No parameters.
//
// LTX-2 (diffusers LTX2VideoTransformer3DModel) uses four of them, all with theta 1e4:
//   video self-attention   max_positions {20, 2048, 2048} on (t seconds, h pixels, w pixels),
//                          H, Dh of the video attention
//   audio self-attention   max_positions {20} on t seconds, the audio attention's H, Dh
//   cross-attention        max_positions {20} on the video's and the audio's t (the shared clock),
//                          dim = audio_cross_attention_dim
// with positions from posenc/core/av_clock.h. layout kInterleaved is rope_type "interleaved",
// kHalf is "split" (the released LTX-2 checkpoints).
#pragma once

#include <torch/arg.h>

#include <vector>

#include "posenc/core/encoder.h"
#include "posenc/functional/rope.h"
#include "posenc/functional/rope_fractional.h"

namespace posenc {

struct RopeFractionalOptions {
  RopeFractionalOptions(int64_t head_dim = 64, int64_t num_heads = 1)
      : head_dim_(head_dim), num_heads_(num_heads) {}
  /// Per-head dimension Dh (even). From the model.
  TORCH_ARG(int64_t, head_dim);
  /// Heads H; the table spans H * Dh (diffusers' `dim`). From the model (default 1).
  TORCH_ARG(int64_t, num_heads);
  /// Each axis' maximum: positions become p / max (default {20, 2048, 2048}: LTX-2's video
  /// base_num_frames, base_height, base_width; {20} for its audio and cross-attention).
  TORCH_ARG(std::vector<double>, max_positions) = std::vector<double>{20.0, 2048.0, 2048.0};
  /// Frequency base theta (default 10000, LTX-2's rope_theta).
  TORCH_ARG(double, theta) = 10000.0;
  /// Pairs within a head (default kInterleaved, LTX-2's rope_type "interleaved"; kHalf is
  /// "split").
  TORCH_ARG(RopeLayout, layout) = RopeLayout::kInterleaved;
  /// The frequencies' pow in float64 (default true, LTX-2's rope_double_precision) or float32.
  TORCH_ARG(bool, double_precision) = true;
};

class RopeFractionalImpl : public PositionalEncodingImpl {
 public:
  explicit RopeFractionalImpl(RopeFractionalOptions options = RopeFractionalOptions());
  void reset();
  std::string type() const override { return "rope_fractional"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// Per-head (cos, sin) [.., N, H, Dh/2] at positions with one axis per max_positions entry.
  std::pair<at::Tensor, at::Tensor> cos_sin(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  RopeFractionalOptions options;
  at::Tensor frequencies;  ///< [F] float32, F = H Dh // (2A)
};
TORCH_MODULE(RopeFractional);

}  // namespace posenc
