// Sinusoidal absolute encoding (Vaswani et al. 2017): x + PE(p), PE from
// posenc/functional/sinusoidal.h. Fixed (no parameters); any real positions, so it extrapolates.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"
#include "posenc/functional/sinusoidal.h"

namespace posenc {

struct SinusoidalOptions {
  explicit SinusoidalOptions(int64_t dim = 64) : dim_(dim) {}
  /// Embedding width D (even). From the model.
  TORCH_ARG(int64_t, dim);
  /// kInterleaved (sin, cos, sin, ...; Vaswani) or kConcat (all sines, then cosines; MAE).
  TORCH_ARG(SinusoidalLayout, layout) = SinusoidalLayout::kInterleaved;
  /// Frequency base (default 10000).
  TORCH_ARG(double, base) = 10000.0;
};

class SinusoidalImpl : public PositionalEncodingImpl {
 public:
  explicit SinusoidalImpl(SinusoidalOptions options = SinusoidalOptions());
  void reset();
  std::string type() const override { return "sinusoidal"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// positions (1 axis) -> [N, D] or [B, N, D] float32.
  at::Tensor table(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  SinusoidalOptions options;
};
TORCH_MODULE(Sinusoidal);

}  // namespace posenc
