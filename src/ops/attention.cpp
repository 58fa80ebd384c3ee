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
//
// T5's relative-position bias the same way (Raffel et al. 2020; transformers' T5Attention):
//
//   out[b,h,i] = sum_j softmax_j(q_i . k_j * scale + table[bucket(j - p_i), h] + causal_ij) v_j
//   bucket = T5's _relative_position_bucket(key minus query position, bidirectional,
//            num_buckets = table.size(0), max_distance) (src/functional/relative.cpp, bit-equal
//            to transformers'), the same positions and causal mask as above.
//
// posenc::t5_attention(q, k, v, table, bidirectional, max_distance, causal, scale) -> out
//   table [num_buckets, H], float32 or q's dtype. scale None: 1/sqrt(D), as SDPA (T5 itself does
//   not scale: pass 1.0). The kernel looks the bias up per key-minus-query offset, an
//   [H, Nq + Nk - 1] table, instead of an [H, Nq, Nk] bias. CUDA: the plain-ATen reference.
// posenc::_t5_attention_forward(...) -> (out, lse [B, H, Nq] float32)
// posenc::_t5_attention_backward(grad_out, q, k, v, out, lse, table, bidirectional,
//                                max_distance, causal, scale) -> (dq, dk, dv, dtable)
//   dtable [num_buckets, H] in the table's dtype: dS summed per (bucket, head).
//
// Shaw et al. 2018 ("Self-Attention with Relative Position Representations", eq. 5, key side)
// the same way, the bias depending on the query:
//
//   out[b,h,i] = sum_j softmax_j((q_i . k_j + q_i . a[clip(j - p_i, -K, K) + K]) * scale
//                                + causal_ij) v_j
//   a = table [2K+1, D], one table shared by the heads (Shaw's a^K_ij; the C++ encoder's
//   ShawImpl::weight, src/encoders/shaw.cpp), offsets key minus query position, the same
//   positions and causal mask as above. scale multiplies both terms, as Shaw's e_ij =
//   q_i (k_j + a_ij)^T / sqrt(d_z) (and BERT's relative_key); None: 1/sqrt(D), where it equals
//   the encoder's bias (q . a / sqrt(D)) added to q k^T / sqrt(D).
//
// posenc::shaw_attention(q, k, v, table, causal, scale) -> out
//   table [2K+1, D], float32 or q's dtype. The kernel reads the bias from qr = q a^T * scale,
//   [B, H, Nq, 2K'+1] with K' = min(K, Nk - 1) (no offset reaches further: the rows past K' are
//   not read and get a zero gradient), instead of an [B, H, Nq, Nk] bias. float64 (and CUDA)
//   take the plain-ATen reference, computed in float64 for float64 inputs (gradcheck).
// posenc::_shaw_attention_forward(...) -> (out, lse [B, H, Nq]: float32, float64 for float64 q)
// posenc::_shaw_attention_backward(grad_out, q, k, v, out, lse, table, causal, scale)
//                                  -> (dq, dk, dv, dtable)
//   dqr[i, r] = scale * sum over j with clip(j - p_i) + K = r of dS_ij; dq += dqr a,
//   dtable = sum_{b,h} dqr^T q, in the table's dtype.
// Autograd: autograd/attention_autograd.cpp; fake kernels: python/posenc/_meta.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>

#include "../kernels/cpu/attention_cpu.h"
#include "posenc/functional/relative.h"

