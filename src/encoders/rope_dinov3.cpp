// DINOv3's RoPE on normalized patch centres, with its training-time coordinate augmentation;
// math and sources in posenc/encoders/rope_dinov3.h. Tables are built on the CPU in float32 (as
// timm builds its grid and draws its augmentation there), then moved to the activations' device.
#include "posenc/encoders/rope_dinov3.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

namespace {

void check_options(const RopeDinoV3Options& o) {
  TORCH_CHECK(
      o.head_dim() >= 4 && o.head_dim() % 4 == 0,
      "rope_dinov3: head_dim must be a positive multiple of 4 (Dh/4 periods per axis), got ",
      o.head_dim());
  TORCH_CHECK(o.min_period().has_value() == o.max_period().has_value(),
              "rope_dinov3: give both min_period and max_period, or neither");
  if (o.min_period().has_value()) {
    TORCH_CHECK(std::isfinite(*o.min_period()) && std::isfinite(*o.max_period()) &&
                    *o.min_period() > 0 && *o.max_period() > 0,
                "rope_dinov3: min_period and max_period must be finite and > 0, got ",
                *o.min_period(), " and ", *o.max_period());
  } else {
    TORCH_CHECK(std::isfinite(o.temperature()) && o.temperature() > 0,
                "rope_dinov3: temperature must be finite and > 0, got ", o.temperature());
  }
  if (o.shift_coords().has_value())
    TORCH_CHECK(std::isfinite(*o.shift_coords()) && *o.shift_coords() >= 0,
                "rope_dinov3: shift_coords must be finite and >= 0, got ", *o.shift_coords());
  if (o.jitter_coords().has_value())
    TORCH_CHECK(std::isfinite(*o.jitter_coords()) && *o.jitter_coords() >= 1,
                "rope_dinov3: jitter_coords must be finite and >= 1 (a factor), got ",
                *o.jitter_coords());
  if (o.rescale_coords().has_value())
    TORCH_CHECK(std::isfinite(*o.rescale_coords()) && *o.rescale_coords() >= 1,
                "rope_dinov3: rescale_coords must be finite and >= 1 (a factor), got ",
                *o.rescale_coords());
}

}  // namespace

at::Tensor rope_dinov3_periods(const RopeDinoV3Options& o) {
  check_options(o);
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
  const int64_t count = o.head_dim() / 4;
  if (o.min_period().has_value()) {  // timm: min_period * ((max_period / min_period) ** exponents)
    const auto exponents = torch::linspace(0, 1, count, f32);
    return *o.min_period() * torch::pow(*o.max_period() / *o.min_period(), exponents);
  }
  // timm: 2.0 * arange(dim, float32) / (self.dim // 2); temperature ** exponents
  const auto exponents = 2.0 * torch::arange(count, f32) / (o.head_dim() / 2);
  return torch::pow(o.temperature(), exponents);
}

at::Tensor rope_dinov3_augment(const at::Tensor& coords, const RopeDinoV3Options& o) {
  check_options(o);
  TORCH_CHECK(coords.dim() == 2, "rope_dinov3: coords must be [N, A], got ", coords.sizes());
  const int64_t axes = coords.size(1);
  const auto like = coords.options();
  auto c = coords;
  // timm's _apply_coord_augs: shift, jitter, rescale, each one draw on the grid's dtype/device
  if (o.shift_coords().has_value()) {
    const double s = *o.shift_coords();
    c = c + torch::empty({axes}, like).uniform_(-s, s).unsqueeze(0);
  }
  if (o.jitter_coords().has_value()) {
    const double j = std::log(*o.jitter_coords());
    c = c * torch::empty({axes}, like).uniform_(-j, j).exp().unsqueeze(0);
  }
  if (o.rescale_coords().has_value()) {
    const double r = std::log(*o.rescale_coords());
    c = c * torch::empty({1}, like).uniform_(-r, r).exp();
  }
  return c;
}

