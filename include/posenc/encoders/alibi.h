// ALiBi (Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases"):
//   causal:    b_h(m, n) = -m_h (p_m - p_n)      (keys after the query are masked anyway)
//   symmetric: b_h(m, n) = -m_h |p_m - p_n|      (encoders, bidirectional attention)
// Slopes m_h from Press' get_slopes for any head count (posenc/functional/relative.h), times
// slope_scale. Positions may be real (timestamps): the bias is linear in the time gap.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

enum class AlibiForm { kCausal, kSymmetric };
std::string to_string(AlibiForm form);
AlibiForm alibi_form_from_string(const std::string& name);

struct AlibiOptions {
  explicit AlibiOptions(int64_t num_heads = 8) : num_heads_(num_heads) {}
  /// Attention heads H. From the model.
  TORCH_ARG(int64_t, num_heads);
  /// kCausal (default) or kSymmetric.
  TORCH_ARG(AlibiForm, form) = AlibiForm::kCausal;
  /// Multiplies every slope (default 1; e.g. 1/seconds to bias by real-time gaps).
  TORCH_ARG(double, slope_scale) = 1.0;
};

class AlibiImpl : public PositionalEncodingImpl {
 public:
  explicit AlibiImpl(AlibiOptions options = AlibiOptions());
  void reset();
  std::string type() const override { return "alibi"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// The bias at these positions, materialized.
  at::Tensor bias_at(const Positions& q_positions, const Positions& k_positions,
                     const at::Tensor& q = {}) const;
  BiasSpec bias_spec() const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  AlibiOptions options;
  torch::Tensor slopes;  ///< [H] float32 buffer
};
TORCH_MODULE(Alibi);

}  // namespace posenc
