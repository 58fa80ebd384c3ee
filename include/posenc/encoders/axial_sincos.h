// Multi-axis sin-cos absolute encoding: 2D patch grids (ViT, MAE), 3D video volumes, any number
// of axes. x + PE(p) with PE from posenc/functional/sinusoidal.h (axial_sincos_table): each axis
// gets D / (2A) frequencies; the layout chooses timm's or MAE's dimension order, which differ and
// must match a checkpoint. Fixed (no parameters); real-valued coordinates work (resized grids).
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"
#include "posenc/functional/sinusoidal.h"

namespace posenc {

struct AxialSincosOptions {
  explicit AxialSincosOptions(int64_t dim = 64) : dim_(dim) {}
  /// Embedding width D (divisible by 2 * axes). From the model.
  TORCH_ARG(int64_t, dim);
  /// kTimm (default; sin of every axis, then cos) or kMae (per axis sin|cos, width axis first).
  TORCH_ARG(AxialSincosLayout, layout) = AxialSincosLayout::kTimm;
  /// Frequency base (default 10000).
  TORCH_ARG(double, temperature) = 10000.0;
  /// Number of axes the positions must have (default 2: h, w).
  TORCH_ARG(int64_t, num_axes) = 2;
};

class AxialSincosImpl : public PositionalEncodingImpl {
 public:
  explicit AxialSincosImpl(AxialSincosOptions options = AxialSincosOptions());
  void reset();
  std::string type() const override { return "axial_sincos"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// positions (num_axes axes) -> [N, D] or [B, N, D] float32.
  at::Tensor table(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  AxialSincosOptions options;
};
TORCH_MODULE(AxialSincos);

}  // namespace posenc
