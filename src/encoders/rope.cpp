// RoPE module over Positions; functional core in src/functional/rope.cpp.
#include "posenc/encoders/rope.h"

#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/rope.h"

namespace posenc {

RopeImpl::RopeImpl(RopeOptions options_) : options(std::move(options_)) { reset(); }

void RopeImpl::reset() { rope_validate(options); }

RopeFrequencies RopeImpl::frequencies(int64_t seq_len) const {
  return rope_frequencies(options, seq_len);
}

std::pair<at::Tensor, at::Tensor> RopeImpl::cos_sin(const Positions& positions,
                                                    const RopeFrequencies& f, bool is_key) const {
  const auto& sections = options.mrope_section();
  if (!sections.empty()) {  // multi-axis: pair i rotates by the coordinate of its section's axis
    positions.check_num_axes("rope", static_cast<int64_t>(sections.size()));
    return rope_cos_sin_sections(positions.coords(), f.inv_freq, sections, options.section_layout(),
                                 f.attention_scaling);
  }
  positions.check_num_axes("rope", 1);
  auto p = positions.axis(0);
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
void check_qk(const at::Tensor& t, const char* name, int64_t head_dim, int64_t n) {
  TORCH_CHECK(t.dim() == 4, "rope: ", name, " must be [B, N, H, Dh], got shape ", t.sizes());
  TORCH_CHECK(t.size(3) == head_dim, "rope: ", name, " has head_dim ", t.size(3),
              " but the encoder was built for head_dim=", head_dim);
  TORCH_CHECK(t.size(1) == n, "rope: ", name, " has N=", t.size(1), " tokens but ", n,
              " positions were given");
}
}  // namespace

std::pair<at::Tensor, at::Tensor> RopeImpl::rotate(const at::Tensor& q, const at::Tensor& k,
                                                   const Positions& q_positions,
                                                   const Positions& k_positions) {
  check_qk(q, "q", options.head_dim(), q_positions.size());
  check_qk(k, "k", options.head_dim(), k_positions.size());
  int64_t seq_len = -1;
  if (k_positions.size() > 0) seq_len = static_cast<int64_t>(std::floor(k_positions.max())) + 1;
  const auto f = frequencies(seq_len);
  auto [qc, qs] = cos_sin(q_positions, f, /*is_key=*/false);
  qc = qc.to(q.device());
  qs = qs.to(q.device());
  const bool shared = !options.xpos() &&
                      q_positions.coords().sizes() == k_positions.coords().sizes() &&
                      (q_positions.coords().is_same(k_positions.coords()) ||
                       at::equal(q_positions.coords(), k_positions.coords()));
  const bool fused = options.fused() && rope_fused_supported(q, qc) && rope_fused_supported(k, qc);
  if (shared && fused && q.scalar_type() == k.scalar_type()) {
    return rope_fused_qk(q, k, qc, qs, options.layout());  // one pass, tables read once per token
  }
  at::Tensor kc = qc, ks = qs;
  if (!shared) {
    std::tie(kc, ks) = cos_sin(k_positions, f, /*is_key=*/true);
    kc = kc.to(k.device());
    ks = ks.to(k.device());
  }
  if (fused)
    return {rope_fused(q, qc, qs, options.layout()), rope_fused(k, kc, ks, options.layout())};
  return {rope_apply(q, qc, qs, options.layout()), rope_apply(k, kc, ks, options.layout())};
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
