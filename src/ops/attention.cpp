// ALiBi attention as dispatcher operators, in SDPA's layout, the bias computed on the fly:
//
//   out[b,h,i] = sum_j softmax_j(q_i . k_j * scale - slope_h * d(i, j) + causal_ij) v_j
//   d(i, j) = p_i - p_j (causal ALiBi, Press et al. 2022) or |p_i - p_j| (symmetric), with the
//   keys at positions 0..Nk-1 and the queries at Nk-Nq..Nk-1 (cached keys first, as SDPA's
//   lower-right causal mask: key j visible to query i when j <= i + Nk - Nq).
//
// posenc::alibi_attention(q, k, v, slopes, causal, symmetric, scale) -> out
//   q [B, H, Nq, D], k [B, H, Nk, D], v [B, H, Nk, Dv], slopes [H] -> [B, H, Nq, Dv]; scale
//   None: 1/sqrt(D). No [H, Nq, Nk] bias is materialized: O(H) memory for the bias.
// posenc::_alibi_attention_forward(...) -> (out, lse [B, H, Nq] float32)
// posenc::_alibi_attention_backward(grad_out, q, k, v, out, lse, slopes, causal, symmetric,
//                                   scale) -> (dq, dk, dv)
//   The tiled CPU kernel (src/kernels/cpu/attention_cpu.cpp; FlashAttention-style online softmax,
//   backward recomputing tiles from lse), float32 inside, results in q's dtype. The plain-ATen
//   specification is posenc::attention_reference (materialized bias), the tests' oracle.
// Autograd: autograd/attention_autograd.cpp; fake kernels: python/posenc/_meta.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "../kernels/cpu/attention_cpu.h"

namespace posenc::ops {

namespace {

struct Prepared {
  detail::AttentionProblem p;
  std::vector<double> pq, pk;
};

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slopes) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "posenc.alibi_attention: q, k, v must be [B, H, N, D] (SDPA's layout), got ",
              q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0),
              "posenc.alibi_attention: batch sizes differ: ", q.size(0), ", ", k.size(0), ", ",
              v.size(0));
  TORCH_CHECK(q.size(1) == k.size(1) && k.size(1) == v.size(1),
              "posenc.alibi_attention: head counts differ: q ", q.size(1), ", k ", k.size(1),
              ", v ", v.size(1), " (repeat grouped k, v heads first)");
  TORCH_CHECK(q.size(3) == k.size(3), "posenc.alibi_attention: q has D=", q.size(3),
              " but k has D=", k.size(3));
  TORCH_CHECK(k.size(2) == v.size(2), "posenc.alibi_attention: k has Nk=", k.size(2), " but v has ",
              v.size(2));
  TORCH_CHECK(q.size(2) <= k.size(2), "posenc.alibi_attention: more queries (", q.size(2),
              ") than keys (", k.size(2), "): the queries are the last keys' positions");
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1),
              "posenc.alibi_attention: slopes must be [H] = [", q.size(1), "], got ",
              slopes.sizes());
  for (const auto* t : {&q, &k, &v})
    TORCH_CHECK(t->scalar_type() == q.scalar_type() &&
                    (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 ||
                     q.scalar_type() == at::kHalf),
                "posenc.alibi_attention: q, k, v must share one of float32, bfloat16, float16; "
                "got ",
                q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && k.device() == v.device() && slopes.device() == q.device(),
              "posenc.alibi_attention: q, k, v, slopes must be on one device, got ", q.device(),
              ", ", k.device(), ", ", v.device(), ", ", slopes.device());
}

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// The kernel's problem; the position vectors live in `out` as long as the problem is used.
void prepare(Prepared& out, const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh,
             const at::Tensor& slopes, bool causal, bool symmetric, double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.alibi = true;
  p.symmetric = symmetric;
  p.causal = causal;
  out.pq.resize(p.nq);
  out.pk.resize(p.nk);
  for (int64_t j = 0; j < p.nk; ++j) out.pk[j] = static_cast<double>(j);
  for (int64_t i = 0; i < p.nq; ++i) out.pq[i] = static_cast<double>(p.nk - p.nq + i);
  p.pq = out.pq.data();
  p.pk = out.pk.data();
  const auto s = slopes.detach().to(at::kCPU, at::kFloat).contiguous();
  p.slopes.assign(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
}

at::Tensor f32(const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); }

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& slopes,
                                               bool causal, bool symmetric,
                                               std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  Prepared prepared;
  prepare(prepared, f32(q), f32(k), f32(v), slopes, causal, symmetric, scale_of(q, scale));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  Prepared prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare(prepared, qh, kh, vh, slopes, causal, symmetric, scale_of(q, scale));
  auto dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);
  at::Tensor dtable;
  if (qh.numel() > 0 && kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

// The plain-ATen specification of the two ops (the bias materialized, [H, Nq, Nk]): the CUDA
// registration until a CUDA kernel takes this layout, and the formula the CPU kernel is tested
// against (tests/python/test_attention.py compares both with SDPA and a materialized bias).
at::Tensor logits_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& slopes,
                     bool causal, bool symmetric, double scale) {
  const int64_t nq = q.size(2), nk = k.size(2);
  const auto opts = q.options().dtype(at::kFloat);
  const auto pk = at::arange(nk, opts);
  const auto pq = at::arange(nk - nq, nk, opts);
  auto d = pq.unsqueeze(1) - pk.unsqueeze(0);  // [Nq, Nk]
  if (symmetric) d = d.abs();
  auto logits = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * scale -
                slopes.to(at::kFloat).view({-1, 1, 1}) * d;
  if (causal) logits = logits.masked_fill(d.lt(0), -std::numeric_limits<float>::infinity());
  return logits;
}

