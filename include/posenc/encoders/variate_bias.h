// Binary variate bias (Moirai, Woo et al. 2024, "Unified Training of Universal Time Series
// Forecasting Transformers"; uni2ts moirai2/module.py's BinaryAttentionBias): a multivariate
// series enters as tokens (patch, variate), and attention learns one logit offset per head for
// "same variate" and one for "other variate", so the variates stay exchangeable (no order among
// them) while a head may keep to its own series or look across:
//
//   b_h(m, n) = table[1, h]  if variate(m) == variate(n)      table: [2, H], learned
//             = table[0, h]  otherwise                          (row 0 = different, row 1 = same)
//
// It reads the positions' axis named `axis` (default "variate": integer ids, stored as the
// positions' floats); the other axes (e.g. "time") are for the other parts of a compose, e.g.
//   {"type": "compose", "encoders": [{"type": "rope", "axes": ["time"]}, {"type": "variate_bias"}]}
// A bias part reads every axis (compose's rule), so this one picks its axis itself.
// In the plan as ids + table (EncodingPlan::set_variate_bias), which the fused attention reads in
// O(N) and the reference materializes as [(B,) H, N, N]; with keys apart from the queries (a
// key-value cache) as a materialized part. Gradients reach the table through autograd.
// Bad ids (not integers, negative, >= num_variates when it is set) are one line naming the tensor
// and the first bad index.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"
#include "posenc/core/ids.h"

namespace posenc {

struct VariateBiasOptions {
  explicit VariateBiasOptions(int64_t num_heads = 8) : num_heads_(num_heads) {}
  /// Attention heads H. From the model.
  TORCH_ARG(int64_t, num_heads);
  /// The positions' axis holding the variate ids (default "variate").
  TORCH_ARG(std::string, axis) = "variate";
  /// Ids must be < num_variates (default 0: any non-negative integer).
  TORCH_ARG(int64_t, num_variates) = 0;
  /// Standard deviation of the table's initial values (default 0: the bias starts at zero, the
  /// logits as without it).
  TORCH_ARG(double, init_std) = 0.0;
};

class VariateBiasImpl : public PositionalEncodingImpl {
 public:
  explicit VariateBiasImpl(VariateBiasOptions options = VariateBiasOptions());
  void reset();
  std::string type() const override { return "variate_bias"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// The bias at these positions, materialized: [H, Nq, Nk] or [B, H, Nq, Nk].
  at::Tensor bias_at(const Positions& q_positions, const Positions& k_positions) const;
  /// The variate ids of these positions as int64 [N] or [B, N], checked (one line on bad ids).
  at::Tensor variate_ids(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  VariateBiasOptions options;
  torch::Tensor table;  ///< [2, H]: row 0 other variate, row 1 same variate
};
TORCH_MODULE(VariateBias);

}  // namespace posenc
