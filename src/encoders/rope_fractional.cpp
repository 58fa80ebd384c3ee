// Fractional RoPE module (LTX-2); see posenc/encoders/rope_fractional.h.
#include "posenc/encoders/rope_fractional.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

RopeFractionalImpl::RopeFractionalImpl(RopeFractionalOptions options_)
    : options(std::move(options_)) {
  reset();
}

void RopeFractionalImpl::reset() {
  const auto& o = options;
  TORCH_CHECK(o.head_dim() >= 2 && o.head_dim() % 2 == 0,
              "rope_fractional: head_dim must be even and >= 2, got ", o.head_dim());
  TORCH_CHECK(o.num_heads() >= 1, "rope_fractional: num_heads must be >= 1, got ", o.num_heads());
  const auto axes = static_cast<int64_t>(o.max_positions().size());
  TORCH_CHECK(axes >= 1, "rope_fractional: max_positions must name at least one axis, got none");
  for (size_t a = 0; a < o.max_positions().size(); ++a)
    TORCH_CHECK(o.max_positions()[a] > 0 && std::isfinite(o.max_positions()[a]),
                "rope_fractional: max_positions[", a, "] must be positive and finite, got ",
                o.max_positions()[a]);
  const int64_t dim = o.num_heads() * o.head_dim();
  TORCH_CHECK(dim >= 2 * axes, "rope_fractional: num_heads * head_dim = ", dim,
              " leaves no frequency for ", axes, " axes (it needs at least 2 * axes = ", 2 * axes,
              ")");
  frequencies = rope_fractional_frequencies(o.theta(), dim / (2 * axes), o.double_precision());
}

std::pair<at::Tensor, at::Tensor> RopeFractionalImpl::cos_sin(const Positions& positions) const {
  positions.check_num_axes("rope_fractional", static_cast<int64_t>(options.max_positions().size()));
  return rope_fractional_cos_sin(positions.coords(), options.max_positions(), frequencies,
                                 options.num_heads(), options.head_dim());
}

void RopeFractionalImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& qp = request.queries;
  const auto& kp = request.rotated_key_positions();
  TORCH_CHECK(!qp.batched() && !kp.batched(),
              "rope_fractional: batched positions are not supported (per-head tables are [N, H, "
              "F], shared by the batch); got ",
              qp.describe());
  RotaryTables tables;
  std::tie(tables.q_cos, tables.q_sin) = cos_sin(qp);  // [N, H, Dh/2]
  tables.q_cos = tables.q_cos.to(request.device);
  tables.q_sin = tables.q_sin.to(request.device);
  if (!qp.coords().is_same(kp.coords())) {
    std::tie(tables.k_cos, tables.k_sin) = cos_sin(kp);
    tables.k_cos = tables.k_cos.to(request.device);
    tables.k_sin = tables.k_sin.to(request.device);
  }
  tables.layout = options.layout();
  tables.per_head = true;
  tables.fused = false;
  tables.head_dim = options.head_dim();
  plan.set_rotary(type(), std::move(tables));
}

Description RopeFractionalImpl::describe(const Positions& positions, const DescribeOptions&) {
  auto [cos, sin] = cos_sin(positions);
  return {{"frequencies", frequencies}, {"cos", cos}, {"sin", sin}};
}

}  // namespace posenc
