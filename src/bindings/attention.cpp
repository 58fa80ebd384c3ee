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
//   [H, Nq + Nk - 1] table, instead of an [H, Nq, Nk] bias.
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
//   CUDA takes them on the reference path (the CUDA kernel does not read them yet).
// posenc::_positional_attention_forward(...) -> (out, lse [B, H, Nq]: float32, float64 for float64)
// posenc::_positional_attention_backward(grad_out, q, k, v, out, lse, ...)
//   -> (dq, dk, dv, dtable, dvariate_bias)
//   dtable: T5's [num_buckets, H] in the table's dtype; without a table an empty float32 [0];
//   dvariate_bias: [2, H] in variate_bias's dtype, without one an empty float32 [0].
// Every op above takes, last, `Tensor? attention_mask=None`: transformers' 2-D mask [B, Nk]
// (bool or integer; 1 = a key to attend to, 0 = padding), -inf on the padding keys' logits before
// the softmax, as SDPA's boolean mask. The kernel reads it as one byte per key (key_keep); a query
// that sees no key gets 0 and lse -inf. The positions stay 0..Nk-1.
// CUDA (a LibTorch with CUDA): alibi, t5 and positional run the CUDA kernel
// (src/kernels/cuda/attention_cuda.cu) where it takes the call, RoPE applied before it (see
// cuda_kernel_takes below); Shaw's query-dependent bias and the rest take the reference.
// Autograd: autograd/attention_autograd.cpp; fake kernels: python/posenc/_meta.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <string>

#include "../kernels/cpu/attention_cpu.h"
#ifdef POSENC_HAS_CUDA_GLUE
#include "../kernels/cuda/cuda_glue.h"
#endif
#include "../kernels/dispatch/operator_checks.h"
#include "posenc/functional/relative.h"
#include "posenc/functional/rope.h"
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

// ALiBi: one slope per head.
void set_alibi(detail::AttentionProblem& p, const at::Tensor& slopes, bool symmetric) {
  p.alibi = true;
  p.symmetric = symmetric;
  const auto s = slopes.detach().to(at::kCPU, at::kFloat).contiguous();
  p.slopes.assign(s.const_data_ptr<float>(), s.const_data_ptr<float>() + s.numel());
}

