// posenc::rope_rotate, rope_rotate_qk, rope_rotate_: schemas, the per-device kernels registered
// per dispatch key, and the C++ library's entry points (rope_fused, rope_fused_qk, rope_fused_)
// as calls through the dispatcher. The math, shapes and conventions are in rope_rotate.h; the
// plain-ATen specification is rope_apply (posenc/functional/rope.h).
#include "rope_rotate.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "posenc/kernels/rope.h"
#if POSENC_HAS_CUDA_GLUE
#include "../kernels/cuda/cuda_glue.h"
#endif

namespace posenc {
namespace ops {

namespace {

// A device kernel: rotates inputs[i] into outputs[i] (rope_rotate_cpu's contract).
using DeviceKernel = void (*)(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&,
                              const at::Tensor&, const at::Tensor&, RopeLayout, bool);

void cpu_kernel(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout, bool inverse) {
  rope_rotate_cpu(inputs, outputs, cos, sin, layout, inverse);
}

// Tables as the kernels read them: [N, F] or [B, N, F]; a batch of 1 broadcasts.
at::Tensor kernel_table(const at::Tensor& table) {
  return table.dim() == 3 && table.size(0) == 1 ? table.select(0, 0) : table;
}

at::Tensor last_dim_contiguous(const at::Tensor& x) {
  return x.stride(-1) == 1 ? x : x.contiguous();
}

at::Tensor empty_result(const at::Tensor& x) {
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

template <DeviceKernel kernel>
at::Tensor rope_rotate_device(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate(x, cos, sin, layout, "rope_rotate");
  auto out = empty_result(x);
  kernel({last_dim_contiguous(x)}, {out}, kernel_table(cos), kernel_table(sin), parsed, inverse);
  return out;
}

template <DeviceKernel kernel>
std::tuple<at::Tensor, at::Tensor> rope_rotate_qk_device(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos,
                                                         const at::Tensor& sin,
                                                         c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate(q, cos, sin, layout, "rope_rotate_qk");
  check_rope_rotate(k, cos, sin, layout, "rope_rotate_qk");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "rope_rotate_qk: q is ", q.scalar_type(),
              " but k is ", k.scalar_type(), "; rotate them one by one (rope_rotate)");
  auto q_out = empty_result(q), k_out = empty_result(k);
  kernel({last_dim_contiguous(q), last_dim_contiguous(k)}, {q_out, k_out}, kernel_table(cos),
         kernel_table(sin), parsed, inverse);
  return {q_out, k_out};
}

template <DeviceKernel kernel>
void rope_rotate_inplace_device(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate(x, cos, sin, layout, "rope_rotate_");
  TORCH_CHECK(x.stride(-1) == 1, "rope_rotate_: in place needs a contiguous last dim, got strides ",
              x.strides());
  at::assert_no_internal_overlap(x);
  at::assert_no_overlap(x, cos);
  at::assert_no_overlap(x, sin);
  kernel({x}, {x}, kernel_table(cos), kernel_table(sin), parsed, inverse);
}

}  // namespace

RopeLayout check_rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             c10::string_view layout, const char* op) {
  const RopeLayout parsed = rope_layout_from_string(std::string(layout));
  TORCH_CHECK(x.dim() == 4, op, ": x must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos and sin shapes differ: ", cos.sizes(), " vs ",
              sin.sizes());
  TORCH_CHECK(cos.dim() == 2 || cos.dim() == 3, op, ": cos/sin must be [N, F] or [B, N, F], got ",
              cos.sizes());
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, op,
              ": cos/sin must be float32 (the kernels' per-pair tables), got ", cos.scalar_type(),
              " and ", sin.scalar_type());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), op,
              ": x must be float32, float64, bfloat16 or float16, got ", x.scalar_type());
  TORCH_CHECK(cos.size(-2) == x.size(1), op, ": cos/sin have ", cos.size(-2),
              " positions but x has N=", x.size(1), " (x shape ", x.sizes(), ")");
  TORCH_CHECK(cos.dim() == 2 || cos.size(0) == 1 || cos.size(0) == x.size(0), op,
              ": cos/sin batch ", cos.size(0), " is neither 1 nor x's B=", x.size(0));
  TORCH_CHECK(2 * cos.size(-1) <= x.size(3), op, ": rotary width 2F=", 2 * cos.size(-1),
              " exceeds head_dim=", x.size(3));
  return parsed;
}

