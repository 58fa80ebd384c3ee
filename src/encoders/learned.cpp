// Learned absolute table and its 1D resampling; contract in posenc/encoders/learned.h.
#include "posenc/encoders/learned.h"

#include <torch/torch.h>

#include "posenc/encoders/sinusoidal.h"

namespace posenc {

std::string to_string(Interpolation mode) {
  return mode == Interpolation::kLinear ? "linear" : "cubic";
}

Interpolation interpolation_from_string(const std::string& name) {
  if (name == "linear") return Interpolation::kLinear;
  if (name == "cubic" || name == "bicubic") return Interpolation::kCubic;
  TORCH_CHECK(false, "learned: unknown interpolation '", name, "'; expected one of: linear, cubic");
}

LearnedImpl::LearnedImpl(LearnedOptions options_) : options(std::move(options_)) { reset(); }

void LearnedImpl::reset() {
  TORCH_CHECK(options.max_positions() > 0, "learned: max_positions must be positive, got ",
              options.max_positions());
  TORCH_CHECK(options.dim() > 0, "learned: dim must be positive, got ", options.dim());
  TORCH_CHECK(options.init_std() >= 0, "learned: init_std must be >= 0, got ", options.init_std());
  weight = register_parameter(
      "weight", torch::randn({options.max_positions(), options.dim()}) * options.init_std());
}

at::Tensor LearnedImpl::lookup(const Positions& positions) const {
  positions.check_num_axes("learned", 1);
  positions.check_integer_range("learned", options.max_positions());
  auto index = positions.axis(0).to(weight.device(), torch::kLong);  // positions may be on the host
  auto sizes = index.sizes().vec();
  sizes.push_back(options.dim());
  return weight.index_select(0, index.flatten()).view(sizes);
}

void LearnedImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_embedding(type(), lookup(request.queries));
}

Restore LearnedImpl::adapt(const Extent& extent) {
  TORCH_CHECK(extent.size() == 1, "learned: adapt takes one extent (the context length), got ",
              extent.size());
  if (extent[0] <= options.max_positions()) return [] {};
  auto restore = restore_weight_and_options(*this);
  // Stretch the table over the longer context: position p reads the table at p * L / length.
  resize(extent[0]);
  return restore;
}

Description LearnedImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"table", lookup(positions).detach()}};
}

at::Tensor resample_table_1d(const at::Tensor& table, int64_t new_length, Interpolation mode) {
  TORCH_CHECK(table.dim() == 2, "learned: table must be [L, D], got shape ", table.sizes());
  TORCH_CHECK(new_length > 0, "learned: new length must be positive, got ", new_length);
  namespace F = torch::nn::functional;
  if (mode == Interpolation::kLinear) {
    auto x = table.t().unsqueeze(0);  // [1, D, L]
    auto y = F::interpolate(x, F::InterpolateFuncOptions()
                                   .size(std::vector<int64_t>{new_length})
                                   .mode(torch::kLinear)
                                   .align_corners(false));
    return y.squeeze(0).t().contiguous();
  }
  auto x = table.t().unsqueeze(0).unsqueeze(-1);  // [1, D, L, 1]
  auto y = F::interpolate(x, F::InterpolateFuncOptions()
                                 .size(std::vector<int64_t>{new_length, 1})
                                 .mode(torch::kBicubic)
                                 .align_corners(false));
  return y.squeeze(-1).squeeze(0).t().contiguous();
}

void LearnedImpl::resize(int64_t new_length, Interpolation mode) {
  torch::NoGradGuard no_grad;
  auto resampled = resample_table_1d(weight.detach(), new_length, mode);
  options.max_positions(new_length);
  weight.set_data(resampled);  // same registered parameter, new shape
}

}  // namespace posenc