// T5: the bucket of each key-minus-query offset that occurs, and the table read through it as a
// per-head lookup [H, rel_count].
void set_t5_table(detail::AttentionProblem& p, KernelPositions& pos, const at::Tensor& table,
                  bool bidirectional, int64_t max_distance) {
  p.table_form = BiasForm::kBucketTable;
  const auto offsets =
      t5_offset_buckets(at::arange(p.nk - p.nq, p.nk, at::kLong), at::arange(p.nk, at::kLong),
                        bidirectional, table.size(0), max_distance);
  pos.buckets = offsets.buckets.contiguous();
  p.rel_min = offsets.offset_min;
  p.rel_count = pos.buckets.numel();
  p.bucket = pos.buckets.const_data_ptr<int64_t>();
  p.num_buckets = table.size(0);
  const auto lut = table.detach()
                       .to(at::kCPU, at::kFloat)
                       .index_select(0, pos.buckets)
                       .t()
                       .contiguous();  // [H, rel_count]
  p.lut.assign(lut.const_data_ptr<float>(), lut.const_data_ptr<float>() + lut.numel());
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

constexpr const char* kAlibi = "posenc.alibi_attention";
constexpr const char* kT5 = "posenc.t5_attention";
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

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor& slopes) {
  check_qkv("posenc.alibi_attention", q, k, v);
  TORCH_CHECK(slopes.dim() == 1 && slopes.size(0) == q.size(1),
              "posenc.alibi_attention: slopes must be [H] = [", q.size(1), "], got ",
              slopes.sizes());
  TORCH_CHECK(at::isFloatingType(slopes.scalar_type()),
              "posenc.alibi_attention: slopes must be floating point, got ", slopes.scalar_type());
  check_forward_devices(kAlibi, q, k, v, {{"slopes", slopes}});
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

void check_t5(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& table, bool bidirectional, int64_t max_distance) {
  check_qkv("posenc.t5_attention", q, k, v);
  check_bucket_table("posenc.t5_attention", "table", q, table, bidirectional, max_distance);
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

// The kernel's problem; the position vectors live in `out` as long as the problem is used.
void prepare(Prepared& out, const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh,
             const at::Tensor& slopes, bool causal, bool symmetric, double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.causal = causal;
  set_token_positions(p, out.pos);
  set_alibi(p, slopes, symmetric);
}

at::Tensor f32(const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); }

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& slopes,
                                               bool causal, bool symmetric,
                                               std::optional<double> scale,
                                               const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kAlibi, q, k, v, {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  Prepared prepared;
  prepare(prepared, f32(q), f32(k), f32(v), slopes, causal, symmetric, scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kAlibi, q, k, attention_mask));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kAlibi, grad_out, q, k, v, out, lse,
                         {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  Prepared prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare(prepared, qh, kh, vh, slopes, causal, symmetric, scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kAlibi, q, k, attention_mask));
  auto dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);
  at::Tensor dtable;
  if (qh.numel() > 0 && kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

// The plain-ATen specification of the two ops (the bias materialized, [H, Nq, Nk]): the CUDA
// registration where the CUDA kernel does not take a call, and the formula the CPU kernel is tested
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

std::tuple<at::Tensor, at::Tensor> forward_reference(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slopes,
    bool causal, bool symmetric, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kAlibi, q, k, v, {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  return softmax_forward(q, v,
                         masked(logits_of(q, k, slopes, causal, symmetric, scale_of(q, scale)),
                                key_mask_of(kAlibi, q, k, attention_mask)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kAlibi, grad_out, q, k, v, out, lse,
                         {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  const double s = scale_of(q, scale);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse,
                                  masked(logits_of(q, k, slopes, causal, symmetric, s),
                                         key_mask_of(kAlibi, q, k, attention_mask)),
                                  s);
  return {g.dq, g.dk, g.dv};
}

at::Tensor alibi_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& slopes, bool causal, bool symmetric,
                                     std::optional<double> scale,
                                     const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(forward_reference(q, k, v, slopes, causal, symmetric, scale, attention_mask));
}

at::Tensor alibi_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& slopes, bool causal, bool symmetric,
                               std::optional<double> scale,
                               const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(forward_cpu(q, k, v, slopes, causal, symmetric, scale, attention_mask));
}

// ---- T5 -----------------------------------------------------------------------------------

using PreparedT5 = Prepared;

void prepare_t5(PreparedT5& out, const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh,
                const at::Tensor& table, bool bidirectional, int64_t max_distance, bool causal,
                double scale) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.causal = causal;
  set_token_positions(p, out.pos);
  set_t5_table(p, out.pos, table, bidirectional, max_distance);
}

std::tuple<at::Tensor, at::Tensor> t5_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, const at::Tensor& table,
                                                  bool bidirectional, int64_t max_distance,
                                                  bool causal, std::optional<double> scale,
                                                  const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kT5, q, k, v, {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  PreparedT5 prepared;
  prepare_t5(prepared, f32(q), f32(k), f32(v), table, bidirectional, max_distance, causal,
             scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kT5, q, k, attention_mask));
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> t5_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool bidirectional,
    int64_t max_distance, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kT5, grad_out, q, k, v, out, lse,
                         {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  PreparedT5 prepared;
  auto qh = f32(q), kh = f32(k), vh = f32(v);
  prepare_t5(prepared, qh, kh, vh, table, bidirectional, max_distance, causal, scale_of(q, scale));
  set_key_mask(prepared.p, key_mask_of(kT5, q, k, attention_mask));
  auto dq = at::zeros_like(qh), dk = at::zeros_like(kh), dv = at::zeros_like(vh);
  at::Tensor dtable;
  if (qh.numel() > 0 && kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable);
  if (!dtable.defined()) dtable = at::zeros({table.size(0), table.size(1)}, at::kFloat);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
          dtable.to(table.scalar_type())};
}

// The plain-ATen T5 specification (bias [H, Nq, Nk] materialized).
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

