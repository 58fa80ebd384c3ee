// Swin-style 2D relative position bias; see posenc/encoders/relative_2d.h.
#include "posenc/encoders/relative_2d.h"

#include <torch/torch.h>

namespace posenc {

Relative2dImpl::Relative2dImpl(Relative2dOptions options_) : options(std::move(options_)) {
  reset();
}

void Relative2dImpl::reset() {
  TORCH_CHECK(options.num_heads() >= 1, "relative_2d: num_heads must be >= 1, got ",
              options.num_heads());
  TORCH_CHECK(options.grid_height() >= 1 && options.grid_width() >= 1,
              "relative_2d: window must be positive, got ", options.grid_height(), "x",
              options.grid_width());
  const int64_t rows = (2 * options.grid_height() - 1) * (2 * options.grid_width() - 1);
  weight =
      register_parameter("weight", torch::randn({rows, options.num_heads()}) * options.init_std());
}

at::Tensor Relative2dImpl::relative_index(const Positions& q_positions,
                                          const Positions& k_positions) const {
  q_positions.check_num_axes("relative_2d", 2);
  k_positions.check_num_axes("relative_2d", 2);
  TORCH_CHECK(!q_positions.batched() && !k_positions.batched(),
              "relative_2d: batched positions are not supported");
  auto q = q_positions.coords().round().to(torch::kLong);  // [Nq, 2]
  auto k = k_positions.coords().round().to(torch::kLong);
  auto dh = q.select(1, 0).unsqueeze(1) - k.select(1, 0).unsqueeze(0);  // query - key
  auto dw = q.select(1, 1).unsqueeze(1) - k.select(1, 1).unsqueeze(0);
  const int64_t gh = options.grid_height(), gw = options.grid_width();
  if (dh.numel() > 0) {
    const auto h_reach = dh.abs().max().item<int64_t>(), w_reach = dw.abs().max().item<int64_t>();
    TORCH_CHECK(h_reach < gh && w_reach < gw, "relative_2d: offsets reach (", h_reach, ", ",
                w_reach, ") but the table covers a ", gh, "x", gw,
                " window (offsets < window); resize() the table first");
  }
  return (dh + gh - 1) * (2 * gw - 1) + (dw + gw - 1);
}

void Relative2dImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  plan.add_bias(type(), bias_at(request.queries, request.key_positions()));
}

Restore Relative2dImpl::adapt(const Extent& extent) {
  TORCH_CHECK(extent.size() == 2, "relative_2d: adapt takes two extents (rows, columns), got ",
              extent.size());
  // the table must cover offsets up to extent - 1; a larger one is kept as it is
  if (extent[0] <= options.grid_height() && extent[1] <= options.grid_width()) return [] {};
  auto restore = restore_weight_and_options(*this);
  resize(std::max(extent[0], options.grid_height()), std::max(extent[1], options.grid_width()));
  return restore;
}

at::Tensor Relative2dImpl::bias_at(const Positions& q_positions, const Positions& k_positions,
                                   const at::Tensor&) const {
  auto index = relative_index(q_positions, k_positions).to(weight.device());
  return torch::embedding(weight, index).permute({2, 0, 1});  // [H, Nq, Nk]
}

Description Relative2dImpl::describe(const Positions& positions, const DescribeOptions&) {
  torch::NoGradGuard no_grad;
  return {{"relative_index", relative_index(positions, positions)},
          {"bias", bias_at(positions, positions)}};
}

void Relative2dImpl::resize(int64_t grid_height, int64_t grid_width) {
  TORCH_CHECK(grid_height >= 1 && grid_width >= 1, "relative_2d: window must be positive, got ",
              grid_height, "x", grid_width);
  torch::NoGradGuard no_grad;
  namespace F = torch::nn::functional;
  const int64_t heads = options.num_heads();
  auto plane = weight.detach().t().reshape(
      {1, heads, 2 * options.grid_height() - 1, 2 * options.grid_width() - 1});
  auto resized =
      F::interpolate(plane, F::InterpolateFuncOptions()
                                .size(std::vector<int64_t>{2 * grid_height - 1, 2 * grid_width - 1})
                                .mode(torch::kBicubic)
                                .align_corners(false));
  options.grid_height(grid_height);
  options.grid_width(grid_width);
  weight.set_data(resized.reshape({heads, -1}).t().contiguous());
}

}  // namespace posenc
