// RoPE module over Positions; functional core in src/functional/rope.cpp.
#include "posenc/encoders/rope.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/rope_fused.h"

namespace posenc {

RopeImpl::RopeImpl(RopeOptions options_) : options(std::move(options_)) { reset(); }

void RopeImpl::reset() { rope_validate(options); }

RopeFrequencies RopeImpl::frequencies(int64_t seq_len) const {
  return rope_frequencies(options, seq_len);
}

namespace {
// (s p) in the angles' dtype (float32 with float32 frequencies: transformers' `2 * math.pi *
// coords` before the product with inv_freq), p itself where s is 1
at::Tensor scaled(const at::Tensor& p, const at::Tensor& inv_freq, double scale) {
  if (scale == 1.0) return p;
  return p.to(inv_freq.scalar_type() == torch::kFloat32 ? torch::kFloat32 : torch::kFloat64) *
         scale;
}
}  // namespace

std::pair<at::Tensor, at::Tensor> RopeImpl::cos_sin(const Positions& positions,
                                                    const RopeFrequencies& f, bool is_key) const {
  const auto& sections = options.sections().sections();
  const double position_scale = options.position_scale();
  if (!sections.empty()) {  // multi-axis: pair i rotates by the coordinate of its section's axis
    positions.check_num_axes("rope", static_cast<int64_t>(sections.size()));
    return rope_cos_sin_sections(
        scaled(rope_section_coords(positions.coords(), options.sections().axes()), f.inv_freq,
               position_scale),
        f.inv_freq, sections, options.sections().layout(), f.attention_scaling);
  }
  positions.check_num_axes("rope", 1);
  auto p = scaled(positions.axis(0), f.inv_freq, position_scale);
  auto [cos, sin] = rope_cos_sin(p, f.inv_freq, f.attention_scaling);
  if (options.xpos()) {
    auto scale = xpos_scale(p, rotary_dim(), options.xpos_scale_base());
    if (is_key) scale = scale.reciprocal();
    cos = cos * scale;
    sin = sin * scale;
  }
  return {cos, sin};
}

namespace {
bool same_positions(const Positions& a, const Positions& b) {
  return a.coords().sizes() == b.coords().sizes() &&
         (a.coords().is_same(b.coords()) || at::equal(a.coords(), b.coords()));
}
}  // namespace

void RopeImpl::contribute(EncodingPlan& plan, const PlanRequest& request) {
  const auto& qp = request.queries;
  const auto& kp = request.rotated_key_positions();
  // dynamic NTK / LongRoPE: frequencies for the longest rotated key, as HF's dynamic_rope_update
  int64_t seq_len = -1;
  if (kp.size() > 0) seq_len = static_cast<int64_t>(std::floor(kp.max())) + 1;
  const auto f = frequencies(seq_len);
  RotaryTables tables;
  std::tie(tables.q_cos, tables.q_sin) = cos_sin(qp, f, /*is_key=*/false);
  tables.q_cos = tables.q_cos.to(request.device);
  tables.q_sin = tables.q_sin.to(request.device);
  if (options.xpos() || !same_positions(qp, kp)) {  // xPos scales keys by the inverse
    std::tie(tables.k_cos, tables.k_sin) = cos_sin(kp, f, /*is_key=*/true);
    tables.k_cos = tables.k_cos.to(request.device);
    tables.k_sin = tables.k_sin.to(request.device);
  }
  tables.layout = options.layout();
  tables.fused = options.fused();
  tables.head_dim = options.head_dim();
  plan.set_rotary(type(), std::move(tables));
}

Description RopeImpl::describe(const Positions& positions, const DescribeOptions& d) {
  int64_t seq_len = d.seq_len;
  if (seq_len < 0 && positions.size() > 0)
    seq_len = static_cast<int64_t>(std::floor(positions.max())) + 1;
  const auto f = frequencies(seq_len);
  auto [cos, sin] = cos_sin(positions, f);
  Description out{{"inv_freq", f.inv_freq},
                  {"attention_scaling", torch::tensor(f.attention_scaling, torch::kFloat64)},
                  {"cos", rope_expand(cos, options.layout())},
                  {"sin", rope_expand(sin, options.layout())}};
  if (options.xpos())
    out.emplace_back("xpos_scale",
                     xpos_scale(positions.axis(0), rotary_dim(), options.xpos_scale_base()));
  return out;
}

}  // namespace posenc
