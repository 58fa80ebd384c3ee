// Multi-axis sin-cos module; math in posenc/functional/sinusoidal.h.
#include "posenc/encoders/axial_sincos.h"

#include <torch/torch.h>

#include "posenc/encoders/sinusoidal.h"

namespace posenc {

AxialSincosImpl::AxialSincosImpl(AxialSincosOptions options_) : options(std::move(options_)) {
  reset();
}

void AxialSincosImpl::reset() {
  TORCH_CHECK(options.num_axes() >= 1, "axial_sincos: num_axes must be >= 1, got ",
              options.num_axes());
  TORCH_CHECK(options.dim() > 0 && options.dim() % (2 * options.num_axes()) == 0,
              "axial_sincos: dim must be divisible by 2 * num_axes = ", 2 * options.num_axes(),
              ", got ", options.dim());
  TORCH_CHECK(options.temperature() > 0, "axial_sincos: temperature must be positive, got ",
              options.temperature());
}

at::Tensor AxialSincosImpl::table(const Positions& positions) const {
  positions.check_num_axes("axial_sincos", options.num_axes());
  return axial_sincos_table(positions.coords(), options.dim(), options.temperature(),
                            options.layout())
      .to(torch::kFloat32);
}

void AxialSincosImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), table(request.queries).to(request.device));
}

Description AxialSincosImpl::describe(const Positions& positions, const DescribeOptions&) {
  positions.check_num_axes("axial_sincos", options.num_axes());
  return {{"table", axial_sincos_table(positions.coords(), options.dim(), options.temperature(),
                                       options.layout())}};
}

}  // namespace posenc
