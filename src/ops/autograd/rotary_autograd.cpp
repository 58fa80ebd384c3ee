// Autograd for posenc::apply_rotary (the formula in ../rotary.h):
//   y = x * c + rot(x) * s   (first W dims; the rest copied)
//   dx   = apply_rotary(dy, cos, -swap(sin))      rot's adjoint turns the table's pair members
//                                                 round: half [s_a | s_b] -> [-s_b | -s_a]
//   dcos = sum_to(dy * x, cos),  dsin = sum_to(dy * rot(x), sin)     (q's and k's terms added)
// Where the tables promote x (bfloat16 x with float32 tables: OLMo's and Ernie's rotation) or
// broadcast it to a larger result, eager autograd sums each product's gradient over the broadcast
// dims and rounds it to x's dtype before adding them (every edge into x is cast to x's dtype), so
// dx is computed that way there, to the bit:
//   dx = round(sum_to(dy * c)) + round(rot^T(sum_to(dy * s))) in x's dtype,  rot^T = -rot
// (the fused path adds first and rounds once).
// The backward calls the operator, not a kernel, so it is itself differentiable (gradgradcheck)
// and torch.compile traces it. apply_rotary_ records no gradients: with autograd on and an input
// that needs one, it is one line (use apply_rotary).
#include <ATen/ExpandUtils.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "../rotary.h"
#include "../registration.h"

namespace posenc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using ApplyRotarySignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                const at::Tensor&,
                                                                const at::Tensor&,
                                                                const at::Tensor&, int64_t,
                                                                c10::string_view);

std::tuple<at::Tensor, at::Tensor> call_apply_rotary(const at::Tensor& q, const at::Tensor& k,
                                                     const at::Tensor& cos, const at::Tensor& sin,
                                                     int64_t unsqueeze_dim,
                                                     const std::string& layout) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::apply_rotary", "")
                             .typed<ApplyRotarySignature>();
  return op.call(q, k, cos, sin, unsqueeze_dim, layout);
}

// dL/dtable for one of q, k: sum over the broadcast dims of g[..., :W] * term(x[..., :W]).
at::Tensor table_grad(const at::Tensor& g, const at::Tensor& term, const at::Tensor& table,
                      int64_t unsqueeze_dim) {
  const auto unsqueezed = table.unsqueeze(unsqueeze_dim);
  // symbolic sizes: under torch.compile(dynamic=True) the batch and token counts stay symbols
  return at::sum_to(g * term, unsqueezed.sym_sizes()).squeeze(unsqueeze_dim);
}

// dL/dx for an x that the tables promoted (its dtype below the result's) or broadcast (the result
// larger than x), as eager autograd gives it for `x * c + rotate_half(x) * s`: each product's
// gradient summed over the broadcast dims and rounded to x's dtype, then the two added there; dims
// past the rotary width pass the gradient through. g [.., D] in the result's dtype,
// c, s the unsqueezed tables [.., W].
at::Tensor per_term_input_grad(const at::Tensor& g, const at::Tensor& x, const at::Tensor& c,
                               const at::Tensor& s, RopeLayout layout) {
  const auto dt = x.scalar_type();
  const c10::SymInt width = c.sym_size(-1), dim = g.sym_size(-1);
  const auto gr = g.narrow_symint(-1, 0, width);
  // eager sums over the dims the tables broadcast x to in the wider dtype, then rounds: so here
  auto rotary_shape = x.sym_sizes().vec();
  rotary_shape.back() = width;
  const auto down = [&](const at::Tensor& t) { return at::sum_to(t, rotary_shape).to(dt); };
  auto dx = down(gr * c) - rotate_half_any(down(gr * s), layout);  // rot^T = -rot
  if (width != dim) {
    auto pass_shape = x.sym_sizes().vec();
    pass_shape.back() = dim - width;
    dx = at::cat({dx, at::sum_to(g.narrow_symint(-1, width, dim - width), pass_shape).to(dt)}, -1);
  }
  return dx;
}