std::tuple<at::Tensor, at::Tensor> forward_reference(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& slopes,
                                                     bool causal, bool symmetric,
                                                     std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  const auto logits = logits_of(q, k, slopes, causal, symmetric, scale_of(q, scale));
  const auto lse = at::logsumexp(logits, -1);
  const auto p = at::exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0);
  return {at::matmul(p, v.to(at::kFloat)).to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  const double s = scale_of(q, scale);
  const auto p =
      at::exp(logits_of(q, k, slopes, causal, symmetric, s) - lse.unsqueeze(-1)).nan_to_num(0.0);
  const auto g = grad_out.to(at::kFloat);
  const auto dv = at::matmul(p.transpose(-1, -2), g);
  const auto dp = at::matmul(g, v.to(at::kFloat).transpose(-1, -2));
  const auto ds = p * (dp - (g * out.to(at::kFloat)).sum(-1, true));
  const auto dq = at::matmul(ds, k.to(at::kFloat)) * s;
  const auto dk = at::matmul(ds.transpose(-1, -2), q.to(at::kFloat)) * s;
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

at::Tensor alibi_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& slopes, bool causal, bool symmetric,
                                     std::optional<double> scale) {
  return std::get<0>(forward_reference(q, k, v, slopes, causal, symmetric, scale));
}

at::Tensor alibi_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& slopes, bool causal, bool symmetric,
                               std::optional<double> scale) {
  return std::get<0>(forward_cpu(q, k, v, slopes, causal, symmetric, scale));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(posenc, m) {
  m.def(
      "alibi_attention(Tensor q, Tensor k, Tensor v, Tensor slopes, bool causal=False, "
      "bool symmetric=False, float? scale=None) -> Tensor");
  m.def(
      "_alibi_attention_forward(Tensor q, Tensor k, Tensor v, Tensor slopes, bool causal=False, "
      "bool symmetric=False, float? scale=None) -> (Tensor, Tensor)");
  m.def(
      "_alibi_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor slopes, bool causal=False, bool symmetric=False, float? scale=None) -> "
      "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  m.impl("alibi_attention", TORCH_FN(alibi_attention_cpu));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_cpu));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_cpu));
}

TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  m.impl("alibi_attention", TORCH_FN(alibi_attention_reference));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_reference));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_reference));
}

}  // namespace posenc::ops
