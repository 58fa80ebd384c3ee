// The SDPA-layout attention operators (q [B, H, N, D]), the position bias computed on the fly:
// posenc::positional_attention (ALiBi, T5's buckets, RoPE, padding, packed ids; every part
// optional) and posenc::shaw_attention. posenc.alibi_attention and posenc.t5_attention (Python)
// are positional_attention with one bias part.
//
//   ALiBi (Press et al. 2022): - slope_h * d(i, j), d(i, j) = p_i - p_j (causal) or |p_i - p_j|
//   (symmetric), slopes [H], no gradient.
//   T5 (Raffel et al. 2020; transformers' T5Attention): + table[bucket(j - p_i), h], bucket = T5's
//   _relative_position_bucket(key minus query position, bidirectional, num_buckets =
//   table.size(0), max_distance) (src/functional/relative.cpp, bit-equal to transformers'),
//   table [num_buckets, H], float32 or q's dtype, with a gradient (dS summed per bucket and head).
//   The keys sit at positions 0..Nk-1 and the queries at Nk-Nq..Nk-1 (cached keys first, as
//   SDPA's lower-right causal mask: key j visible to query i when j <= i + Nk - Nq). scale None:
//   1/sqrt(D), as SDPA (T5 itself does not scale: pass 1.0).
//
// positional_attention is one operator over posenc::attention_fused's CPU and CUDA paths
// (src/kernels/dispatch/attention_fused_operator.h): its forward and backward hand q, k, v to
// _attention_fused_forward / _backward as [B, N, H, D] views, and route_positional
// (positional_route.h) decides, once for the operator, its backward and
// positional_attention_route, whether a call takes the tiled CPU kernel (RoPE inside its tiles,
// or q, k rotated first), the CUDA kernel (RoPE rotated first) or the plain-ATen reference here
// (float64, and what the kernels do not take).
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
//
// RoPE (Su et al. 2021) inside the same tiles, ALiBi and T5's bias summed in one pass, each part
// optional:
//
//   out[b,h,i] = sum_j softmax_j(rot_i(q_i) . rot_j(k_j) * scale - slope_h d(i, j)
//                                + table[bucket(j - p_i), h] + causal_ij) v_j
//   rot_n: apply_rotary's formula (rotary.h) with row n of cos, sin: [Nk, W] or [Bt, Nk, W]
//          (Bt 1 or B), the tables of transformers' rotary modules and of rope_cos_sin; W <= D
//          even, dims W.. pass through (partial rotary):
//          half:        [x0 .. x(W/2-1) | x(W/2) .. x(W-1)] pairs (i, i + W/2), rows cat(t, t)
//          interleaved: (x0, x1)(x2, x3) ..                  pairs (2i, 2i+1), rows t0 t0 t1 t1
//          keys at rows 0..Nk-1, queries at rows Nk-Nq..Nk-1 (the positions above).
//
// posenc::positional_attention(q, k, v, cos, sin, layout, slopes, symmetric, t5_table,
//                              bidirectional, max_distance, causal, scale) -> out
//   The kernel rotates q and k as it loads each tile and its backward rotates dq, dk back (no
//   rotated copy of q or k) wherever it can read the tables: one [Nk, F] per-pair table, i.e.
//   the batch rows of cos, sin equal and both members of every pair holding one value (what
//   transformers' tables hold). Otherwise q, k are rotated first by the same formula in float32
//   and rotated back after the backward; tables that require a gradient are rotated by
//   posenc::apply_rotary first (autograd/). float64: the plain-ATen reference in float64.
//   positional_attention_route(...) -> str says which path a call takes.
//   Packed samples and Moirai's binary variate bias (uni2ts' packed_attention_mask and
//   BinaryAttentionBias), last in the schema, optional:
//     sample_ids [B, Nk] int64: key j visible to query i only when sample_ids[b, j] ==
//       sample_ids[b, Nk - Nq + i] (each id one contiguous run per row; the kernel skips the
//       tiles whose runs do not meet);
//     variate_ids [B, Nk] int64 >= 0, variate_bias [2, H]: + variate_bias[1, h] on equal ids,
//       variate_bias[0, h] otherwise (row 0 different, row 1 same: Moirai's Embedding(2, H)
//       weight as is), with a gradient: two sums of dS per head.
//     causal_ids [B, Nk] int64: key j visible to query i only when causal_ids[b, j] <=
//       causal_ids[b, Nk - Nq + i] (causal in these ids instead of token order: Moirai-2's
//       packed_causal_attention_mask on time_id, whose variate-major packing is not in time
//       order); refused with causal=True (two causal rules). The kernel skips a tile whose keys'
//       smallest id exceeds its queries' largest.
//   The CUDA kernel reads sample_ids and the variate bias; causal_ids take the reference there.
// posenc::_positional_attention_forward(...) -> (out, lse [B, H, Nq]: float32, float64 for float64)
// posenc::_positional_attention_backward(grad_out, q, k, v, out, lse, ...)
//   -> (dq, dk, dv, dtable, dvariate_bias)
//   dtable: T5's [num_buckets, H] in the table's dtype; without a table an empty float32 [0];
//   dvariate_bias: [2, H] in variate_bias's dtype, without one an empty float32 [0].
// Every op above takes, last, `Tensor? attention_mask=None`: transformers' 2-D mask [B, Nk]
// (bool or integer; 1 = a key to attend to, 0 = padding), -inf on the padding keys' logits before
// the softmax, as SDPA's boolean mask. The kernel reads it as one byte per key (key_keep); a query
// that sees no key gets 0 and lse -inf. The positions stay 0..Nk-1.
// CUDA: positional_attention's CUDA kernel through attention_fused (a LibTorch with the CUDA glue)
// where route_positional sends it, the reference elsewhere; Shaw's query-dependent bias takes the
// reference.
// Autograd: autograd/attention_autograd.cpp; fake kernels: python/posenc/_meta.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <string>

