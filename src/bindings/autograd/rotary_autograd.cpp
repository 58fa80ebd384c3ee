// Autograd for posenc::apply_rotary (the formula in ../rotary.h):
//   y = x * c + rot(x) * s   (first W dims; the rest copied)
//   dx   = apply_rotary(dy, cos, -swap(sin))      rot's adjoint turns the table's pair members
//                                                 round: half [s_a | s_b] -> [-s_b | -s_a]
//   dcos = sum_to(dy * x, cos),  dsin = sum_to(dy * rot(x), sin)     (q's and k's terms, each
//                                                 rounded to the table's dtype, added there)
// Where the tables promote x (bfloat16 x with float32 tables: OLMo's and Ernie's rotation) or
// broadcast it to a larger result, eager autograd sums each product's gradient over the broadcast
// dims and rounds it to x's dtype before adding them (every edge into x is cast to x's dtype), so
// dx is computed that way there, to the bit:
//   dx = round(sum_to(dy * c)) + round(rot^T(sum_to(dy * s))) in x's dtype,  rot^T = -rot
// (the fused path adds first and rounds once).
// Tables whose unsqueezed last dim is 1 (unsqueeze_dim -1: broadcast over the head dim, which
// rotates whole) take the per-term way too (swap(sin) would exchange another dim's halves).
// Gradients whose last dim is not unit-strided (an expanded one: `loss = a.sum() + b.sum()`) are
// made dense once (.contiguous()) so that the operator's fused kernel takes them, not the formula's
// several passes; apply_rotary_backward_route(q, k, cos, sin, unsqueeze_dim, layout, grad_q,
// grad_k) -> str says which way a backward goes.
// The backward calls the operator, not a kernel, so it is itself differentiable (gradgradcheck)
// and torch.compile traces it. apply_rotary_ records no gradients: with autograd on and an input
// that needs one, it is one line (use apply_rotary).
#include <ATen/ExpandUtils.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include "../../kernels/dispatch/operator_checks.h"
#include "../registration.h"
#include "../rotary.h"

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
// The rotary width of x under the unsqueezed table c (rotary_width, with symbolic sizes).
c10::SymInt sym_rotary_width(const at::Tensor& x, const at::Tensor& c) {
  return c.sym_size(-1) == 1 ? x.sym_size(-1) : c.sym_size(-1);
}