std::pair<at::Tensor, at::Tensor> rope_dinov3_cos_sin(const at::Tensor& coords,
                                                      const at::Tensor& periods) {
  TORCH_CHECK(coords.dim() == 2 && coords.size(1) == 2,
              "rope_dinov3: coords must be [N, 2] (row, column), got ", coords.sizes());
  TORCH_CHECK(periods.dim() == 1, "rope_dinov3: periods must be [Dh/4], got ", periods.sizes());
  // timm: coords[:, :, None].to(periods' dtype); 2 * math.pi * coords / periods[None, None, :]
  const auto c = coords.unsqueeze(-1).to(periods.scalar_type());             // [N, 2, 1]
  const auto angles = (2 * M_PI * c / periods.view({1, 1, -1})).flatten(1);  // [N, Dh/2]
  return {angles.cos(), angles.sin()};
}

RopeDinoV3Impl::RopeDinoV3Impl(RopeDinoV3Options options_) : options(std::move(options_)) {
  reset();
}

void RopeDinoV3Impl::reset() { periods = rope_dinov3_periods(options); }

bool RopeDinoV3Impl::augments() const {
  return options.shift_coords().has_value() || options.jitter_coords().has_value() ||
         options.rescale_coords().has_value();
}

at::Tensor RopeDinoV3Impl::coords(const Positions& positions) const {
  positions.check_num_axes("rope_dinov3", 2);
  TORCH_CHECK(!positions.batched(), "rope_dinov3: batched positions are not supported");
  TORCH_CHECK(positions.size() > 0, "rope_dinov3: no positions");
  const auto p = positions.coords().to(torch::kCPU, torch::kFloat64);  // [N, 2]
  const auto index = p.round();
  TORCH_CHECK(p.min().item<double>() >= 0 && at::equal(p, index),
              "rope_dinov3: positions must be patch-grid indices (integers >= 0), got ",
              positions.describe());
  const auto extent = std::get<0>(index.max(0)).add(1).to(torch::kLong);  // [2]: H, W
  const int64_t height = extent[0].item<int64_t>(), width = extent[1].item<int64_t>();
  // timm's _build_grid(grid_type "centered", indexing "ij"), flattened row-major: [H W, 2]
  PatchGridOptions grid;
  grid.coords(GridCoords::kCentered).normalize(options.normalize());
  auto table = patch_grid({height, width}, grid).view({-1, 2});
  // one transform for the whole grid, then the positions' rows (the ops are elementwise)
  if (is_training() && augments()) table = rope_dinov3_augment(table, options);
  const auto rows =
      index.select(1, 0).to(torch::kLong) * width + index.select(1, 1).to(torch::kLong);
  return table.index_select(0, rows);
}

std::pair<at::Tensor, at::Tensor> RopeDinoV3Impl::cos_sin(const Positions& positions) const {
  return rope_dinov3_cos_sin(coords(positions), periods);
}

void RopeDinoV3Impl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& qp = request.queries;
  const auto& kp = request.rotated_key_positions();
  RotaryTables tables;
  // one draw per forward: the keys at the queries' positions share the queries' tables
  std::tie(tables.q_cos, tables.q_sin) = cos_sin(qp);
  tables.q_cos = tables.q_cos.to(request.device);
  tables.q_sin = tables.q_sin.to(request.device);
  const bool same =
      qp.coords().is_same(kp.coords()) ||
      (qp.coords().sizes() == kp.coords().sizes() && at::equal(qp.coords(), kp.coords()));
  if (!same) {
    TORCH_CHECK(!(is_training() && augments()),
                "rope_dinov3: keys at other positions than the queries cannot share one "
                "augmentation draw; augmented training needs self-attention over one grid");
    std::tie(tables.k_cos, tables.k_sin) = cos_sin(kp);
    tables.k_cos = tables.k_cos.to(request.device);
    tables.k_sin = tables.k_sin.to(request.device);
  }
  tables.layout = options.layout();
  tables.head_dim = options.head_dim();
  plan.set_rotary(type(), std::move(tables));
}

Description RopeDinoV3Impl::describe(const Positions& positions, const DescribeOptions&) {
  auto c = coords(positions);
  auto [cos, sin] = rope_dinov3_cos_sin(c, periods);
  return {{"periods", periods},
          {"coords", c},
          {"cos", rope_expand(cos, options.layout())},
          {"sin", rope_expand(sin, options.layout())}};
}

}  // namespace posenc
