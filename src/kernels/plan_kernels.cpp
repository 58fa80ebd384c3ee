// The plan's kernel-backed operations (declared in posenc/core/plan.h): RoPE on q and k through
// the fused CPU kernel where it applies (else the reference rotation), the materialized bias
// (bias_from_spec, the fused kernel's oracle) and the fused attention kernel's prepared bias.
// Defined here, beside the kernels they call, so that core depends on no kernel header (the kernels
// include core/plan.h, not the reverse).
#include <ATen/record_function.h>
#include <torch/torch.h>

#include "posenc/core/plan.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"

namespace posenc {

namespace {

void check_rotary_input(const at::Tensor& t, const char* name, const RotaryTables& r, int64_t n) {
  TORCH_CHECK(t.dim() == 4, "rope: ", name, " must be [B, N, H, Dh], got shape ", t.sizes());
  TORCH_CHECK(r.head_dim <= 0 || t.size(3) == r.head_dim, "rope: ", name, " has head_dim ",
              t.size(3), " but the encoder was built for head_dim=", r.head_dim);
  TORCH_CHECK(t.size(1) == n, "rope: ", name, " has N=", t.size(1), " tokens but ", n,
              " positions were given");
}

}  // namespace

std::pair<at::Tensor, at::Tensor> EncodingPlan::apply_rotary(const at::Tensor& q,
                                                             const at::Tensor& k) const {
  if (!rotary_.defined()) return {q, k};
  RECORD_USER_SCOPE("posenc::rotary");  // a category of `posenc train --profile`
  const auto& r = rotary_;
  const int64_t nq = r.per_head ? r.q_cos.size(0) : r.q_cos.size(-2);
  const int64_t nk = r.per_head ? r.k_cos.size(0) : r.k_cos.size(-2);
  check_rotary_input(q, "q", r, nq);
  check_rotary_input(k, "k", r, nk);
  if (r.per_head) {  // [N, H, F] per head: broadcast over the batch
    TORCH_CHECK(r.q_cos.size(1) == q.size(2), "rope: per-head tables for ", r.q_cos.size(1),
                " heads but q has ", q.size(2));
    return {rope_rotate_pairs(q, r.q_cos.unsqueeze(0), r.q_sin.unsqueeze(0), r.layout),
            rope_rotate_pairs(k, r.k_cos.unsqueeze(0), r.k_sin.unsqueeze(0), r.layout)};
  }
  auto qc = r.q_cos.to(q.device()), qs = r.q_sin.to(q.device());
  const bool fused = r.fused && rope_fused_supported(q, qc) && rope_fused_supported(k, qc);
  if (r.shared && fused && q.scalar_type() == k.scalar_type())
    return rope_fused_qk(q, k, qc, qs, r.layout);  // one pass, tables read once per token
  auto kc = r.k_cos.to(k.device()), ks = r.k_sin.to(k.device());
  if (fused) return {rope_fused(q, qc, qs, r.layout), rope_fused(k, kc, ks, r.layout)};
  return {rope_apply(q, qc, qs, r.layout), rope_apply(k, kc, ks, r.layout)};
}

at::Tensor EncodingPlan::materialize_bias(int64_t heads, const at::Tensor& q) const {
  at::Tensor total;
  auto accumulate = [&](at::Tensor part) {
    if (!part.defined()) return;
    if (q.defined()) part = part.to(q.device());
    total = total.defined() ? total + part : part;
  };
  for (const auto& spec : bias_specs_) {
    const int64_t h = heads >= 0 || !spec.slopes.defined() ? heads : spec.slopes.numel();
    accumulate(bias_from_spec(spec, bias_q_, bias_k_, h, q));
  }
  accumulate(materialized_bias_);
  for (const auto& fn : query_biases_) {
    TORCH_CHECK(q.defined(), "plan: a query-dependent bias needs q [B, Nq, H, Dh]");
    accumulate(fn(q));
  }
  if (variate_table_.defined()) {
    // + table[1, h] where the ids are equal, table[0, h] where not: [(B,) H, N, N]
    auto same = variate_ids_.unsqueeze(-1) == variate_ids_.unsqueeze(-2);  // [(B,) N, N]
    const int64_t h = variate_table_.size(1);
    std::vector<int64_t> shape(static_cast<size_t>(same.dim() + 1), 1);
    shape[shape.size() - 3] = h;
    accumulate(torch::where(same.unsqueeze(-3).to(variate_table_.device()),
                            variate_table_[1].view(shape), variate_table_[0].view(shape)));
  }
  return total;
}

std::shared_ptr<const FusedBias> EncodingPlan::fused_bias() const {
  TORCH_CHECK(bias_describable() || !has_bias(),
              "plan: the fused kernel takes describable bias parts only");
  if (!fused_) {
    at::Tensor q = bias_q_, k = bias_k_;
    if (!q.defined()) {  // no bias: the kernel still reads the (1D) positions' count
      q = torch::zeros({request_.queries.size()}, torch::kFloat64);
      k = torch::zeros({request_.key_positions().size()}, torch::kFloat64);
    }
    fused_ = posenc::fused_bias(bias_specs_, q, k);
  }
  return fused_;
}

}  // namespace posenc
