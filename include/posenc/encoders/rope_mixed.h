// RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer"): 2D rotary
// position embedding whose frequencies are learned per head and mix both axes:
//   angle_{h,i}(p) = f^x_{h,i} p_w + f^y_{h,i} p_h        (p = (h, w) patch coordinates)
// Initialised as the reference init_2d_freqs: magnitudes m_i = theta^(-4i/Dh), i < Dh/4, and per
// head a random direction phi_h:
//   f^x = [m cos(phi), m cos(phi + pi/2)],  f^y = [m sin(phi), m sin(phi + pi/2)]   (Dh/2 each)
// with theta = 10. Pairs are interleaved (2i, 2i+1), as the reference's complex multiplication.
// The frequencies are parameters, so this takes the reference rotation (autograd through the
// angles), not the fused kernel.
#pragma once

#include <torch/arg.h>

#include "posenc/core/encoder.h"
#include "posenc/functional/rope.h"

namespace posenc {

struct RopeMixedOptions {
  RopeMixedOptions(int64_t head_dim = 64, int64_t num_heads = 8)
      : head_dim_(head_dim), num_heads_(num_heads) {}
  /// Per-head dimension Dh (a multiple of 4). From the model.
  TORCH_ARG(int64_t, head_dim);
  /// Heads H. From the model.
  TORCH_ARG(int64_t, num_heads);
  /// Magnitude base theta (default 10, as the paper's ViT setting).
  TORCH_ARG(double, theta) = 10.0;
  /// Pair layout (default kInterleaved, as the reference).
  TORCH_ARG(RopeLayout, layout) = RopeLayout::kInterleaved;
};

class RopeMixedImpl : public PositionalEncodingImpl {
 public:
  explicit RopeMixedImpl(RopeMixedOptions options = RopeMixedOptions());
  void reset();
  std::string type() const override { return "rope_mixed"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// Per-head (cos, sin): [N, H, Dh/2] from positions with axes (h, w).
  std::pair<at::Tensor, at::Tensor> cos_sin(const Positions& positions) const;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  RopeMixedOptions options;
  torch::Tensor freqs;  ///< [2, H, Dh/2]: row 0 multiplies w (x), row 1 multiplies h (y)
};
TORCH_MODULE(RopeMixed);

/// rope_apply with one table per head: x [B, N, H, Dh], cos/sin [N, H, F] (reference, autograd).
at::Tensor rope_apply_per_head(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                               RopeLayout layout);

}  // namespace posenc