#include "../kernels/cpu/attention_cpu.h"
#include "../kernels/dispatch/attention_fused_operator.h"
#include "../kernels/dispatch/operator_checks.h"
#include "posenc/functional/relative.h"
#include "posenc/functional/rope.h"
#include "positional_route.h"
#include "registration.h"
#include "rotary.h"

namespace posenc::ops {

namespace {

// Where the kernel reads positions: keys at 0 .. Nk-1, queries at the last Nq of them (a decode
// step's cached keys come first), as reals (ALiBi) and integers (T5, Shaw), and T5's
// offset -> bucket row. They live here as long as the problem that points at them.
struct KernelPositions {
  std::vector<double> pq, pk;
  std::vector<int64_t> iq, ik;
  at::Tensor buckets;  ///< [Nq + Nk - 1] int64: bucket of key-minus-query offset rel_min + r
};

// The kernel's problem and the positions it points at (every op of this file).
struct Prepared {
  detail::AttentionProblem p;
  KernelPositions pos;
};

void set_token_positions(detail::AttentionProblem& p, KernelPositions& pos) {
  pos.pk.resize(p.nk);
  pos.pq.resize(p.nq);
  pos.ik.resize(p.nk);
  pos.iq.resize(p.nq);
  for (int64_t j = 0; j < p.nk; ++j) pos.pk[j] = static_cast<double>(pos.ik[j] = j);
  for (int64_t i = 0; i < p.nq; ++i) pos.pq[i] = static_cast<double>(pos.iq[i] = p.nk - p.nq + i);
  p.pq = pos.pq.data();
  p.pk = pos.pk.data();
  p.iq = pos.iq.data();
  p.ik = pos.ik.data();
}

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

constexpr const char* kShaw = "posenc.shaw_attention";

// Every tensor argument of an attention operator on q's device
// (src/kernels/dispatch/operator_checks.h), in the schema's order: the forward's q, k, v and its
// tables (slopes, a bias table, rotary tables, the mask), the backward's grad_out, q, k, v, out,
// lse and the same tables.
void check_forward_devices(const char* op, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const std::vector<NamedTensor>& tables) {
  std::vector<NamedTensor> all{{"q", q}, {"k", k}, {"v", v}};
  all.insert(all.end(), tables.begin(), tables.end());
  check_same_device(op, all);
}
void check_backward_devices(const char* op, const at::Tensor& grad_out, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                            const at::Tensor& lse, const std::vector<NamedTensor>& tables) {
  std::vector<NamedTensor> all{{"grad_out", grad_out}, {"q", q},    {"k", k}, {"v", v},
                               {"out", out},           {"lse", lse}};
  all.insert(all.end(), tables.begin(), tables.end());
  check_same_device(op, all);
}

// The table [num_buckets, H] and the bucket parameters T5's formula accepts (HF does not check:
// max_distance <= the exact range gives NaN or negative buckets there). `op` and `arg` name the
// operator and the argument in the messages.
void check_bucket_table(const char* op, const char* arg, const at::Tensor& q,
                        const at::Tensor& table, bool bidirectional, int64_t max_distance) {
  TORCH_CHECK(table.dim() == 2 && table.size(1) == q.size(1), op, ": ", arg,
              " must be [num_buckets, H] = [num_buckets, ", q.size(1), "], got ", table.sizes());
  const int64_t num_buckets = table.size(0);
  const int64_t max_exact = (bidirectional ? num_buckets / 2 : num_buckets) / 2;
  TORCH_CHECK(max_exact >= 1, op, ": ", arg, ".size(0) (num_buckets) must be >= ",
              bidirectional ? "4 with bidirectional=True" : "2", ", got ", num_buckets);
  TORCH_CHECK(max_distance > max_exact, op, ": max_distance must exceed the ", "exact range ",
              max_exact, " (num_buckets=", num_buckets, bidirectional ? ", bidirectional" : "",
              "), got ", max_distance);
  TORCH_CHECK(table.scalar_type() == at::kFloat || table.scalar_type() == q.scalar_type(), op, ": ",
              arg, " must be float32 or q's dtype (", q.scalar_type(), "), got ",
              table.scalar_type());
  TORCH_CHECK(table.device() == q.device(), op, ": ", arg, " must be on q's device (", q.device(),
              "), got ", table.device());
}

// scale None: 1/sqrt(D), as SDPA; with D = 0 the dot products are empty sums (0) and SDPA's
// logits are the bias alone: any finite scale gives that (1/sqrt(0) would give 0 * inf = NaN).
double scale_of(const at::Tensor& q, std::optional<double> scale) {
  if (scale.has_value()) return *scale;
  return q.size(3) == 0 ? 1.0 : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
}

// transformers' 2-D attention_mask [B, Nk]: true / 1 = a key to attend to, false / 0 = padding
// (a key no query sees; a query that sees no key gets 0 and lse -inf, as SDPA gives it). bool or
// integer (what tokenizers return); an additive float mask is refused, not read as a boolean.
// Returned as bool on q's device; undefined when absent.
at::Tensor key_mask_of(const char* op, const at::Tensor& q, const at::Tensor& k,
                       const std::optional<at::Tensor>& attention_mask) {
  if (!attention_mask.has_value() || !attention_mask->defined()) return {};
  const auto& m = *attention_mask;
  TORCH_CHECK(m.dim() == 2 && m.size(0) == q.size(0) && m.size(1) == k.size(2), op,
              ": attention_mask must be [B, Nk] = [", q.size(0), ", ", k.size(2),
              "] (transformers' 2-D mask: 1 = a key to attend to, 0 = padding), got ", m.sizes());
  TORCH_CHECK(m.scalar_type() == at::kBool || at::isIntegralType(m.scalar_type(), false), op,
              ": attention_mask must be bool or integer (1 = attend, 0 = padding), got ",
              m.scalar_type(), "; an additive float mask is not taken");
  TORCH_CHECK(m.device() == q.device(), op, ": attention_mask must be on q's device (", q.device(),
              "), got ", m.device());
  if (m.scalar_type() == at::kBool) return m;
  if (m.numel() > 0) {
    const auto [lowest, highest] = at::aminmax(m);  // one pass
    const auto low = lowest.item<int64_t>(), high = highest.item<int64_t>();
    TORCH_CHECK(low >= 0 && high <= 1, op,
                ": attention_mask values must be 0 or 1, got values in [", low, ", ", high, "]");
  }
  return m.to(at::kBool);
}

// The kernel reads the mask as one byte per key: [B, Nk].
void set_key_mask(detail::AttentionProblem& p, const at::Tensor& mask) {
  if (!mask.defined()) return;
  const auto keep = mask.to(at::kCPU, at::kByte).contiguous();
  p.key_keep.assign(keep.const_data_ptr<uint8_t>(), keep.const_data_ptr<uint8_t>() + keep.numel());
}

// logits [B, H, Nq, Nk] with the padding keys at -inf (the reference's way of the same mask).
at::Tensor masked(const at::Tensor& logits, const at::Tensor& mask) {
  if (!mask.defined()) return logits;
  return logits.masked_fill(mask.logical_not().view({mask.size(0), 1, 1, mask.size(1)}),
                            -std::numeric_limits<double>::infinity());
}

at::Tensor f32(const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); }

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

std::tuple<at::Tensor, at::Tensor> shaw_forward_reference(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    bool causal, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kShaw, q, k, v, {{"table", table}, {"attention_mask", attention_mask}});
  check_shaw(q, k, v, table);
  return softmax_forward(q, v,
                         masked(shaw_logits_of(q, k, table, causal, scale_of(q, scale)).logits,
                                key_mask_of(kShaw, q, k, attention_mask)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> shaw_backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool causal,
    std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kShaw, grad_out, q, k, v, out, lse,
                         {{"table", table}, {"attention_mask", attention_mask}});
  check_shaw(q, k, v, table);
  const double s = scale_of(q, scale);
  const auto l = shaw_logits_of(q, k, table, causal, s);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse,
                                  masked(l.logits, key_mask_of(kShaw, q, k, attention_mask)), s);
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
using PreparedShaw = Prepared;

void prepare_shaw(PreparedShaw& out, const at::Tensor& qh, const at::Tensor& kh,
                  const at::Tensor& vh, const at::Tensor& table, bool causal, double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.table_form = BiasForm::kRelativeTable;
  p.causal = causal;
  set_token_positions(p, out.pos);
  const auto range = shaw_range(kh, table);
  p.max_relative = range.used;
  p.rel_scale = static_cast<float>(scale);  // (q . k + q . a) * scale: one scale for both
  p.rel_table = table.detach()
                    .narrow(0, range.max_relative - range.used, 2 * range.used + 1)
                    .to(at::kCPU, at::kFloat)
                    .contiguous();                                      // [2K'+1, D]
  p.qr = (at::matmul(qh, p.rel_table.t()) * p.rel_scale).contiguous();  // [B, H, Nq, 2K'+1]
}

std::tuple<at::Tensor, at::Tensor> shaw_forward_cpu(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    bool causal, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kShaw, q, k, v, {{"table", table}, {"attention_mask", attention_mask}});
  check_shaw(q, k, v, table);
  // float64: the exact reference (the kernel computes in float32)
  if (q.scalar_type() == at::kDouble)
    return shaw_forward_reference(q, k, v, table, causal, scale, attention_mask);
  PreparedShaw prepared;
  prepare_shaw(prepared, f32(q), f32(k), f32(v), table, causal, scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kShaw, q, k, attention_mask));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> shaw_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool causal,
    std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kShaw, grad_out, q, k, v, out, lse,
                         {{"table", table}, {"attention_mask", attention_mask}});
  check_shaw(q, k, v, table);
  if (q.scalar_type() == at::kDouble)
    return shaw_backward_reference(grad_out, q, k, v, out, lse, table, causal, scale,
                                   attention_mask);
  PreparedShaw prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare_shaw(prepared, qh, kh, vh, table, causal, scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kShaw, q, k, attention_mask));
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
                                    std::optional<double> scale,
                                    const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(shaw_forward_reference(q, k, v, table, causal, scale, attention_mask));
}