namespace posenc::ops {

namespace {

struct Prepared {
  detail::AttentionProblem p;
  std::vector<double> pq, pk;
};

// q, k, v in SDPA's layout, one dtype and device; `op` names the operator in the messages.
// allow_double: float64 as well (an op whose float64 path is the plain-ATen reference).
void check_qkv(const char* op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               bool allow_double = false) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op,
              ": q, k, v must be [B, H, N, D] (SDPA's layout), got ", q.sizes(), ", ", k.sizes(),
              ", ", v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0), op,
              ": batch sizes differ: ", q.size(0), ", ", k.size(0), ", ", v.size(0));
  TORCH_CHECK(q.size(1) == k.size(1) && k.size(1) == v.size(1), op, ": head counts differ: q ",
              q.size(1), ", k ", k.size(1), ", v ", v.size(1),
              " (repeat grouped k, v heads first)");
  TORCH_CHECK(q.size(3) == k.size(3), op, ": q has D=", q.size(3), " but k has D=", k.size(3));
  TORCH_CHECK(k.size(2) == v.size(2), op, ": k has Nk=", k.size(2), " but v has ", v.size(2));
  TORCH_CHECK(q.size(2) <= k.size(2), op, ": more queries (", q.size(2), ") than keys (", k.size(2),
              "): the queries are the last keys' positions");
  const auto dtype = q.scalar_type();
  for (const auto* t : {&q, &k, &v})
    TORCH_CHECK(
        t->scalar_type() == dtype && (dtype == at::kFloat || dtype == at::kBFloat16 ||
                                      dtype == at::kHalf || (allow_double && dtype == at::kDouble)),
        op, ": q, k, v must share one of float32, bfloat16, float16",
        allow_double ? ", float64" : "", "; got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
        v.scalar_type());
  TORCH_CHECK(q.device() == k.device() && k.device() == v.device(), op,
              ": q, k, v must be on one device, got ", q.device(), ", ", k.device(), ", ",
              v.device());
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slopes) {
  check_qkv("posenc.alibi_attention", q, k, v);
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1),
              "posenc.alibi_attention: slopes must be [H] = [", q.size(1), "], got ",
              slopes.sizes());
  TORCH_CHECK(slopes.device() == q.device(),
              "posenc.alibi_attention: q, k, v, slopes must be on one device, got ", q.device(),
              ", ", k.device(), ", ", v.device(), ", ", slopes.device());
}

// The table [num_buckets, H] and the bucket parameters T5's formula accepts (HF does not check:
// max_distance <= the exact range gives NaN or negative buckets there).
void check_t5(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& table, bool bidirectional, int64_t max_distance) {
  check_qkv("posenc.t5_attention", q, k, v);
  TORCH_CHECK(table.dim() == 2 && table.size(1) == q.size(1),
              "posenc.t5_attention: table must be [num_buckets, H] = [num_buckets, ", q.size(1),
              "], got ", table.sizes());
  const int64_t num_buckets = table.size(0);
  const int64_t max_exact = (bidirectional ? num_buckets / 2 : num_buckets) / 2;
  TORCH_CHECK(max_exact >= 1, "posenc.t5_attention: table.size(0) (num_buckets) must be >= ",
              bidirectional ? "4 with bidirectional=True" : "2", ", got ", num_buckets);
  TORCH_CHECK(max_distance > max_exact, "posenc.t5_attention: max_distance must exceed the ",
              "exact range ", max_exact, " (num_buckets=", num_buckets,
              bidirectional ? ", bidirectional" : "", "), got ", max_distance);
  TORCH_CHECK(table.scalar_type() == at::kFloat || table.scalar_type() == q.scalar_type(),
              "posenc.t5_attention: table must be float32 or q's dtype (", q.scalar_type(),
              "), got ", table.scalar_type());
  TORCH_CHECK(table.device() == q.device(), "posenc.t5_attention: table must be on q's device (",
              q.device(), "), got ", table.device());
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

// softmax(logits) v and the row log-sum-exp (in the logits' dtype); rows that see no key give 0
// (lse -inf).
std::tuple<at::Tensor, at::Tensor> softmax_forward(const at::Tensor& q, const at::Tensor& v,
                                                   const at::Tensor& logits) {
  const auto lse = at::logsumexp(logits, -1);
  const auto p = at::exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0);
  return {at::matmul(p, v.to(logits.scalar_type())).to(q.scalar_type()), lse};
}

// The gradients of softmax_forward, and dS = dLoss/dlogits ([B, H, Nq, Nk] in the logits' dtype).
struct ReferenceGrads {
  at::Tensor dq, dk, dv, ds;
};
ReferenceGrads softmax_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                const at::Tensor& lse, const at::Tensor& logits, double s) {
  const auto ct = logits.scalar_type();  // float32; float64 for float64 inputs (Shaw)
  const auto p = at::exp(logits - lse.unsqueeze(-1)).nan_to_num(0.0);
  const auto g = grad_out.to(ct);
  const auto dv = at::matmul(p.transpose(-1, -2), g);
  const auto dp = at::matmul(g, v.to(ct).transpose(-1, -2));
  const auto ds = p * (dp - (g * out.to(ct)).sum(-1, true));
  const auto dq = at::matmul(ds, k.to(ct)) * s;
  const auto dk = at::matmul(ds.transpose(-1, -2), q.to(ct)) * s;
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), ds};
}

