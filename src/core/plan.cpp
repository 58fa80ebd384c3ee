// The position plan: builders that encoders call, the additive way the plan is applied
// (include/posenc/core/plan.h). The three that run kernels or their references, apply_rotary,
// materialize_bias and fused_bias, are defined with the kernels (src/kernels/plan_kernels.cpp):
// core includes no kernel header.
#include "posenc/core/plan.h"

#include <ATen/record_function.h>
#include <torch/torch.h>

#include "posenc/core/ids.h"

namespace posenc {

std::string to_string(BiasForm form) {
  switch (form) {
    case BiasForm::kNone:
      return "none";
    case BiasForm::kAlibi:
      return "alibi";
    case BiasForm::kBucketTable:
      return "bucket_table";
    case BiasForm::kRelativeTable:
      return "relative_table";
  }
  return "unknown";
}

EncodingPlan::EncodingPlan(PlanRequest request) : request_(std::move(request)) {
  TORCH_CHECK(request_.queries.defined(), "plan: query positions are required");
  if (request_.sample_ids.defined()) {
    const auto& q = request_.queries;
    TORCH_CHECK(!request_.keys.defined() && !request_.rotated_keys.defined(),
                "plan: sample_ids (packed samples) need self-attention without a key-value cache");
    TORCH_CHECK(request_.sample_ids.size(-1) == q.size() &&
                    (request_.sample_ids.dim() == 1 || request_.sample_ids.dim() == 2),
                "plan: sample_ids must be [N] or [B, N] with N = ", q.size(),
                " (the positions), got shape ", request_.sample_ids.sizes());
    sample_ids_ = checked_sample_ids(request_.sample_ids).to(request_.device);
  }
}

void EncodingPlan::set_variate_bias(const std::string& encoder, const at::Tensor& ids,
                                    const at::Tensor& table) {
  TORCH_CHECK(!variate_table_.defined(), "plan: two variate bias parts (", variate_owner_, " and ",
              encoder, ")");
  TORCH_CHECK(!request_.keys.defined() && !request_.rotated_keys.defined(), "plan: ", encoder,
              " (variate bias) needs self-attention without a key-value cache");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == 2, "plan: ", encoder,
              "'s table must be [2, H], got shape ", table.sizes());
  TORCH_CHECK((ids.dim() == 1 || ids.dim() == 2) && ids.size(-1) == request_.queries.size(),
              "plan: ", encoder,
              "'s variate ids must be [N] or [B, N] with N = ", request_.queries.size(),
              ", got shape ", ids.sizes());
  variate_ids_ = checked_ids(ids, encoder + ": variate ids").to(request_.device);
  variate_table_ = table;
  variate_owner_ = encoder;
  parts_.push_back({encoder, "bias (variate)"});
}

void EncodingPlan::add_embedding(const std::string& encoder, const at::Tensor& embedding,
                                 const at::Tensor& prefix_rows) {
  const int64_t n = request_.queries.size();
  TORCH_CHECK(embedding.dim() == 2 || embedding.dim() == 3, "plan: ", encoder,
              "'s embedding must be [N, D] or [B, N, D], got shape ", embedding.sizes());
  TORCH_CHECK(embedding.size(-2) == n, "plan: ", encoder, "'s embedding has ", embedding.size(-2),
              " rows for ", n, " positions");
  if (embedding_.defined()) {
    TORCH_CHECK(embedding_.size(-1) == embedding.size(-1),
                "plan: additive parts of different "
                "widths: ",
                embedding_.size(-1), " and ", embedding.size(-1), " (", encoder, ")");
    embedding_ = embedding_ + embedding.to(embedding_.device());
  } else {
    embedding_ = embedding;
  }
  if (prefix_rows.defined()) {
    TORCH_CHECK(prefix_rows.dim() == 2 && prefix_rows.size(1) == embedding.size(-1),
                "plan: ", encoder, "'s prefix rows must be [P, ", embedding.size(-1), "], got ",
                prefix_rows.sizes());
    if (prefix_embedding_.defined()) {
      TORCH_CHECK(prefix_embedding_.sizes() == prefix_rows.sizes(), "plan: prefix rows ",
                  prefix_embedding_.sizes(), " and ", prefix_rows.sizes(), " (", encoder,
                  ") differ");
      prefix_embedding_ = prefix_embedding_ + prefix_rows;
    } else {
      prefix_embedding_ = prefix_rows;
    }
  }
  additive_owner_ += (additive_owner_.empty() ? "" : " + ") + encoder;
  parts_.push_back({encoder, "additive"});
}

