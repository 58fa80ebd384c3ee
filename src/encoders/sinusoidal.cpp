// Sinusoidal absolute encoding module; math in posenc/functional/sinusoidal.h.
#include "posenc/encoders/sinusoidal.h"

#include <torch/torch.h>

namespace posenc {

SinusoidalImpl::SinusoidalImpl(SinusoidalOptions options_) : options(std::move(options_)) {
  reset();
}

void SinusoidalImpl::reset() {
  TORCH_CHECK(options.dim() > 0 && options.dim() % 2 == 0,
              "sinusoidal: dim must be positive and even, got ", options.dim());
  TORCH_CHECK(options.base() > 0, "sinusoidal: base must be positive, got ", options.base());
}

at::Tensor SinusoidalImpl::table(const Positions& positions) const {
  positions.check_num_axes("sinusoidal", 1);
  return sinusoidal_table(positions.axis(0), options.dim(), options.base(), options.layout())
      .to(torch::kFloat32);
}

void SinusoidalImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), table(request.queries).to(request.device));
}

Description SinusoidalImpl::describe(const Positions& positions, const DescribeOptions&) {
  positions.check_num_axes("sinusoidal", 1);
  // float64 for inspection: exact enough to cross-check other implementations
  return {{"table",
           sinusoidal_table(positions.axis(0), options.dim(), options.base(), options.layout())}};
}

}  // namespace posenc
