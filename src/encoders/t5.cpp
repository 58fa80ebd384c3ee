// T5 bucketed relative bias module; buckets in src/functional/relative.cpp.
#include "posenc/encoders/t5.h"

#include <torch/torch.h>

#include "posenc/functional/relative.h"

namespace posenc {

T5Impl::T5Impl(T5Options options_) : options(std::move(options_)) { reset(); }

void T5Impl::reset() {
  TORCH_CHECK(options.num_heads() >= 1, "t5: num_heads must be >= 1, got ", options.num_heads());
  TORCH_CHECK(options.num_buckets() >= 2, "t5: num_buckets must be >= 2, got ",
              options.num_buckets());
  const int64_t exact =
      (options.bidirectional() ? options.num_buckets() / 2 : options.num_buckets()) / 2;
  TORCH_CHECK(exact >= 1 && options.max_distance() > exact, "t5: max_distance must exceed ", exact,
              " (the exact range for num_buckets=", options.num_buckets(), "), got ",
              options.max_distance());
  weight = register_parameter(
      "weight", torch::randn({options.num_buckets(), options.num_heads()}) * options.init_std());
}

at::Tensor T5Impl::buckets(const Positions& q_positions, const Positions& k_positions) const {
  q_positions.check_num_axes("t5", 1);
  k_positions.check_num_axes("t5", 1);
  auto rel = relative_positions(q_positions.axis(0), k_positions.axis(0));
  return t5_relative_position_bucket(rel, options.bidirectional(), options.num_buckets(),
                                     options.max_distance());
}

void T5Impl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& q = request.queries;
  const auto& k = request.key_positions();
  q.check_num_axes("t5", 1);
  k.check_num_axes("t5", 1);
  if (!q.batched() && !k.batched()) {
    plan.add_bias_spec(type(), bias_spec());
  } else {
    plan.add_bias(type(), bias_at(q, k));
  }
}

at::Tensor T5Impl::bias_at(const Positions& q_positions, const Positions& k_positions,
                           const at::Tensor&) const {
  auto b = buckets(q_positions, k_positions).to(weight.device());  // [.., Nq, Nk]
  auto values = torch::embedding(weight, b);                       // [.., Nq, Nk, H]
  return values.movedim(-1, -3);                                   // [.., H, Nq, Nk]
}

BiasSpec T5Impl::bias_spec() const {
  BiasSpec spec;
  spec.form = BiasForm::kBucketTable;
  spec.table = weight;
  spec.num_buckets = options.num_buckets();
  spec.max_distance = options.max_distance();
  spec.bidirectional = options.bidirectional();
  return spec;
}

Description T5Impl::describe(const Positions& positions, const DescribeOptions&) {
  torch::NoGradGuard no_grad;
  return {{"buckets", buckets(positions, positions)}, {"bias", bias_at(positions, positions)}};
}

}  // namespace posenc