const c10::TypedOperatorHandle<RopeRotateSignature>& rope_rotate_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::rope_rotate", "")
                             .typed<RopeRotateSignature>();
  return op;
}

const c10::TypedOperatorHandle<RopeRotateQkSignature>& rope_rotate_qk_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::rope_rotate_qk", "")
                             .typed<RopeRotateQkSignature>();
  return op;
}

const c10::TypedOperatorHandle<RopeRotateInPlaceSignature>& rope_rotate_inplace_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("posenc::rope_rotate_", "")
                             .typed<RopeRotateInPlaceSignature>();
  return op;
}

TORCH_LIBRARY_FRAGMENT(posenc, m) {
  m.def(
      "rope_rotate(Tensor x, Tensor cos, Tensor sin, str layout=\"half\", bool inverse=False) -> "
      "Tensor");
  m.def(
      "rope_rotate_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, str layout=\"half\", "
      "bool inverse=False) -> (Tensor, Tensor)");
  m.def(
      "rope_rotate_(Tensor(a!) x, Tensor cos, Tensor sin, str layout=\"half\", "
      "bool inverse=False) -> ()");
}

TORCH_LIBRARY_IMPL(posenc, CPU, m) {
  m.impl("rope_rotate", TORCH_FN(rope_rotate_device<cpu_kernel>));
  m.impl("rope_rotate_qk", TORCH_FN(rope_rotate_qk_device<cpu_kernel>));
  m.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_device<cpu_kernel>));
}

#if POSENC_HAS_CUDA_GLUE
TORCH_LIBRARY_IMPL(posenc, CUDA, m) {
  m.impl("rope_rotate", TORCH_FN(rope_rotate_device<detail::rope_rotate_cuda>));
  m.impl("rope_rotate_qk", TORCH_FN(rope_rotate_qk_device<detail::rope_rotate_cuda>));
  m.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_device<detail::rope_rotate_cuda>));
}
#endif

TORCH_LIBRARY_IMPL(posenc, Autograd, m) {
  m.impl("rope_rotate", TORCH_FN(rope_rotate_autograd));
  m.impl("rope_rotate_qk", TORCH_FN(rope_rotate_qk_autograd));
  m.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_autograd));
}

}  // namespace ops

// ---- the C++ library's entry points: the operators, through the dispatcher --------------------

bool rope_fused_supported(const at::Tensor& x, const at::Tensor& cos) {
  if (cos.scalar_type() != at::kFloat || cos.requires_grad()) return false;
  const auto dtype = x.scalar_type();
  const bool reduced = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (x.device().is_cpu()) return cos.device().is_cpu() && (reduced || dtype == at::kDouble);
  // the CUDA kernel stores fp32/bf16/fp16 (cos/sin may live anywhere: moved to the device)
  return x.is_cuda() && reduced &&
         c10::Dispatcher::singleton()
             .findSchemaOrThrow("posenc::rope_rotate", "")
             .hasKernelForDispatchKey(c10::DispatchKey::CUDA);
}

at::Tensor rope_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                      RopeLayout layout) {
  return ops::rope_rotate_op().call(x, cos, sin, to_string(layout), /*inverse=*/false);
}

std::pair<at::Tensor, at::Tensor> rope_fused_qk(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& cos, const at::Tensor& sin,
                                                RopeLayout layout) {
  auto [qr, kr] = ops::rope_rotate_qk_op().call(q, k, cos, sin, to_string(layout), false);
  return {qr, kr};
}

void rope_fused_(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) {
  ops::rope_rotate_inplace_op().call(x, cos, sin, to_string(layout), /*inverse=*/false);
}

}  // namespace posenc