std::tuple<at::Tensor, at::Tensor> forward_reference(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& v, const at::Tensor& slopes,
                                                     bool causal, bool symmetric,
                                                     std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  return softmax_forward(q, v, logits_of(q, k, slopes, causal, symmetric, scale_of(q, scale)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale) {
  check_inputs(q, k, v, slopes);
  const double s = scale_of(q, scale);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse,
                                  logits_of(q, k, slopes, causal, symmetric, s), s);
  return {g.dq, g.dk, g.dv};
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

// ---- T5 -----------------------------------------------------------------------------------

// The kernel's T5 problem; positions and the offset -> bucket row live in `out`.
struct PreparedT5 {
  detail::AttentionProblem p;
  std::vector<int64_t> iq, ik;
  at::Tensor buckets;  ///< [Nq + Nk - 1] int64: bucket of key-minus-query offset rel_min + r
};

void prepare_t5(PreparedT5& out, const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh,
                const at::Tensor& table, bool bidirectional, int64_t max_distance, bool causal,
                double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.table_form = BiasForm::kBucketTable;
  p.causal = causal;
  out.ik.resize(p.nk);
  out.iq.resize(p.nq);
  for (int64_t j = 0; j < p.nk; ++j) out.ik[j] = j;
  for (int64_t i = 0; i < p.nq; ++i) out.iq[i] = p.nk - p.nq + i;
  p.iq = out.iq.data();
  p.ik = out.ik.data();
  const auto offsets =
      t5_offset_buckets(at::arange(p.nk - p.nq, p.nk, at::kLong), at::arange(p.nk, at::kLong),
                        bidirectional, table.size(0), max_distance);
  out.buckets = offsets.buckets.contiguous();
  p.rel_min = offsets.offset_min;
  p.rel_count = out.buckets.numel();
  p.bucket = out.buckets.const_data_ptr<int64_t>();
  p.num_buckets = table.size(0);
  const auto lut = table.detach()
                       .to(at::kCPU, at::kFloat)
                       .index_select(0, out.buckets)
                       .t()
                       .contiguous();  // [H, rel_count]
  p.lut.assign(lut.const_data_ptr<float>(), lut.const_data_ptr<float>() + lut.numel());
}

std::tuple<at::Tensor, at::Tensor> t5_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& table,
                                                  bool bidirectional, int64_t max_distance,
                                                  bool causal, std::optional<double> scale) {
  check_t5(q, k, v, table, bidirectional, max_distance);
  PreparedT5 prepared;
  prepare_t5(prepared, f32(q), f32(k), f32(v), table, bidirectional, max_distance, causal,
             scale_of(q, scale));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> t5_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool bidirectional,
    int64_t max_distance, bool causal, std::optional<double> scale) {
  check_t5(q, k, v, table, bidirectional, max_distance);
  PreparedT5 prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare_t5(prepared, qh, kh, vh, table, bidirectional, max_distance, causal, scale_of(q, scale));
  auto dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);
  at::Tensor dtable;
  if (qh.numel() > 0 && kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable);
  if (!dtable.defined()) dtable = at::zeros({table.size(0), table.size(1)}, at::kFloat);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
          dtable.to(table.scalar_type())};
}

// The plain-ATen T5 specification (bias [H, Nq, Nk] materialized): the CUDA registration.
// bucket: [Nq, Nk] int64 on q's device; rel = key minus query position.
at::Tensor t5_logits_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& table,
                        const at::Tensor& bucket, const at::Tensor& rel, bool causal,
                        double scale) {
  const int64_t nq = q.size(2), nk = k.size(2), heads = q.size(1);
  const auto bias = table.to(at::kFloat)
                        .index_select(0, bucket.reshape({-1}))
                        .view({nq, nk, heads})
                        .permute({2, 0, 1});  // [H, Nq, Nk]
  auto logits = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * scale + bias;
  if (causal) logits = logits.masked_fill(rel.gt(0), -std::numeric_limits<float>::infinity());
  return logits;
}