void EncodingPlan::set_rotary(const std::string& encoder, RotaryTables tables) {
  TORCH_CHECK(!rotary_.defined(), "plan: two rotary parts (", rotary_owner_, " and ", encoder,
              "); a plan rotates q and k once: keep one rotary encoder (give it per-axis "
              "sections for several axes)");
  TORCH_CHECK(tables.q_cos.defined() && tables.q_sin.defined(), "plan: ", encoder,
              " set rotary tables without q_cos/q_sin");
  if (!tables.k_cos.defined()) {
    tables.k_cos = tables.q_cos;
    tables.k_sin = tables.q_sin;
    tables.shared = true;
  }
  rotary_ = std::move(tables);
  rotary_owner_ = encoder;
  parts_.push_back({encoder, "rotary"});
}

void EncodingPlan::add_bias_spec(const std::string& encoder, BiasSpec spec) {
  const auto& q = request_.queries;
  const auto& k = request_.key_positions();
  TORCH_CHECK(q.num_axes() == 1 && k.num_axes() == 1 && !q.batched() && !k.batched(),
              "plan: ", encoder, "'s describable bias needs one-axis, unbatched positions, got ",
              q.describe(), " and ", k.describe(), "; add the bias materialized instead");
  if (!bias_q_.defined()) {
    bias_q_ = q.axis(0).to(torch::kFloat64).contiguous();
    bias_k_ = k.axis(0).to(torch::kFloat64).contiguous();
  }
  parts_.push_back({encoder, "bias (" + to_string(spec.form) + ")"});
  bias_specs_.push_back(std::move(spec));
  fused_.reset();
}

void EncodingPlan::add_bias(const std::string& encoder, const at::Tensor& bias) {
  TORCH_CHECK(bias.dim() == 3 || bias.dim() == 4, "plan: ", encoder,
              "'s bias must be [H, Nq, Nk] or [B, H, Nq, Nk], got shape ", bias.sizes());
  TORCH_CHECK(
      bias.size(-2) == request_.queries.size() && bias.size(-1) == request_.key_positions().size(),
      "plan: ", encoder, "'s bias is ", bias.sizes(), " for ", request_.queries.size(),
      " queries and ", request_.key_positions().size(), " keys");
  materialized_bias_ = materialized_bias_.defined() ? materialized_bias_ + bias : bias;
  parts_.push_back({encoder, "bias (materialized)"});
}

void EncodingPlan::add_query_bias(const std::string& encoder,
                                  std::function<at::Tensor(const at::Tensor& q)> bias) {
  query_biases_.push_back(std::move(bias));
  parts_.push_back({encoder, "bias (query-dependent)"});
}

at::Tensor EncodingPlan::apply_additive(const at::Tensor& x, int64_t prefix) const {
  if (!has_additive()) return x;
  TORCH_CHECK(x.dim() == 2 || x.dim() == 3, "plan: x must be [N, D] or [B, N, D], got shape ",
              x.sizes());
  const int64_t n = request_.queries.size();
  const auto& who = additive_owner_;
  if (prefix == 0) {
    TORCH_CHECK(x.size(-2) == n, who, ": x has ", x.size(-2), " tokens but ", n,
                " positions were given");
  } else {
    TORCH_CHECK(prefix > 0 && x.size(-2) == prefix + n, who, ": x has ", x.size(-2), " tokens but ",
                prefix, " prefix + ", n, " positions were given");
  }
  const auto width = embedding_.size(-1);
  TORCH_CHECK(x.size(-1) == width, who, ": x has width ", x.size(-1),
              " but the encoder has dim=", width);
  const int64_t rows = prefix_embedding_.defined() ? prefix_embedding_.size(0) : 0;
  TORCH_CHECK(rows == 0 || rows == prefix, "plan: the additive encoding has ", rows,
              " prefix row(s) (CLS, registers) but the input has ", prefix, " prefix token(s)");
  const auto options = x.options();
  auto positioned = x.narrow(-2, prefix, n) + embedding_.to(options);
  if (prefix == 0) return positioned;
  auto head = x.narrow(-2, 0, prefix);
  if (rows > 0) head = head + prefix_embedding_.to(options);
  if (positioned.dim() > head.dim())  // batched embedding over unbatched x
    head = head.unsqueeze(0).expand({positioned.size(0), prefix, width});
  return torch::cat({head, positioned}, -2);
}

}  // namespace posenc
