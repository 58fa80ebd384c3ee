// Factorized space-time learned encoding for video (TimeSformer, Bertasius et al. 2021; ViViT's
// factorised embeddings, Arnab et al. 2021): x + S[h * G_w + w] + T[t], with a spatial table S
// [G_h * G_w, D] shared by all frames and a temporal table T [frames, D]. Positions have axes
// (t, h, w), integers inside the tables; anything outside is an error naming the table's extent.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"

namespace posenc {

struct LearnedSpacetimeOptions {
  LearnedSpacetimeOptions(int64_t frames = 8, int64_t grid_height = 14, int64_t grid_width = 14,
                          int64_t dim = 64)
      : frames_(frames), grid_height_(grid_height), grid_width_(grid_width), dim_(dim) {}
  /// Temporal table length (default 8).
  TORCH_ARG(int64_t, frames);
  /// Patch rows G_h (default 14).
  TORCH_ARG(int64_t, grid_height);
  /// Patch columns G_w (default 14).
  TORCH_ARG(int64_t, grid_width);
  /// Embedding width D. From the model.
  TORCH_ARG(int64_t, dim);
  /// Initial standard deviation of both tables (default 0.02).
  TORCH_ARG(double, init_std) = 0.02;
};

class LearnedSpacetimeImpl : public PositionalEncodingImpl {
 public:
  explicit LearnedSpacetimeImpl(LearnedSpacetimeOptions options = LearnedSpacetimeOptions());
  void reset();
  std::string type() const override { return "learned_spacetime"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// [N, D]: S[h * G_w + w] + T[t]
  at::Tensor lookup(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  LearnedSpacetimeOptions options;
  torch::Tensor spatial;   ///< [G_h * G_w, D]
  torch::Tensor temporal;  ///< [frames, D]
};
TORCH_MODULE(LearnedSpacetime);

}  // namespace posenc