class ApplyRotaryFunction : public torch::autograd::Function<ApplyRotaryFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin, int64_t unsqueeze_dim,
                               const std::string& layout) {
    ctx->save_for_backward({q, k, cos, sin});
    ctx->saved_data["unsqueeze_dim"] = unsqueeze_dim;
    ctx->saved_data["layout"] = layout;
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [yq, yk] = call_apply_rotary(q, k, cos, sin, unsqueeze_dim, layout);
    return {yq, yk};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &cos = saved[2], &sin = saved[3];
    const int64_t unsqueeze_dim = ctx->saved_data["unsqueeze_dim"].toInt();
    const std::string layout = ctx->saved_data["layout"].toStringRef();
    const RopeLayout parsed = rope_layout_from_string(layout);
    const int64_t u = unsqueeze_dim < 0 ? unsqueeze_dim + cos.dim() + 1 : unsqueeze_dim;
    const auto gq = grads[0].defined()
                        ? grads[0]
                        : at::zeros_like(q, q.options().dtype(at::result_type(q, cos)));
    const auto gk = grads[1].defined()
                        ? grads[1]
                        : at::zeros_like(k, k.options().dtype(at::result_type(k, cos)));
    variable_list result(6);
    const auto promoted = [&](const at::Tensor& x) {
      return at::promote_types(at::result_type(x, cos), sin.scalar_type()) != x.scalar_type();
    };
    // tables that broadcast q or k to a larger result: eager sums each product's gradient over
    // the broadcast dims before adding the two, so the per-term path follows its order there too
    const auto broadcast = [&](const at::Tensor& x, const at::Tensor& g) {
      return x.sym_sizes() != g.sym_sizes();
    };
    if ((q.requires_grad() || k.requires_grad()) &&
        (promoted(q) || promoted(k) || broadcast(q, gq) || broadcast(k, gk))) {
      const auto c = cos.unsqueeze(u), s = sin.unsqueeze(u);
      result[0] = per_term_input_grad(gq, q, c, s, parsed);
      result[1] = per_term_input_grad(gk, k, c, s, parsed);
    } else if (q.requires_grad() || k.requires_grad()) {  // q, k their results' shape and dtype
      std::tie(result[0], result[1]) =
          call_apply_rotary(gq, gk, cos, -swap_pair_members(sin, parsed), u, layout);
    }
    const c10::SymInt width = cos.sym_size(-1);
    const auto rotary = [&](const at::Tensor& t) { return t.narrow_symint(-1, 0, width); };
    if (cos.requires_grad())
      result[2] =
          (table_grad(rotary(gq), rotary(q), cos, u) + table_grad(rotary(gk), rotary(k), cos, u))
              .to(cos.scalar_type());
    if (sin.requires_grad())
      result[3] = (table_grad(rotary(gq), rotate_half_any(rotary(q), parsed), sin, u) +
                   table_grad(rotary(gk), rotate_half_any(rotary(k), parsed), sin, u))
                      .to(sin.scalar_type());
    return result;
  }
};

std::tuple<at::Tensor, at::Tensor> apply_rotary_autograd(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos,
                                                         const at::Tensor& sin,
                                                         int64_t unsqueeze_dim,
                                                         c10::string_view layout) {
  auto out = ApplyRotaryFunction::apply(q, k, cos, sin, unsqueeze_dim, std::string(layout));
  return {out[0], out[1]};
}

using ApplyRotaryInPlaceSignature = void(at::Tensor&, at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, c10::string_view);

const c10::TypedOperatorHandle<ApplyRotaryInPlaceSignature>& apply_rotary_inplace_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::apply_rotary_", "")
                             .typed<ApplyRotaryInPlaceSignature>();
  return op;
}

void apply_rotary_inplace_autograd(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                                   const at::Tensor& sin, int64_t unsqueeze_dim,
                                   c10::string_view layout) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() ||
                                               cos.requires_grad() || sin.requires_grad())),
              "posenc.apply_rotary_: in-place rotation records no gradients; use apply_rotary "
              "(or run under torch.no_grad())");
  at::AutoDispatchBelowAutograd guard;  // to the ADInplaceOrView kernel, which bumps the versions
  apply_rotary_inplace_op().call(q, k, cos, sin, unsqueeze_dim, layout);
}

// In place under InferenceMode too (the Autograd keys skipped, ADInplaceOrView not): q's and k's
// version counters are bumped here, so a tensor saved for backward and modified later is caught.
void apply_rotary_inplace_ad_view(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                                  const at::Tensor& sin, int64_t unsqueeze_dim,
                                  c10::string_view layout) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    apply_rotary_inplace_op().call(q, k, cos, sin, unsqueeze_dim, layout);
  }
  torch::autograd::impl::bump_version(q);
  torch::autograd::impl::bump_version(k);
}

}  // namespace

POSENC_LIBRARY_IMPL(Autograd, m) {
  m.impl("apply_rotary", TORCH_FN(apply_rotary_autograd));
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace_autograd));
}

POSENC_LIBRARY_IMPL(ADInplaceOrView, m) {
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace_ad_view));
}

}  // namespace posenc::ops