std::tuple<at::Tensor, at::Tensor> t5_rel_and_bucket(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& table, bool bidirectional,
                                                     int64_t max_distance) {
  const int64_t nq = q.size(2), nk = k.size(2);
  const auto longs = q.options().dtype(at::kLong);
  auto rel = at::arange(nk, longs).unsqueeze(0) - at::arange(nk - nq, nk, longs).unsqueeze(1);
  auto bucket = t5_relative_position_bucket(rel, bidirectional, table.size(0), max_distance);
  return {rel, bucket};
}

std::tuple<at::Tensor, at::Tensor> t5_forward_reference(const at::Tensor& q, const at::Tensor& k,
                                                        const at::Tensor& v,
                                                        const at::Tensor& table, bool bidirectional,
                                                        int64_t max_distance, bool causal,
                                                        std::optional<double> scale) {
  check_t5(q, k, v, table, bidirectional, max_distance);
  const auto [rel, bucket] = t5_rel_and_bucket(q, k, table, bidirectional, max_distance);
  return softmax_forward(q, v, t5_logits_of(q, k, table, bucket, rel, causal, scale_of(q, scale)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> t5_backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool bidirectional,
    int64_t max_distance, bool causal, std::optional<double> scale) {
  check_t5(q, k, v, table, bidirectional, max_distance);
  const double s = scale_of(q, scale);
  const auto [rel, bucket] = t5_rel_and_bucket(q, k, table, bidirectional, max_distance);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse,
                                  t5_logits_of(q, k, table, bucket, rel, causal, s), s);
  // dtable[bucket(i, j), h] += sum_b dS[b, h, i, j]
  const int64_t heads = q.size(1);
  const auto dbias = g.ds.sum(0).permute({1, 2, 0}).reshape({-1, heads});  // [Nq * Nk, H]
  const auto dtable =
      at::zeros({table.size(0), heads}, g.ds.options()).index_add_(0, bucket.reshape({-1}), dbias);
  return {g.dq, g.dk, g.dv, dtable.to(table.scalar_type())};
}

at::Tensor t5_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& table, bool bidirectional, int64_t max_distance,
                                  bool causal, std::optional<double> scale) {
  return std::get<0>(
      t5_forward_reference(q, k, v, table, bidirectional, max_distance, causal, scale));
}

at::Tensor t5_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& table, bool bidirectional, int64_t max_distance,
                            bool causal, std::optional<double> scale) {
  return std::get<0>(t5_forward_cpu(q, k, v, table, bidirectional, max_distance, causal, scale));
}

// ---- Shaw ---------------------------------------------------------------------------------

// The table [2K+1, D] (one for all heads), on q's device, float32 or q's dtype.
void check_shaw(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& table) {
  check_qkv("posenc.shaw_attention", q, k, v, /*allow_double=*/true);
  TORCH_CHECK(q.size(3) >= 1, "posenc.shaw_attention: head dim D must be >= 1, got ", q.size(3));
  TORCH_CHECK(table.dim() == 2 && table.size(0) % 2 == 1 && table.size(1) == q.size(3),
              "posenc.shaw_attention: table must be [2K+1, D] = [2K+1, ", q.size(3),
              "] (an odd number of rows), got ", table.sizes());
  TORCH_CHECK(table.scalar_type() == at::kFloat || table.scalar_type() == q.scalar_type(),
              "posenc.shaw_attention: table must be float32 or q's dtype (", q.scalar_type(),
              "), got ", table.scalar_type());
  TORCH_CHECK(table.device() == q.device(), "posenc.shaw_attention: table must be on q's device (",
              q.device(), "), got ", table.device());
}

// K of the table, and K' = min(K, Nk - 1): key-minus-query offsets lie in [-(Nk-1), Nq-1], so
// rows K - K' .. K + K' of the table are the only ones read (clip to K' = clip to K there).
struct ShawRange {
  int64_t max_relative = 0;  ///< K
  int64_t used = 0;          ///< K'
};
ShawRange shaw_range(const at::Tensor& k, const at::Tensor& table) {
  const int64_t kmax = (table.size(0) - 1) / 2;
  return {kmax, std::min(kmax, std::max<int64_t>(k.size(2) - 1, 0))};
}