at::Tensor shaw_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& table, bool causal, std::optional<double> scale,
                              const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(shaw_forward_cpu(q, k, v, table, causal, scale, attention_mask));
}

// ---- positional: RoPE inside, ALiBi and T5 together -------------------------------------

// The optional parts of one positional_attention call, checked (undefined tensor: no part).
struct Positional {
  at::Tensor cos, sin;  ///< [Nk, W] or [Bt, Nk, W] (Bt 1 or B), apply_rotary's convention
  RopeLayout layout = RopeLayout::kHalf;
  at::Tensor slopes;  ///< [H]
  bool symmetric = false;
  at::Tensor table;  ///< T5's [num_buckets, H]
  bool bidirectional = true;
  int64_t max_distance = 128;
  bool causal = false;
  double scale = 1.0;
  at::Tensor mask;                     ///< [B, Nk] bool: transformers' attention_mask (key_mask_of)
  at::Tensor sample_ids, variate_ids;  ///< [B, Nk] integer (packed samples, variate bias)
  at::Tensor variate_bias;             ///< [2, H]
  at::Tensor causal_ids;               ///< [B, Nk] integer: causal on these ids
  bool packed() const {
    return sample_ids.defined() || variate_ids.defined() || causal_ids.defined();
  }
  bool rotary() const { return cos.defined() && cos.size(-1) > 0; }
};

