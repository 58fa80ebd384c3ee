// posenc::attention_fused, _attention_fused_forward, _attention_fused_backward: schemas, the
// argument checks every path shares, the per-device kernels registered per dispatch key, and the
// C++ library's entry point attention_fused (posenc/kernels/attention_fused.h) as a call through
// the dispatcher. The math, shapes and conventions are in attention_fused_operator.h; the
// plain-ATen specification is attention_reference with bias_from_spec
// (src/kernels/attention_fused.cpp).
#include "attention_fused_operator.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "../cpu/attention_cpu.h"
#include "operator_checks.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"
#include "rope_rotate_operator.h"
#if POSENC_HAS_CUDA_GLUE
#include "../cuda/cuda_glue.h"
#endif

namespace posenc {
namespace ops {

namespace {

BiasForm table_form_from_string(c10::string_view name) {
  for (auto form : {BiasForm::kNone, BiasForm::kBucketTable, BiasForm::kRelativeTable})
    if (name == to_string(form)) return form;
  TORCH_CHECK(false, "attention_fused: table_form must be 'none', 'bucket_table' (T5) or ",
              "'relative_table' (Shaw), got '", name, "'");
}

std::optional<at::Tensor> given(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t : std::nullopt;
}

// The operators' arguments as the kernels read them.
struct Unpacked {
  std::shared_ptr<const FusedBias> bias;  // positions, folded slopes, the table part, T5 buckets
  AttentionMasks masks;
  AttentionRotary rotary;  // undefined: no RoPE inside
  at::Tensor table;        // the T5 or Shaw table, or empty
};

void check_rotary(const AttentionRotary& r, const at::Tensor& q, const at::Tensor& k,
                  const FusedBias& bias) {
  TORCH_CHECK(r.q_sin.defined() && r.k_cos.defined() && r.k_sin.defined(),
              "attention_fused: rotary needs q_cos, q_sin, k_cos and k_sin");
  TORCH_CHECK(
      r.q_cos.dim() == 2 && r.q_cos.sizes() == r.q_sin.sizes() && r.q_cos.size(0) == q.size(1),
      "attention_fused: rotary q_cos/q_sin must be [Nq, F] with Nq=", q.size(1), ", got ",
      r.q_cos.sizes(), " and ", r.q_sin.sizes());
  TORCH_CHECK(r.k_cos.dim() == 2 && r.k_cos.sizes() == r.k_sin.sizes() &&
                  r.k_cos.size(0) == k.size(1) && r.k_cos.size(1) == r.q_cos.size(1),
              "attention_fused: rotary k_cos/k_sin must be [Nk, F] = [", k.size(1), ", ",
              r.q_cos.size(1), "], got ", r.k_cos.sizes(), " and ", r.k_sin.sizes());
  TORCH_CHECK(2 * r.q_cos.size(1) <= q.size(3),
              "attention_fused: rotary width 2F=", 2 * r.q_cos.size(1),
              " exceeds the head dim D=", q.size(3));
  TORCH_CHECK(!(r.q_cos.requires_grad() || r.q_sin.requires_grad() || r.k_cos.requires_grad() ||
                r.k_sin.requires_grad()),
              "attention_fused: rotary tables are constants here; rotate q, k outside "
              "(rope_fused) when the frequencies are learned");
  TORCH_CHECK(bias.table.form != BiasForm::kRelativeTable,
              "attention_fused: rotary inside and a relative table (Shaw) together are not "
              "supported; rotate q, k outside");
}

// Positions, slopes, tables, masks: on q's device, or on the CPU for CUDA activations (the
// documented exception); q, k, v on one device.
void check_devices(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& q_positions, const at::Tensor& k_positions,
                   const std::optional<at::Tensor>& slopes, const std::optional<at::Tensor>& table,
                   const std::optional<at::Tensor>& key_padding,
                   const std::optional<at::Tensor>& q_cos, const std::optional<at::Tensor>& q_sin,
                   const std::optional<at::Tensor>& k_cos, const std::optional<at::Tensor>& k_sin,
                   const std::optional<at::Tensor>& sample_ids,
                   const std::optional<at::Tensor>& variate_ids,
                   const std::optional<at::Tensor>& variate_bias,
                   const std::optional<at::Tensor>& causal_ids) {
  check_same_device("attention_fused", {{"q", q}, {"k", k}, {"v", v}},
                    {{"q_positions", q_positions},
                     {"k_positions", k_positions},
                     {"slopes", slopes},
                     {"table", table},
                     {"key_padding", key_padding},
                     {"q_cos", q_cos},
                     {"q_sin", q_sin},
                     {"k_cos", k_cos},
                     {"k_sin", k_sin},
                     {"sample_ids", sample_ids},
                     {"variate_ids", variate_ids},
                     {"variate_bias", variate_bias},
                     {"causal_ids", causal_ids}});
}

// Positions, slopes and tables hold real numbers (an imaginary part would be dropped).
void check_real(const char* name, const std::optional<at::Tensor>& t, bool integers_too) {
  if (!t.has_value() || !t->defined()) return;
  const auto dtype = t->scalar_type();
  TORCH_CHECK(at::isFloatingType(dtype) || (integers_too && at::isIntegralType(dtype, false)),
              "attention_fused: ", name, " must hold real numbers (",
              integers_too ? "floating point or integer" : "floating point", "), got ", dtype);
}

Unpacked unpack(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                POSENC_ATTENTION_FUSED_PARAMS) {
  check_devices(q, k, v, q_positions, k_positions, slopes, table, key_padding, q_cos, q_sin, k_cos,
                k_sin, sample_ids, variate_ids, variate_bias, causal_ids);
  check_real("q_positions", q_positions, true);
  check_real("k_positions", k_positions, true);
  check_real("slopes", slopes, false);
  check_real("table", table, false);
  for (const auto& [name, t] :
       {std::pair<const char*, const std::optional<at::Tensor>&>{"q_cos", q_cos},
        {"q_sin", q_sin},
        {"k_cos", k_cos},
        {"k_sin", k_sin}})
    check_real(name, t, false);
  check_attention_shapes(q, k, v);
  TORCH_CHECK(std::isfinite(scale), "attention_fused: scale must be finite, got ", scale);
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "attention_fused: q must be float32, bfloat16 or float16 (the kernels compute in "
              "float32), got ",
              dtype, "; use attention_reference");
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "attention_fused: q, k, v must share a dtype, got ", dtype, ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK(q_positions.dim() == 1 && k_positions.dim() == 1 &&
                  q_positions.size(0) == q.size(1) && k_positions.size(0) == k.size(1),
              "attention_fused: positions must be [Nq] and [Nk] = [", q.size(1), "] and [",
              k.size(1), "], got ", q_positions.sizes(), " and ", k_positions.sizes());
  std::vector<BiasSpec> parts;
  if (auto s = given(slopes)) {
    TORCH_CHECK(s->dim() == 1 && s->numel() == q.size(2), "attention_fused: ", s->numel(),
                " ALiBi slopes for ", q.size(2), " heads (slopes shape ", s->sizes(), ")");
    BiasSpec alibi;
    alibi.form = BiasForm::kAlibi;
    alibi.slopes = *s;
    alibi.symmetric = symmetric;
    parts.push_back(alibi);
  }
  Unpacked u;
  const BiasForm form = table_form_from_string(table_form);
  auto t = given(table);
  TORCH_CHECK((form == BiasForm::kNone) == !t.has_value(), "attention_fused: table_form '",
              table_form, "' ", t.has_value() ? "takes no table" : "needs a table");
  if (form == BiasForm::kBucketTable) {
    TORCH_CHECK(t->dim() == 2 && t->size(1) == q.size(2) && t->size(0) == num_buckets,
                "attention_fused: the bucket table must be [num_buckets, H] = [", num_buckets, ", ",
                q.size(2), "], got ", t->sizes());
    TORCH_CHECK(num_buckets >= 1 && max_distance >= 1,
                "attention_fused: num_buckets and max_distance must be >= 1, got ", num_buckets,
                " and ", max_distance);
  }
  if (form == BiasForm::kRelativeTable) {
    TORCH_CHECK(max_relative_position >= 1,
                "attention_fused: max_relative_position must be >= 1, got ", max_relative_position);
    TORCH_CHECK(
        t->dim() == 2 && t->size(0) == 2 * max_relative_position + 1 && t->size(1) == q.size(3),
        "attention_fused: the relative table must be [2K+1, D] = [", 2 * max_relative_position + 1,
        ", ", q.size(3), "], got ", t->sizes());
  }
  if (t.has_value()) {
    BiasSpec part;
    part.form = form;
    part.table = *t;
    part.num_buckets = num_buckets;
    part.max_distance = max_distance;
    part.bidirectional = bidirectional;
    part.max_relative_position = max_relative_position;
    parts.push_back(part);
    u.table = *t;
  } else {
    u.table = at::empty({0}, q.options().dtype(at::kFloat));
  }
  u.bias = fused_bias(parts, q_positions, k_positions);
  TORCH_CHECK(u.bias->unsupported.empty(), "attention_fused: ", u.bias->unsupported,
              "; use attention_reference");
  u.masks.causal = causal;
  if (auto kp = given(key_padding)) {
    TORCH_CHECK(kp->sizes() == at::IntArrayRef({k.size(0), k.size(1)}),
                "attention_fused: key_padding must be [B, Nk] = [", k.size(0), ", ", k.size(1),
                "], got ", kp->sizes());
    TORCH_CHECK(kp->scalar_type() == at::kBool,
                "attention_fused: key_padding must be bool (true: a real key), got ",
                kp->scalar_type(),
                " (an additive 0/-inf mask or 0/1 numbers: convert it, e.g. "
                "mask == 0 or mask != 0)");
    u.masks.key_padding = *kp;
  }
  if (auto s = given(sample_ids)) u.masks.sample_ids = *s;
  if (auto s = given(variate_ids)) u.masks.variate_ids = *s;
  if (auto s = given(variate_bias)) u.masks.variate_bias = *s;
  detail::check_packed_ids("attention_fused", u.masks.sample_ids, u.masks.variate_ids,
                           u.masks.variate_bias, k.size(0), k.size(1), q.size(2));
  TORCH_CHECK(!u.masks.sample_ids.defined() || q.size(1) <= k.size(1),
              "attention_fused: sample_ids with more queries (", q.size(1), ") than keys (",
              k.size(1), "): the queries take the last Nq ids");
  if (auto s = given(causal_ids)) u.masks.causal_ids = *s;
  detail::check_causal_ids("attention_fused", u.masks.causal_ids, causal, k.size(0), q.size(1),
                           k.size(1));
  const bool any_table = given(q_cos) || given(q_sin) || given(k_cos) || given(k_sin);
  if (any_table) {
    TORCH_CHECK(given(q_cos) && given(q_sin) && given(k_cos) && given(k_sin),
                "attention_fused: rotary needs q_cos, q_sin, k_cos and k_sin");
    u.rotary = {*q_cos, *q_sin, *k_cos, *k_sin, rope_layout_from_string(std::string(rope_layout))};
    check_rotary(u.rotary, q, k, *u.bias);
  }
  return u;
}

// The backward's own inputs: the forward's out [B, Nq, H, Dv], lse [B, H, Nq] and grad_out as out.
void check_backward(const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse,
                    const at::Tensor& q, const at::Tensor& v) {
  const std::vector<int64_t> want_out{q.size(0), q.size(1), q.size(2), v.size(3)};
  const std::vector<int64_t> want_lse{q.size(0), q.size(2), q.size(1)};
  TORCH_CHECK(
      out.sizes() == at::IntArrayRef(want_out) && grad_out.sizes() == at::IntArrayRef(want_out),
      "_attention_fused_backward: out and grad_out must be [B, Nq, H, Dv] = ", want_out, ", got ",
      out.sizes(), " and ", grad_out.sizes());
  TORCH_CHECK(lse.sizes() == at::IntArrayRef(want_lse),
              "_attention_fused_backward: lse must be [B, H, Nq] = ", want_lse, ", got ",
              lse.sizes());
  check_same_device("_attention_fused_backward",
                    {{"grad_out", grad_out}, {"out", out}, {"lse", lse}, {"q", q}});
}

// ---- CPU: the tiled kernel (src/kernels/cpu/attention_cpu.cpp) ---------------------------------

// [B, N, H, D] -> float32 [B, H, N, D], detached: the transposed view where the kernel reads it in
// place (detail::attention_cpu_reads_in_place: unit stride in D, rows apart by at least D), else a
// contiguous copy.
at::Tensor heads_first(const at::Tensor& x) {
  auto view = x.detach().to(at::kFloat).transpose(1, 2);
  return detail::attention_cpu_reads_in_place(view) ? view : view.contiguous();
}

// qh, kh, vh: contiguous float32 [B, H, N, D]; table: the bias's table (T5 or Shaw) or empty.
detail::AttentionProblem make_problem(const at::Tensor& qh, const at::Tensor& kh,
                                      const at::Tensor& vh, const Unpacked& u, double scale) {
  const FusedBias& bias = *u.bias;
  detail::AttentionProblem p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.alibi = bias.alibi;
  p.table_form = bias.table.form;
  p.symmetric = bias.symmetric;
  p.causal = u.masks.causal;
  p.pq = bias.pq.data();
  p.pk = bias.pk.data();
  p.iq = bias.iq.data();
  p.ik = bias.ik.data();
  if (p.alibi) {
    auto s = bias.slopes.to(at::kFloat).contiguous();
    p.slopes.assign(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  }
  if (p.table_form == BiasForm::kRelativeTable) {  // qr = q a^T / sqrt(D): [B, H, Nq, 2K+1]
    p.max_relative = bias.table.max_relative_position;
    p.rel_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.dim)));
    p.rel_table = u.table.detach().to(at::kCPU, at::kFloat).contiguous();
    p.qr = (at::matmul(qh, p.rel_table.t()) * p.rel_scale).contiguous();
  }
  if (p.table_form == BiasForm::kBucketTable) {
    const auto& bucket = bias.buckets;
    p.rel_min = bias.rel_min;
    p.rel_count = bucket.numel();
    p.bucket = bucket.const_data_ptr<int64_t>();
    p.num_buckets = bias.table.num_buckets;
    auto lut = u.table.detach().to(at::kCPU, at::kFloat).index_select(0, bucket).t().contiguous();
    p.lut.assign(lut.data_ptr<float>(), lut.data_ptr<float>() + lut.numel());  // [H, R]
  }
  const auto& padding = u.masks.key_padding;
  if (padding.defined() && padding.numel() > 0) {
    auto keep = padding.to(at::kCPU, at::kByte).contiguous();
    p.key_keep.assign(keep.data_ptr<uint8_t>(), keep.data_ptr<uint8_t>() + keep.numel());
  }
  const auto& r = u.rotary;
  if (r.defined() && r.q_cos.numel() > 0) {  // RoPE inside the tiles: float32 [N, F]
    auto f32 = [](const at::Tensor& t) { return t.detach().to(at::kCPU, at::kFloat).contiguous(); };
    p.rotary = true;
    p.q_cos = f32(r.q_cos);
    p.q_sin = f32(r.q_sin);
    p.k_cos = f32(r.k_cos);
    p.k_sin = f32(r.k_sin);
    p.rotary_pairs = r.q_cos.size(-1);
    p.rotary_interleaved = r.layout == RopeLayout::kInterleaved;
  }
  detail::set_packed(p, "attention_fused", u.masks.sample_ids, u.masks.variate_ids,
                     u.masks.variate_bias);
  detail::set_causal_ids(p, "attention_fused", u.masks.causal_ids);
  return p;
}

