// posenc::rope_rotate, rope_rotate_qk, rope_rotate_: schemas, the per-device kernels registered
// per dispatch key, and the C++ library's entry points (rope_fused, rope_fused_qk, rope_fused_)
// as calls through the dispatcher. The math, shapes and conventions are in rope_rotate_operator.h;
// the plain-ATen specification is rope_apply (posenc/functional/rope.h).
#include "rope_rotate_operator.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "operator_checks.h"
#include "posenc/kernels/rope_fused.h"
#if POSENC_HAS_CUDA_GLUE
#include "../cuda/cuda_glue.h"
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

// The kernels read rows with a unit stride. (contiguous() keeps an empty tensor's or a size-1 last
// dim's strides, as they are contiguous already; a clone lays them out afresh.)
at::Tensor last_dim_contiguous(const at::Tensor& x) {
  return x.stride(-1) == 1 ? x : x.clone(at::MemoryFormat::Contiguous);
}

at::Tensor empty_result(const at::Tensor& x) {
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

template <DeviceKernel kernel>
at::Tensor rope_rotate_device(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                              c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate(x, cos, sin, layout, "rope_rotate", "x");
  auto out = empty_result(x);
  kernel({last_dim_contiguous(x)}, {out}, kernel_table(cos), kernel_table(sin), parsed, inverse);
  return out;
}

template <DeviceKernel kernel>
std::tuple<at::Tensor, at::Tensor> rope_rotate_qk_device(const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& cos,
                                                         const at::Tensor& sin,
                                                         c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate_qk(q, k, cos, sin, layout);
  auto q_out = empty_result(q), k_out = empty_result(k);
  kernel({last_dim_contiguous(q), last_dim_contiguous(k)}, {q_out, k_out}, kernel_table(cos),
         kernel_table(sin), parsed, inverse);
  return {q_out, k_out};
}

template <DeviceKernel kernel>
void rope_rotate_inplace_device(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                c10::string_view layout, bool inverse) {
  const RopeLayout parsed = check_rope_rotate(x, cos, sin, layout, "rope_rotate_", "x");
  if (x.numel() == 0 || cos.size(-1) == 0) return;  // nothing to rotate
  TORCH_CHECK(x.stride(-1) == 1, "rope_rotate_: in place needs a contiguous last dim, got strides ",
              x.strides());
  check_no_aliasing("rope_rotate_", {{"x", x}}, {{"cos", cos}, {"sin", sin}},
                    "use rope_rotate (C++: rope_fused)");
  kernel({x}, {x}, kernel_table(cos), kernel_table(sin), parsed, inverse);
}

}  // namespace

RopeLayout check_rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             c10::string_view layout, const char* op, const char* name) {
  // tables may live on the CPU for a CUDA x (the CUDA glue moves them): the one exception
  check_same_device(op, {{name, x}}, {{"cos", cos}, {"sin", sin}});
  const RopeLayout parsed = rope_layout_from_string(std::string(layout));
  TORCH_CHECK(x.dim() == 4, op, ": ", name, " must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos and sin shapes differ: ", cos.sizes(), " vs ",
              sin.sizes());
  TORCH_CHECK(cos.dim() == 2 || cos.dim() == 3, op, ": cos/sin must be [N, F] or [B, N, F], got ",
              cos.sizes());
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, op,
              ": cos/sin must be float32 (the kernels' per-pair tables), got ", cos.scalar_type(),
              " and ", sin.scalar_type());
  const auto dtype = x.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf,
      op, ": ", name, " must be float32, float64, bfloat16 or float16, got ", dtype);
  TORCH_CHECK(cos.size(-2) == x.size(1), op, ": cos/sin have ", cos.size(-2), " positions but ",
              name, " has N=", x.size(1), " (", name, " shape ", x.sizes(), ")");
  TORCH_CHECK(cos.dim() == 2 || cos.size(0) == 1 || cos.size(0) == x.size(0), op,
              ": cos/sin batch ", cos.size(0), " is neither 1 nor ", name, "'s B=", x.size(0));
  TORCH_CHECK(2 * cos.size(-1) <= x.size(3), op, ": rotary width 2F=", 2 * cos.size(-1),
              " exceeds head_dim=", x.size(3), " of ", name);
  return parsed;
}