constexpr const char* kPositional = "posenc.positional_attention";

RopeLayout positional_layout(c10::string_view layout) {
  const std::string name(layout);
  TORCH_CHECK(name == "half" || name == "neox" || name == "interleaved" || name == "gptj",
              kPositional, ": layout must be 'half' or 'interleaved', got '", name, "'");
  return rope_layout_from_string(name);
}

Positional positional_args(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
    c10::string_view layout, const std::optional<at::Tensor>& slopes, bool symmetric,
    const std::optional<at::Tensor>& t5_table, bool bidirectional, int64_t max_distance,
    bool causal, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask,
    const std::optional<at::Tensor>& sample_ids, const std::optional<at::Tensor>& variate_ids,
    const std::optional<at::Tensor>& variate_bias, const std::optional<at::Tensor>& causal_ids) {
  check_qkv(kPositional, q, k, v, /*allow_double=*/true);
  Positional a;
  a.layout = positional_layout(layout);
  const bool has_cos = cos.has_value() && cos->defined();
  const bool has_sin = sin.has_value() && sin->defined();
  TORCH_CHECK(has_cos == has_sin, kPositional, ": cos and sin go together; got ",
              has_cos ? "cos without sin" : "sin without cos");
  if (has_cos) {
    const int64_t nk = k.size(2);
    TORCH_CHECK(cos->sizes() == sin->sizes(), kPositional,
                ": cos and sin shapes differ: ", cos->sizes(), " vs ", sin->sizes());
    TORCH_CHECK((cos->dim() == 2 || cos->dim() == 3) && cos->size(-2) == nk, kPositional,
                ": cos, sin must be [Nk, W] or [B or 1, Nk, W] (rows for the key positions "
                "0..Nk-1) with Nk=",
                nk, ", got ", cos->sizes());
    TORCH_CHECK(cos->dim() == 2 || cos->size(0) == 1 || cos->size(0) == q.size(0), kPositional,
                ": cos, sin batch must be 1 or B=", q.size(0), ", got ", cos->sizes());
    const int64_t width = cos->size(-1);
    TORCH_CHECK(width % 2 == 0, kPositional, ": the rotary width cos.size(-1) must be even, got ",
                width);
    TORCH_CHECK(width <= q.size(3), kPositional, ": the rotary width cos.size(-1)=", width,
                " exceeds the head dim D=", q.size(3));
    for (const auto* t : {&*cos, &*sin}) {
      TORCH_CHECK(at::isFloatingType(t->scalar_type()), kPositional,
                  ": cos, sin must be floating point, got ", t->scalar_type());
      TORCH_CHECK(t->device() == q.device(), kPositional, ": cos, sin must be on q's device (",
                  q.device(), "), got ", t->device());
    }
    a.cos = *cos;
    a.sin = *sin;
  }
  if (slopes.has_value() && slopes->defined()) {
    TORCH_CHECK(slopes->dim() == 1 && slopes->size(0) == q.size(1), kPositional,
                ": slopes must be [H] = [", q.size(1), "], got ", slopes->sizes());
    TORCH_CHECK(at::isFloatingType(slopes->scalar_type()), kPositional,
                ": slopes must be floating point, got ", slopes->scalar_type());
    TORCH_CHECK(slopes->device() == q.device(), kPositional, ": slopes must be on q's device (",
                q.device(), "), got ", slopes->device());
    a.slopes = *slopes;
  }
  if (t5_table.has_value() && t5_table->defined()) {
    check_bucket_table(kPositional, "t5_table", q, *t5_table, bidirectional, max_distance);
    a.table = *t5_table;
  }
  a.symmetric = symmetric;
  a.bidirectional = bidirectional;
  a.max_distance = max_distance;
  a.causal = causal;
  a.scale = scale_of(q, scale);
  a.mask = key_mask_of(kPositional, q, k, attention_mask);
  const auto defined = [](const std::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() ? *t : at::Tensor();
  };
  a.sample_ids = defined(sample_ids);
  a.variate_ids = defined(variate_ids);
  a.variate_bias = defined(variate_bias);
  detail::check_packed_ids(kPositional, a.sample_ids, a.variate_ids, a.variate_bias, q.size(0),
                           k.size(2), q.size(1));
  a.causal_ids = defined(causal_ids);
  detail::check_causal_ids(kPositional, a.causal_ids, causal, q.size(0), q.size(2), k.size(2));
  return a;
}