std::tuple<at::Tensor, at::Tensor> t5_forward_reference(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    bool bidirectional, int64_t max_distance, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kT5, q, k, v, {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  const auto [rel, bucket] = t5_rel_and_bucket(q, k, table, bidirectional, max_distance);
  return softmax_forward(q, v,
                         masked(t5_logits_of(q, k, table, bucket, rel, causal, scale_of(q, scale)),
                                key_mask_of(kT5, q, k, attention_mask)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> t5_backward_reference(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool bidirectional,
    int64_t max_distance, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kT5, grad_out, q, k, v, out, lse,
                         {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  const double s = scale_of(q, scale);
  const auto [rel, bucket] = t5_rel_and_bucket(q, k, table, bidirectional, max_distance);
  const auto g = softmax_backward(grad_out, q, k, v, out, lse,
                                  masked(t5_logits_of(q, k, table, bucket, rel, causal, s),
                                         key_mask_of(kT5, q, k, attention_mask)),
                                  s);
  // dtable[bucket(i, j), h] += sum_b dS[b, h, i, j]
  const int64_t heads = q.size(1);
  const auto dbias = g.ds.sum(0).permute({1, 2, 0}).reshape(
      {q.size(2) * k.size(2), heads});  // [Nq * Nk, H] (H may be 0)
  const auto dtable =
      at::zeros({table.size(0), heads}, g.ds.options()).index_add_(0, bucket.reshape({-1}), dbias);
  return {g.dq, g.dk, g.dv, dtable.to(table.scalar_type())};
}

at::Tensor t5_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& table, bool bidirectional, int64_t max_distance,
                                  bool causal, std::optional<double> scale,
                                  const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(t5_forward_reference(q, k, v, table, bidirectional, max_distance, causal,
                                          scale, attention_mask));
}

at::Tensor t5_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& table, bool bidirectional, int64_t max_distance,
                            bool causal, std::optional<double> scale,
                            const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(
      t5_forward_cpu(q, k, v, table, bidirectional, max_distance, causal, scale, attention_mask));
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

// The reference instead of the kernel: float64 (exact), not on the CPU, or an empty head dim.
std::string positional_reference_reason(const at::Tensor& q, const at::Tensor& v) {
  if (q.scalar_type() == at::kDouble) return "float64 (the kernel computes in float32)";
  if (!q.device().is_cpu()) return "not on the CPU";
  if (q.numel() > 0 && (q.size(3) == 0 || v.size(3) == 0)) return "a head dim of 0";
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

// The kernel's problem: ALiBi and T5 parts, positions, and (rotary_inside) the per-pair tables.
using PreparedPositional = Prepared;

void prepare_positional(PreparedPositional& out, const at::Tensor& qh, const at::Tensor& kh,
                        const at::Tensor& vh, const Positional& a, bool rotary_inside) {
  auto& p = out.p;
  detail::set_tensors(p, qh, kh, vh, a.scale);
  p.causal = a.causal;
  set_token_positions(p, out.pos);
  if (a.slopes.defined()) set_alibi(p, a.slopes, a.symmetric);
  if (a.table.defined()) set_t5_table(p, out.pos, a.table, a.bidirectional, a.max_distance);
  set_key_mask(p, a.mask);
  detail::set_packed(p, kPositional, a.sample_ids, a.variate_ids, a.variate_bias);
  detail::set_causal_ids(p, kPositional, a.causal_ids);
  if (rotary_inside) {  // per-pair tables [N, F]: one member of each pair (both read the same)
    const int64_t width = a.cos.size(-1), pairs = width / 2;
    const auto per_pair = [&](const at::Tensor& t) {
      const auto t2 = t.dim() == 3 ? t[0] : t;  // [Nk, W]
      return a.layout == RopeLayout::kHalf ? t2.narrow(-1, 0, pairs) : t2.slice(-1, 0, width, 2);
    };
    const auto cos = per_pair(a.cos), sin = per_pair(a.sin);  // [Nk, F]
    p.rotary = true;
    p.rotary_pairs = pairs;
    p.rotary_interleaved = a.layout == RopeLayout::kInterleaved;
    p.k_cos = f32(cos);
    p.k_sin = f32(sin);
    p.q_cos = f32(cos.narrow(0, p.nk - p.nq, p.nq));  // the queries' rows: the last Nq
    p.q_sin = f32(sin.narrow(0, p.nk - p.nq, p.nq));
  }
}

// q, k as the kernel reads them (float32), rotated here when the tables cannot go inside.
struct KernelInputs {
  at::Tensor qh, kh, vh;
  bool rotary_inside = false, rotary_outside = false;
};

KernelInputs kernel_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const Positional& a) {
  KernelInputs in{f32(q), f32(k), f32(v)};
  if (!a.rotary() || q.numel() == 0) return in;
  if (positional_rotary_outside(a).empty()) {
    in.rotary_inside = true;
  } else {
    in.rotary_outside = true;
    in.qh = rotate_rows_of(in.qh, a, k.size(2) - q.size(2), /*inverse=*/false);
    in.kh = rotate_rows_of(in.kh, a, 0, /*inverse=*/false);
  }
  return in;
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

std::tuple<at::Tensor, at::Tensor> positional_forward_reference(const at::Tensor& q,
                                                                const at::Tensor& k,
                                                                const at::Tensor& v,
                                                                POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  return positional_forward_reference_of(q, k, v, positional_args(q, k, v, POSITIONAL_ARGS));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
positional_backward_reference(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                              POSITIONAL_PARAMS) {
  check_backward_devices(kPositional, grad_out, q, k, v, out, lse,
                         positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                           variate_ids, variate_bias, causal_ids));
  return positional_backward_reference_of(grad_out, q, k, v, out, lse,
                                          positional_args(q, k, v, POSITIONAL_ARGS));
}

std::tuple<at::Tensor, at::Tensor> positional_forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& v, POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  if (!positional_reference_reason(q, v).empty())
    return positional_forward_reference_of(q, k, v, a);
  const auto in = kernel_inputs(q, k, v, a);
  PreparedPositional prepared;
  prepare_positional(prepared, in.qh, in.kh, in.vh, a, in.rotary_inside);
  const auto& p = prepared.p;
  auto out = at::empty({p.batch, p.heads, p.nq, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  if (out.numel() > 0) detail::attention_forward_cpu(p, out, lse);
  return {out.to(q.scalar_type()), lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> positional_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, POSITIONAL_PARAMS) {
  check_backward_devices(kPositional, grad_out, q, k, v, out, lse,
                         positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                           variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  if (!positional_reference_reason(q, v).empty())
    return positional_backward_reference_of(grad_out, q, k, v, out, lse, a);
  const auto in = kernel_inputs(q, k, v, a);
  PreparedPositional prepared;
  prepare_positional(prepared, in.qh, in.kh, in.vh, a, in.rotary_inside);
  auto dq = at::zeros_like(in.qh), dk = at::zeros_like(in.kh), dv = at::zeros_like(in.vh);
  at::Tensor dtable;    // [num_buckets, H] float32 with a T5 table
  at::Tensor dvariate;  // [2, H] float32 with a variate bias
  if (in.qh.numel() > 0 && in.kh.numel() > 0)
    detail::attention_backward_cpu(prepared.p, f32(out), lse.contiguous(), f32(grad_out), dq, dk,
                                   dv, dtable,
                                   &dvariate);  // rotated back inside when rotary_inside
  if (in.rotary_outside) {
    dq = rotate_rows_of(dq, a, k.size(2) - q.size(2), /*inverse=*/true);
    dk = rotate_rows_of(dk, a, 0, /*inverse=*/true);
  }
  if (a.table.defined()) {
    if (!dtable.defined()) dtable = at::zeros({a.table.size(0), a.table.size(1)}, at::kFloat);
    dtable = dtable.to(a.table.scalar_type());
  } else {
    dtable = at::empty({0}, q.options().dtype(at::kFloat));
  }
  if (a.variate_ids.defined()) {
    if (!dvariate.defined()) dvariate = at::zeros({2, q.size(1)}, at::kFloat);
    dvariate = dvariate.to(a.variate_bias.scalar_type());
  } else {
    dvariate = at::empty({0}, q.options().dtype(at::kFloat));
  }
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dtable, dvariate};
}

at::Tensor positional_attention_reference(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, POSITIONAL_PARAMS) {
  return std::get<0>(positional_forward_reference(q, k, v, POSITIONAL_ARGS));
}

at::Tensor positional_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    POSITIONAL_PARAMS) {
  return std::get<0>(positional_forward_cpu(q, k, v, POSITIONAL_ARGS));
}

// ---- CUDA: the fused CUDA kernel (src/kernels/cuda/, through cuda_glue.h) ---------------------
#ifdef POSENC_HAS_CUDA_GLUE
// The ops' SDPA layout [B, H, N, D] is the kernel's [B, N, H, D] transposed (the glue takes any
// strides with a contiguous last dim: tests/cuda_emu/test_tensor_launch_emu.cpp runs it on such
// views), with the ops' positions (keys 0..Nk-1, queries Nk-Nq..Nk-1) and one bias part, ALiBi or
// T5. RoPE is applied first by the reference's formula in float32 (rotate_rows_of) and the
// gradients rotated back; q, k, v then go to the kernel as float32 (it accumulates in float32 for
// every storage type, so this changes no result). The reference stays where the kernel does not
// go: float64, head dims of 0 or above cuda::kAttentionMaxDim, or ALiBi and T5 together.
bool cuda_kernel_takes(const at::Tensor& q, const at::Tensor& v, const Positional& a) {
  return detail::attention_cuda_supported(q) && v.size(3) > 0 && q.size(3) > 0 &&
         detail::attention_cuda_supported(v) && !(a.slopes.defined() && a.table.defined()) &&
         !a.causal_ids.defined();
}

BiasSpec cuda_bias_of(const Positional& a) {
  BiasSpec spec;
  if (a.slopes.defined()) {
    spec.form = BiasForm::kAlibi;
    spec.slopes = a.slopes;
    spec.symmetric = a.symmetric;
  } else if (a.table.defined()) {
    spec.form = BiasForm::kBucketTable;
    spec.table = a.table;
    spec.num_buckets = a.table.size(0);
    spec.max_distance = a.max_distance;
    spec.bidirectional = a.bidirectional;
  }
  return spec;
}

struct CudaProblem {
  at::Tensor qh, kh, vh;                ///< [B, H, N, D] as the kernel reads them (rotated)
  at::Tensor q_positions, k_positions;  ///< [Nq], [Nk] float64 (the glue moves them)
  BiasSpec spec;
  AttentionMasks masks;
};

CudaProblem cuda_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const Positional& a) {
  CudaProblem c;
  const int64_t nq = q.size(2), nk = k.size(2);
  c.qh = q;
  c.kh = k;
  c.vh = v;
  if (a.rotary()) {  // the reference's rotation, in float32
    c.qh = rotate_rows_of(q.to(at::kFloat), a, nk - nq, /*inverse=*/false);
    c.kh = rotate_rows_of(k.to(at::kFloat), a, 0, /*inverse=*/false);
    c.vh = v.to(at::kFloat);
  }
  c.k_positions = at::arange(nk, at::TensorOptions().dtype(at::kDouble));
  c.q_positions = c.k_positions.narrow(0, nk - nq, nq);
  c.spec = cuda_bias_of(a);
  c.masks.causal = a.causal;
  c.masks.key_padding = a.mask;
  c.masks.sample_ids = a.sample_ids;  // packed samples and the variate bias: the kernel reads them
  c.masks.variate_ids = a.variate_ids;
  c.masks.variate_bias = a.variate_bias;
  return c;
}

std::tuple<at::Tensor, at::Tensor> cuda_forward_of(const at::Tensor& q, const at::Tensor& k,
                                                   const at::Tensor& v, const Positional& a) {
  const auto c = cuda_problem(q, k, v, a);
  auto [out, lse] = detail::attention_forward_cuda(
      c.qh.transpose(1, 2), c.kh.transpose(1, 2), c.vh.transpose(1, 2), c.spec.table, c.spec,
      c.q_positions, c.k_positions, c.masks, a.scale);  // out [B, Nq, H, Dv]
  return {out.transpose(1, 2).to(q.scalar_type()).contiguous(), lse};
}

// (dq, dk, dv, dtable: T5's in the table's dtype, else undefined); *dvariate (when given):
// variate_bias's gradient on its device, in its dtype, or an empty float32 [0] without one
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> cuda_backward_of(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const Positional& a,
    at::Tensor* dvariate = nullptr) {
  const auto c = cuda_problem(q, k, v, a);
  const auto st = c.qh.scalar_type();
  auto [dq, dk, dv, dtable] = detail::attention_backward_cuda(
      grad_out.to(st).transpose(1, 2), out.to(st).transpose(1, 2), lse, c.qh.transpose(1, 2),
      c.kh.transpose(1, 2), c.vh.transpose(1, 2), c.spec.table, c.spec, c.q_positions,
      c.k_positions, c.masks, a.scale, dvariate);  // [B, N, H, D]
  if (dvariate != nullptr)
    *dvariate = a.variate_ids.defined() ? dvariate->to(a.variate_bias.options())
                                        : at::empty({0}, q.options().dtype(at::kFloat));
  dq = dq.transpose(1, 2);
  dk = dk.transpose(1, 2);
  dv = dv.transpose(1, 2);
  if (a.rotary()) {  // gradients of the rotated q', k': rotated back (R^T)
    dq = rotate_rows_of(dq.to(at::kFloat), a, k.size(2) - q.size(2), /*inverse=*/true);
    dk = rotate_rows_of(dk.to(at::kFloat), a, 0, /*inverse=*/true);
  }
  if (a.table.defined()) {
    if (!dtable.defined())
      dtable = at::zeros({a.table.size(0), a.table.size(1)}, a.table.options());
    dtable = dtable.to(a.table.scalar_type());
  }
  return {dq.to(q.scalar_type()).contiguous(), dk.to(k.scalar_type()).contiguous(),
          dv.to(v.scalar_type()).contiguous(), dtable};
}

Positional alibi_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& slopes,
                         bool causal, bool symmetric, std::optional<double> scale,
                         const std::optional<at::Tensor>& attention_mask) {
  Positional a;
  a.slopes = slopes;
  a.symmetric = symmetric;
  a.causal = causal;
  a.scale = scale_of(q, scale);
  a.mask = key_mask_of(kAlibi, q, k, attention_mask);
  return a;
}

Positional t5_problem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& table,
                      bool bidirectional, int64_t max_distance, bool causal,
                      std::optional<double> scale,
                      const std::optional<at::Tensor>& attention_mask) {
  Positional a;
  a.table = table;
  a.bidirectional = bidirectional;
  a.max_distance = max_distance;
  a.causal = causal;
  a.scale = scale_of(q, scale);
  a.mask = key_mask_of(kT5, q, k, attention_mask);
  return a;
}

std::tuple<at::Tensor, at::Tensor> forward_cuda(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& slopes,
                                                bool causal, bool symmetric,
                                                std::optional<double> scale,
                                                const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kAlibi, q, k, v, {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  const auto a = alibi_problem(q, k, slopes, causal, symmetric, scale, attention_mask);
  if (!cuda_kernel_takes(q, v, a))
    return forward_reference(q, k, v, slopes, causal, symmetric, scale, attention_mask);
  return cuda_forward_of(q, k, v, a);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& slopes, bool causal,
    bool symmetric, std::optional<double> scale, const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kAlibi, grad_out, q, k, v, out, lse,
                         {{"slopes", slopes}, {"attention_mask", attention_mask}});
  check_inputs(q, k, v, slopes);
  const auto a = alibi_problem(q, k, slopes, causal, symmetric, scale, attention_mask);
  if (!cuda_kernel_takes(q, v, a))
    return backward_reference(grad_out, q, k, v, out, lse, slopes, causal, symmetric, scale,
                              attention_mask);
  auto [dq, dk, dv, dtable] = cuda_backward_of(grad_out, q, k, v, out, lse, a);
  return {dq, dk, dv};
}

at::Tensor alibi_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& slopes, bool causal, bool symmetric,
                                std::optional<double> scale,
                                const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(forward_cuda(q, k, v, slopes, causal, symmetric, scale, attention_mask));
}

std::tuple<at::Tensor, at::Tensor> t5_forward_cuda(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& table,
    bool bidirectional, int64_t max_distance, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_forward_devices(kT5, q, k, v, {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  const auto a =
      t5_problem(q, k, table, bidirectional, max_distance, causal, scale, attention_mask);
  if (!cuda_kernel_takes(q, v, a))
    return t5_forward_reference(q, k, v, table, bidirectional, max_distance, causal, scale,
                                attention_mask);
  return cuda_forward_of(q, k, v, a);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> t5_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& table, bool bidirectional,
    int64_t max_distance, bool causal, std::optional<double> scale,
    const std::optional<at::Tensor>& attention_mask) {
  check_backward_devices(kT5, grad_out, q, k, v, out, lse,
                         {{"table", table}, {"attention_mask", attention_mask}});
  check_t5(q, k, v, table, bidirectional, max_distance);
  const auto a =
      t5_problem(q, k, table, bidirectional, max_distance, causal, scale, attention_mask);
  if (!cuda_kernel_takes(q, v, a))
    return t5_backward_reference(grad_out, q, k, v, out, lse, table, bidirectional, max_distance,
                                 causal, scale, attention_mask);
  return cuda_backward_of(grad_out, q, k, v, out, lse, a);
}

at::Tensor t5_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& table, bool bidirectional, int64_t max_distance,
                             bool causal, std::optional<double> scale,
                             const std::optional<at::Tensor>& attention_mask) {
  return std::get<0>(
      t5_forward_cuda(q, k, v, table, bidirectional, max_distance, causal, scale, attention_mask));
}

std::tuple<at::Tensor, at::Tensor> positional_forward_cuda(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& v, POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  if (!cuda_kernel_takes(q, v, a)) return positional_forward_reference_of(q, k, v, a);
  return cuda_forward_of(q, k, v, a);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> positional_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, POSITIONAL_PARAMS) {
  check_backward_devices(kPositional, grad_out, q, k, v, out, lse,
                         positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                           variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  if (!cuda_kernel_takes(q, v, a))
    return positional_backward_reference_of(grad_out, q, k, v, out, lse, a);
  at::Tensor dvariate;
  auto [dq, dk, dv, dtable] = cuda_backward_of(grad_out, q, k, v, out, lse, a, &dvariate);
  if (!dtable.defined()) dtable = at::empty({0}, q.options().dtype(at::kFloat));
  return {dq, dk, dv, dtable, dvariate};
}

at::Tensor positional_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     POSITIONAL_PARAMS) {
  return std::get<0>(positional_forward_cuda(q, k, v, POSITIONAL_ARGS));
}
#endif  // POSENC_HAS_CUDA_GLUE

// Which path a call takes, and why (inspection; the tests assert RoPE goes inside): "fused",
// "fused, RoPE inside", "fused, RoPE outside: <why>", "reference: <why>"; tables that require a
// gradient are rotated by apply_rotary first (the Autograd kernel), then "fused".
std::string positional_attention_route(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, POSITIONAL_PARAMS) {
  check_forward_devices(kPositional, q, k, v,
                        positional_tables(cos, sin, slopes, t5_table, attention_mask, sample_ids,
                                          variate_ids, variate_bias, causal_ids));
  const auto a = positional_args(q, k, v, POSITIONAL_ARGS);
  const bool learned =
      at::GradMode::is_enabled() && a.rotary() && (a.cos.requires_grad() || a.sin.requires_grad());
  const std::string first = learned ? "apply_rotary first (cos/sin require grad), then " : "";
#ifdef POSENC_HAS_CUDA_GLUE
  if (q.is_cuda()) {
    if (!cuda_kernel_takes(q, v, a))
      return first +
             "reference: a call the CUDA kernel does not take (float64, a head dim of 0 "
             "or above 256, ALiBi and T5 together, or causal ids)";
    return first + (a.rotary() && !learned ? "CUDA kernel, RoPE outside (float32)" : "CUDA kernel");
  }
#endif
  if (const auto why = positional_reference_reason(q, v); !why.empty())
    return first + "reference: " + why;
  if (!a.rotary() || learned) return first + "fused";
  const auto why = positional_rotary_outside(a);
  return why.empty() ? "fused, RoPE inside" : "fused, RoPE outside: " + why;
}

#undef POSITIONAL_ARGS
#undef POSITIONAL_PARAMS

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "alibi_attention(Tensor q, Tensor k, Tensor v, Tensor slopes, bool causal=False, "
      "bool symmetric=False, float? scale=None, Tensor? attention_mask=None) -> Tensor");
  m.def(
      "_alibi_attention_forward(Tensor q, Tensor k, Tensor v, Tensor slopes, bool causal=False, "
      "bool symmetric=False, float? scale=None, Tensor? attention_mask=None) -> (Tensor, Tensor)");
  m.def(
      "_alibi_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor slopes, bool causal=False, bool symmetric=False, float? scale=None, "
      "Tensor? attention_mask=None) -> "
      "(Tensor, Tensor, Tensor)");
  m.def(
      "t5_attention(Tensor q, Tensor k, Tensor v, Tensor table, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None) -> "
      "Tensor");
  m.def(
      "_t5_attention_forward(Tensor q, Tensor k, Tensor v, Tensor table, bool bidirectional=True, "
      "int max_distance=128, bool causal=False, float? scale=None, Tensor? attention_mask=None) -> "
      "(Tensor, Tensor)");
  m.def(
      "_t5_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor table, bool bidirectional=True, int max_distance=128, "
      "bool causal=False, float? scale=None, Tensor? attention_mask=None) -> (Tensor, Tensor, "
      "Tensor, Tensor)");
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
  m.impl("alibi_attention", TORCH_FN(alibi_attention_cpu));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_cpu));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_cpu));
  m.impl("t5_attention", TORCH_FN(t5_attention_cpu));
  m.impl("_t5_attention_forward", TORCH_FN(t5_forward_cpu));
  m.impl("_t5_attention_backward", TORCH_FN(t5_backward_cpu));
  m.impl("shaw_attention", TORCH_FN(shaw_attention_cpu));
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_cpu));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_cpu));
  m.impl("positional_attention", TORCH_FN(positional_attention_cpu));
  m.impl("_positional_attention_forward", TORCH_FN(positional_forward_cpu));
  m.impl("_positional_attention_backward", TORCH_FN(positional_backward_cpu));
}

