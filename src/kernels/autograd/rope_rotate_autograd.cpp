// Autograd for posenc::rope_rotate / rope_rotate_qk (the math in
// ../dispatch/rope_rotate_operator.h):
//   y = R(theta) x   ->   dx = R(theta)^T dy = R(-theta) dy = rope_rotate(dy, inverse = !inverse)
// The backward calls the operator, not a kernel, so it is itself differentiable (the rotation is
// linear in x: the second derivative is the operator again) and torch.compile traces it. cos/sin
// are constants on this path; where a table needs a gradient (learned frequencies), the call takes
// the plain-ATen reference rope_apply, which autograd differentiates in full.
// rope_rotate_ records no gradients: with autograd on and an input that needs one, one line.
#include <torch/autograd.h>

#include "../dispatch/rope_rotate_operator.h"

namespace posenc::ops {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool tables_need_grad(const at::Tensor& cos, const at::Tensor& sin) {
  return at::GradMode::is_enabled() && (cos.requires_grad() || sin.requires_grad());
}

// The specification, differentiable in x and the tables; contiguous, as the kernels' results.
at::Tensor rotate_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            RopeLayout layout, bool inverse) {
  return rope_apply(x, cos, inverse ? -sin : sin, layout).contiguous();
}

class RopeRotateFunction : public torch::autograd::Function<RopeRotateFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin, const std::string& layout, bool inverse) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["inverse"] = inverse;
    at::AutoDispatchBelowADInplaceOrView guard;
    return {rope_rotate_op().call(x, cos, sin, layout, inverse)};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto layout = ctx->saved_data["layout"].toStringRef();
    const bool inverse = ctx->saved_data["inverse"].toBool();
    variable_list result(5);  // x, cos, sin, layout, inverse
    if (grads[0].defined())
      result[0] = rope_rotate_op().call(grads[0], saved[0], saved[1], layout, !inverse);
    return result;
  }
};

// q and k sharing the tables: one pass forward, one pass back.
class RopeRotateQkFunction : public torch::autograd::Function<RopeRotateQkFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin,
                               const std::string& layout, bool inverse) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["inverse"] = inverse;
    ctx->set_materialize_grads(false);  // an unused result: no gradient, not zeros
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [qr, kr] = rope_rotate_qk_op().call(q, k, cos, sin, layout, inverse);
    return {qr, kr};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto layout = ctx->saved_data["layout"].toStringRef();
    const bool back = !ctx->saved_data["inverse"].toBool();
    const auto &cos = saved[0], &sin = saved[1];
    variable_list result(6);  // q, k, cos, sin, layout, inverse
    if (grads[0].defined() && grads[1].defined()) {
      std::tie(result[0], result[1]) =
          rope_rotate_qk_op().call(grads[0], grads[1], cos, sin, layout, back);
    } else {
      for (size_t i = 0; i < 2; ++i)
        if (grads[i].defined()) result[i] = rope_rotate_op().call(grads[i], cos, sin, layout, back);
    }
    return result;
  }
};

}  // namespace

at::Tensor rope_rotate_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                c10::string_view layout, bool inverse) {
  if (tables_need_grad(cos, sin))
    return rotate_reference(x, cos, sin, check_rope_rotate(x, cos, sin, layout, "rope_rotate", "x"),
                            inverse);
  return RopeRotateFunction::apply(x, cos, sin, std::string(layout), inverse)[0];
}

std::tuple<at::Tensor, at::Tensor> rope_rotate_qk_autograd(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& cos,
                                                           const at::Tensor& sin,
                                                           c10::string_view layout, bool inverse) {
  if (tables_need_grad(cos, sin)) {
    const RopeLayout parsed = check_rope_rotate_qk(q, k, cos, sin, layout);
    return {rotate_reference(q, cos, sin, parsed, inverse),
            rotate_reference(k, cos, sin, parsed, inverse)};
  }
  auto out = RopeRotateQkFunction::apply(q, k, cos, sin, std::string(layout), inverse);
  return {out[0], out[1]};
}

void rope_rotate_inplace_autograd(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  c10::string_view layout, bool inverse) {
  TORCH_CHECK(!(at::GradMode::is_enabled() &&
                (x.requires_grad() || cos.requires_grad() || sin.requires_grad())),
              "rope_rotate_: in-place rotation records no gradients; use rope_rotate (C++: "
              "rope_fused), or run under no_grad");
  at::AutoDispatchBelowAutograd guard;  // to the ADInplaceOrView kernel, which bumps the version
  rope_rotate_inplace_op().call(x, cos, sin, layout, inverse);
}

}  // namespace posenc::ops
