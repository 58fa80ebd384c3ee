// Autograd for the fused residual add + layer norm (posenc/kernels/layer_norm.h): forward =
// add_layer_norm_forward_cpu, saving h, mu, rstd and the weight; backward =
// add_layer_norm_backward_cpu(dy, dh_in) giving dx = dr = dh, dweight, dbias. First order only:
// create_graph through it is refused in one line (first_order.h), as for the fused attention.
// Inputs the fused passes do not take go to the reference, whose autograd is ATen's.
#include <torch/torch.h>

#include "first_order.h"
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
    ctx->save_for_backward({h, mean, rstd, weight, bias});
    ctx->saved_data["eps"] = eps;
    return {h, y};
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& dh_in = grads[0];
    const auto& dy = grads[1];
    detail::require_first_order("add_layer_norm");
    if (!dy.defined()) {  // only h's gradient: the add's
      const auto dh = dh_in.defined() ? dh_in : at::zeros_like(h);
      return {dh, dh, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto [dh, dw, db] = detail::add_layer_norm_backward_cpu(
        contiguous_float(dy), dh_in.defined() ? contiguous_float(dh_in) : at::Tensor(), h, saved[1],
        saved[2], saved[3]);
    return {dh, dh, dw, db, at::Tensor()};
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& r,
                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                  double eps) {
  if (!add_layer_norm_fused_supported(x, r, weight, bias))
    return add_layer_norm_reference(x, r, weight, bias, eps);
  auto out = AddLayerNormFunction::apply(x, r, weight, bias, eps);
  return {out[0], out[1]};
}

}  // namespace posenc
