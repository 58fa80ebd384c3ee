// Composition: several encoders acting on one model, each through its part of the plan
// (posenc/core/plan.h).
//
//   x  -> x + sum_i E_i(p)                    additive parts summed
//   q, k -> R(p) q, R(p) k                    at most one rotary part (two: an error naming both)
//   logits -> logits + sum_i b_i(p_q, p_k)     bias parts summed; fused in one kernel call when
//                                             every part is describable (e.g. ALiBi + T5)
//
// Examples: RoPE + ALiBi; a learned absolute table + T5 buckets; a learned modality embedding
// beside rotary positions. For mixed streams (posenc/core/stream.h) a part may act on one
// modality only: its encoder sees the positions of that modality's tokens (optionally some axes
// of them) and adds its embedding to those tokens, e.g. 1D sinusoidal on the text (axis t) and
// 3D sin-cos on the video while one M-RoPE spans the stream. Such a part must be additive.
// A part on some axes of every token may also rotate: e.g. audio patches with axes (freq, time),
// absolute along frequency (pitch matters) and rotary along time (shift invariant):
// {"type": "compose", "encoders": [{"type": "sinusoidal", "axes": ["freq"]},
//                                  {"type": "rope", "axes": ["time"]}]}  (registry: "freq_time").
// Logit-bias parts read every axis.
// Config: {"type": "compose", "encoders": [{...}, {"type": "sinusoidal", "modality": "text",
// "axes": ["t"]}]}.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "posenc/core/encoder.h"

namespace posenc {

/// A part of a composite: an encoder, optionally restricted to one modality's tokens and to
/// some axes of their positions.
struct ComposePart {
  PositionalEncoding encoder{nullptr};
  std::optional<SegmentKind> modality;  ///< the tokens it acts on (none: every token)
  std::vector<std::string> axes;        ///< the axes it reads, by name (empty: all)
};

class ComposeImpl : public PositionalEncodingImpl {
 public:
  explicit ComposeImpl(std::vector<ComposePart> parts);
  void reset();
  std::string type() const override { return "compose"; }
  void contribute(EncodingPlan& plan, const PlanRequest& request) override;
  /// Every part's description, names prefixed "i.type/".
  Description describe(const Positions& positions, const DescribeOptions& options) override;
  /// Every part adapted; the restore undoes them in reverse order.
  Restore adapt(const Extent& extent) override;

  std::vector<ComposePart> parts;
};
TORCH_MODULE(Compose);

}  // namespace posenc
