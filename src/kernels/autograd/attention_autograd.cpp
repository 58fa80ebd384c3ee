// Fused attention as an autograd Function over the tiled CPU kernel
// (src/kernels/cpu/attention_cpu.cpp), plus the plain-ATen reference it is tested against.
// Contract in include/posenc/kernels/attention.h.
#include <torch/torch.h>

#include <limits>

#include "../cpu/attention_cpu.h"
#include "first_order.h"
#include "posenc/functional/relative.h"
#include "posenc/kernels/attention.h"
#include "posenc/kernels/rope.h"
#if POSENC_HAS_CUDA_GLUE
#include "../cuda/cuda_glue.h"
#endif

namespace posenc {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool integer_valued(const at::Tensor& t) { return t.numel() == 0 || at::equal(t, t.round()); }

std::vector<double> to_vector(const at::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kFloat64).contiguous();  // read in host memory
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// qh, kh, vh: contiguous float32 [B, H, N, D]; table: the bias's table (T5 or Shaw) or empty.
detail::AttentionProblem make_problem(const at::Tensor& qh, const at::Tensor& kh,
                                      const at::Tensor& vh, const FusedBias& bias,
                                      const at::Tensor& table, const AttentionMasks& masks,
                                      double scale) {
  detail::AttentionProblem p;
  detail::set_tensors(p, qh, kh, vh, scale);
  p.alibi = bias.alibi;
  p.table_form = bias.table.form;
  p.symmetric = bias.symmetric;
  p.causal = masks.causal;
  p.pq = bias.pq.data();
  p.pk = bias.pk.data();
  p.iq = bias.iq.data();
  p.ik = bias.ik.data();
  if (p.alibi) {
    auto s = bias.slopes.to(torch::kFloat32).contiguous();
    p.slopes.assign(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  }
  if (p.table_form == BiasForm::kRelativeTable) {  // qr = q a^T / sqrt(D): [B, H, Nq, 2K+1]
    p.max_relative = bias.table.max_relative_position;
    p.rel_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(p.dim)));
    p.rel_table = table.detach().to(torch::kFloat32).contiguous();
    p.qr = (torch::matmul(qh, p.rel_table.t()) * p.rel_scale).contiguous();
  }
  if (p.table_form == BiasForm::kBucketTable) {
    const auto& bucket = bias.buckets;
    p.rel_min = bias.rel_min;
    p.rel_count = bucket.numel();
    p.bucket = bucket.const_data_ptr<int64_t>();
    p.num_buckets = bias.table.num_buckets;
    auto lut =
        table.detach().to(torch::kFloat32).index_select(0, bucket).t().contiguous();  // [H, R]
    p.lut.assign(lut.data_ptr<float>(), lut.data_ptr<float>() + lut.numel());
  }
  if (masks.key_padding.defined() && masks.key_padding.numel() > 0) {
    auto keep = masks.key_padding.to(torch::kUInt8).contiguous();
    p.key_keep.assign(keep.data_ptr<uint8_t>(), keep.data_ptr<uint8_t>() + keep.numel());
  }
  return p;
}

// RoPE inside the tiles: tables as float32 contiguous [N, F].
void set_rotary(detail::AttentionProblem& p, const at::Tensor& q_cos, const at::Tensor& q_sin,
                const at::Tensor& k_cos, const at::Tensor& k_sin, bool interleaved) {
  if (!q_cos.defined() || q_cos.numel() == 0) return;
  auto f32 = [](const at::Tensor& t) { return t.detach().to(torch::kFloat32).contiguous(); };
  p.rotary = true;
  p.q_cos = f32(q_cos);
  p.q_sin = f32(q_sin);
  p.k_cos = f32(k_cos);
  p.k_sin = f32(k_sin);
  p.rotary_pairs = q_cos.size(-1);
  p.rotary_interleaved = interleaved;
}

// [B, N, H, D] -> float32 [B, H, N, D], detached: contiguous() may return a view of the input
// (N or H of 1, or empty), and the kernels' out= matmuls refuse a tensor that requires grad.
at::Tensor heads_first(const at::Tensor& x) {
  return x.detach().to(torch::kFloat32).transpose(1, 2).contiguous();
}

// Everything the backward needs besides the tensors saved for backward, as one object: the
// forward's prepared bias (shared with the plan), masks, scale, float32 rotary tables.
struct SavedAttention : torch::CustomClassHolder {
  std::shared_ptr<const FusedBias> bias;
  AttentionMasks masks;
  double scale = 1.0;
  AttentionRotary rotary;
  at::ScalarType dtype = at::kFloat;
};