std::tuple<at::Tensor, at::Tensor> forward_cpu(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, POSENC_ATTENTION_FUSED_PARAMS) {
  const auto u = unpack(q, k, v, POSENC_ATTENTION_FUSED_ARGS);
  auto p = make_problem(heads_first(q), heads_first(k), heads_first(v), u, scale);
  // written in place through its [B, H, Nq, Dv] view
  auto out = at::empty({p.batch, p.nq, p.heads, p.dim_v}, q.options().dtype(at::kFloat));
  auto lse = at::empty({p.batch, p.heads, p.nq}, q.options().dtype(at::kFloat));
  auto out_heads = out.transpose(1, 2);
  detail::attention_forward_cpu(p, out_heads, lse);
  return {out, lse};
}

// variate_bias's gradient on its device, in its dtype ([0] float32 without one).
at::Tensor variate_gradient(const at::Tensor& dvariate, const Unpacked& u, const at::Tensor& q) {
  const auto& w = u.masks.variate_bias;
  if (!w.defined()) return at::empty({0}, q.options().dtype(at::kFloat));
  return dvariate.defined() ? dvariate.to(w.options()) : at::zeros_like(w);
}

// The table's gradient on the table's device, in its dtype (zeros where the kernel gave none).
at::Tensor table_gradient(const at::Tensor& dtable, const Unpacked& u) {
  if (u.table.numel() == 0 && !dtable.defined()) return u.table;  // no table: [0]
  return dtable.defined() ? dtable.to(u.table.options()) : at::zeros_like(u.table);
}

