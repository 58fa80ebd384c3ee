// Binary variate bias (Moirai's BinaryAttentionBias); see posenc/encoders/variate_bias.h.
#include "posenc/encoders/variate_bias.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

VariateBiasImpl::VariateBiasImpl(VariateBiasOptions options_) : options(std::move(options_)) {
  reset();
}

void VariateBiasImpl::reset() {
  TORCH_CHECK(options.num_heads() >= 1, "variate_bias: num_heads must be >= 1, got ",
              options.num_heads());
  TORCH_CHECK(options.num_variates() >= 0, "variate_bias: num_variates must be >= 0, got ",
              options.num_variates());
  TORCH_CHECK(std::isfinite(options.init_std()) && options.init_std() >= 0,
              "variate_bias: init_std must be >= 0, got ", options.init_std());
  TORCH_CHECK(!options.axis().empty(), "variate_bias: axis must name a positions axis");
  table = register_parameter("table", torch::randn({2, options.num_heads()}) * options.init_std());
}

at::Tensor VariateBiasImpl::variate_ids(const Positions& positions) const {
  const int64_t axis = positions.axis_index(options.axis());
  return checked_ids(positions.axis(axis), "variate_bias: positions axis '" + options.axis() + "'",
                     options.num_variates());
}

at::Tensor VariateBiasImpl::bias_at(const Positions& q_positions,
                                    const Positions& k_positions) const {
  auto vq = variate_ids(q_positions).to(table.device());  // [.., Nq]
  auto vk = variate_ids(k_positions).to(table.device());  // [.., Nk]
  auto same = vq.unsqueeze(-1) == vk.unsqueeze(-2);       // [.., Nq, Nk]
  const int64_t h = options.num_heads();
  auto view = [&](const at::Tensor& row) {  // [H] -> [(1,) H, 1, 1] to broadcast over [.., Nq, Nk]
    return same.dim() == 3 ? row.view({1, h, 1, 1}) : row.view({h, 1, 1});
  };
  return torch::where(same.unsqueeze(-3), view(table[1]), view(table[0]));
}

void VariateBiasImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  if (!request.keys.defined() && !request.rotated_keys.defined()) {
    // self-attention: the ids and the table, so a fused kernel reads O(N) ids, never [N, N]
    plan.set_variate_bias(type(), variate_ids(request.queries), table);
  } else {  // keys apart from the queries (a cache): materialized [(B,) H, Nq, Nk]
    plan.add_bias(type(), bias_at(request.queries, request.key_positions()).to(request.device));
  }
}

Description VariateBiasImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"table", table}, {"bias", bias_at(positions, positions)}};
}

}  // namespace posenc
