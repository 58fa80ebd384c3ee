// Learned absolute encoding (BERT, GPT-2, ViT): x_n + W[p_n], W a trainable [max_positions, D]
// table, initialised N(0, init_std^2). Positions must be integers in [0, max_positions): past the
// end is an error, not a silent clamp. resize() resamples the table to a new length along the
// position axis (torch interpolate, align_corners=False): linear, or cubic (bicubic kernel,
// a = -0.75, as torch and timm use for ViT tables).
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

enum class Interpolation { kLinear, kCubic };
std::string to_string(Interpolation mode);
Interpolation interpolation_from_string(const std::string& name);

struct LearnedOptions {
  LearnedOptions(int64_t max_positions = 512, int64_t dim = 64)
      : max_positions_(max_positions), dim_(dim) {}
  /// Table length: valid positions are 0 .. max_positions-1 (default 512).
  TORCH_ARG(int64_t, max_positions);
  /// Embedding width D. From the model.
  TORCH_ARG(int64_t, dim);
  /// Standard deviation of the initial table (default 0.02, as BERT/ViT).
  TORCH_ARG(double, init_std) = 0.02;
};

class LearnedImpl : public PositionalEncodingImpl {
 public:
  explicit LearnedImpl(LearnedOptions options = LearnedOptions());
  void reset();
  std::string type() const override { return "learned"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  Restore adapt(const Extent& extent) override;
  /// positions (1 axis, integers in range) -> [N, D] or [B, N, D].
  at::Tensor lookup(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;
  /// Resamples the table to `new_length` positions (the parameter is replaced, values kept
  /// as a function of relative position); max_positions becomes new_length.
  void resize(int64_t new_length, Interpolation mode = Interpolation::kLinear);

  LearnedOptions options;
  torch::Tensor weight;  ///< [max_positions, D]
};
TORCH_MODULE(Learned);

/// The resampling used by resize(): table [L, D] -> [new_length, D].
at::Tensor resample_table_1d(const at::Tensor& table, int64_t new_length, Interpolation mode);

}  // namespace posenc