// The backward reads the output as the forward returned it, in float32 (the accumulator's values,
// not rounded to q's dtype): delta_i = dO_i . O_i. (CUDA: q's dtype, the kernel's output.) From a
// bfloat16 O, as FlashAttention reads it, dq and dk in bfloat16 err about twice as much against
// float64.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, POSENC_ATTENTION_FUSED_PARAMS) {
  const auto u = unpack(q, k, v, POSENC_ATTENTION_FUSED_ARGS);
  check_backward(grad_out, out, lse, q, v);
  auto qh = heads_first(q), kh = heads_first(k), vh = heads_first(v);
  auto p = make_problem(qh, kh, vh, u, scale);
  // [B, N, H, D] float32, written in place through their [B, H, N, D] views
  const auto f32 = q.options().dtype(at::kFloat);
  auto dq = at::zeros(q.sizes(), f32), dk = at::zeros(k.sizes(), f32);
  auto dv = at::zeros(v.sizes(), f32);
  auto dq_heads = dq.transpose(1, 2), dk_heads = dk.transpose(1, 2), dv_heads = dv.transpose(1, 2);
  at::Tensor dtable, dvariate;
  detail::attention_backward_cpu(p, heads_first(out), lse.to(at::kFloat).contiguous(),
                                 heads_first(grad_out), dq_heads, dk_heads, dv_heads, dtable,
                                 &dvariate);
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()),
          table_gradient(dtable, u), variate_gradient(dvariate, u, q)};
}

