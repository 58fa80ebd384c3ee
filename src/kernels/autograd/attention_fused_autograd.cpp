// Autograd for posenc::attention_fused (the math in ../dispatch/attention_fused_operator.h): the
// forward calls _attention_fused_forward (out and the rows' log-sum-exp), the backward
// _attention_fused_backward with them (the tiles recomputed from lse: dS = P * (dP - delta),
// delta_i = dO_i . O_i), each dispatched to the device's kernel. Gradients for q, k, v, the T5 or
// Shaw table and the binary variate bias [2, H]; positions, slopes, masks and the rotary tables are
// constants here (learned frequencies rotate q and k outside, with rope_fused). First order only:
// the backward kernels are not differentiable.
#include <torch/autograd.h>

#include <string>

#include "../dispatch/attention_fused_operator.h"
#include "first_order.h"

namespace posenc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The operator's arguments after (q, k, v) but the table, kept for the backward's call.
struct Arguments : torch::CustomClassHolder {
  at::Tensor q_positions, k_positions;
  std::optional<at::Tensor> slopes, key_padding, q_cos, q_sin, k_cos, k_sin, sample_ids,
      variate_ids, causal_ids;
  bool symmetric = false, bidirectional = true, causal = false, has_table = false;
  bool has_variate = false;
  std::string table_form, rope_layout;
  int64_t num_buckets = 0, max_distance = 0, max_relative_position = 0;
  double scale = 1.0;
};

// The operators' arguments from (a, table, variate_bias): the order of
// POSENC_ATTENTION_FUSED_PARAMS.
#define POSENC_SAVED_ARGS(a, table, variate_bias)                                                 \
  a.q_positions, a.k_positions, a.slopes, a.symmetric, table, a.table_form, a.num_buckets,        \
      a.max_distance, a.bidirectional, a.max_relative_position, a.causal, a.key_padding, a.scale, \
      a.q_cos, a.q_sin, a.k_cos, a.k_sin, a.rope_layout, a.sample_ids, a.variate_ids,             \
      variate_bias, a.causal_ids

class AttentionFusedFunction : public torch::autograd::Function<AttentionFusedFunction> {
 public:
  // table: the T5 or Shaw table, variate_bias: [2, H]; inputs so that autograd tracks them ([0]
  // without one)
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& table,
                               const at::Tensor& variate_bias, c10::intrusive_ptr<Arguments> args) {
    const auto& a = *args;
    const auto t = a.has_table ? std::optional<at::Tensor>(table) : std::nullopt;
    const auto w = a.has_variate ? std::optional<at::Tensor>(variate_bias) : std::nullopt;
    at::AutoDispatchBelowADInplaceOrView guard;
    // out (float32 on the CPU) kept for the backward's delta = dO . O; the caller gets q's dtype
    auto [out, lse] = attention_fused_forward_op().call(q, k, v, POSENC_SAVED_ARGS(a, t, w));
    ctx->save_for_backward({q, k, v, table, out, lse, variate_bias});
    ctx->saved_data["arguments"] = c10::IValue::make_capsule(std::move(args));
    return {attention_out_in_dtype(out, q)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("attention_fused");
    variable_list result(6);  // q, k, v, table, variate_bias, arguments
    if (!grads[0].defined()) return result;
    const auto saved = ctx->get_saved_variables();
    const auto& a =
        *c10::static_intrusive_pointer_cast<Arguments>(ctx->saved_data["arguments"].toCapsule());
    const auto& table = saved[3];
    const auto t = a.has_table ? std::optional<at::Tensor>(table) : std::nullopt;
    const auto w = a.has_variate ? std::optional<at::Tensor>(saved[6]) : std::nullopt;
    auto [dq, dk, dv, dtable, dvariate] = attention_fused_backward_op().call(
        grads[0], saved[4], saved[5], saved[0], saved[1], saved[2], POSENC_SAVED_ARGS(a, t, w));
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (a.has_table && ctx->needs_input_grad(3)) result[3] = dtable;
    if (a.has_variate && ctx->needs_input_grad(4)) result[4] = dvariate;
    return result;
  }
};

#undef POSENC_SAVED_ARGS

}  // namespace

at::Tensor attention_fused_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    POSENC_ATTENTION_FUSED_PARAMS) {
  // constants here: a gradient asked for is refused, not dropped
  auto wants_grad = [](const std::optional<at::Tensor>& t) {
    return t.has_value() && t->defined() && t->requires_grad();
  };
  TORCH_CHECK(!at::GradMode::is_enabled() || !(q_positions.requires_grad() ||
                                               k_positions.requires_grad() || wants_grad(slopes)),
              "attention_fused: positions and ALiBi slopes are constants here (no gradient); "
              "detach them, or materialize the bias (attention_reference) to learn them");
  auto a = c10::make_intrusive<Arguments>();
  a->q_positions = q_positions;
  a->k_positions = k_positions;
  a->slopes = slopes;
  a->symmetric = symmetric;
  a->has_table = table.has_value() && table->defined();
  a->table_form = std::string(table_form);
  a->num_buckets = num_buckets;
  a->max_distance = max_distance;
  a->bidirectional = bidirectional;
  a->max_relative_position = max_relative_position;
  a->causal = causal;
  a->key_padding = key_padding;
  a->scale = scale;
  a->q_cos = q_cos;
  a->q_sin = q_sin;
  a->k_cos = k_cos;
  a->k_sin = k_sin;
  a->rope_layout = std::string(rope_layout);
  a->sample_ids = sample_ids;
  a->variate_ids = variate_ids;
  a->causal_ids = causal_ids;
  a->has_variate = variate_bias.has_value() && variate_bias->defined();
  const auto t = a->has_table ? *table : at::empty({0}, q.options().dtype(at::kFloat));
  const auto w = a->has_variate ? *variate_bias : at::empty({0}, q.options().dtype(at::kFloat));
  return AttentionFusedFunction::apply(q, k, v, t, w, std::move(a))[0];
}

}  // namespace posenc::ops
