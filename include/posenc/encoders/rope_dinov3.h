// DINOv3's rotary position embedding (Simeoni et al. 2025, "DINOv3"; facebookresearch/dinov3
// RopePositionEmbedding, timm 1.0.31's RotaryEmbeddingDinoV3 in layers/pos_embed_sincos.py,
// transformers' DINOv3ViTRopePositionEmbedding): axial 2D RoPE on patch centres normalized to
// [-1, 1] per axis, so a larger grid of the same image is sampled more densely over the same
// range (interpolation), where index coordinates would run past the trained ones.
//
// For a patch grid of H x W (the positions' extent: rows 0..H-1, columns 0..W-1):
//   c_h[j] = 2 (j + 0.5) / d_h - 1,  c_w[j] = 2 (j + 0.5) / d_w - 1
//     d = (H, W) (normalize "separate"), (max, max) or (min, min)       (timm's _build_grid)
//   periods p_i = temperature^(2i / (Dh/2)), i < Dh/4 (temperature 100), or
//     min_period (max_period / min_period)^linspace(0, 1, Dh/4) when both are given
//   angle[n, a Dh/4 + i] = (2 pi c_a[n]) / p_i                          (a = 0: row, 1: column)
// F = Dh/2 pairs, laid out "half" (DINOv3's rotate_half: pair (i, i + F)) or "interleaved".
// All in float32, op for op as timm (the scalar product first, then the division).
//
// Training-time coordinate augmentation (DINOv3's, in its random order; each off unless given):
//   shift_coords s:   c_a += u_a,            u_a ~ U(-s, s) per axis           (2 draws)
//   jitter_coords J:  c_a *= exp(v_a),       v_a ~ U(-log J, log J) per axis   (2 draws)
//   rescale_coords R: c   *= exp(w),         w   ~ U(-log R, log R) shared     (1 draw)
// One transform for the whole grid per forward, drawn from torch's default CPU generator (which
// `posenc train` seeds per step, so runs repeat), in training mode only: eval mode is
// unaugmented. DINOv3's released training config: rescale 2, no shift, no jitter.
#pragma once

#include <torch/arg.h>

#include <optional>

#include "posenc/core/encoder.h"
#include "posenc/functional/patch_grid.h"
#include "posenc/functional/rope.h"

namespace posenc {

struct RopeDinoV3Options {
  RopeDinoV3Options(int64_t head_dim = 64) : head_dim_(head_dim) {}
  /// Per-head dimension Dh (a multiple of 4: Dh/4 periods per axis). From the model.
  TORCH_ARG(int64_t, head_dim);
  /// Period base (default 100, DINOv3's); unused when min_period and max_period are given.
  TORCH_ARG(double, temperature) = 100.0;
  /// Shortest and longest period (both or neither; default: none, the temperature's ladder).
  TORCH_ARG(std::optional<double>, min_period) = std::nullopt;
  TORCH_ARG(std::optional<double>, max_period) = std::nullopt;
  /// Denominator of the centred coordinates (default kSeparate: each axis its own size).
  TORCH_ARG(GridNormalize, normalize) = GridNormalize::kSeparate;
  /// Training-time shift bound s >= 0 (default: off).
  TORCH_ARG(std::optional<double>, shift_coords) = std::nullopt;
  /// Training-time per-axis log-uniform scale factor J >= 1 (default: off).
  TORCH_ARG(std::optional<double>, jitter_coords) = std::nullopt;
  /// Training-time shared log-uniform scale factor R >= 1 (default: off; DINOv3 trains with 2).
  TORCH_ARG(std::optional<double>, rescale_coords) = std::nullopt;
  /// Pair layout (default kHalf, DINOv3's rotate_half).
  TORCH_ARG(RopeLayout, layout) = RopeLayout::kHalf;
};

/// DINOv3's periods [Dh/4] float32 (timm's RotaryEmbeddingDinoV3._compute_periods).
at::Tensor rope_dinov3_periods(const RopeDinoV3Options& options);

/// The augmentation on coordinates [N, A] (one transform for all rows; draws from torch's default
/// generator in DINOv3's order: shift (A), jitter (A), rescale (1)); unchanged when all are off.
at::Tensor rope_dinov3_augment(const at::Tensor& coords, const RopeDinoV3Options& options);

/// Per-pair (cos, sin) [N, Dh/2] float32 of coordinates [N, 2] (row, column) in [-1, 1].
std::pair<at::Tensor, at::Tensor> rope_dinov3_cos_sin(const at::Tensor& coords,
                                                      const at::Tensor& periods);

class RopeDinoV3Impl : public PositionalEncodingImpl {
 public:
  explicit RopeDinoV3Impl(RopeDinoV3Options options = RopeDinoV3Options());
  void reset();
  std::string type() const override { return "rope_dinov3"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// The normalized (and, in training mode, augmented) coordinates [N, 2] of patch-grid
  /// positions (row, column), integers >= 0; the grid is their extent.
  at::Tensor coords(const Positions& positions) const;
  /// Per-pair (cos, sin) [N, Dh/2] at the positions (augmented in training mode).
  std::pair<at::Tensor, at::Tensor> cos_sin(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;
  bool augments() const;

  RopeDinoV3Options options;
  at::Tensor periods;  ///< [Dh/4] float32
};
TORCH_MODULE(RopeDinoV3);

}  // namespace posenc