at::Tensor attention_fused_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               POSENC_ATTENTION_FUSED_PARAMS) {
  return attention_out_in_dtype(std::get<0>(forward_cpu(q, k, v, POSENC_ATTENTION_FUSED_ARGS)), q);
}

#if POSENC_HAS_CUDA_GLUE
// ---- CUDA: the CUDA kernel's glue; RoPE as one rotation pass before it -------------------------

// The one bias part the CUDA kernel takes, its ALiBi slopes on the device.
BiasSpec cuda_bias(const Unpacked& u, const at::Tensor& q) {
  const FusedBias& bias = *u.bias;
  TORCH_CHECK(detail::attention_cuda_supported(q), "attention_fused (CUDA): unsupported q (",
              q.device(), ", ", q.scalar_type(), ", shape ", q.sizes(),
              "); use attention_reference");
  TORCH_CHECK(!(bias.alibi && bias.table.form != BiasForm::kNone) &&
                  bias.table.form != BiasForm::kRelativeTable,
              "attention_fused (CUDA): one bias part, ALiBi or T5 (a relative table or two parts "
              "run on the CPU); got ",
              bias.alibi ? "alibi + " : "", to_string(bias.table.form));
  TORCH_CHECK(!u.masks.causal_ids.defined(),
              "attention_fused (CUDA): causal_ids run on the CPU kernel; use attention_reference "
              "on CUDA");
  BiasSpec spec = bias.table;
  if (bias.alibi) {
    spec = BiasSpec{};
    spec.form = BiasForm::kAlibi;
    spec.slopes = bias.slopes.to(q.device());
    spec.symmetric = bias.symmetric;
  }
  return spec;
}

