// Autograd for the SDPA-layout attention operators (../attention_operators.cpp): the forward op
// saves the log-sum-exp of each row, the backward op recomputes the tiles from it
// (FlashAttention-2's backward). Both go through the dispatcher, so torch.compile sees the two ops
// and their fake kernels (python/posenc/_meta.py).
// posenc::shaw_attention: dq, dk, dv and a gradient for its [2K+1, D] table
// (_shaw_attention_backward's dtable: sum_{b,h} dqr^T q, dqr = dS summed per clipped offset).
// posenc::positional_attention (RoPE inside + ALiBi + T5 + packed samples + binary variate bias;
// posenc.alibi_attention and posenc.t5_attention are it): gradients for q, k, v (the backward op
// rotates dq, dk back), the T5 table and variate_bias [2, H]; the slopes, the ids and the
// rotary tables are constants. Rotary tables that require a gradient (learned frequencies) are
// applied first by posenc::apply_rotary (its own Autograd kernel gives dcos, dsin; a rotated copy
// of q and k), then the op runs without them.
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>

#include "../../kernels/autograd/first_order.h"
#include "../registration.h"

namespace posenc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptionalTensor = std::optional<at::Tensor>;

OptionalTensor optional_of(const at::Tensor& t) {
  return t.defined() ? OptionalTensor(t) : std::nullopt;
}

class ShawAttentionFunction : public torch::autograd::Function<ShawAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& table, bool causal,
                               std::optional<double> scale, const OptionalTensor& attention_mask) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_shaw_attention_forward", "")
            .typed<std::tuple<at::Tensor, at::Tensor>(
                const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                std::optional<double>, const OptionalTensor&)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = op.call(q, k, v, table, causal, scale, attention_mask);
    ctx->save_for_backward({q, k, v, out, lse, table, attention_mask.value_or(at::Tensor())});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("posenc attention");
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_shaw_attention_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                std::optional<double>, const OptionalTensor&)>();
    const auto s = ctx->get_saved_variables();
    const auto scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    auto [dq, dk, dv, dtable] =
        op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5],
                ctx->saved_data["causal"].toBool(), scale, optional_of(s[6]));
    return {dq, dk, dv, dtable, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor shaw_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& table, bool causal,
                                   std::optional<double> scale,
                                   const OptionalTensor& attention_mask) {
  return ShawAttentionFunction::apply(q, k, v, table, causal, scale, attention_mask)[0];
}

class PositionalAttentionFunction : public torch::autograd::Function<PositionalAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const OptionalTensor& cos,
                               const OptionalTensor& sin, const std::string& layout,
                               const OptionalTensor& slopes, bool symmetric,
                               const OptionalTensor& t5_table, bool bidirectional,
                               int64_t max_distance, bool causal, std::optional<double> scale,
                               const OptionalTensor& attention_mask,
                               const OptionalTensor& sample_ids, const OptionalTensor& variate_ids,
                               const OptionalTensor& variate_bias,
                               const OptionalTensor& causal_ids) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_positional_attention_forward", "")
            .typed<std::tuple<at::Tensor, at::Tensor>(
                const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptionalTensor&,
                const OptionalTensor&, c10::string_view, const OptionalTensor&, bool,
                const OptionalTensor&, bool, int64_t, bool, std::optional<double>,
                const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
                const OptionalTensor&, const OptionalTensor&)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] =
        op.call(q, k, v, cos, sin, layout, slopes, symmetric, t5_table, bidirectional, max_distance,
                causal, scale, attention_mask, sample_ids, variate_ids, variate_bias, causal_ids);
    ctx->save_for_backward({q, k, v, out, lse, cos.value_or(at::Tensor()),
                            sin.value_or(at::Tensor()), slopes.value_or(at::Tensor()),
                            t5_table.value_or(at::Tensor()), attention_mask.value_or(at::Tensor()),
                            sample_ids.value_or(at::Tensor()), variate_ids.value_or(at::Tensor()),
                            variate_bias.value_or(at::Tensor()),
                            causal_ids.value_or(at::Tensor())});
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["symmetric"] = symmetric;
    ctx->saved_data["bidirectional"] = bidirectional;
    ctx->saved_data["max_distance"] = max_distance;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    detail::require_first_order("posenc attention");
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_positional_attention_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                const at::Tensor&, const at::Tensor&, const OptionalTensor&, const OptionalTensor&,
                c10::string_view, const OptionalTensor&, bool, const OptionalTensor&, bool, int64_t,
                bool, std::optional<double>, const OptionalTensor&, const OptionalTensor&,
                const OptionalTensor&, const OptionalTensor&, const OptionalTensor&)>();
    const auto s = ctx->get_saved_variables();
    const auto scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    const auto layout = ctx->saved_data["layout"].toStringRef();
    auto [dq, dk, dv, dtable, dvariate] = op.call(
        grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], optional_of(s[5]), optional_of(s[6]),
        layout, optional_of(s[7]), ctx->saved_data["symmetric"].toBool(), optional_of(s[8]),
        ctx->saved_data["bidirectional"].toBool(), ctx->saved_data["max_distance"].toInt(),
        ctx->saved_data["causal"].toBool(), scale, optional_of(s[9]), optional_of(s[10]),
        optional_of(s[11]), optional_of(s[12]), optional_of(s[13]));
    // q, k, v, cos, sin, layout, slopes, symmetric, t5_table, bidirectional, max_distance,
    // causal, scale, attention_mask, sample_ids, variate_ids, variate_bias, causal_ids
    return {dq,
            dk,
            dv,
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            s[8].defined() ? dtable : at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            s[12].defined() ? dvariate : at::Tensor(),
            at::Tensor()};
  }
};