// Rows [start, start + n) of a table as [Bt, 1, n, W], broadcasting over the heads of
// x [B, H, n, D] (queries: the last Nq rows; keys: all of them).
at::Tensor table_rows(const at::Tensor& t, int64_t start, int64_t n) {
  const auto t3 = t.dim() == 2 ? t.unsqueeze(0) : t;  // [Bt, Nk, W]
  return t3.narrow(1, start, n).unsqueeze(1);
}

// apply_rotary's formula (rotary.h): y[..., :W] = x[..., :W] * c + rot(x[..., :W]) * s, dims W..
// pass through; contiguous. The inverse (the gradient's way back): s -> -swap(s).
at::Tensor rotate_formula(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s,
                          RopeLayout layout) {
  const int64_t width = c.size(-1), dim = x.size(-1);
  if (width == 0) return x.contiguous();
  const auto rotary = x.narrow(-1, 0, width);
  auto y = rotary * c + rotate_half_any(rotary, layout) * s;
  if (width < dim) y = at::cat({y, x.narrow(-1, width, dim - width).to(y.scalar_type())}, -1);
  return y.contiguous();
}

// x [B, H, n, D] rotated by rows [start, start + n) of the tables, in x's dtype (inverse: R^T).
at::Tensor rotate_rows_of(const at::Tensor& x, const Positional& a, int64_t start, bool inverse) {
  const auto ct = x.scalar_type();
  const int64_t n = x.size(2);
  const auto c = table_rows(a.cos, start, n).to(ct);
  auto s = table_rows(a.sin, start, n).to(ct);
  if (inverse) s = -swap_pair_members(s, a.layout);
  return rotate_formula(x, c, s, a.layout);
}

// Why the tiled kernel cannot rotate inside its tiles ("" when it can): it reads one [N, F]
// per-pair table for q and one for k.
std::string positional_rotary_outside(const Positional& a) {
  if (!a.rotary()) return "";
  for (const auto* t : {&a.cos, &a.sin}) {
    if (t->dim() == 3 && t->size(0) > 1 && !at::equal(*t, t->narrow(0, 0, 1).expand_as(*t)))
      return "per-batch tables whose rows differ (the kernel reads one [Nk, W] table)";
    const int64_t width = t->size(-1), f = width / 2;
    const bool equal = a.layout == RopeLayout::kHalf
                           ? at::equal(t->narrow(-1, 0, f), t->narrow(-1, f, f))
                           : at::equal(t->slice(-1, 0, width, 2), t->slice(-1, 1, width, 2));
    if (!equal) return "the two members of a pair read different table values";
  }
  return "";
}

// The plain-ATen specification, in float32 (float64 for float64 q):
// logits = rot(q) rot(k)^T * scale - slope_h d(i, j) + table[bucket(j - p_i), h] + causal.
struct PositionalLogits {
  at::Tensor qr, kr;        ///< rotated q, k [B, H, N, D] in the compute dtype
  at::Tensor logits;        ///< [B, H, Nq, Nk]
  at::Tensor bucket;        ///< [Nq, Nk] int64 (a T5 table only)
  at::Tensor same_variate;  ///< [B, 1, Nq, Nk] bool (a variate bias only)
};

PositionalLogits positional_logits_of(const at::Tensor& q, const at::Tensor& k,
                                      const Positional& a) {
  const auto ct = q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t nq = q.size(2), nk = k.size(2), heads = q.size(1);
  PositionalLogits l;
  l.qr = q.to(ct);
  l.kr = k.to(ct);
  if (a.rotary()) {
    l.qr = rotate_rows_of(l.qr, a, nk - nq, /*inverse=*/false);
    l.kr = rotate_rows_of(l.kr, a, 0, /*inverse=*/false);
  }
  const auto longs = q.options().dtype(at::kLong);
  const auto rel =
      at::arange(nk, longs).unsqueeze(0) - at::arange(nk - nq, nk, longs).unsqueeze(1);  // [Nq, Nk]
  auto logits = at::matmul(l.qr, l.kr.transpose(-1, -2)) * a.scale;
  if (a.slopes.defined()) {  // -slope_h (p_i - p_j) or -slope_h |p_i - p_j|
    const auto d = (a.symmetric ? rel.abs() : -rel).to(ct);
    logits = logits - a.slopes.to(ct).view({-1, 1, 1}) * d;
  }
  if (a.table.defined()) {
    l.bucket = t5_relative_position_bucket(rel, a.bidirectional, a.table.size(0), a.max_distance);
    logits = logits + a.table.to(ct)
                          .index_select(0, l.bucket.reshape({-1}))
                          .view({nq, nk, heads})
                          .permute({2, 0, 1});  // [H, Nq, Nk]
  }
  if (a.variate_ids.defined()) {  // uni2ts: ~ind * weight[:1] + ind * weight[1:]
    const auto ids = a.variate_ids.to(at::kLong);
    l.same_variate = (ids.narrow(1, nk - nq, nq).unsqueeze(2) == ids.unsqueeze(1)).unsqueeze(1);
    const auto w = a.variate_bias.to(ct).view({2, 1, heads, 1, 1});
    logits = logits + (at::logical_not(l.same_variate) * w[0] + l.same_variate * w[1]);
  }
  if (a.causal) logits = logits.masked_fill(rel.gt(0), -std::numeric_limits<double>::infinity());
  if (a.sample_ids.defined()) {
    const auto ids = a.sample_ids.to(at::kLong);
    const auto visible = ids.narrow(1, nk - nq, nq).unsqueeze(2) == ids.unsqueeze(1);
    logits = logits.masked_fill(at::logical_not(visible).unsqueeze(1),
                                -std::numeric_limits<double>::infinity());
  }
  if (a.causal_ids.defined()) {  // uni2ts: time_id[..., None, :] <= time_id[..., :, None]
    const auto ids = a.causal_ids.to(at::kLong);
    const auto visible = ids.unsqueeze(1) <= ids.narrow(1, nk - nq, nq).unsqueeze(2);
    logits = logits.masked_fill(at::logical_not(visible).unsqueeze(1),
                                -std::numeric_limits<double>::infinity());
  }
  l.logits = masked(logits, a.mask);
  return l;
}

