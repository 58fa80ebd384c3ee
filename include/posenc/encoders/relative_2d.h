// 2D relative position bias (Swin Transformer, Liu et al. 2021; BEiT): a learned scalar per head
// for every 2D offset between query and key patches,
//   b_h(m, n) = T[(h_m - h_n + G_h - 1) * (2 G_w - 1) + (w_m - w_n + G_w - 1), h]
// (query minus key, as Swin's relative_position_index), T a trainable [(2G_h-1)(2G_w-1), H]
// table covering offsets up to a G_h x G_w window. Offsets beyond it are an error; resize() grows
// or shrinks the table by bicubic interpolation over the offset plane (as timm's
// resize_rel_pos_bias_table does for a new window). Materialized bias (not a BiasSpec form yet).
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct Relative2dOptions {
  Relative2dOptions(int64_t num_heads = 8, int64_t grid_height = 7, int64_t grid_width = 7)
      : num_heads_(num_heads), grid_height_(grid_height), grid_width_(grid_width) {}
  /// Heads H. From the model.
  TORCH_ARG(int64_t, num_heads);
  /// Window rows G_h: offsets -(G_h-1) .. G_h-1 (default 7, Swin).
  TORCH_ARG(int64_t, grid_height);
  /// Window columns G_w (default 7).
  TORCH_ARG(int64_t, grid_width);
  /// Initial table standard deviation (default 0.02, Swin's trunc_normal std).
  TORCH_ARG(double, init_std) = 0.02;
};

class Relative2dImpl : public PositionalEncodingImpl {
 public:
  explicit Relative2dImpl(Relative2dOptions options = Relative2dOptions());
  void reset();
  std::string type() const override { return "relative_2d"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  Restore adapt(const Extent& extent) override;
  /// Table rows [Nq, Nk] for pairs of (h, w) positions.
  at::Tensor relative_index(const Positions& q_positions, const Positions& k_positions) const;
  /// [H, Nq, Nk]
  /// The bias at these positions, materialized.
  at::Tensor bias_at(const Positions& q_positions, const Positions& k_positions,
                     const at::Tensor& q = {}) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;
  /// Resamples the table to a new window (bicubic over the offset plane).
  void resize(int64_t grid_height, int64_t grid_width);

  Relative2dOptions options;
  torch::Tensor weight;  ///< [(2G_h-1)(2G_w-1), H]
};
TORCH_MODULE(Relative2d);

}  // namespace posenc
