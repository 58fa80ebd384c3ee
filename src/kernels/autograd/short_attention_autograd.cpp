// attention_short: checks, the autograd function around the short-sequence CPU kernel
// (src/kernels/cpu/short_attention_cpu.cpp); contract in include/posenc/kernels/short_attention.h.
// When gradients are needed and attention_short_saves_probabilities(N, D), the forward keeps each
// head's probabilities P [B * H, Np, Np] (Np = N rounded up to 8) for the backward, which then
// reads them instead of recomputing S = Q'K'^T and its exponentials; inference keeps nothing.
#include <torch/torch.h>

#include "../cpu/short_attention_cpu.h"
#include "first_order.h"
#include "posenc/kernels/short_attention.h"

namespace posenc {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool constant_table(const at::Tensor& t, int64_t n) {
  return t.defined() && t.device().is_cpu() && t.dim() == 2 && t.size(0) == n && !t.requires_grad();
}

// The rotation is applied to q and k alike: one pair of tables.
bool rotary_fits(const AttentionRotary& r, const at::Tensor& q) {
  if (!r.defined()) return true;
  const int64_t n = q.size(1);
  return constant_table(r.q_cos, n) && constant_table(r.q_sin, n) &&
         r.q_cos.sizes() == r.q_sin.sizes() && 2 * r.q_cos.size(1) <= q.size(3) &&
         r.k_cos.defined() && r.k_sin.defined() &&
         (r.k_cos.is_same(r.q_cos) || r.k_cos.equal(r.q_cos)) &&
         (r.k_sin.is_same(r.q_sin) || r.k_sin.equal(r.q_sin));
}

void set_strides(const at::Tensor& x, int64_t* stride) {
  stride[0] = x.stride(0);
  stride[1] = x.stride(1);
  stride[2] = x.stride(2);
}

// Tensors and settings of one call; the tables as float32 contiguous.
detail::ShortAttentionProblem problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      double scale, bool causal, const at::Tensor& cos,
                                      const at::Tensor& sin, bool interleaved) {
  detail::ShortAttentionProblem p;
  p.q = q.data_ptr<float>();
  p.k = k.data_ptr<float>();
  p.v = v.data_ptr<float>();
  set_strides(q, p.q_stride);
  set_strides(k, p.k_stride);
  set_strides(v, p.v_stride);
  p.batch = q.size(0);
  p.n = q.size(1);
  p.heads = q.size(2);
  p.dim = q.size(3);
  p.scale = static_cast<float>(scale);
  p.causal = causal;
  if (cos.numel() > 0) {  // an empty table: no rotation
    p.cos = cos.data_ptr<float>();
    p.sin = sin.data_ptr<float>();
    p.pairs = cos.size(1);
    p.interleaved = interleaved;
  }
  return p;
}

// A contiguous last dim, as the kernel reads rows in place (detached: only data is read).
at::Tensor rows(const at::Tensor& x) {
  auto d = x.detach();
  return d.stride(3) == 1 ? d : d.contiguous();
}

// A saved tensor's data, or null where the forward left it undefined (P or the log-sum-exp).
float* optional_data(const at::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; }

struct ForwardResults {
  at::Tensor out, lse, probabilities;
};

// The forward kernel's results: out [B, N, H, D] and, when keep_probabilities (and the rule
// says so), P [B * H, Np, Np], else each row's log-sum-exp [B, H, N] (the backward reads one of
// the two; the other is undefined).
ForwardResults forward_kernel(detail::ShortAttentionProblem p, bool keep_probabilities) {
  ForwardResults r;
  r.out = torch::empty({p.batch, p.n, p.heads, p.dim}, torch::kFloat32);
  if (keep_probabilities && attention_short_saves_probabilities(p.n, p.dim)) {
    const int64_t np = detail::short_attention_padded(p.n);
    r.probabilities = torch::empty({p.batch * p.heads, np, np}, torch::kFloat32);
    p.probabilities = r.probabilities.data_ptr<float>();
  } else {
    r.lse = torch::empty({p.batch, p.heads, p.n}, torch::kFloat32);
  }
  detail::short_attention_forward_cpu(p, r.out.data_ptr<float>(), optional_data(r.lse));
  return r;
}

