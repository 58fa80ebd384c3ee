// Shaw relative position representations (key side); contract in posenc/encoders/shaw.h.
#include "posenc/encoders/shaw.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/functional/relative.h"

namespace posenc {

ShawImpl::ShawImpl(ShawOptions options_) : options(std::move(options_)) { reset(); }

void ShawImpl::reset() {
  TORCH_CHECK(options.head_dim() >= 1, "shaw: head_dim must be >= 1, got ", options.head_dim());
  TORCH_CHECK(options.max_relative_position() >= 1,
              "shaw: max_relative_position must be >= 1, got ", options.max_relative_position());
  weight = register_parameter(
      "weight", torch::randn({2 * options.max_relative_position() + 1, options.head_dim()}) *
                    options.init_std());
}

at::Tensor ShawImpl::relative_index(const Positions& q_positions,
                                    const Positions& k_positions) const {
  q_positions.check_num_axes("shaw", 1);
  k_positions.check_num_axes("shaw", 1);
  return shaw_relative_index(relative_positions(q_positions.axis(0), k_positions.axis(0)),
                             options.max_relative_position());
}

void ShawImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& qp = request.queries;
  const auto& kp = request.key_positions();
  qp.check_num_axes("shaw", 1);
  kp.check_num_axes("shaw", 1);
  if (!qp.batched() && !kp.batched()) {
    plan.add_bias_spec(type(), bias_spec());
  } else {
    plan.add_query_bias(type(), [this, qp, kp](const at::Tensor& q) { return bias_at(qp, kp, q); });
  }
}

at::Tensor ShawImpl::bias_at(const Positions& q_positions, const Positions& k_positions,
                             const at::Tensor& q) const {
  TORCH_CHECK(q.defined(), "shaw: the bias depends on the queries; q [B, Nq, H, Dh] is required");
  TORCH_CHECK(q.dim() == 4, "shaw: q must be [B, Nq, H, Dh], got shape ", q.sizes());
  TORCH_CHECK(q.size(3) == options.head_dim(), "shaw: q has head_dim ", q.size(3),
              " but the encoder was built for head_dim=", options.head_dim());
  TORCH_CHECK(q.size(1) == q_positions.size(), "shaw: q has Nq=", q.size(1), " but ",
              q_positions.size(), " query positions were given");
  // scores against every table row, then pick each pair's row: [B, H, Nq, 2K+1] -> [B, H, Nq, Nk]
  auto scores = torch::einsum("bqhd,rd->bhqr", {q, weight.to(q.scalar_type())}) /
                std::sqrt(static_cast<double>(options.head_dim()));
  auto index = relative_index(q_positions, k_positions).to(q.device());  // [.., Nq, Nk]
  if (index.dim() == 2) index = index.unsqueeze(0);
  index = index.unsqueeze(1).expand({q.size(0), q.size(2), index.size(-2), index.size(-1)});
  return scores.gather(-1, index);
}

BiasSpec ShawImpl::bias_spec() const {
  BiasSpec spec;
  spec.form = BiasForm::kRelativeTable;
  spec.table = weight;
  spec.max_relative_position = options.max_relative_position();
  return spec;
}

Description ShawImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"relative_index", relative_index(positions, positions)}, {"table", weight.detach()}};
}

}  // namespace posenc