std::pair<at::Tensor, at::Tensor> rotated(const at::Tensor& q, const at::Tensor& k,
                                          const AttentionRotary& r) {
  if (!r.defined()) return {q, k};
  const auto layout = to_string(r.layout);
  return {rope_rotate_op().call(q, r.q_cos, r.q_sin, layout, false),
          rope_rotate_op().call(k, r.k_cos, r.k_sin, layout, false)};
}

std::tuple<at::Tensor, at::Tensor> forward_cuda(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v,
                                                POSENC_ATTENTION_FUSED_PARAMS) {
  const auto u = unpack(q, k, v, POSENC_ATTENTION_FUSED_ARGS);
  const auto spec = cuda_bias(u, q);
  auto [qr, kr] = rotated(q, k, u.rotary);
  // out in q's dtype, as the CUDA kernel writes it (its backward computes delta from that)
  return detail::attention_forward_cuda(qr, kr, v, u.table, spec, u.bias->q_positions,
                                        u.bias->k_positions, u.masks, scale);
}

// The gradients of the rotated q, k, turned back: R(theta)^T = R(-theta).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse, const at::Tensor& q,
    const at::Tensor& k, const at::Tensor& v, POSENC_ATTENTION_FUSED_PARAMS) {
  const auto u = unpack(q, k, v, POSENC_ATTENTION_FUSED_ARGS);
  check_backward(grad_out, out, lse, q, v);
  const auto spec = cuda_bias(u, q);
  auto [qr, kr] = rotated(q, k, u.rotary);
  at::Tensor dvariate;  // [2, H] float32 with a variate bias
  auto [dq, dk, dv, dtable] = detail::attention_backward_cuda(
      grad_out, out.to(q.scalar_type()), lse, qr, kr, v, u.table, spec, u.bias->q_positions,
      u.bias->k_positions, u.masks, scale, &dvariate);
  if (u.rotary.defined()) {
    const auto layout = to_string(u.rotary.layout);
    dq = rope_rotate_op().call(dq, u.rotary.q_cos, u.rotary.q_sin, layout, true);
    dk = rope_rotate_op().call(dk, u.rotary.k_cos, u.rotary.k_sin, layout, true);
  }
  return {dq, dk, dv, table_gradient(dtable, u), variate_gradient(dvariate, u, q)};
}

