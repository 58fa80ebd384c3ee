// Shaw et al. 2018, "Self-Attention with Relative Position Representations" (key side):
//   e_mn = q_m . (k_n + a_{clip(p_n - p_m, -K, K)}) / sqrt(Dh)
// so the bias is b_h(m, n) = q_{m,h} . a[clip(p_n - p_m, -K, K) + K] / sqrt(Dh), with a a
// trainable [2K+1, Dh] table shared by the heads (as in the paper). The bias depends on q:
// it is a query-dependent bias (BiasForm::kRelativeTable). The value-side term a^V of the paper
// is not included.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct ShawOptions {
  explicit ShawOptions(int64_t head_dim = 64) : head_dim_(head_dim) {}
  /// Per-head dimension Dh. From the model.
  TORCH_ARG(int64_t, head_dim);
  /// Clipping distance K (default 16).
  TORCH_ARG(int64_t, max_relative_position) = 16;
  /// Initial table standard deviation (default 0.02).
  TORCH_ARG(double, init_std) = 0.02;
};

class ShawImpl : public PositionalEncodingImpl {
 public:
  explicit ShawImpl(ShawOptions options = ShawOptions());
  void reset();
  std::string type() const override { return "shaw"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// Table index [.., Nq, Nk] (int64).
  at::Tensor relative_index(const Positions& q_positions, const Positions& k_positions) const;
  /// Needs q [B, Nq, H, Dh]; returns [B, H, Nq, Nk].
  /// The bias at these positions, materialized.
  at::Tensor bias_at(const Positions& q_positions, const Positions& k_positions,
                     const at::Tensor& q = {}) const;
  BiasSpec bias_spec() const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  ShawOptions options;
  torch::Tensor weight;  ///< [2K+1, Dh]
};
TORCH_MODULE(Shaw);

}  // namespace posenc
