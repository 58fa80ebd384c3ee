// ALiBi bias module; slopes in src/functional/relative.cpp.
#include "posenc/encoders/alibi.h"

#include <torch/torch.h>

#include "posenc/functional/relative.h"

namespace posenc {

std::string to_string(AlibiForm form) {
  return form == AlibiForm::kCausal ? "causal" : "symmetric";
}

AlibiForm alibi_form_from_string(const std::string& name) {
  if (name == "causal") return AlibiForm::kCausal;
  if (name == "symmetric") return AlibiForm::kSymmetric;
  TORCH_CHECK(false, "alibi: unknown form '", name, "'; expected one of: causal, symmetric");
}

AlibiImpl::AlibiImpl(AlibiOptions options_) : options(std::move(options_)) { reset(); }

void AlibiImpl::reset() {
  TORCH_CHECK(options.num_heads() >= 1, "alibi: num_heads must be >= 1, got ", options.num_heads());
  TORCH_CHECK(std::isfinite(options.slope_scale()) && options.slope_scale() > 0,
              "alibi: slope_scale must be positive, got ", options.slope_scale());
  auto values = torch::tensor(alibi_slopes(options.num_heads()), torch::kFloat64);
  slopes = register_buffer("slopes", (values * options.slope_scale()).to(torch::kFloat32));
}

void AlibiImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& q = request.queries;
  const auto& k = request.key_positions();
  q.check_num_axes("alibi", 1);
  k.check_num_axes("alibi", 1);
  // -slope * distance must stay a float32 number: a larger span would bias by +-inf (NaN after
  // the softmax), so it is an error rather than silent garbage.
  if (q.size() > 0 && k.size() > 0) {
    const double span = std::max(q.coords().max().item<double>(), k.coords().max().item<double>()) -
                        std::min(q.coords().min().item<double>(), k.coords().min().item<double>());
    const double slope = slopes.abs().max().item<double>();
    TORCH_CHECK(span * slope <= 1e30, "alibi: positions span ", span, " times the largest slope ",
                slope, " is ", span * slope,
                ", beyond the float32 logits' range (1e30); scale the positions or slope_scale");
  }
  if (!q.batched() && !k.batched()) {
    plan.add_bias_spec(type(), bias_spec());
  } else {
    plan.add_bias(type(), bias_at(q, k).to(request.device));
  }
}

at::Tensor AlibiImpl::bias_at(const Positions& q_positions, const Positions& k_positions,
                              const at::Tensor&) const {
  q_positions.check_num_axes("alibi", 1);
  k_positions.check_num_axes("alibi", 1);
  // distance p_m - p_n = -(p_n - p_m): [.., Nq, Nk] in float64, then one slope per head
  auto distance = -relative_positions(q_positions.axis(0), k_positions.axis(0));
  if (options.form() == AlibiForm::kSymmetric) distance = distance.abs();
  auto m = slopes.to(torch::kFloat64).view({-1, 1, 1});  // [H, 1, 1]
  return (-m * distance.to(slopes.device()).unsqueeze(-3)).to(torch::kFloat32);
}

BiasSpec AlibiImpl::bias_spec() const {
  BiasSpec spec;
  spec.form = BiasForm::kAlibi;
  spec.slopes = slopes;
  spec.symmetric = options.form() == AlibiForm::kSymmetric;
  return spec;
}

Description AlibiImpl::describe(const Positions& positions, const DescribeOptions&) {
  return {{"slopes", slopes}, {"bias", bias_at(positions, positions)}};
}

}  // namespace posenc