at::Tensor attention_fused_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                POSENC_ATTENTION_FUSED_PARAMS) {
  return attention_out_in_dtype(std::get<0>(forward_cuda(q, k, v, POSENC_ATTENTION_FUSED_ARGS)), q);
}
#endif

// The schemas' parameters after (q, k, v): the order of POSENC_ATTENTION_FUSED_PARAMS.
#define POSENC_PARAMS_SCHEMA                                                                  \
  "Tensor q_positions, Tensor k_positions, Tensor? slopes, bool symmetric, Tensor? table, "   \
  "str table_form, int num_buckets, int max_distance, bool bidirectional, "                   \
  "int max_relative_position, bool causal, Tensor? key_padding, float scale, Tensor? q_cos, " \
  "Tensor? q_sin, Tensor? k_cos, Tensor? k_sin, str rope_layout, Tensor? sample_ids=None, "   \
  "Tensor? variate_ids=None, Tensor? variate_bias=None, Tensor? causal_ids=None"

// Registered once per process (see rope_rotate_operator.cpp: the static core may be loaded twice).
bool register_once() {
  if (c10::Dispatcher::singleton().findSchema({"posenc::attention_fused", ""}).has_value())
    return false;
  static torch::Library def(torch::Library::FRAGMENT, "posenc", std::nullopt, __FILE__, __LINE__);
  def.def("attention_fused(Tensor q, Tensor k, Tensor v, " POSENC_PARAMS_SCHEMA ") -> Tensor");
  def.def("_attention_fused_forward(Tensor q, Tensor k, Tensor v, " POSENC_PARAMS_SCHEMA
          ") -> (Tensor, Tensor)");
  def.def(
      "_attention_fused_backward(Tensor grad_out, Tensor out, Tensor lse, Tensor q, Tensor k, "
      "Tensor v, " POSENC_PARAMS_SCHEMA ") -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  static torch::Library cpu(torch::Library::IMPL, "posenc", c10::DispatchKey::CPU, __FILE__,
                            __LINE__);
  cpu.impl("attention_fused", TORCH_FN(attention_fused_cpu));
  cpu.impl("_attention_fused_forward", TORCH_FN(forward_cpu));
  cpu.impl("_attention_fused_backward", TORCH_FN(backward_cpu));
#if POSENC_HAS_CUDA_GLUE
  static torch::Library cuda(torch::Library::IMPL, "posenc", c10::DispatchKey::CUDA, __FILE__,
                             __LINE__);
  cuda.impl("attention_fused", TORCH_FN(attention_fused_cuda));
  cuda.impl("_attention_fused_forward", TORCH_FN(forward_cuda));
  cuda.impl("_attention_fused_backward", TORCH_FN(backward_cuda));
#endif
  static torch::Library autograd(torch::Library::IMPL, "posenc", c10::DispatchKey::Autograd,
                                 __FILE__, __LINE__);
  autograd.impl("attention_fused", TORCH_FN(attention_fused_autograd));
  return true;
}