at::Tensor per_term_input_grad(const at::Tensor& g, const at::Tensor& x, const at::Tensor& c,
                               const at::Tensor& s, RopeLayout layout) {
  const auto dt = x.scalar_type();
  const c10::SymInt width = sym_rotary_width(x, c), dim = g.sym_size(-1);
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

// A gradient the fused kernel reads: its last dim unit-strided (an expanded gradient, strides 0,
// made dense once).
at::Tensor dense_gradient(const at::Tensor& g) {
  return g.sym_stride(-1) == 1 ? g : g.contiguous();
}

bool promoted(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return apply_rotary_result_dtype(x, cos, sin) != x.scalar_type();
}

// Why dq, dk are computed per term (as eager autograd rounds and sums them) rather than by the
// operator on the gradients; "" when the operator computes them. g*: the results' gradients.
std::string per_term_reason(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                            const at::Tensor& sin, int64_t u, const at::Tensor& gq,
                            const at::Tensor& gk) {
  if (promoted(q, cos, sin) || promoted(k, cos, sin))
    return "the tables promote q or k (each product's gradient rounded to its dtype)";
  if (q.sym_sizes() != gq.sym_sizes() || k.sym_sizes() != gk.sym_sizes())
    return "the tables broadcast q or k to a larger result (summed per product)";
  if (u == cos.dim() || cos.sym_size(-1) == 1)
    return "the tables' last dim broadcasts over the head dim";
  return "";
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
    const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
    const auto gq = grads[0].defined()
                        ? grads[0]
                        : at::zeros_like(q, q.options().dtype(at::result_type(q, cos)));
    const auto gk = grads[1].defined()
                        ? grads[1]
                        : at::zeros_like(k, k.options().dtype(at::result_type(k, cos)));
    variable_list result(6);
    // tables that promote q or k, or broadcast them to a larger result: eager sums each
    // product's gradient over the broadcast dims and rounds it before adding the two, so the
    // per-term path follows its order there
    if ((q.requires_grad() || k.requires_grad()) &&
        !per_term_reason(q, k, cos, sin, u, gq, gk).empty()) {
      const auto c = cos.unsqueeze(u), s = sin.unsqueeze(u);
      result[0] = per_term_input_grad(gq, q, c, s, parsed);
      result[1] = per_term_input_grad(gk, k, c, s, parsed);
    } else if (q.requires_grad() || k.requires_grad()) {  // q, k their results' shape and dtype
      std::tie(result[0], result[1]) = call_apply_rotary(
          dense_gradient(gq), dense_gradient(gk), cos, -swap_pair_members(sin, parsed), u, layout);
    }
    const auto c = cos.unsqueeze(u);
    const auto rotary = [&](const at::Tensor& t, const at::Tensor& x) {
      return t.narrow_symint(-1, 0, sym_rotary_width(x, c));
    };
    // q's term and k's term each rounded to the table's dtype, then added there: eager casts the
    // gradient of each use of the unsqueezed table (q and k wider than the tables: 1 ulp apart
    // when added first)
    if (cos.requires_grad())
      result[2] = table_grad(rotary(gq, q), rotary(q, q), cos, u).to(cos.scalar_type()) +
                  table_grad(rotary(gk, k), rotary(k, k), cos, u).to(cos.scalar_type());
    if (sin.requires_grad())
      result[3] = table_grad(rotary(gq, q), rotate_half_any(rotary(q, q), parsed), sin, u)
                      .to(sin.scalar_type()) +
                  table_grad(rotary(gk, k), rotate_half_any(rotary(k, k), parsed), sin, u)
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

// Which way apply_rotary's backward computes dq, dk for these inputs and gradients (None: dense
// gradients of the results' shape): "per-term: <why>", or the operator's route on the gradients
// ("fused", "reference: <why>"), after "gradients made dense first, then " where they were not.
std::string apply_rotary_backward_route_kernel(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& cos, const at::Tensor& sin,
                                               int64_t unsqueeze_dim, c10::string_view layout,
                                               const std::optional<at::Tensor>& grad_q,
                                               const std::optional<at::Tensor>& grad_k) {
  const std::string name(layout);
  const RopeLayout parsed = apply_rotary_check(q, k, cos, sin, unsqueeze_dim, name);
  const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
  const auto c = cos.unsqueeze(u);
  const auto gradient = [&](const std::optional<at::Tensor>& g, const at::Tensor& x) {
    if (g.has_value() && g->defined()) return *g;
    return at::empty(apply_rotary_result_shape(x, c),
                     x.options().dtype(apply_rotary_result_dtype(x, cos, sin)));
  };
  const auto gq = gradient(grad_q, q), gk = gradient(grad_k, k);
  check_same_device("posenc.apply_rotary_backward_route",
                    {{"q", q}, {"grad_q", gq}, {"grad_k", gk}});
  if (const auto why = per_term_reason(q, k, cos, sin, u, gq, gk); !why.empty())
    return "per-term: " + why;
  const auto dq = dense_gradient(gq), dk = dense_gradient(gk);
  const std::string first =
      dq.is_same(gq) && dk.is_same(gk) ? "" : "gradients made dense first, then ";
  const auto why =
      apply_rotary_fused_refusal(dq, dk, cos, -swap_pair_members(sin, parsed), u, parsed);
  return first + (why.empty() ? "fused" : "reference: " + why);
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  // Which way apply_rotary's backward goes for these inputs and gradients (inspection).
  m.def(
      "apply_rotary_backward_route(Tensor q, Tensor k, Tensor cos, Tensor sin, "
      "int unsqueeze_dim=1, str layout=\"half\", Tensor? grad_q=None, Tensor? grad_k=None) -> str",
      TORCH_FN(apply_rotary_backward_route_kernel));
}

POSENC_LIBRARY_IMPL(Autograd, m) {
  m.impl("apply_rotary", TORCH_FN(apply_rotary_autograd));
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace_autograd));
}

POSENC_LIBRARY_IMPL(ADInplaceOrView, m) {
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace_ad_view));
}

}  // namespace posenc::ops
