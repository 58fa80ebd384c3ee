// T5 relative attention bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning"):
//   b_h(m, n) = W[bucket(p_n - p_m), h], W a trainable [num_buckets, H] table (one scalar per
//   bucket and head), buckets as HF T5Attention._relative_position_bucket
//   (posenc/functional/relative.h). Initialised N(0, init_std^2).
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct T5Options {
  explicit T5Options(int64_t num_heads = 8) : num_heads_(num_heads) {}
  /// Attention heads H. From the model.
  TORCH_ARG(int64_t, num_heads);
  /// Buckets (default 32).
  TORCH_ARG(int64_t, num_buckets) = 32;
  /// Distance beyond which all positions share the last bucket (default 128).
  TORCH_ARG(int64_t, max_distance) = 128;
  /// Separate buckets for keys before and after the query (default true; false for decoders).
  TORCH_ARG(bool, bidirectional) = true;
  /// Initial table standard deviation (default 0.02: biases start near zero).
  TORCH_ARG(double, init_std) = 0.02;
};

class T5Impl : public PositionalEncodingImpl {
 public:
  explicit T5Impl(T5Options options = T5Options());
  void reset();
  std::string type() const override { return "t5"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// Buckets [.., Nq, Nk] (int64) for the pairs of positions.
  at::Tensor buckets(const Positions& q_positions, const Positions& k_positions) const;
  /// The bias at these positions, materialized.
  at::Tensor bias_at(const Positions& q_positions, const Positions& k_positions,
                     const at::Tensor& q = {}) const;
  BiasSpec bias_spec() const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  T5Options options;
  torch::Tensor weight;  ///< [num_buckets, H]
};
TORCH_MODULE(T5);

}  // namespace posenc