[[maybe_unused]] const bool kRegisteredHere = register_once();

#undef POSENC_PARAMS_SCHEMA

}  // namespace

void check_attention_shapes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "attention: q, k, v must be [B, N, H, D], got ", q.sizes(), ", ", k.sizes(), ", ",
              v.sizes());
  TORCH_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0),
              "attention: batch sizes differ: ", q.size(0), ", ", k.size(0), ", ", v.size(0));
  TORCH_CHECK(q.size(2) == k.size(2) && k.size(2) == v.size(2),
              "attention: head counts differ: ", q.size(2), ", ", k.size(2), ", ", v.size(2));
  TORCH_CHECK(q.size(3) == k.size(3), "attention: q has D=", q.size(3), " but k has D=", k.size(3));
  TORCH_CHECK(k.size(1) == v.size(1), "attention: k has Nk=", k.size(1), " but v has ", v.size(1));
}

const c10::TypedOperatorHandle<AttentionFusedSignature>& attention_fused_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::attention_fused", "")
                             .typed<AttentionFusedSignature>();
  return op;
}

const c10::TypedOperatorHandle<AttentionFusedForwardSignature>& attention_fused_forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::_attention_fused_forward", "")
                             .typed<AttentionFusedForwardSignature>();
  return op;
}

const c10::TypedOperatorHandle<AttentionFusedBackwardSignature>& attention_fused_backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::_attention_fused_backward", "")
                             .typed<AttentionFusedBackwardSignature>();
  return op;
}

at::Tensor attention_out_in_dtype(const at::Tensor& out, const at::Tensor& q) {
  return out.scalar_type() == q.scalar_type() ? out : out.to(q.scalar_type());
}

}  // namespace ops

// ---- the C++ library's entry point: the operator, through the dispatcher ----------------------

at::Tensor attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::shared_ptr<const FusedBias>& prepared,
                           const AttentionMasks& masks, double scale,
                           const AttentionRotary& rotary) {
  TORCH_CHECK(prepared != nullptr, "attention_fused: no prepared bias (use fused_bias({}, ...))");
  const FusedBias& bias = *prepared;
  ops::check_attention_shapes(q, k, v);
  TORCH_CHECK(attention_fused_supported(bias, q, masks), "attention_fused: unsupported input (",
              bias.unsupported.empty() ? "" : bias.unsupported + ", ", "bias ",
              bias.alibi ? "alibi + " : "", to_string(bias.table.form), ", device ", q.device(),
              ", dtype ", q.scalar_type(),
              masks.causal_ids.defined() ? ", causal ids (CPU kernel only)" : "",
              "); use attention_reference");
  auto opt = [](bool has, const at::Tensor& t) {
    return has ? std::optional<at::Tensor>(t) : std::nullopt;
  };
  const auto& t = bias.table;
  const bool has_table = t.form != BiasForm::kNone;
  return ops::attention_fused_op().call(
      q, k, v, bias.q_positions, bias.k_positions, opt(bias.alibi, bias.slopes), bias.symmetric,
      opt(has_table, t.table), to_string(t.form), t.num_buckets, t.max_distance, t.bidirectional,
      t.max_relative_position, masks.causal, opt(masks.key_padding.defined(), masks.key_padding),
      scale, opt(rotary.defined(), rotary.q_cos), opt(rotary.defined(), rotary.q_sin),
      opt(rotary.defined(), rotary.k_cos), opt(rotary.defined(), rotary.k_sin),
      to_string(rotary.layout), opt(masks.sample_ids.defined(), masks.sample_ids),
      opt(masks.variate_ids.defined(), masks.variate_ids),
      opt(masks.variate_bias.defined(), masks.variate_bias),
      opt(masks.causal_ids.defined(), masks.causal_ids));
}

}  // namespace posenc