// Rows [start, start + n) of a table [Nk, W] or [Bt, Nk, W] as [Bt, n, W] (apply_rotary's
// unsqueeze_dim=1 form).
at::Tensor rotary_rows(const at::Tensor& t, int64_t start, int64_t n) {
  return (t.dim() == 2 ? t.unsqueeze(0) : t).narrow(1, start, n);
}

at::Tensor positional_attention_autograd(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptionalTensor& cos,
    const OptionalTensor& sin, c10::string_view layout, const OptionalTensor& slopes,
    bool symmetric, const OptionalTensor& t5_table, bool bidirectional, int64_t max_distance,
    bool causal, std::optional<double> scale, const OptionalTensor& attention_mask,
    const OptionalTensor& sample_ids, const OptionalTensor& variate_ids,
    const OptionalTensor& variate_bias, const OptionalTensor& causal_ids) {
  static const auto route =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("posenc::positional_attention_route", "")
          .typed<std::string(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const OptionalTensor&, const OptionalTensor&, c10::string_view,
                             const OptionalTensor&, bool, const OptionalTensor&, bool, int64_t,
                             bool, std::optional<double>, const OptionalTensor&,
                             const OptionalTensor&, const OptionalTensor&, const OptionalTensor&,
                             const OptionalTensor&)>();
  TORCH_CHECK(!(at::GradMode::is_enabled() && slopes.has_value() && slopes->defined() &&
                slopes->requires_grad()),
              "posenc.positional_attention: the slopes have no gradient (ALiBi's are fixed); pass "
              "them detached");
  const bool learned = at::GradMode::is_enabled() && cos.has_value() && cos->defined() &&
                       sin.has_value() && sin->defined() &&
                       (cos->requires_grad() || sin->requires_grad());
  if (learned) {  // rotate first, differentiably in the tables (checks all arguments first)
    route.call(q, k, v, cos, sin, layout, slopes, symmetric, t5_table, bidirectional, max_distance,
               causal, scale, attention_mask, sample_ids, variate_ids, variate_bias, causal_ids);
    static const auto rotate = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("posenc::apply_rotary", "")
                                   .typed<std::tuple<at::Tensor, at::Tensor>(
                                       const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, int64_t, c10::string_view)>();
    const int64_t nq = q.size(2), nk = k.size(2);
    const auto qr = std::get<0>(rotate.call(q, q, rotary_rows(*cos, nk - nq, nq),
                                            rotary_rows(*sin, nk - nq, nq), 1, layout));
    const auto kr = std::get<0>(
        rotate.call(k, k, rotary_rows(*cos, 0, nk), rotary_rows(*sin, 0, nk), 1, layout));
    return PositionalAttentionFunction::apply(
        qr.to(q.scalar_type()), kr.to(k.scalar_type()), v, std::nullopt, std::nullopt,
        std::string(layout), slopes, symmetric, t5_table, bidirectional, max_distance, causal,
        scale, attention_mask, sample_ids, variate_ids, variate_bias, causal_ids)[0];
  }
  return PositionalAttentionFunction::apply(q, k, v, cos, sin, std::string(layout), slopes,
                                            symmetric, t5_table, bidirectional, max_distance,
                                            causal, scale, attention_mask, sample_ids, variate_ids,
                                            variate_bias, causal_ids)[0];
}

}  // namespace

POSENC_LIBRARY_IMPL(Autograd, m) {
  m.impl("shaw_attention", TORCH_FN(shaw_attention_autograd));
  m.impl("positional_attention", TORCH_FN(positional_attention_autograd));
}

}  // namespace posenc::ops
