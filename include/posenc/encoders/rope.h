// RoPE module: rotates q and k by angles p * inv_freq (math, layouts and scalings in
// posenc/functional/rope.h). No parameters. Dynamic NTK and LongRoPE choose their frequencies per
// call from the longest key position (seq_len = max p_k + 1), as HF's dynamic_rope_update does.
// With a section map the positions have one axis per section (M-RoPE t, h, w; axial 2D/3D RoPE);
// the frequency source (theta ladder, per-axis ladders, real-time periods) is independent of it.
#pragma once

#include "posenc/core/encoder.h"
#include "posenc/functional/rope.h"

namespace posenc {

class RopeImpl : public PositionalEncodingImpl {
 public:
  explicit RopeImpl(RopeOptions options = RopeOptions());
  void reset();
  std::string type() const override { return "rope"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  Description describe(const Positions& positions, const DescribeOptions& options) override;

  /// Frequencies for sequences of length seq_len (-1: within the original context).
  RopeFrequencies frequencies(int64_t seq_len = -1) const;
  /// Per-pair (cos, sin) [.., N, r/2] at positions for a given frequency set, times the
  /// attention scaling and, with xpos, the xPos scale (inverse for keys).
  std::pair<at::Tensor, at::Tensor> cos_sin(const Positions& positions, const RopeFrequencies& f,
                                            bool is_key = false) const;
  int64_t rotary_dim() const { return rope_rotary_dim(options); }

  RopeOptions options;
};
TORCH_MODULE(Rope);

}  // namespace posenc