std::tuple<at::Tensor, at::Tensor> positional_forward_reference_of(const at::Tensor& q,
                                                                   const at::Tensor& k,
                                                                   const at::Tensor& v,
                                                                   const Positional& a) {
  auto [out, lse] = softmax_forward(q, v, positional_logits_of(q, k, a).logits);
  return {out.contiguous(), lse};
}

// variate_bias's gradient from dS [B, H, Nq, Nk]: the sums over the pairs of different / same
// ids, [2, H] in variate_bias's dtype; without a variate bias an empty float32 [0].
at::Tensor variate_gradient_of(const at::Tensor& ds, const PositionalLogits& l, const Positional& a,
                               const at::Tensor& q) {
  if (!a.variate_ids.defined()) return at::empty({0}, q.options().dtype(at::kFloat));
  const auto same = ds.masked_fill(at::logical_not(l.same_variate), 0).sum({0, 2, 3});
  const auto differ = ds.masked_fill(l.same_variate, 0).sum({0, 2, 3});
  return at::stack({differ, same}).to(a.variate_bias.scalar_type());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
positional_backward_reference_of(const at::Tensor& grad_out, const at::Tensor& q,
                                 const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                 const at::Tensor& lse, const Positional& a) {
  const auto l = positional_logits_of(q, k, a);
  const auto g = softmax_backward(grad_out, l.qr, l.kr, v, out, lse, l.logits, a.scale);
  auto dq = g.dq, dk = g.dk;  // for the rotated q', k': rotated back (R^T)
  if (a.rotary()) {
    dq = rotate_rows_of(dq, a, k.size(2) - q.size(2), /*inverse=*/true);
    dk = rotate_rows_of(dk, a, 0, /*inverse=*/true);
  }
  at::Tensor dtable = at::empty({0}, q.options().dtype(at::kFloat));
  if (a.table.defined()) {  // dtable[bucket(i, j), h] += sum_b dS[b, h, i, j]
    const int64_t heads = q.size(1);
    const auto dbias = g.ds.sum(0).permute({1, 2, 0}).reshape(
        {q.size(2) * k.size(2), heads});  // [Nq * Nk, H] (H may be 0)
    dtable = at::zeros({a.table.size(0), heads}, g.ds.options())
                 .index_add_(0, l.bucket.reshape({-1}), dbias)
                 .to(a.table.scalar_type());
  }
  return {dq.to(q.scalar_type()).contiguous(), dk.to(k.scalar_type()).contiguous(),
          g.dv.contiguous(), dtable, variate_gradient_of(g.ds, l, a, q)};
}

// The schema's optional parts, one spelling for the six functions below.
// The positional operators' table arguments, in the schema's order.
std::vector<NamedTensor> positional_tables(
    const std::optional<at::Tensor>& cos, const std::optional<at::Tensor>& sin,
    const std::optional<at::Tensor>& slopes, const std::optional<at::Tensor>& t5_table,
    const std::optional<at::Tensor>& attention_mask, const std::optional<at::Tensor>& sample_ids,
    const std::optional<at::Tensor>& variate_ids, const std::optional<at::Tensor>& variate_bias,
    const std::optional<at::Tensor>& causal_ids) {
  return {{"cos", cos},
          {"sin", sin},
          {"slopes", slopes},
          {"t5_table", t5_table},
          {"attention_mask", attention_mask},
          {"sample_ids", sample_ids},
          {"variate_ids", variate_ids},
          {"variate_bias", variate_bias},
          {"causal_ids", causal_ids}};
}

#define POSITIONAL_PARAMS                                                                       \
  const std::optional<at::Tensor>&cos, const std::optional<at::Tensor>&sin,                     \
      c10::string_view layout, const std::optional<at::Tensor>&slopes, bool symmetric,          \
      const std::optional<at::Tensor>&t5_table, bool bidirectional, int64_t max_distance,       \
      bool causal, std::optional<double> scale, const std::optional<at::Tensor>&attention_mask, \
      const std::optional<at::Tensor>&sample_ids, const std::optional<at::Tensor>&variate_ids,  \
      const std::optional<at::Tensor>&variate_bias, const std::optional<at::Tensor>&causal_ids
#define POSITIONAL_ARGS                                                                      \
  cos, sin, layout, slopes, symmetric, t5_table, bidirectional, max_distance, causal, scale, \
      attention_mask, sample_ids, variate_ids, variate_bias, causal_ids

// ---- the kernels: posenc::attention_fused's, in its layout ----------------------------------
// positional_attention is one operator over attention_fused's CPU and CUDA paths: q, k, v go to
// _attention_fused_forward / _backward as views in its layout [B, N, H, D] (SDPA's [B, H, N, D]
// transposed: no copy; its CPU kernel makes the float32 heads-first copy it always makes, its CUDA
// glue reads any strides), with the positions of SDPA's convention (keys 0..Nk-1, queries the last
// Nq), and come back transposed. Which path a call takes is route_positional's decision
// (positional_route.h): the tiled CPU kernel with RoPE inside its tiles (per-pair [N, W/2] tables)
// where it reads the tables, or q, k rotated first in float32 by the reference's formula (and the
// gradients rotated back: R^T) where it does not and on CUDA, where the kernel reads no tables.

PositionalCall positional_call(const at::Tensor& q, const at::Tensor& v, const Positional& a,
                               bool learned) {
  PositionalCall c;
  c.device = q.device().type();
  c.dtype = q.scalar_type();
  c.head_dim = q.size(3);
  c.value_dim = v.size(3);
  c.empty = q.numel() == 0;
  c.alibi = a.slopes.defined();
  c.t5 = a.table.defined();
  c.causal_ids = a.causal_ids.defined();
  c.rotary = a.rotary();
  c.learned_tables = learned;
  // the tables' values decide it (at::equal): read only where the CPU kernel could take them in
  if (c.rotary && !learned && c.device == c10::DeviceType::CPU)
    c.tables_unreadable = positional_rotary_outside(a);
#ifdef POSENC_HAS_CUDA_GLUE
  c.cuda_glue = true;
#endif
  return c;
}

// A call's arguments, checked, and the path it takes; the operators' tensors on the way in.
struct Routed {
  Positional a;
  PositionalRoute route;
};

Routed routed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, POSITIONAL_PARAMS) {
  Routed r{positional_args(q, k, v, POSITIONAL_ARGS), {}};
  r.route = route_positional(positional_call(q, v, r.a, /*learned=*/false));
  return r;
}