// dtable for the rows the kernel read ([2K'+1, D]), zero rows around it: [2K+1, D].
at::Tensor shaw_full_dtable(const at::Tensor& used_grad, const ShawRange& range) {
  const int64_t pad = range.max_relative - range.used;
  return pad == 0 ? used_grad : at::constant_pad_nd(used_grad, {0, 0, pad, pad}, 0.0);
}

// The plain-ATen Shaw specification (scores against every used table row, then each pair's row
// picked: [B, H, Nq, Nk] materialized), in float32, float64 for float64 inputs: the CUDA
// registration and the float64 path. index: [Nq, Nk] int64, clip(j - p_i, -K', K') + K'.
struct ShawLogits {
  at::Tensor logits;  ///< [B, H, Nq, Nk]
  at::Tensor table;   ///< the used rows [2K'+1, D] in the compute dtype
  at::Tensor index;   ///< [B, H, Nq, Nk] int64 (expanded)
};

ShawLogits shaw_logits_of(const at::Tensor& q, const at::Tensor& k, const at::Tensor& table,
                          bool causal, double scale) {
  const auto ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t nq = q.size(2), nk = k.size(2);
  const auto range = shaw_range(k, table);
  const auto longs = q.options().dtype(at::kLong);
  const auto rel =
      at::arange(nk, longs).unsqueeze(0) - at::arange(nk - nq, nk, longs).unsqueeze(1);  // [Nq, Nk]
  const auto index =
      (rel.clamp(-range.used, range.used) + range.used).expand({q.size(0), q.size(1), nq, nk});
  const auto used =
      table.narrow(0, range.max_relative - range.used, 2 * range.used + 1).to(ct);  // [2K'+1, D]
  const auto qc = q.to(ct);
  const auto qr = at::matmul(qc, used.t());  // [B, H, Nq, 2K'+1]
  auto logits = (at::matmul(qc, k.to(ct).transpose(-1, -2)) + qr.gather(-1, index)) * scale;
  if (causal) logits = logits.masked_fill(rel.gt(0), -std::numeric_limits<double>::infinity());
  return {logits, used, index};
}

std::tuple<at::Tensor, at::Tensor> shaw_forward_reference(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v,
                                                          const at::Tensor& table, bool causal,
                                                          std::optional<double> scale) {
  check_shaw(q, k, v, table);
  return softmax_forward(q, v, shaw_logits_of(q, k, table, causal, scale_of(q, scale)).logits);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> shaw_backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool causal,
    std::optional<double> scale) {
  check_shaw(q, k, v, table);
  const double s = scale_of(q, scale);
  const auto l = shaw_logits_of(q, k, table, causal, s);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse, l.logits, s);
  // dqr[b, h, i, r] = s * sum of dS[b, h, i, j] over the j with index r: [B, H, Nq, 2K'+1]
  const auto dqr = at::zeros({q.size(0), q.size(1), q.size(2), l.table.size(0)}, g.ds.options())
                       .scatter_add_(-1, l.index, g.ds) *
                   s;
  const auto dq = g.dq.to(dqr.scalar_type()) + at::matmul(dqr, l.table);
  const auto dused = at::einsum("bhqr,bhqd->rd", {dqr, q.to(dqr.scalar_type())});  // [2K'+1, D]
  return {dq.to(q.scalar_type()), g.dk, g.dv,
          shaw_full_dtable(dused, shaw_range(k, table)).to(table.scalar_type())};
}

// The kernel's Shaw problem; the positions live in `out`, qr and the table in the problem.
struct PreparedShaw {
  detail::AttentionProblem p;
  std::vector<int64_t> iq, ik;
};