POSENC_LIBRARY_IMPL(CUDA, m) {
#ifdef POSENC_HAS_CUDA_GLUE  // the CUDA kernel where it takes the call (cuda_kernel_takes)
  m.impl("alibi_attention", TORCH_FN(alibi_attention_cuda));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_cuda));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_cuda));
  m.impl("t5_attention", TORCH_FN(t5_attention_cuda));
  m.impl("_t5_attention_forward", TORCH_FN(t5_forward_cuda));
  m.impl("_t5_attention_backward", TORCH_FN(t5_backward_cuda));
  m.impl("positional_attention", TORCH_FN(positional_attention_cuda));
  m.impl("_positional_attention_forward", TORCH_FN(positional_forward_cuda));
  m.impl("_positional_attention_backward", TORCH_FN(positional_backward_cuda));
#else  // a LibTorch without CUDA glue: the plain-ATen reference
  m.impl("alibi_attention", TORCH_FN(alibi_attention_reference));
  m.impl("_alibi_attention_forward", TORCH_FN(forward_reference));
  m.impl("_alibi_attention_backward", TORCH_FN(backward_reference));
  m.impl("t5_attention", TORCH_FN(t5_attention_reference));
  m.impl("_t5_attention_forward", TORCH_FN(t5_forward_reference));
  m.impl("_t5_attention_backward", TORCH_FN(t5_backward_reference));
  m.impl("positional_attention", TORCH_FN(positional_attention_reference));
  m.impl("_positional_attention_forward", TORCH_FN(positional_forward_reference));
  m.impl("_positional_attention_backward", TORCH_FN(positional_backward_reference));
#endif
  m.impl("shaw_attention", TORCH_FN(shaw_attention_reference));  // a query-dependent bias
  m.impl("_shaw_attention_forward", TORCH_FN(shaw_forward_reference));
  m.impl("_shaw_attention_backward", TORCH_FN(shaw_backward_reference));
}

}  // namespace posenc::ops