RopeLayout check_rope_rotate_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                const at::Tensor& sin, c10::string_view layout) {
  check_same_device("rope_rotate_qk", {{"q", q}, {"k", k}});
  const RopeLayout parsed = check_rope_rotate(q, cos, sin, layout, "rope_rotate_qk", "q");
  check_rope_rotate(k, cos, sin, layout, "rope_rotate_qk", "k");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "rope_rotate_qk: q is ", q.scalar_type(),
              " but k is ", k.scalar_type(), "; rotate them one by one (rope_rotate)");
  TORCH_CHECK(q.size(0) == k.size(0), "rope_rotate_qk: q has B=", q.size(0),
              " but k has B=", k.size(0));
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

namespace {

// In place under InferenceMode too (where the Autograd keys are skipped but ADInplaceOrView is
// not): the version counter is bumped here, so a saved tensor modified later is caught.
void rope_rotate_inplace_ad_view(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 c10::string_view layout, bool inverse) {
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    rope_rotate_inplace_op().call(x, cos, sin, layout, inverse);
  }
  torch::autograd::impl::bump_version(x);
}

// The three operators' kernels for one device.
template <DeviceKernel kernel>
void impl_device(torch::Library& library) {
  library.impl("rope_rotate", TORCH_FN(rope_rotate_device<kernel>));
  library.impl("rope_rotate_qk", TORCH_FN(rope_rotate_qk_device<kernel>));
  library.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_device<kernel>));
}

// The registrations, made once per process: the static core may be linked into more than one
// loaded object (libposenc_ops.so holds a copy, and so may a program or extension that links
// libposenc.a and loads it), and a second TORCH_LIBRARY_FRAGMENT defining the same schema would
// abort the process. The first copy registers; the others find the schema and use it (the same
// code). torch::Library objects live as long as the process (their destructors deregister).
bool register_once() {
  if (c10::Dispatcher::singleton().findSchema({"posenc::rope_rotate", ""}).has_value())
    return false;
  static torch::Library def(torch::Library::FRAGMENT, "posenc", std::nullopt, __FILE__, __LINE__);
  def.def(
      "rope_rotate(Tensor x, Tensor cos, Tensor sin, str layout=\"half\", bool inverse=False) -> "
      "Tensor");
  def.def(
      "rope_rotate_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, str layout=\"half\", "
      "bool inverse=False) -> (Tensor, Tensor)");
  def.def(
      "rope_rotate_(Tensor(a!) x, Tensor cos, Tensor sin, str layout=\"half\", "
      "bool inverse=False) -> ()");

  static torch::Library cpu(torch::Library::IMPL, "posenc", c10::DispatchKey::CPU, __FILE__,
                            __LINE__);
  impl_device<cpu_kernel>(cpu);
#if POSENC_HAS_CUDA_GLUE
  static torch::Library cuda(torch::Library::IMPL, "posenc", c10::DispatchKey::CUDA, __FILE__,
                             __LINE__);
  impl_device<detail::rope_rotate_cuda>(cuda);
#endif
  static torch::Library autograd(torch::Library::IMPL, "posenc", c10::DispatchKey::Autograd,
                                 __FILE__, __LINE__);
  autograd.impl("rope_rotate", TORCH_FN(rope_rotate_autograd));
  autograd.impl("rope_rotate_qk", TORCH_FN(rope_rotate_qk_autograd));
  autograd.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_autograd));
  static torch::Library view(torch::Library::IMPL, "posenc", c10::DispatchKey::ADInplaceOrView,
                             __FILE__, __LINE__);
  view.impl("rope_rotate_", TORCH_FN(rope_rotate_inplace_ad_view));
  return true;
}

// At load, as TORCH_LIBRARY would (Python finds the operators once the library is loaded).
[[maybe_unused]] const bool kRegisteredHere = register_once();

}  // namespace

}  // namespace ops

// ---- the C++ library's entry points: the operators, through the dispatcher --------------------

bool rope_fused_supported(const at::Tensor& x, const at::Tensor& cos) {
  if (cos.scalar_type() != at::kFloat || cos.requires_grad()) return false;
  const auto dtype = x.scalar_type();
  const bool float_storage = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (x.device().is_cpu()) return cos.device().is_cpu() && (float_storage || dtype == at::kDouble);
  // the CUDA kernel stores fp32/bf16/fp16 (cos/sin may live anywhere: moved to the device)
  return x.is_cuda() && float_storage &&
         ops::rope_rotate_op().hasKernelForDispatchKey(c10::DispatchKey::CUDA);
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