class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& table,
                               const std::shared_ptr<const FusedBias>& bias,
                               const AttentionMasks& masks, double scale,
                               const AttentionRotary& rotary) {
    auto qh = heads_first(q), kh = heads_first(k), vh = heads_first(v);
    auto p = make_problem(qh, kh, vh, *bias, table, masks, scale);
    const bool interleaved = rotary.layout == RopeLayout::kInterleaved;
    set_rotary(p, rotary.q_cos, rotary.q_sin, rotary.k_cos, rotary.k_sin, interleaved);
    auto out = torch::empty({p.batch, p.heads, p.nq, p.dim_v}, torch::kFloat32);
    auto lse = torch::empty({p.batch, p.heads, p.nq}, torch::kFloat32);
    detail::attention_forward_cpu(p, out, lse);
    auto saved = c10::make_intrusive<SavedAttention>();
    saved->bias = bias;
    saved->masks = masks;
    saved->scale = scale;
    if (p.rotary) saved->rotary = {p.q_cos, p.q_sin, p.k_cos, p.k_sin, rotary.layout};
    saved->dtype = q.scalar_type();
    ctx->saved_data["attention"] = c10::IValue::make_capsule(std::move(saved));
    ctx->save_for_backward({qh, kh, vh, out, lse, table});
    return {out.transpose(1, 2).contiguous().to(q.scalar_type())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("attention_fused");
    auto saved = ctx->get_saved_variables();
    const auto state = c10::static_intrusive_pointer_cast<SavedAttention>(
        ctx->saved_data["attention"].toCapsule());
    const auto& qh = saved[0];
    const auto& kh = saved[1];
    const auto& vh = saved[2];
    auto p = make_problem(qh, kh, vh, *state->bias, saved[5], state->masks, state->scale);
    const auto& r = state->rotary;
    set_rotary(p, r.q_cos, r.q_sin, r.k_cos, r.k_sin, r.layout == RopeLayout::kInterleaved);
    auto grad_out = heads_first(grads[0]);
    auto dq = torch::zeros_like(qh), dk = torch::zeros_like(kh), dv = torch::zeros_like(vh);
    at::Tensor dtable;
    detail::attention_backward_cpu(p, saved[3], saved[4], grad_out, dq, dk, dv, dtable);
    auto back = [&](const at::Tensor& t) {
      return t.transpose(1, 2).contiguous().to(state->dtype);
    };
    at::Tensor table_grad;
    if (dtable.defined() && saved[5].requires_grad())
      table_grad = dtable.to(saved[5].scalar_type());
    return {back(dq),     back(dk),     back(dv),     table_grad,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
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

}  // namespace

std::shared_ptr<const FusedBias> fused_bias(const std::vector<BiasSpec>& parts,
                                            const at::Tensor& q_positions,
                                            const at::Tensor& k_positions) {
  auto out = std::make_shared<FusedBias>();
  auto& f = *out;
  TORCH_CHECK(q_positions.dim() == 1 && k_positions.dim() == 1,
              "fused_bias: positions must be [Nq] and [Nk], got ", q_positions.sizes(), " and ",
              k_positions.sizes());
  f.q_positions = q_positions.to(torch::kFloat64).contiguous();
  f.k_positions = k_positions.to(torch::kFloat64).contiguous();
  f.pq = to_vector(f.q_positions);
  f.pk = to_vector(f.k_positions);
  for (const auto& part : parts) {
    switch (part.form) {
      case BiasForm::kNone:
        break;
      case BiasForm::kAlibi: {
        auto slopes = part.slopes.detach().to(at::kCPU, torch::kFloat32);
        if (!f.alibi) {
          f.alibi = true;
          f.symmetric = part.symmetric;
          f.slopes = slopes.clone();
        } else if (f.symmetric != part.symmetric) {
          f.unsupported = "two ALiBi parts of different forms (causal and symmetric)";
        } else if (f.slopes.numel() != slopes.numel()) {
          f.unsupported = "two ALiBi parts with different head counts";
        } else {
          f.slopes = f.slopes + slopes;  // -m1 d - m2 d = -(m1 + m2) d
        }
        break;
      }
      case BiasForm::kBucketTable:
      case BiasForm::kRelativeTable:
        if (f.table.form != BiasForm::kNone) {
          f.unsupported =
              "two table parts (" + to_string(f.table.form) + " and " + to_string(part.form) + ")";
        } else {
          f.table = part;
        }
        break;
    }
  }
  if (f.table.form != BiasForm::kNone) {
    if (!integer_valued(f.q_positions) || !integer_valued(f.k_positions)) {
      f.unsupported = to_string(f.table.form) + " needs integer positions";
    } else {
      for (double x : f.pq) f.iq.push_back(static_cast<int64_t>(std::llround(x)));
      for (double x : f.pk) f.ik.push_back(static_cast<int64_t>(std::llround(x)));
    }
  }
  if (f.table.form == BiasForm::kBucketTable && f.unsupported.empty()) {
    auto offsets = t5_offset_buckets(f.q_positions, f.k_positions, f.table.bidirectional,
                                     f.table.num_buckets, f.table.max_distance);
    f.rel_min = offsets.offset_min;
    f.buckets = offsets.buckets.contiguous();
  }
  return out;
}

bool attention_fused_supported(const FusedBias& bias, const at::Tensor& q) {
  if (!bias.unsupported.empty()) return false;
  // float64 stays on the (exact) reference path: the kernel computes in float32.
  const auto dtype = q.scalar_type();
  if (!(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) return false;
  if (q.device().is_cpu()) return true;
#if POSENC_HAS_CUDA_GLUE
  // the CUDA kernel takes one part; Shaw's query-dependent bias is CPU only
  const bool one_part = !(bias.alibi && bias.table.form != BiasForm::kNone);
  return detail::attention_cuda_supported(q) && one_part &&
         bias.table.form != BiasForm::kRelativeTable;
#else
  return false;
#endif
}

bool attention_fused_supported(const BiasSpec& bias, const at::Tensor& q,
                               const at::Tensor& q_positions, const at::Tensor& k_positions) {
  if (q_positions.dim() != 1 || k_positions.dim() != 1) return false;
  return attention_fused_supported(*fused_bias({bias}, q_positions, k_positions), q);
}

at::Tensor attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::shared_ptr<const FusedBias>& prepared,
                           const AttentionMasks& masks, double scale,
                           const AttentionRotary& rotary) {
  TORCH_CHECK(prepared != nullptr, "attention_fused: no prepared bias (use fused_bias({}, ...))");
  const FusedBias& bias = *prepared;
  check_attention_shapes(q, k, v);
  TORCH_CHECK(attention_fused_supported(bias, q), "attention_fused: unsupported input (",
              bias.unsupported.empty() ? "" : bias.unsupported + ", ", "bias ",
              bias.alibi ? "alibi + " : "", to_string(bias.table.form), ", device ", q.device(),
              ", dtype ", q.scalar_type(), "); use attention_reference");
  TORCH_CHECK(bias.q_positions.size(0) == q.size(1) && bias.k_positions.size(0) == k.size(1),
              "attention_fused: ", bias.q_positions.size(0), " query and ",
              bias.k_positions.size(0), " key positions for Nq=", q.size(1), " and Nk=", k.size(1));
  if (bias.alibi)
    TORCH_CHECK(bias.slopes.numel() == q.size(2), "attention_fused: ", bias.slopes.numel(),
                " ALiBi slopes for ", q.size(2), " heads");
  const auto& t = bias.table;
  if (t.form == BiasForm::kBucketTable)
    TORCH_CHECK(t.table.dim() == 2 && t.table.size(1) == q.size(2),
                "attention_fused: the bucket table must be [num_buckets, ", q.size(2), "], got ",
                t.table.sizes());
  if (t.form == BiasForm::kRelativeTable) {
    TORCH_CHECK(t.max_relative_position >= 1,
                "attention_fused: max_relative_position must be >= 1, got ",
                t.max_relative_position);
    TORCH_CHECK(t.table.dim() == 2 && t.table.size(0) == 2 * t.max_relative_position + 1 &&
                    t.table.size(1) == q.size(3),
                "attention_fused: the relative table must be [2K+1, D] = [",
                2 * t.max_relative_position + 1, ", ", q.size(3), "], got ", t.table.sizes());
  }
  if (masks.key_padding.defined())
    TORCH_CHECK(masks.key_padding.sizes() == at::IntArrayRef({k.size(0), k.size(1)}),
                "attention_fused: key_padding must be [B, Nk] = [", k.size(0), ", ", k.size(1),
                "], got ", masks.key_padding.sizes());
  if (rotary.defined()) check_rotary(rotary, q, k, bias);
#if POSENC_HAS_CUDA_GLUE
  if (q.is_cuda()) {  // the one dispatch point to the CUDA kernel (RoPE: one pass before it)
    BiasSpec spec = t;
    if (bias.alibi) {
      spec = BiasSpec{};
      spec.form = BiasForm::kAlibi;
      spec.slopes = bias.slopes.to(q.device());
      spec.symmetric = bias.symmetric;
    }
    auto qr = rotary.defined() ? rope_fused(q, rotary.q_cos, rotary.q_sin, rotary.layout) : q;
    auto kr = rotary.defined() ? rope_fused(k, rotary.k_cos, rotary.k_sin, rotary.layout) : k;
    return detail::attention_fused_cuda(qr, kr, v, spec, bias.q_positions, bias.k_positions, masks,
                                        scale);
  }
#endif
  at::Tensor table = t.form != BiasForm::kNone ? t.table : torch::empty({0});
  return AttentionFunction::apply(q, k, v, table, prepared, masks, scale, rotary)[0];
}

at::Tensor attention_fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const BiasSpec& bias, const at::Tensor& q_positions,
                           const at::Tensor& k_positions, const AttentionMasks& masks, double scale,
                           const AttentionRotary& rotary) {
  TORCH_CHECK(q_positions.dim() == 1 && k_positions.dim() == 1,
              "attention_fused: positions must be [Nq] and [Nk], got ", q_positions.sizes(),
              " and ", k_positions.sizes());
  return attention_fused(q, k, v, fused_bias({bias}, q_positions, k_positions), masks, scale,
                         rotary);
}

at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& bias, const AttentionMasks& masks, double scale) {
  check_attention_shapes(q, k, v);
  const auto compute = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto logits = torch::einsum("bqhd,bkhd->bhqk", {q.to(compute), k.to(compute)}) * scale;
  if (bias.defined()) logits = logits + bias.to(compute);
  const int64_t nq = q.size(1), nk = k.size(1);
  const auto inf = -std::numeric_limits<double>::infinity();
  if (masks.causal) {  // key j visible to query i when j <= i + nk - nq
    const auto longs = q.options().dtype(torch::kLong);
    auto i = torch::arange(nq, longs).unsqueeze(1), j = torch::arange(nk, longs).unsqueeze(0);
    logits = logits.masked_fill(j > i + (nk - nq), inf);
  }
  if (masks.key_padding.defined())
    logits =
        logits.masked_fill(~masks.key_padding.to(torch::kBool).view({q.size(0), 1, 1, nk}), inf);
  auto weights = torch::softmax(logits, -1);
  weights = torch::where(torch::isnan(weights), torch::zeros_like(weights), weights);  // no key
  return torch::einsum("bhqk,bkhd->bqhd", {weights, v.to(compute)}).to(q.scalar_type());
}

