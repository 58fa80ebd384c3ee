// Autograd for the fused rotation: forward = rope_rotate_cpu, backward = the same kernel with
// sin negated (R(theta)^T = R(-theta)). cos/sin are constants here; when they need gradients
// (learned frequencies) callers use the reference rope_apply instead (rope_fused_supported).
#include <torch/torch.h>

#include "posenc/kernels/rope.h"
#if POSENC_HAS_CUDA_GLUE
#include "../cuda/cuda_glue.h"
#endif

namespace posenc {

namespace {

// The one dispatch point: CUDA tensors to the CUDA kernel (when built), the rest to the CPU's.
void rope_rotate_any(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout,
                     bool inverse) {
#if POSENC_HAS_CUDA_GLUE
  if (!inputs.empty() && inputs[0].is_cuda())
    return detail::rope_rotate_cuda(inputs, outputs, cos, sin, layout, inverse);
#endif
  rope_rotate_cpu(inputs, outputs, cos, sin, layout, inverse);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Inputs with a contiguous last dim, as the kernel needs.
at::Tensor last_dim_contiguous(const at::Tensor& x) {
  return x.stride(-1) == 1 ? x : x.contiguous();
}

variable_list rotate(const variable_list& inputs, const at::Tensor& cos, const at::Tensor& sin,
                     RopeLayout layout, bool inverse) {
  std::vector<at::Tensor> in, out;
  for (const auto& x : inputs) {
    in.push_back(last_dim_contiguous(x));
    out.push_back(at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous)));
  }
  rope_rotate_any(in, out, cos, sin, layout, inverse);
  return out;
}

variable_list rotate_backward(AutogradContext* ctx, const variable_list& grads) {
  auto saved = ctx->get_saved_variables();
  const auto layout = static_cast<RopeLayout>(ctx->saved_data["layout"].toInt());
  variable_list present;
  for (const auto& g : grads)
    if (g.defined()) present.push_back(g);
  auto rotated = present.empty() ? variable_list{}
                                 : rotate(present, saved[0], saved[1], layout, /*inverse=*/true);
  variable_list result;
  size_t next = 0;
  for (const auto& g : grads) result.push_back(g.defined() ? rotated[next++] : at::Tensor());
  return result;
}

// One tensor.
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                               const at::Tensor& sin, int64_t layout) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["layout"] = layout;
    return rotate({x}, cos, sin, static_cast<RopeLayout>(layout), /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto result = rotate_backward(ctx, grads);
    result.resize(4);  // no gradients for cos, sin, layout
    return result;
  }
};

// q and k sharing cos/sin: one pass.
class RopeQkFunction : public torch::autograd::Function<RopeQkFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& cos, const at::Tensor& sin, int64_t layout) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["layout"] = layout;
    return rotate({q, k}, cos, sin, static_cast<RopeLayout>(layout), /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto result = rotate_backward(ctx, grads);
    result.resize(5);
    return result;
  }
};

}  // namespace

bool rope_fused_supported(const at::Tensor& x, const at::Tensor& cos) {
#if POSENC_HAS_CUDA_GLUE
  if (x.is_cuda())  // the CUDA kernel stores fp32/bf16/fp16; cos/sin may live anywhere
    return !cos.requires_grad() &&
           (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 ||
            x.scalar_type() == at::kHalf);
#endif
  return x.device().is_cpu() && cos.device().is_cpu() && !cos.requires_grad() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ||
          x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf);
}

at::Tensor rope_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeLayout layout) {
  return RopeFunction::apply(x, cos, sin, static_cast<int64_t>(layout))[0];
}

std::pair<at::Tensor, at::Tensor> rope_fused_qk(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                RopeLayout layout) {
  auto out = RopeQkFunction::apply(q, k, cos, sin, static_cast<int64_t>(layout));
  return {out[0], out[1]};
}

void rope_fused_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) {
  TORCH_CHECK(x.stride(-1) == 1, "rope_fused_: in place needs a contiguous last dim");
  TORCH_CHECK(!(x.requires_grad() && torch::GradMode::is_enabled()),
              "rope_fused_: in-place rotation does not record gradients; use rope_fused");
  rope_rotate_any({x}, {x}, cos, sin, layout, /*inverse=*/false);
}

}  // namespace posenc
