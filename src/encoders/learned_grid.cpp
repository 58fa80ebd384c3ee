// Learned 2D table with prefix tokens and timm-style resampling; see
// posenc/encoders/learned_grid.h.
#include "posenc/encoders/learned_grid.h"

#include <torch/torch.h>

namespace posenc {

at::Tensor resample_grid_table(const at::Tensor& table, int64_t old_h, int64_t old_w, int64_t new_h,
                               int64_t new_w, int64_t prefix, const GridResample& o) {
  TORCH_CHECK(table.dim() == 2, "learned_grid: table must be [prefix + H*W, D], got ",
              table.sizes());
  TORCH_CHECK(table.size(0) == prefix + old_h * old_w, "learned_grid: table has ", table.size(0),
              " rows but prefix ", prefix, " + grid ", old_h, "x", old_w, " needs ",
              prefix + old_h * old_w);
  TORCH_CHECK(new_h > 0 && new_w > 0, "learned_grid: new grid must be positive, got ", new_h, "x",
              new_w);
  TORCH_CHECK(o.mode() == "bicubic" || o.mode() == "bilinear" || o.mode() == "ast",
              "learned_grid: unknown resample mode '", o.mode(),
              "'; expected bicubic, bilinear or ast");
  if (old_h == new_h && old_w == new_w) return table.clone();
  namespace F = torch::nn::functional;
  const int64_t dim = table.size(1);
  // [1, D, H, W] as timm lays it out: a channels-last view of the rows [1, H, W, D] (strides
  // H W D, 1, W D, D), so F.interpolate takes timm's kernel: torch 2.15's antialiased kernel for a
  // contiguous [1, D, H, W] gives every row of a one-column result the first row's value
  auto grid = table.narrow(0, prefix, old_h * old_w)
                  .contiguous()
                  .reshape({1, old_h, old_w, dim})
                  .permute({0, 3, 1, 2});
  auto interpolate = [&](const at::Tensor& x, int64_t h, int64_t w, bool bicubic, bool antialias) {
    auto options = F::InterpolateFuncOptions()
                       .size(std::vector<int64_t>{h, w})
                       .align_corners(o.align_corners())
                       .antialias(antialias);
    options.mode(bicubic ? F::InterpolateFuncOptions::mode_t(torch::kBicubic)
                         : F::InterpolateFuncOptions::mode_t(torch::kBilinear));
    return F::interpolate(x, options);
  };
  at::Tensor resized;  // [1, D, new_h, new_w]
  if (o.mode() == "ast") {
    // AST: columns first (a bilinear resize that keeps the row count leaves rows as they are)
    resized = new_w <= old_w ? grid.narrow(3, old_w / 2 - new_w / 2, new_w)
                             : interpolate(grid, old_h, new_w, false, false);
    resized = new_h <= old_h ? resized.narrow(2, old_h / 2 - new_h / 2, new_h)
                             : interpolate(resized, new_h, new_w, false, false);
  } else {
    resized = interpolate(grid, new_h, new_w, o.mode() == "bicubic", o.antialias());
  }
  resized = resized.reshape({dim, new_h * new_w}).t();
  return torch::cat({table.narrow(0, 0, prefix), resized}, 0).contiguous();
}

LearnedGridImpl::LearnedGridImpl(LearnedGridOptions options_) : options(std::move(options_)) {
  reset();
}

void LearnedGridImpl::reset() {
  TORCH_CHECK(options.grid_height() > 0 && options.grid_width() > 0,
              "learned_grid: grid must be positive, got ", options.grid_height(), "x",
              options.grid_width());
  TORCH_CHECK(options.dim() > 0, "learned_grid: dim must be positive, got ", options.dim());
  TORCH_CHECK(options.num_prefix_tokens() >= 0,
              "learned_grid: num_prefix_tokens must be >= 0, got ", options.num_prefix_tokens());
  const int64_t rows = options.num_prefix_tokens() + options.grid_height() * options.grid_width();
  weight = register_parameter("weight", torch::randn({rows, options.dim()}) * options.init_std());
}

at::Tensor LearnedGridImpl::lookup(const Positions& positions) const {
  positions.check_num_axes("learned_grid", 2);
  auto h = positions.axis(0), w = positions.axis(1);
  if (positions.size() > 0) {
    const bool integers = at::equal(h, h.round()) && at::equal(w, w.round());
    TORCH_CHECK(integers, "learned_grid: positions must be integer patch indices");
    const auto hmax = h.max().item<int64_t>(), wmax = w.max().item<int64_t>();
    TORCH_CHECK(h.min().item<double>() >= 0 && w.min().item<double>() >= 0 &&
                    hmax < options.grid_height() && wmax < options.grid_width(),
                "learned_grid: positions reach row ", hmax, ", column ", wmax,
                " but the table is a ", options.grid_height(), "x", options.grid_width(),
                " grid; resize() the table to the new grid first");
  }
  auto index = (h * options.grid_width() + w).to(weight.device(), torch::kLong) +
               options.num_prefix_tokens();
  auto sizes = index.sizes().vec();
  sizes.push_back(options.dim());
  return weight.index_select(0, index.flatten()).view(sizes);
}

void LearnedGridImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const int64_t prefix = options.num_prefix_tokens();
  auto patches = lookup(request.queries);  // [N, D] or [B, N, D]
  plan.add_embedding(type(), patches, prefix > 0 ? weight.narrow(0, 0, prefix) : at::Tensor());
}

Restore LearnedGridImpl::adapt(const Extent& extent) {
  TORCH_CHECK(extent.size() == 2, "learned_grid: adapt takes two extents (rows, columns), got ",
              extent.size());
  if (extent[0] == options.grid_height() && extent[1] == options.grid_width()) return [] {};
  auto restore = restore_weight_and_options(*this);
  resize(extent[0], extent[1], options.resample());
  return restore;
}

Description LearnedGridImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"table", lookup(positions).detach()}};
}

void LearnedGridImpl::resize(int64_t grid_height, int64_t grid_width,
                             const GridResample& resample) {
  torch::NoGradGuard no_grad;
  auto resampled =
      resample_grid_table(weight.detach(), options.grid_height(), options.grid_width(), grid_height,
                          grid_width, options.num_prefix_tokens(), resample);
  options.grid_height(grid_height);
  options.grid_width(grid_width);
  weight.set_data(resampled);
}

}  // namespace posenc