void prepare_shaw(PreparedShaw& out, const at::Tensor& qh, const at::Tensor& kh,
                  const at::Tensor& vh, const at::Tensor& table, bool causal, double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.table_form = BiasForm::kRelativeTable;
  p.causal = causal;
  out.ik.resize(p.nk);
  out.iq.resize(p.nq);
  for (int64_t j = 0; j < p.nk; ++j) out.ik[j] = j;
  for (int64_t i = 0; i < p.nq; ++i) out.iq[i] = p.nk - p.nq + i;
  p.iq = out.iq.data();
  p.ik = out.ik.data();
  const auto range = shaw_range(kh, table);
  p.max_relative = range.used;
  p.rel_scale = static_cast<float>(scale);  // (q . k + q . a) * scale: one scale for both
  p.rel_table = table.detach()
                    .narrow(0, range.max_relative - range.used, 2 * range.used + 1)
                    .to(at::kCPU, at::kFloat)
                    .contiguous();                                      // [2K'+1, D]
  p.qr = (at::matmul(qh, p.rel_table.t()) * p.rel_scale).contiguous();  // [B, H, Nq, 2K'+1]
}

std::tuple<at::Tensor, at::Tensor> shaw_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const at::Tensor& table,
                                                    bool causal, std::optional<double> scale) {
  check_shaw(q, k, v, table);
  // float64: the exact reference (the kernel computes in float32)
  if (q.scalar_type() == at::kDouble) return shaw_forward_reference(q, k, v, table, causal, scale);
  PreparedShaw prepared;
  prepare_shaw(prepared, f32(q), f32(k), f32(v), table, causal, scale_of(q, scale));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> shaw_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool causal,
    std::optional<double> scale) {
  check_shaw(q, k, v, table);
  if (q.scalar_type() == at::kDouble)
    return shaw_backward_reference(grad_out, q, k, v, out, lse, table, causal, scale);
  PreparedShaw prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare_shaw(prepared, qh, kh, vh, table, causal, scale_of(q, scale));
  auto dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);
  at::Tensor dtable;  // [2K'+1, D] float32
  if (qh.numel() > 0 && kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable);
  const auto range = shaw_range(k, table);
  if (!dtable.defined()) dtable = at::zeros({2 * range.used + 1, table.size(1)}, at::kFloat);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
          shaw_full_dtable(dtable, range).to(table.scalar_type())};
}

at::Tensor shaw_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& table, bool causal,
                                    std::optional<double> scale) {
  return std::get<0>(shaw_forward_reference(q, k, v, table, causal, scale));
}

at::Tensor shaw_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& table, bool causal, std::optional<double> scale) {
  return std::get<0>(shaw_forward_cpu(q, k, v, table, causal, scale));
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
  m.def(
      "t5_attention(Tensor q, Tensor k, Tensor v, Tensor table, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None) -> Tensor");
  m.def(
      "_t5_attention_forward(Tensor q, Tensor k, Tensor v, Tensor table, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None) -> (Tensor, Tensor)");
  m.def(
      "_t5_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor table, bool bidirectional=True, int max_distance=128, "
      "bool causal=False, float? scale=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "shaw_attention(Tensor q, Tensor k, Tensor v, Tensor table, bool causal=False, "
      "float? scale=None) -> Tensor");
  m.def(
      "_shaw_attention_forward(Tensor q, Tensor k, Tensor v, Tensor table, bool causal=False, "
      "float? scale=None) -> (Tensor, Tensor)");
  m.def(
      "_shaw_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor table, bool causal=False, float? scale=None) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  m.impl("alibi_attention", TORCH_FN(alibi_attention_cpu));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_cpu));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_cpu));
  m.impl("t5_attention", TORCH_FN(t5_attention_cpu));
  m.impl("_t5_attention_forward", TORCH_FN(t5_forward_cpu));
  m.impl("_t5_attention_backward", TORCH_FN(t5_backward_cpu));
  m.impl("shaw_attention", TORCH_FN(shaw_attention_cpu));
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_cpu));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_cpu));
}

TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  m.impl("alibi_attention", TORCH_FN(alibi_attention_reference));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_reference));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_reference));
  m.impl("t5_attention", TORCH_FN(t5_attention_reference));
  m.impl("_t5_attention_forward", TORCH_FN(t5_forward_reference));
  m.impl("_t5_attention_backward", TORCH_FN(t5_backward_reference));
  m.impl("shaw_attention", TORCH_FN(shaw_attention_reference));
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_reference));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_reference));
}

}  // namespace posenc::ops
