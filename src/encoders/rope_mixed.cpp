// RoPE-Mixed: learned mixed-axis frequencies per head; see posenc/encoders/rope_mixed.h.
#include "posenc/encoders/rope_mixed.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

at::Tensor rope_apply_per_head(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               RopeLayout layout) {
  TORCH_CHECK(x.dim() == 4, "rope_mixed: x must be [B, N, H, Dh], got ", x.sizes());
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == x.size(1) && cos.size(1) == x.size(2),
              "rope_mixed: per-head tables must be [N, H, F] = [", x.size(1), ", ", x.size(2),
              ", F], got ", cos.sizes());
  const int64_t f = cos.size(2);
  TORCH_CHECK(2 * f <= x.size(3), "rope_mixed: rotary width 2F=", 2 * f,
              " exceeds head_dim=", x.size(3));
  return rope_rotate_pairs(x, cos.unsqueeze(0), sin.unsqueeze(0), layout);  // [1, N, H, F]
}

RopeMixedImpl::RopeMixedImpl(RopeMixedOptions options_) : options(std::move(options_)) { reset(); }

void RopeMixedImpl::reset() {
  TORCH_CHECK(options.head_dim() > 0 && options.head_dim() % 4 == 0,
              "rope_mixed: head_dim must be a positive multiple of 4, got ", options.head_dim());
  TORCH_CHECK(options.num_heads() >= 1, "rope_mixed: num_heads must be >= 1, got ",
              options.num_heads());
  TORCH_CHECK(options.theta() > 0, "rope_mixed: theta must be positive, got ", options.theta());
  const int64_t dh = options.head_dim(), heads = options.num_heads();
  auto magnitude = torch::pow(options.theta(), -torch::arange(0, dh, 4, torch::kFloat64) /
                                                   static_cast<double>(dh));  // [Dh/4]
  auto phi = torch::rand({heads, 1}, torch::kFloat64) * 2 * M_PI;
  auto fx = torch::cat({magnitude * torch::cos(phi), magnitude * torch::cos(phi + M_PI / 2)}, -1);
  auto fy = torch::cat({magnitude * torch::sin(phi), magnitude * torch::sin(phi + M_PI / 2)}, -1);
  freqs = register_parameter("freqs", torch::stack({fx, fy}).to(torch::kFloat32));
}

std::pair<at::Tensor, at::Tensor> RopeMixedImpl::cos_sin(const Positions& positions) const {
  positions.check_num_axes("rope_mixed", 2);
  TORCH_CHECK(!positions.batched(), "rope_mixed: batched positions are not supported");
  // the positions may be on the host; the learned frequencies are where the model is
  auto h = positions.axis(0).to(freqs.device(), freqs.scalar_type()).view({-1, 1, 1});
  auto w = positions.axis(1).to(freqs.device(), freqs.scalar_type()).view({-1, 1, 1});
  auto angles = w * freqs[0] + h * freqs[1];  // [N, H, F]
  return {angles.cos(), angles.sin()};
}

void RopeMixedImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& qp = request.queries;
  const auto& kp = request.rotated_key_positions();
  RotaryTables tables;
  std::tie(tables.q_cos, tables.q_sin) = cos_sin(qp);  // [N, H, F], learned: gradients flow
  if (!qp.coords().is_same(kp.coords())) std::tie(tables.k_cos, tables.k_sin) = cos_sin(kp);
  tables.layout = options.layout();
  tables.per_head = true;
  tables.fused = false;
  tables.head_dim = options.head_dim();
  plan.set_rotary(type(), std::move(tables));
}

Description RopeMixedImpl::describe(const Positions& positions, const DescribeOptions&) {
  auto [cos, sin] = cos_sin(positions);
  return {{"freqs", freqs.detach()}, {"cos", cos.detach()}, {"sin", sin.detach()}};
}

}  // namespace posenc