at::Tensor bias_from_spec(const BiasSpec& bias, const at::Tensor& q_positions,
                          const at::Tensor& k_positions, int64_t heads, const at::Tensor& q) {
  auto rel = relative_positions(q_positions, k_positions);  // p_k - p_q: [Nq, Nk]
  switch (bias.form) {
    case BiasForm::kNone:
      return {};
    case BiasForm::kAlibi: {
      TORCH_CHECK(bias.slopes.numel() == heads, "bias_from_spec: ", bias.slopes.numel(),
                  " ALiBi slopes for ", heads, " heads");
      auto distance = (bias.symmetric ? rel.abs() : -rel).to(bias.slopes.device());
      return (-bias.slopes.to(torch::kFloat64).view({-1, 1, 1}) * distance).to(torch::kFloat32);
    }
    case BiasForm::kBucketTable: {
      auto b =
          t5_relative_position_bucket(rel, bias.bidirectional, bias.num_buckets, bias.max_distance);
      return torch::embedding(bias.table, b.to(bias.table.device())).movedim(-1, -3);
    }
    case BiasForm::kRelativeTable: {  // q_i . a[clip(p_j - p_i)] / sqrt(D): [B, H, Nq, Nk]
      TORCH_CHECK(q.defined() && q.dim() == 4,
                  "bias_from_spec: a relative table (Shaw) depends on the queries; q [B, Nq, H, "
                  "Dh] is required");
      auto scores = torch::einsum("bqhd,rd->bhqr", {q, bias.table.to(q.scalar_type())}) /
                    std::sqrt(static_cast<double>(q.size(3)));
      auto index = shaw_relative_index(rel, bias.max_relative_position).to(q.device());
      index = index.view({1, 1, rel.size(0), rel.size(1)})
                  .expand({q.size(0), q.size(2), rel.size(0), rel.size(1)});
      return scores.gather(-1, index);
    }
  }
  return {};
}

}  // namespace posenc