// attention_fused's arguments after (q, k, v) for one positional call.
struct FusedCall {
  at::Tensor q, k, v;                   ///< [B, N, H, D] views (rotated first: float32, contiguous)
  at::Tensor q_positions, k_positions;  ///< [Nq], [Nk] float64 on the CPU (the glue moves them)
  std::optional<at::Tensor> q_cos, q_sin, k_cos, k_sin;  ///< RoPE inside: per-pair [N, W/2]
};

FusedCall fused_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const Routed& r) {
  const auto& a = r.a;
  const int64_t nq = q.size(2), nk = k.size(2);
  FusedCall f;
  auto qh = q, kh = k;
  if (r.route.rotate_first) {  // the reference's rotation, in float32
    qh = rotate_rows_of(q.to(at::kFloat), a, nk - nq, /*inverse=*/false);
    kh = rotate_rows_of(k.to(at::kFloat), a, 0, /*inverse=*/false);
  }
  f.q = qh.transpose(1, 2);
  f.k = kh.transpose(1, 2);
  f.v = (r.route.rotate_first ? v.to(at::kFloat) : v).transpose(1, 2);
  f.k_positions = at::arange(nk, at::TensorOptions().dtype(at::kDouble));
  f.q_positions = f.k_positions.narrow(0, nk - nq, nq);
  if (r.route.rope_inside) {  // one member of each pair (both read the same), constants
    const int64_t width = a.cos.size(-1), pairs = width / 2;
    const auto per_pair = [&](const at::Tensor& t) {
      const auto t2 = t.dim() == 3 ? t[0] : t;  // [Nk, W]: the batch rows are equal
      return f32(a.layout == RopeLayout::kHalf ? t2.narrow(-1, 0, pairs)
                                               : t2.slice(-1, 0, width, 2));
    };
    f.k_cos = per_pair(a.cos);
    f.k_sin = per_pair(a.sin);
    f.q_cos = f.k_cos->narrow(0, nk - nq, nq);  // the queries' rows: the last Nq
    f.q_sin = f.k_sin->narrow(0, nk - nq, nq);
  }
  return f;
}

