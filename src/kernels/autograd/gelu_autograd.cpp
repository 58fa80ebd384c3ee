// Autograd for the fused GELU (posenc/kernels/gelu.h): forward = gelu_forward_cpu, saving x;
// backward = gelu_backward_cpu(grad, x) (ATen's gelu_backward when a graph of the gradient is
// asked for, create_graph, so second-order gradients stay ATen's). Inputs the fused passes do not
// take (another dtype or device, a strided view) go through at::gelu, whose autograd is ATen's.
#include <torch/torch.h>

#include "posenc/kernels/gelu.h"

namespace posenc {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GeluFunction : public torch::autograd::Function<GeluFunction> {
 public:
  // x: [...] float32 CPU contiguous
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return gelu_forward_cpu(x);
  }
  static variable_list backward(AutogradContext* ctx, const variable_list& grads) {
    const auto x = ctx->get_saved_variables()[0];
    const auto& g = grads[0];
    if (!g.defined()) return {at::Tensor()};
    // create_graph (grad mode on inside backward): ATen's gelu_backward, whose own derivative
    // (gelu'') autograd knows; the fused pass would give a gradient without a graph to x
    if (at::GradMode::is_enabled()) return {at::gelu_backward(g, x)};
    // a gradient of another layout (an expanded ones from a sum) is made contiguous first
    const auto dy =
        g.is_contiguous() && g.scalar_type() == at::kFloat ? g : g.contiguous().to(at::kFloat);
    return {gelu_backward_cpu(dy, x)};
  }
};

}  // namespace

at::Tensor gelu_fused(const at::Tensor& x) {
  if (!gelu_fused_supported(x)) return gelu_reference(x);
  return GeluFunction::apply(x);
}

}  // namespace posenc
