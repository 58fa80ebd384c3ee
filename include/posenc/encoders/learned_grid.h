// Learned 2D absolute table for patch grids (ViT, Dosovitskiy et al. 2021): x_n + W[h_n * G_w +
// w_n], W a trainable [G_h * G_w, D] table, plus num_prefix_tokens rows (CLS, registers) kept
// apart: x is [B, prefix + N, D] and its first `prefix` tokens get the prefix rows.
// Resampling to a new grid follows timm's resample_abs_pos_embed: prefix rows unchanged, the grid
// rows reshaped to [1, D, G_h, G_w] and interpolated (bicubic or bilinear, optional antialias,
// align_corners), non-square grids allowed. Mode "ast" is AST's per-axis rule (Gong et al. 2021,
// ast_models.py, adapting DeiT's 24 x 24 table to a spectrogram's patch grid): each axis on its
// own, columns (time) first, then rows (frequency): an axis that shrinks or stays is cut from the
// middle (the n entries starting at old / 2 - n / 2, integer halves), an axis that grows is
// interpolated bilinearly along that axis alone (no antialias). A grid that does not match the
// table is an error naming both grids: resample first (no silent interpolation).
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct GridResample {
  /// "bicubic" (default, as timm and HF ViT), "bilinear", or "ast" (per-axis cut or bilinear).
  TORCH_ARG(std::string, mode) = "bicubic";
  /// Antialias when resizing (default true, as timm; HF ViT uses false).
  TORCH_ARG(bool, antialias) = true;
  /// align_corners (default false, as both).
  TORCH_ARG(bool, align_corners) = false;
};

/// table [prefix + old_h * old_w, D] -> [prefix + new_h * new_w, D].
at::Tensor resample_grid_table(const at::Tensor& table, int64_t old_h, int64_t old_w, int64_t new_h,
                               int64_t new_w, int64_t num_prefix_tokens,
                               const GridResample& options = GridResample());

struct LearnedGridOptions {
  LearnedGridOptions(int64_t grid_height = 14, int64_t grid_width = 14, int64_t dim = 64)
      : grid_height_(grid_height), grid_width_(grid_width), dim_(dim) {}
  /// Patch rows G_h (default 14).
  TORCH_ARG(int64_t, grid_height);
  /// Patch columns G_w (default 14).
  TORCH_ARG(int64_t, grid_width);
  /// Embedding width D. From the model.
  TORCH_ARG(int64_t, dim);
  /// Rows for prefix tokens such as CLS (default 0).
  TORCH_ARG(int64_t, num_prefix_tokens) = 0;
  /// Initial table standard deviation (default 0.02).
  TORCH_ARG(double, init_std) = 0.02;
  /// How adapt() (a new grid at evaluation) resamples the table (default: timm's bicubic).
  TORCH_ARG(GridResample, resample) = GridResample();
};

class LearnedGridImpl : public PositionalEncodingImpl {
 public:
  explicit LearnedGridImpl(LearnedGridOptions options = LearnedGridOptions());
  void reset();
  std::string type() const override { return "learned_grid"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  Restore adapt(const Extent& extent) override;
  /// positions (h, w integers inside the grid) -> [N, D] or [B, N, D] (without prefix rows).
  at::Tensor lookup(const Positions& positions) const;
  /// x: [B, prefix + N, D] or [prefix + N, D].
  Description describe(const Positions& positions, const DescribeOptions& options) override;
  /// Resamples the table to a new grid (the parameter keeps its identity, new shape).
  void resize(int64_t grid_height, int64_t grid_width,
              const GridResample& resample = GridResample());

  LearnedGridOptions options;
  torch::Tensor weight;  ///< [prefix + G_h * G_w, D]
};
TORCH_MODULE(LearnedGrid);

}  // namespace posenc
