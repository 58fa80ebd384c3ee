// The attention backends' admission rules and their priority walk; see
// posenc/nn/attention_backend.h.
#include "posenc/nn/attention_backend.h"

#include <functional>

#include "posenc/kernels/short_attention.h"
#include "posenc/nn/attention.h"

namespace posenc {

namespace {

using Rule = std::function<std::string(const AttentionCall&, AttentionRoute&)>;

// The plan's rotary tables for the short kernel: constant [N, F], one pair for q and k.
AttentionRotary short_rotary(const EncodingPlan& plan, const at::Tensor& q) {
  const auto& r = plan.rotary();
  if (!r.defined() || !r.fused || r.per_head || !r.shared || r.q_cos.dim() != 2 ||
      r.q_cos.requires_grad() || r.q_sin.requires_grad() ||
      (r.head_dim > 0 && r.head_dim != q.size(3)))
    return {};
  return {r.q_cos, r.q_sin, r.k_cos, r.k_sin, r.layout};
}

// RoPE inside the fused kernel's tiles: CPU, constant [N, F] tables, no Shaw table.
bool rotary_inside_fused(const EncodingPlan& plan, const at::Tensor& q, const FusedBias& bias) {
  const auto& r = plan.rotary();
  return r.defined() && r.fused && !r.per_head && q.device().is_cpu() && r.q_cos.dim() == 2 &&
         r.k_cos.dim() == 2 && !r.q_cos.requires_grad() && !r.k_cos.requires_grad() &&
         (r.head_dim <= 0 || r.head_dim == q.size(3)) &&
         bias.table.form != BiasForm::kRelativeTable;
}

// ---- the rules: "" admits, otherwise the first reason it does not ----

std::string fused_kernels_on(const AttentionCall& c) {
  return c.options.fused() ? "" : "options.fused is off";
}

std::string short_sequence(const AttentionCall& c) {
  if (auto why = fused_kernels_on(c); !why.empty()) return why;
  if (c.plan.has_bias()) return "the plan has a bias";
  if (c.plan.has_sample_mask()) return "the plan has a sample mask (packed samples)";
  if (c.key_padding) return "key padding is given";
  if (c.cache) return "a key-value cache is given";
  if (!c.q.device().is_cpu()) return "not on the CPU";
  return "";
}

std::string admit_short_rotary(const AttentionCall& c, AttentionRoute& route) {
  if (auto why = short_sequence(c); !why.empty()) return why;
  if (c.prefix > 0) return "prefix tokens without position";
  if (!c.plan.rotary().defined()) return "the plan has no rotary tables";
  auto rotary = short_rotary(c.plan, c.q);
  if (!rotary.defined()) return "the rotary tables are not constant [N, F] shared by q and k";
  if (!attention_short_supported(c.q, c.k, c.v, rotary))
    return "the short kernel does not take these shapes";
  route.rotary_inside = true;
  route.rotary = rotary;
  return "";
}

std::string admit_short(const AttentionCall& c, AttentionRoute&) {
  if (auto why = short_sequence(c); !why.empty()) return why;
  if (!attention_short_supported(c.q, c.k, c.v))
    return "the short kernel does not take these shapes";
  return "";
}

std::string admit_sdpa(const AttentionCall& c, AttentionRoute&) {
  if (auto why = fused_kernels_on(c); !why.empty()) return why;
  if (c.plan.has_bias()) return "the plan has a bias";
  if (c.plan.has_sample_mask()) return "the plan has a sample mask (packed samples)";
  if (c.key_padding) return "key padding is given";
  if (c.options.causal() && c.cached > 0)
    return "a causal mask over cached keys (SDPA aligns it top-left)";
  return "";
}

std::string admit_fused(const AttentionCall& c, AttentionRoute& route) {
  if (auto why = fused_kernels_on(c); !why.empty()) return why;
  if (c.prefix > 0) return "prefix tokens without position";
  if (c.plan.has_bias() && !c.plan.bias_describable())
    return "the bias is not one the kernel computes (materialized only)";
  if ((c.plan.has_variate_bias() || c.plan.has_sample_mask()) && !c.q.device().is_cpu())
    return "the variate bias and the sample mask are fused on the CPU only";
  if (!c.plan.has_bias() && !c.plan.has_sample_mask() && !c.key_padding &&
      !(c.options.causal() && c.cached > 0))
    return "nothing for it to add (no bias, sample mask, key padding or cached causal keys)";
  auto fused = c.plan.fused_bias();
  if (!attention_fused_supported(*fused, c.q)) return "the fused kernel does not take these inputs";
  route.fused = fused;
  if (!c.cache && rotary_inside_fused(c.plan, c.q, *fused)) {
    const auto& r = c.plan.rotary();
    route.rotary_inside = true;
    route.rotary = {r.q_cos, r.q_sin, r.k_cos, r.k_sin, r.layout};
  }
  return "";
}

}  // namespace

std::string to_string(AttentionBackend backend) {
  switch (backend) {
    case AttentionBackend::kShortRotary:
      return "short_rotary";
    case AttentionBackend::kShort:
      return "short";
    case AttentionBackend::kSdpa:
      return "sdpa";
    case AttentionBackend::kFused:
      return "fused";
    case AttentionBackend::kReference:
      return "reference";
  }
  return "?";
}

AttentionRoute select_attention(const AttentionCall& call) {
  static const std::vector<std::pair<AttentionBackend, Rule>> kPriority{
      {AttentionBackend::kShortRotary, admit_short_rotary},
      {AttentionBackend::kShort, admit_short},
      {AttentionBackend::kSdpa, admit_sdpa},
      {AttentionBackend::kFused, admit_fused},
  };
  AttentionRoute route;
  for (const auto& [backend, admit] : kPriority) {
    AttentionRoute candidate;
    const auto why = admit(call, candidate);
    if (why.empty()) {
      candidate.backend = backend;
      candidate.not_taken = std::move(route.not_taken);
      return candidate;
    }
    route.not_taken.emplace_back(backend, why);
  }
  route.backend = AttentionBackend::kReference;
  return route;
}

std::string describe(const AttentionRoute& route) {
  std::string out = to_string(route.backend);
  if (route.rotary_inside) out += " with RoPE inside";
  if (route.not_taken.empty()) return out;
  out += " (";
  for (size_t i = 0; i < route.not_taken.size(); ++i)
    out += (i ? "; " : "") + to_string(route.not_taken[i].first) + ": " + route.not_taken[i].second;
  return out + ")";
}

}  // namespace posenc