// Whether a backward can follow (the tables are constants): only then are P kept.
bool gradients_needed(std::initializer_list<at::Tensor> inputs) {
  if (!at::GradMode::is_enabled()) return false;
  for (const auto& x : inputs)
    if (x.requires_grad()) return true;
  return false;
}

void save_settings(AutogradContext* ctx, double scale, bool causal, bool interleaved) {
  ctx->saved_data["scale"] = scale;
  ctx->saved_data["causal"] = causal;
  ctx->saved_data["interleaved"] = interleaved;
}

class ShortAttentionFunction : public torch::autograd::Function<ShortAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, double scale, bool causal,
                               const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                               bool keep_probabilities) {
    auto qr = rows(q), kr = rows(k), vr = rows(v);
    auto r = forward_kernel(problem(qr, kr, vr, scale, causal, cos, sin, interleaved),
                            keep_probabilities);
    ctx->save_for_backward({qr, kr, vr, r.out, r.lse, cos, sin, r.probabilities});
    save_settings(ctx, scale, causal, interleaved);
    return {r.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("attention_short");
    auto s = ctx->get_saved_variables();
    auto p = problem(s[0], s[1], s[2], ctx->saved_data["scale"].toDouble(),
                     ctx->saved_data["causal"].toBool(), s[5], s[6],
                     ctx->saved_data["interleaved"].toBool());
    p.probabilities = optional_data(s[7]);
    auto grad_out = grads[0].to(torch::kFloat32).contiguous();
    auto dq = torch::empty({p.batch, p.n, p.heads, p.dim}, torch::kFloat32);
    auto dk = torch::empty_like(dq), dv = torch::empty_like(dq);
    detail::short_attention_backward_cpu(p, s[3].data_ptr<float>(), optional_data(s[4]),
                                         grad_out.data_ptr<float>(), dq.data_ptr<float>(),
                                         dk.data_ptr<float>(), dv.data_ptr<float>());
    return {dq,           dk,           dv,           at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// q, k, v as the three parts of one [B, N, 3, H, D] projection, and gradients written straight
// into one [B, N, 3, H, D] tensor: no stack of dq, dk, dv after the backward (unbind's backward
// is a copy of every gradient, 7% of the main job's step at N = 16).
class ShortAttentionPackedFunction
    : public torch::autograd::Function<ShortAttentionPackedFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& qkv, double scale,
                               bool causal, const at::Tensor& cos, const at::Tensor& sin,
                               bool interleaved, bool keep_probabilities) {
    auto packed = qkv.detach();
    if (packed.stride(4) != 1) packed = packed.contiguous();
    auto r = forward_kernel(problem(packed.select(2, 0), packed.select(2, 1), packed.select(2, 2),
                                    scale, causal, cos, sin, interleaved),
                            keep_probabilities);
    ctx->save_for_backward({packed, r.out, r.lse, cos, sin, r.probabilities});
    save_settings(ctx, scale, causal, interleaved);
    return {r.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("attention_short");
    auto s = ctx->get_saved_variables();
    const auto& packed = s[0];
    auto p = problem(packed.select(2, 0), packed.select(2, 1), packed.select(2, 2),
                     ctx->saved_data["scale"].toDouble(), ctx->saved_data["causal"].toBool(), s[3],
                     s[4], ctx->saved_data["interleaved"].toBool());
    p.probabilities = optional_data(s[5]);
    auto grad_out = grads[0].to(torch::kFloat32).contiguous();
    auto dqkv = torch::empty({p.batch, p.n, 3, p.heads, p.dim}, torch::kFloat32);  // contiguous
    p.grad_stride[0] = dqkv.stride(0);
    p.grad_stride[1] = dqkv.stride(1);
    p.grad_stride[2] = dqkv.stride(3);
    float* base = dqkv.data_ptr<float>();
    const int64_t part = dqkv.stride(2);
    detail::short_attention_backward_cpu(p, s[1].data_ptr<float>(), optional_data(s[2]),
                                         grad_out.data_ptr<float>(), base, base + part,
                                         base + 2 * part);
    return {dqkv,         at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The tables as autograd inputs: an empty table is no rotation.
std::pair<at::Tensor, at::Tensor> tables(const AttentionRotary& rotary) {
  at::Tensor cos = torch::empty({0}, torch::kFloat32), sin = cos;
  if (rotary.defined()) {
    cos = rotary.q_cos.detach().to(torch::kFloat32).contiguous();
    sin = rotary.q_sin.detach().to(torch::kFloat32).contiguous();
  }
  return {cos, sin};
}

}  // namespace

bool attention_short_saves_probabilities(int64_t n, int64_t d) {
  const int64_t padded = detail::short_attention_padded(n);
  return n >= 1 && d >= 1 && padded * padded <= n * d;
}

bool attention_short_supported(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionRotary& rotary) {
  auto fits = [&](const at::Tensor& x) {
    return x.defined() && x.dim() == 4 && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
           x.sizes() == q.sizes();
  };
  return fits(q) && fits(k) && fits(v) && q.size(1) >= 1 && q.size(1) <= kShortAttentionMaxTokens &&
         q.size(3) >= 1 && q.size(3) <= kShortAttentionMaxHeadDim && rotary_fits(rotary, q);
}

at::Tensor attention_short(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           double scale, const AttentionRotary& rotary, bool causal) {
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "attention_short: q, k, v must be [B, N, H, D] of one shape, got ", q.sizes(), ", ",
              k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.size(1) <= kShortAttentionMaxTokens && q.size(3) <= kShortAttentionMaxHeadDim,
              "attention_short: N=", q.size(1), " and D=", q.size(3),
              " exceed the limits N <= ", kShortAttentionMaxTokens,
              ", D <= ", kShortAttentionMaxHeadDim, " (use attention_fused)");
  TORCH_CHECK(
      attention_short_supported(q, k, v, rotary),
      "attention_short: needs CPU float32 q, k, v and constant rotary tables [N, F] "
      "shared by q and k (2F <= D); got ",
      q.scalar_type(), " on ", q.device(),
      rotary.defined() ? ", tables " + std::to_string(rotary.q_cos.dim()) + "-D" : std::string());
  // autograd inputs must be defined tensors: no rotation is an empty table
  const auto [cos, sin] = tables(rotary);
  return ShortAttentionFunction::apply(q, k, v, scale, causal, cos, sin,
                                       rotary.layout == RopeLayout::kInterleaved,
                                       gradients_needed({q, k, v}))[0];
}

at::Tensor attention_short_packed(const at::Tensor& qkv, double scale,
                                  const AttentionRotary& rotary, bool causal) {
  TORCH_CHECK(qkv.dim() == 5 && qkv.size(2) == 3,
              "attention_short_packed: qkv must be [B, N, 3, H, D], got ", qkv.sizes());
  const auto q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  TORCH_CHECK(q.size(1) <= kShortAttentionMaxTokens && q.size(3) <= kShortAttentionMaxHeadDim,
              "attention_short_packed: N=", q.size(1), " and D=", q.size(3),
              " exceed the limits N <= ", kShortAttentionMaxTokens,
              ", D <= ", kShortAttentionMaxHeadDim, " (use attention_fused)");
  TORCH_CHECK(attention_short_supported(q, k, v, rotary),
              "attention_short_packed: needs a CPU float32 qkv and constant rotary tables [N, F] "
              "shared by q and k (2F <= D); got ",
              qkv.scalar_type(), " on ", qkv.device());
  const auto [cos, sin] = tables(rotary);
  return ShortAttentionPackedFunction::apply(qkv, scale, causal, cos, sin,
                                             rotary.layout == RopeLayout::kInterleaved,
                                             gradients_needed({qkv}))[0];
}

}  // namespace posenc
