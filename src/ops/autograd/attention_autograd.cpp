// Autograd for posenc::alibi_attention (the formula in ../attention.cpp): the forward op saves
// the log-sum-exp of each row, the backward op recomputes the tiles from it
// (FlashAttention-2's backward): dq, dk, dv; the slopes are constants (no gradient: ALiBi's are
// fixed). Both go through the dispatcher, so torch.compile sees the two ops and their fake
// kernels (python/posenc/_meta.py).
// posenc::t5_attention the same way, with a gradient for its bucket table as well
// (_t5_attention_backward's dtable: dS summed per bucket and head).
// posenc::shaw_attention likewise, with a gradient for its [2K+1, D] table
// (_shaw_attention_backward's dtable: sum_{b,h} dqr^T q, dqr = dS summed per clipped offset).
#include <torch/autograd.h>
#include <torch/library.h>

namespace posenc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class AlibiAttentionFunction : public torch::autograd::Function<AlibiAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& slopes, bool causal,
                               bool symmetric, std::optional<double> scale) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("posenc::_alibi_attention_forward", "")
                               .typed<std::tuple<at::Tensor, at::Tensor>(
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool, std::optional<double>)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = op.call(q, k, v, slopes, causal, symmetric, scale);
    ctx->save_for_backward({q, k, v, out, lse, slopes});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["symmetric"] = symmetric;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("posenc::_alibi_attention_backward", "")
                               .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, bool, std::optional<double>)>();
    const auto s = ctx->get_saved_variables();
    const auto scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    auto [dq, dk, dv] =
        op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5],
                ctx->saved_data["causal"].toBool(), ctx->saved_data["symmetric"].toBool(), scale);
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor alibi_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const at::Tensor& slopes, bool causal, bool symmetric,
                                    std::optional<double> scale) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && slopes.requires_grad()),
              "posenc.alibi_attention: the slopes have no gradient (ALiBi's are fixed); pass "
              "them detached");
  return AlibiAttentionFunction::apply(q, k, v, slopes, causal, symmetric, scale)[0];
}

class T5AttentionFunction : public torch::autograd::Function<T5AttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& table, bool bidirectional,
                               int64_t max_distance, bool causal, std::optional<double> scale) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_t5_attention_forward", "")
            .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                      const at::Tensor&, const at::Tensor&, bool,
                                                      int64_t, bool, std::optional<double>)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = op.call(q, k, v, table, bidirectional, max_distance, causal, scale);
    ctx->save_for_backward({q, k, v, out, lse, table});
    ctx->saved_data["bidirectional"] = bidirectional;
    ctx->saved_data["max_distance"] = max_distance;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("posenc::_t5_attention_backward", "")
            .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, int64_t, bool,
                std::optional<double>)>();
    const auto s = ctx->get_saved_variables();
    const auto scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    auto [dq, dk, dv, dtable] =
        op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5],
                ctx->saved_data["bidirectional"].toBool(), ctx->saved_data["max_distance"].toInt(),
                ctx->saved_data["causal"].toBool(), scale);
    return {dq, dk, dv, dtable, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor t5_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& table, bool bidirectional, int64_t max_distance,
                                 bool causal, std::optional<double> scale) {
  return T5AttentionFunction::apply(q, k, v, table, bidirectional, max_distance, causal, scale)[0];
}

class ShawAttentionFunction : public torch::autograd::Function<ShawAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const at::Tensor& table, bool causal,
                               std::optional<double> scale) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("posenc::_shaw_attention_forward", "")
                               .typed<std::tuple<at::Tensor, at::Tensor>(
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, std::optional<double>)>();
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, lse] = op.call(q, k, v, table, causal, scale);
    ctx->save_for_backward({q, k, v, out, lse, table});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale.has_value() ? c10::IValue(*scale) : c10::IValue();
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("posenc::_shaw_attention_backward", "")
                               .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const at::Tensor&, bool, std::optional<double>)>();
    const auto s = ctx->get_saved_variables();
    const auto scale_value = ctx->saved_data["scale"];
    const std::optional<double> scale =
        scale_value.isNone() ? std::nullopt : std::optional<double>(scale_value.toDouble());
    auto [dq, dk, dv, dtable] = op.call(grads[0].contiguous(), s[0], s[1], s[2], s[3], s[4], s[5],
                                        ctx->saved_data["causal"].toBool(), scale);
    return {dq, dk, dv, dtable, at::Tensor(), at::Tensor()};
  }
};

at::Tensor shaw_attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& table, bool causal,
                                   std::optional<double> scale) {
  return ShawAttentionFunction::apply(q, k, v, table, causal, scale)[0];
}

}  // namespace

TORCH_LIBRARY_IMPL(posenc, Autograd, m) {
  m.impl("alibi_attention", TORCH_FN(alibi_attention_autograd));
  m.impl("t5_attention", TORCH_FN(t5_attention_autograd));
  m.impl("shaw_attention", TORCH_FN(shaw_attention_autograd));
}

}  // namespace posenc::ops