std::optional<at::Tensor> given(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// attention_fused's parameters after (q, k, v), in its schema's order.
#define POSENC_FUSED_ARGS(f, a)                                                              \
  f.q_positions, f.k_positions, given(a.slopes), a.symmetric, given(a.table),                \
      a.table.defined() ? "bucket_table" : "none", a.table.defined() ? a.table.size(0) : 0,  \
      a.max_distance, a.bidirectional, /*max_relative_position=*/0, a.causal, given(a.mask), \
      a.scale, f.q_cos, f.q_sin, f.k_cos, f.k_sin, to_string(a.layout), given(a.sample_ids), \
      given(a.variate_ids), given(a.variate_bias), given(a.causal_ids)

std::tuple<at::Tensor, at::Tensor> positional_forward(const at::Tensor& q, const at::Tensor& k,
                                                      const at::Tensor& v, POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  const auto r = routed(q, k, v, POSITIONAL_ARGS);
  if (r.route.path == PositionalPath::kReference)
    return positional_forward_reference_of(q, k, v, r.a);
  const auto f = fused_call(q, k, v, r);
  // out [B, Nq, H, Dv]: float32 from the CPU kernel (the accumulator's values), the kernel's
  // input dtype from CUDA; lse [B, H, Nq]
  auto [out, lse] = attention_fused_forward_op().call(f.q, f.k, f.v, POSENC_FUSED_ARGS(f, r.a));
  return {out.transpose(1, 2).to(q.scalar_type()).contiguous(), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> positional_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, POSITIONAL_PARAMS) {
  check_backward_devices(kPositional, grad_out, q, k, v, out, lse,
                         positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                           variate_ids, variate_bias, causal_ids));
  const auto r = routed(q, k, v, POSITIONAL_ARGS);
  // nothing to differentiate (no query or no key): the reference's zeros in every shape
  if (r.route.path == PositionalPath::kReference || q.numel() == 0 || k.numel() == 0)
    return positional_backward_reference_of(grad_out, q, k, v, out, lse, r.a);
  const auto f = fused_call(q, k, v, r);
  const auto st = f.q.scalar_type();  // the CUDA kernel reads out and grad_out in q's dtype
  auto [dq, dk, dv, dtable, dvariate] = attention_fused_backward_op().call(
      grad_out.to(st).transpose(1, 2), out.to(st).transpose(1, 2), lse, f.q, f.k, f.v,
      POSENC_FUSED_ARGS(f, r.a));  // [B, N, H, D]
  dq = dq.transpose(1, 2);
  dk = dk.transpose(1, 2);
  if (r.route.rotate_first) {  // gradients of the rotated q', k': rotated back (R^T)
    dq = rotate_rows_of(dq.to(at::kFloat), r.a, k.size(2) - q.size(2), /*inverse=*/true);
    dk = rotate_rows_of(dk.to(at::kFloat), r.a, 0, /*inverse=*/true);
  }
  return {dq.to(q.scalar_type()).contiguous(), dk.to(k.scalar_type()).contiguous(),
          dv.transpose(1, 2).to(v.scalar_type()).contiguous(), dtable, dvariate};
}

#undef POSENC_FUSED_ARGS

at::Tensor positional_attention_kernel(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, POSITIONAL_PARAMS) {
  return std::get<0>(positional_forward(q, k, v, POSITIONAL_ARGS));
}

// Which path a call takes, and why (inspection; python/posenc/routes.py reads the line as an
// AttentionRoute): describe(route_positional(...)), the decision the operator itself reads, with
// tables that require a gradient (under grad mode) rotated by apply_rotary first (the Autograd
// kernel does that).
std::string positional_attention_route(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  const bool learned =
      at::GradMode::is_enabled() && a.rotary() && (a.cos.requires_grad() || a.sin.requires_grad());
  return describe(route_positional(positional_call(q, v, a, learned)));
}

#undef POSITIONAL_ARGS
#undef POSITIONAL_PARAMS

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "shaw_attention(Tensor q, Tensor k, Tensor v, Tensor table, bool causal=False, "
      "float? scale=None, Tensor? attention_mask=None) -> Tensor");
  m.def(
      "_shaw_attention_forward(Tensor q, Tensor k, Tensor v, Tensor table, bool causal=False, "
      "float? scale=None, Tensor? attention_mask=None) -> (Tensor, Tensor)");
  m.def(
      "_shaw_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor table, bool causal=False, float? scale=None, Tensor? "
      "attention_mask=None) -> "
      "(Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "positional_attention(Tensor q, Tensor k, Tensor v, Tensor? cos=None, Tensor? sin=None, str "
      "layout=\"half\", "
      "Tensor? slopes=None, bool symmetric=False, Tensor? t5_table=None, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None, "
      "Tensor? sample_ids=None, Tensor? variate_ids=None, Tensor? variate_bias=None, "
      "Tensor? causal_ids=None) -> "
      "Tensor");
  m.def(
      "_positional_attention_forward(Tensor q, Tensor k, Tensor v, Tensor? cos=None, Tensor? "
      "sin=None, str layout=\"half\", "
      "Tensor? slopes=None, bool symmetric=False, Tensor? t5_table=None, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None, "
      "Tensor? sample_ids=None, Tensor? variate_ids=None, Tensor? variate_bias=None, "
      "Tensor? causal_ids=None) -> "
      "(Tensor, Tensor)");
  m.def(
      "_positional_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor? cos=None, Tensor? sin=None, str layout=\"half\", "
      "Tensor? slopes=None, bool symmetric=False, Tensor? t5_table=None, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None, "
      "Tensor? sample_ids=None, Tensor? variate_ids=None, Tensor? variate_bias=None, "
      "Tensor? causal_ids=None) -> "
      "(Tensor, Tensor, Tensor, "
      "Tensor, Tensor)");
  // Which path positional_attention takes and why (inspection; any device).
  m.def(
      "positional_attention_route(Tensor q, Tensor k, Tensor v, Tensor? cos=None, Tensor? "
      "sin=None, str layout=\"half\", "
      "Tensor? slopes=None, bool symmetric=False, Tensor? t5_table=None, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None, "
      "Tensor? sample_ids=None, Tensor? variate_ids=None, Tensor? variate_bias=None, "
      "Tensor? causal_ids=None) -> "
      "str",
      TORCH_FN(positional_attention_route));
}

POSENC_LIBRARY_IMPL(CPU, m) {
  m.impl("shaw_attention", TORCH_FN(shaw_attention_cpu));
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_cpu));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_cpu));
  m.impl("positional_attention", TORCH_FN(positional_attention_kernel));
  m.impl("_positional_attention_forward", TORCH_FN(positional_forward));
  m.impl("_positional_attention_backward", TORCH_FN(positional_backward));
}

// CUDA: the same functions (route_positional sends a call to the CUDA kernel through
// attention_fused, or to the reference: a LibTorch without the CUDA glue, or a call the kernel does
// not take); Shaw's query-dependent bias takes the reference.
POSENC_LIBRARY_IMPL(CUDA, m) {
  m.impl("positional_attention", TORCH_FN(positional_attention_kernel));
  m.impl("_positional_attention_forward", TORCH_FN(positional_forward));
  m.impl("_positional_attention_backward", TORCH_FN(positional_backward));
  m.impl("shaw_attention", TORCH_FN(shaw_attention_reference));
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_reference));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_reference));
}

}  // namespace posenc::ops
