// The C++ library's fused attention around its operator: the bias parts prepared once per forward
// (fused_bias: ALiBi slopes folded, positions as the kernels read them, T5's bucket of every
// relative offset), whether the kernels take them (attention_fused_supported), and the
// plain-ATen specification every kernel is tested against:
//
//   attention_reference: softmax(q k^T * scale + bias + masks) v, with a row that sees no key
//   giving 0; bias_from_spec: the bias a BiasSpec describes, materialized (ALiBi, T5, Shaw).
//
// attention_fused itself is the operator posenc::attention_fused
// (dispatch/attention_fused_operator.cpp: one dispatch point between the CPU and CUDA kernels).
// Contract: posenc/kernels/attention_fused.h.
#include "posenc/kernels/attention_fused.h"

#include <torch/torch.h>

#include <limits>

#include "cpu/attention_cpu.h"
#include "dispatch/attention_fused_operator.h"
#include "posenc/functional/relative.h"
#if POSENC_HAS_CUDA_GLUE
#include "cuda/cuda_glue.h"
#endif

namespace posenc {

namespace {

bool integer_valued(const at::Tensor& t) { return t.numel() == 0 || at::equal(t, t.round()); }

std::vector<double> to_vector(const at::Tensor& t) {
  auto c = t.to(torch::kCPU, torch::kFloat64).contiguous();  // read in host memory
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
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

bool attention_fused_supported(const FusedBias& bias, const at::Tensor& q,
                               const AttentionMasks& masks) {
  // packed samples and the variate bias: both kernels (CUDA: src/kernels/cuda/attention_cuda.cu)
  return attention_fused_supported(bias, q) &&
         (!masks.causal_ids.defined() || q.device().is_cpu());  // causal ids: the CPU kernel
}

bool attention_fused_supported(const BiasSpec& bias, const at::Tensor& q,
                               const at::Tensor& q_positions, const at::Tensor& k_positions) {
  if (q_positions.dim() != 1 || k_positions.dim() != 1) return false;
  return attention_fused_supported(*fused_bias({bias}, q_positions, k_positions), q);
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
  ops::check_attention_shapes(q, k, v);
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
  detail::check_packed_ids("attention_reference", masks.sample_ids, masks.variate_ids,
                           masks.variate_bias, q.size(0), nk, q.size(2));
  if (masks.variate_ids.defined())
    logits = logits + variate_bias_from_ids(masks.variate_ids.to(q.device()),
                                            masks.variate_bias.to(q.device(), compute), nq);
  if (masks.key_padding.defined())
    logits =
        logits.masked_fill(~masks.key_padding.to(torch::kBool).view({q.size(0), 1, 1, nk}), inf);
  if (masks.sample_ids.defined())
    logits = logits.masked_fill(
        ~sample_mask_from_ids(masks.sample_ids.to(q.device()), nq).unsqueeze(1), inf);
  detail::check_causal_ids("attention_reference", masks.causal_ids, masks.causal, q.size(0), nq,
                           nk);
  if (masks.causal_ids.defined())
    logits = logits.masked_fill(
        ~causal_mask_from_ids(masks.causal_ids.to(q.device()), nq).unsqueeze(1), inf);
  // a row that sees no key (every logit -inf) gives 0; a NaN from the inputs stays NaN
  const auto none = (logits == inf).all(-1, /*keepdim=*/true);
  auto weights = torch::softmax(logits.masked_fill(none, 0.0), -1).masked_fill(none, 0.0);
  return torch::einsum("bhqk,bkhd->bqhd", {weights, v.to(compute)}).to(q.scalar_type());
}

namespace {

// ids [B, Nk] -> [B, Nq, Nk] bool: ids of the queries (the last Nq) equal those of the keys.
at::Tensor equal_ids(const at::Tensor& ids, int64_t nq, const char* name) {
  TORCH_CHECK(ids.dim() == 2 && nq <= ids.size(1), name, " must be [B, Nk] with Nk >= Nq=", nq,
              ", got ", ids.sizes());
  const int64_t nk = ids.size(1);
  return ids.narrow(1, nk - nq, nq).unsqueeze(2) == ids.unsqueeze(1);
}

}  // namespace

at::Tensor sample_mask_from_ids(const at::Tensor& sample_ids, int64_t nq) {
  return equal_ids(sample_ids, nq, "sample_mask_from_ids: sample_ids");
}

at::Tensor causal_mask_from_ids(const at::Tensor& causal_ids, int64_t nq) {
  TORCH_CHECK(causal_ids.dim() == 2 && nq <= causal_ids.size(1),
              "causal_mask_from_ids: causal_ids must be [B, Nk] with Nk >= Nq=", nq, ", got ",
              causal_ids.sizes());
  const int64_t nk = causal_ids.size(1);
  // uni2ts' packed_causal_attention_mask: time_id[..., None, :] <= time_id[..., :, None]
  return causal_ids.unsqueeze(1) <= causal_ids.narrow(1, nk - nq, nq).unsqueeze(2);
}

at::Tensor variate_bias_from_ids(const at::Tensor& variate_ids, const at::Tensor& variate_bias,
                                 int64_t nq) {
  TORCH_CHECK(variate_bias.dim() == 2 && variate_bias.size(0) == 2,
              "variate_bias_from_ids: variate_bias must be [2, H], got ", variate_bias.sizes());
  const auto same = equal_ids(variate_ids, nq, "variate_bias_from_ids: variate_ids").unsqueeze(1);
  const auto w = variate_bias.view({2, 1, -1, 1, 1});  // [2, 1, H, 1, 1]
  // uni2ts: ~ind * weight[:1] + ind * weight[1:]
  return at::logical_not(same) * w[0] + same * w[1];  // [B, H, Nq, Nk]
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
