// Autograd for the fused residual add + layer norm (posenc/kernels/layer_norm.h): forward =
// add_layer_norm_forward_cpu, saving h, mu, rstd and the weight; backward =
// add_layer_norm_backward_cpu(dy, dh_in) giving dx = dr = dh, dweight, dbias. Under create_graph
// (grad mode on inside the backward) the gradient is ATen's native_layer_norm_backward of the
// saved h, whose own derivative autograd knows: second-order terms reach x and r through h, this
// node's output. Gradients are not materialized: without dy (y unused) weight and bias get none,
// as with ATen's layer_norm. Inputs the fused passes do not take go to the reference. Under CPU
// autocast, bf16 and half inputs are widened to float32 first (the op is on autocast's float32
// side).
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "posenc/kernels/layer_norm.h"

namespace posenc {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor contiguous_float(const at::Tensor& g) {
  return g.is_contiguous() && g.scalar_type() == at::kFloat ? g : g.contiguous().to(at::kFloat);
}

class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  // x, r: [..., D]; weight, bias: [D] -> (h, y) [..., D]
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& r,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    auto [h, y, mean, rstd] = detail::add_layer_norm_forward_cpu(x, r, weight, bias, eps);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({h, mean, rstd, weight, bias});
    ctx->saved_data["eps"] = eps;
    return {h, y};
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& dh_in = grads[0];
    const auto& dy = grads[1];
    if (!dy.defined()) {  // y unused: only the add's gradient, none for weight and bias
      return {dh_in, dh_in, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    if (at::GradMode::is_enabled()) {  // create_graph: ATen's differentiable backward of h
      const auto& w = saved[3];
      const auto eps = ctx->saved_data["eps"].toDouble();
      const int64_t d = h.size(-1);
      auto stats = at::native_layer_norm(h.detach(), {d}, w.detach(), saved[4].detach(), eps);
      auto g = at::native_layer_norm_backward(dy, h, {d}, std::get<1>(stats), std::get<2>(stats), w,
                                              saved[4], {true, true, true});
      auto dh = dh_in.defined() ? std::get<0>(g) + dh_in : std::get<0>(g);
      return {dh, dh, std::get<1>(g), std::get<2>(g), at::Tensor()};
    }
    auto [dh, dw, db] = detail::add_layer_norm_backward_cpu(
        contiguous_float(dy), dh_in.defined() ? contiguous_float(dh_in) : at::Tensor(), h, saved[1],
        saved[2], saved[3]);
    return {dh, dh, dw, db, at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x_in, const at::Tensor& r_in,
                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                  double eps) {
  // Under CPU autocast (train.precision: bf16) this is a float32 op, as autocast lists layer_norm
  // on CUDA: bf16 or half x and r are widened (exactly), so the residual stream h and the norm
  // are float32 and take the fused passes; outside autocast the inputs keep their dtypes.
  const bool widen = at::autocast::is_autocast_enabled(at::kCPU) && x_in.is_cpu();
  const auto widened = [&](const at::Tensor& t) {
    return widen && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf)
               ? t.to(at::kFloat)
               : t;
  };
  const auto x = widened(x_in), r = widened(r_in);
  if (!add_layer_norm_fused_supported(x, r, weight, bias))
    return add_layer_norm_reference(x, r, weight, bias, eps);
  auto out = AddLayerNormFunction::apply(x, r, weight, bias, eps);
  return {out[0], out[1]};
}

}  // namespace posenc
