// posenc::apply_rotary and posenc::apply_rotary_: schemas, the plain-ATen reference, and the
// CPU and CUDA implementations (rope_rotate's kernel of the device, rounding each op as eager,
// where the inputs allow; the reference elsewhere). The math and the conventions are in rotary.h;
// autograd in autograd/rotary_autograd.cpp.
#include "rotary.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "../kernels/dispatch/operator_checks.h"
#include "posenc/kernels/rope_fused.h"
#include "registration.h"
#if POSENC_HAS_CUDA_GLUE
#include "../kernels/cuda/cuda_glue.h"
#endif

namespace posenc::ops {

int64_t normalized_unsqueeze_dim(int64_t unsqueeze_dim, const at::Tensor& cos) {
  const int64_t rank = cos.dim() + 1;
  TORCH_CHECK(unsqueeze_dim >= -rank && unsqueeze_dim < rank,
              "posenc.apply_rotary: unsqueeze_dim must be in [", -rank, ", ", rank - 1,
              "] for cos of shape ", cos.sizes(), ", got ", unsqueeze_dim);
  return unsqueeze_dim < 0 ? unsqueeze_dim + rank : unsqueeze_dim;
}

at::ScalarType apply_rotary_result_dtype(const at::Tensor& x, const at::Tensor& cos,
                                         const at::Tensor& sin) {
  return at::promote_types(at::result_type(x, cos), sin.scalar_type());
}

namespace {

// The two members of every rotary pair, as views of a [..., W] tensor. Symbolic sizes: the
// backward runs this under torch.compile, where a concrete size() would specialize every dim.
std::pair<at::Tensor, at::Tensor> pair_members(const at::Tensor& x, const c10::SymInt& width,
                                               RopeLayout layout) {
  if (layout == RopeLayout::kHalf)
    return {x.narrow_symint(-1, 0, width / 2), x.narrow_symint(-1, width / 2, width / 2)};
  return {x.slice_symint(-1, 0, width, 2), x.slice_symint(-1, 1, width, 2)};
}

// y = formula(x) for one of q, k. Where the tables broadcast x to a larger shape, the
// pass-through dims follow the rotated ones' shape (transformers' partial rotary, a torch.cat of
// the two, would fail there; the rotated part has that shape).
at::Tensor rotate_reference(const at::Tensor& x, const at::Tensor& c, const at::Tensor& s,
                            RopeLayout layout) {
  const int64_t width = rotary_width(x, c), dim = x.size(-1);
  const auto rotary = x.narrow(-1, 0, width);
  auto y = rotary * c + rotate_half_any(rotary, layout) * s;
  if (width == dim) return y;
  auto pass_shape = y.sizes().vec();
  pass_shape.back() = dim - width;
  const auto pass = x.narrow(-1, width, dim - width).to(y.scalar_type()).expand(pass_shape);
  return at::cat({y, pass}, -1);
}

// Whether two shapes broadcast (numpy's rule, aligned at the last dim).
bool broadcastable(c10::IntArrayRef a, c10::IntArrayRef b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 1; i <= n; ++i) {
    const int64_t x = a[a.size() - i], y = b[b.size() - i];
    if (x != y && x != 1 && y != 1) return false;
  }
  return true;
}

bool is_kernel_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// The result laid out as empty_like(x) (what the fake kernel promises, whatever the path). Where
// cos/sin broadcast x to a larger shape (q of batch 1 with tables of batch B, as transformers'
// formula allows), the result has that shape, contiguous (the fake kernel says the same).
at::Tensor as_output(const at::Tensor& x, const at::Tensor& y) {
  if (y.sizes() != x.sizes()) return y.contiguous();
  auto out = at::empty_like(x, x.options().dtype(y.scalar_type()));
  out.copy_(y);
  return out;
}

// In place writes each element of q and k once, reading the tables: q and k must not overlap
// themselves (an expanded tensor), each other, or the tables
// (src/kernels/dispatch/operator_checks.h).
void check_writable(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                    const at::Tensor& sin) {
  check_no_aliasing("posenc.apply_rotary_", {{"q", q}, {"k", k}}, {{"cos", cos}, {"sin", sin}},
                    "use apply_rotary");
}

// [B, N, H, D] views of q/k for the kernel, whichever of HF's two layouts they are in.
at::Tensor tokens_major(const at::Tensor& x, int64_t unsqueeze_dim) {
  return unsqueeze_dim == 1 ? x.transpose(1, 2) : x;
}

// The per-pair table [N, F] or [B, N, F] the CPU kernel reads (one member of each pair).
at::Tensor per_pair(const at::Tensor& table, int64_t batch, RopeLayout layout) {
  auto first = pair_members(table, table.size(-1), layout).first;
  return (first.size(0) == 1 && batch != 1) ? first.squeeze(0) : first;
}

// The whole table [N, W] or [B, N, W] (a kernel reading each output element's own entries).
at::Tensor whole_table(const at::Tensor& table, int64_t batch) {
  return (table.size(0) == 1 && batch != 1) ? table.squeeze(0) : table;
}

void rotate_cpu(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) {
  rope_rotate_cpu(inputs, outputs, cos, sin, layout, /*inverse=*/false, /*round_each_op=*/true);
}

// The kernel of the inputs' device (apply_rotary_fused_refusal has taken them): the CPU one reads
// per-pair tables, the CUDA one (eager mode) the whole tables.
RotaryKernel device_kernel(const at::Tensor& q) {
#if POSENC_HAS_CUDA_GLUE
  if (q.is_cuda()) return {&detail::rope_rotate_cuda_eager, /*reads_whole_tables=*/true};
#endif
  TORCH_CHECK(q.device().is_cpu(), "posenc.apply_rotary: no fused kernel on ", q.device());
  return {&rotate_cpu, /*reads_whole_tables=*/false};
}

}  // namespace

at::Tensor rotate_half_any(const at::Tensor& x, RopeLayout layout) {
  const c10::SymInt width = x.sym_size(-1);
  if (layout == RopeLayout::kHalf) {
    auto [a, b] = pair_members(x, width, layout);
    return at::cat({-b, a}, -1);
  }
  auto [a, b] = pair_members(x, width, layout);
  return at::stack({-b, a}, -1).flatten(-2);  // (-x1, x0, -x3, x2, ...)
}

at::Tensor swap_pair_members(const at::Tensor& table, RopeLayout layout) {
  const c10::SymInt width = table.sym_size(-1);
  auto [a, b] = pair_members(table, width, layout);
  if (layout == RopeLayout::kHalf) return at::cat({b, a}, -1);
  return at::stack({b, a}, -1).flatten(-2);
}

int64_t rotary_width(const at::Tensor& x, const at::Tensor& c) {
  return c.size(-1) == 1 ? x.size(-1) : c.size(-1);
}

std::vector<int64_t> apply_rotary_result_shape(const at::Tensor& x, const at::Tensor& c) {
  const auto lead =
      at::infer_size(x.sizes().slice(0, x.dim() - 1), c.sizes().slice(0, c.dim() - 1));
  std::vector<int64_t> shape(lead.begin(), lead.end());
  shape.push_back(x.size(-1));
  return shape;
}

RopeLayout apply_rotary_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t unsqueeze_dim,
                              const std::string& layout) {
  constexpr const char* op = "posenc.apply_rotary";
  check_same_device(op, {{"q", q}, {"k", k}, {"cos", cos}, {"sin", sin}});
  const RopeLayout parsed = rope_layout_from_string(layout);
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}, {"cos", cos}, {"sin", sin}}) {
    TORCH_CHECK(is_kernel_dtype(t.scalar_type()), op, ": ", name,
                " must be a floating-point tensor of float32, float64, bfloat16 or float16, got ",
                t.scalar_type());
    TORCH_CHECK(t.dim() >= 1, op, ": ", name, " must have a last dim, got a scalar");
  }
  TORCH_CHECK(cos.sizes() == sin.sizes(), op, ": cos and sin shapes differ: ", cos.sizes(), " vs ",
              sin.sizes());
  const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
  // transformers' q * cos.unsqueeze(u): the unsqueezed table's last dim is the rotary width W
  // (W < D: partial rotary, the rest passing through), or 1, broadcast over the whole head dim
  // (unsqueeze_dim -1, or tables of width 1): then every x rotates over its full head dim
  const auto c = cos.unsqueeze(u);
  for (const auto& [name, x] : {std::pair<const char*, const at::Tensor&>{"q", q}, {"k", k}}) {
    const int64_t width = rotary_width(x, c);
    TORCH_CHECK(width % 2 == 0, op, ": the rotary width must be even, got ", width,
                c.size(-1) == 1 ? std::string(" (") + name +
                                      "'s head dim: cos.unsqueeze(unsqueeze_dim) of shape " +
                                      c10::str(c.sizes()) + " broadcasts over it)"
                                : std::string(" (cos.size(-1))"));
    TORCH_CHECK(width <= x.size(-1), op, ": rotary width ", width, " exceeds the head dim of ",
                name, " (", x.size(-1), "), shape ", x.sizes());
    TORCH_CHECK(broadcastable(x.sizes().slice(0, x.dim() - 1), c.sizes().slice(0, c.dim() - 1)), op,
                ": cos.unsqueeze(", unsqueeze_dim, ") of shape ", c.sizes(),
                " does not broadcast with ", name, " of shape ", x.sizes(),
                " (transformers' formula ", name, " * cos.unsqueeze(unsqueeze_dim) fails too)");
  }
  return parsed;
}

std::tuple<at::Tensor, at::Tensor> apply_rotary_reference(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& cos,
                                                          const at::Tensor& sin,
                                                          int64_t unsqueeze_dim,
                                                          const std::string& layout) {
  const RopeLayout parsed = apply_rotary_check(q, k, cos, sin, unsqueeze_dim, layout);
  const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
  const auto c = cos.unsqueeze(u), s = sin.unsqueeze(u);
  return {as_output(q, rotate_reference(q, c, s, parsed)),
          as_output(k, rotate_reference(k, c, s, parsed))};
}

std::string apply_rotary_kernel_refusal(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        int64_t unsqueeze_dim, RopeLayout layout,
                                        RotaryKernelTakes takes) {
  if (q.dim() != 4 || k.dim() != 4) return "q and k are not 4-dimensional";
  if (cos.dim() != 3) return "cos/sin are not [B, N, W]";
  const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
  if (u != 1 && u != 2) return "unsqueeze_dim is neither 1 ([B, H, N, D]) nor 2 ([B, N, H, D])";
  if (cos.size(-1) == 1) return "cos/sin of width 1 (broadcast over the head dim)";
  const int64_t token_dim = u == 1 ? 2 : 1;
  if (q.size(0) != k.size(0) || q.size(token_dim) != k.size(token_dim))
    return "q and k differ in batch or tokens";
  if (cos.size(0) != 1 && cos.size(0) != q.size(0)) return "cos/sin batch is neither 1 nor B";
  if (cos.size(1) != q.size(token_dim)) return "cos/sin tokens differ from q's";
  if (q.scalar_type() != k.scalar_type() || !is_kernel_dtype(q.scalar_type()))
    return "q and k are not both float32, float64, bfloat16 or float16";
  if (!takes.float64 && q.scalar_type() == at::kDouble)
    return "float64 (the CUDA kernel stores float32, bfloat16 or float16)";
  if (apply_rotary_result_dtype(q, cos, sin) != q.scalar_type())
    return "cos/sin are of a wider dtype than q (the result would be promoted)";
  if (q.stride(-1) != 1 || k.stride(-1) != 1) return "the last dim of q or k is not contiguous";
  if (q.numel() == 0 || k.numel() == 0) return "empty";
  // Table values: only where the kernel needs them checked (on CUDA each at::equal would wait for
  // the device). float64 tables come here only with float64 q (with any other q the result is
  // promoted, refused above), so a kernel that takes no float64 (CUDA) reads none of them.
  if (takes.float64)
    for (const auto* t : {&cos, &sin})  // the kernel reads float32 tables: only lossless ones
      if (t->scalar_type() == at::kDouble && !at::equal(t->to(at::kFloat).to(at::kDouble), *t))
        return "cos/sin are float64 values float32 cannot hold (the kernel reads float32 tables)";
  // A kernel reading each output element's own entries computes eager's formula whatever the
  // tables hold; one reading one entry per pair needs the two members equal
  if (!takes.unequal_pair_members) {
    const int64_t width = cos.size(-1);
    for (const auto* t : {&cos, &sin}) {
      auto [a, b] = pair_members(*t, width, layout);
      if (!at::equal(a, b)) return "the two members of a pair read different table values";
    }
  }
  return "";
}

std::string apply_rotary_fused_refusal(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& cos, const at::Tensor& sin,
                                       int64_t unsqueeze_dim, RopeLayout layout) {
  // apply_rotary_check has put every tensor on q's device
  const auto device = q.device();
  if (device.is_cuda()) {
#if POSENC_HAS_CUDA_GLUE
    return apply_rotary_kernel_refusal(q, k, cos, sin, unsqueeze_dim, layout,
                                       kCudaRotaryKernelTakes);
#else
    return "this posenc was built without the CUDA glue (a LibTorch without CUDA)";
#endif
  }
  if (!device.is_cpu())
    return "on " + device.str() + " (the fused kernels run on the CPU and CUDA)";
  return apply_rotary_kernel_refusal(q, k, cos, sin, unsqueeze_dim, layout, kCpuRotaryKernelTakes);
}

void apply_rotary_through(const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t unsqueeze_dim, RopeLayout layout,
                          RotaryKernel kernel) {
  std::vector<at::Tensor> x, y;
  for (size_t i = 0; i < inputs.size(); ++i) {
    x.push_back(tokens_major(inputs[i], unsqueeze_dim));
    y.push_back(tokens_major(outputs[i], unsqueeze_dim));
  }
  const int64_t batch = inputs[0].size(0);
  if (kernel.reads_whole_tables)
    kernel.rotate(x, y, whole_table(cos, batch), whole_table(sin, batch), layout);
  else
    kernel.rotate(x, y, per_pair(cos, batch, layout), per_pair(sin, batch, layout), layout);
}

std::tuple<at::Tensor, at::Tensor> apply_rotary_fused_or_reference(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    int64_t unsqueeze_dim, const std::string& layout) {
  const RopeLayout parsed = apply_rotary_check(q, k, cos, sin, unsqueeze_dim, layout);
  if (!apply_rotary_fused_refusal(q, k, cos, sin, unsqueeze_dim, parsed).empty())
    return apply_rotary_reference(q, k, cos, sin, unsqueeze_dim, layout);
  const int64_t u = normalized_unsqueeze_dim(unsqueeze_dim, cos);
  auto q_out = at::empty_like(q), k_out = at::empty_like(k);
  apply_rotary_through({q, k}, {q_out, k_out}, cos, sin, u, parsed, device_kernel(q));
  return {q_out, k_out};
}

namespace {

std::tuple<at::Tensor, at::Tensor> apply_rotary_kernel(const at::Tensor& q, const at::Tensor& k,
                                                       const at::Tensor& cos, const at::Tensor& sin,
                                                       int64_t unsqueeze_dim,
                                                       c10::string_view layout) {
  return apply_rotary_fused_or_reference(q, k, cos, sin, unsqueeze_dim, std::string(layout));
}

std::tuple<at::Tensor, at::Tensor> apply_rotary_reference_kernel(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    int64_t unsqueeze_dim, c10::string_view layout) {
  return apply_rotary_reference(q, k, cos, sin, unsqueeze_dim, std::string(layout));
}

// In place: the kernel writes over q and k; elsewhere the reference's result is copied back.
void apply_rotary_inplace(at::Tensor& q, at::Tensor& k, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t unsqueeze_dim, c10::string_view layout) {
  const std::string name(layout);
  const RopeLayout parsed = apply_rotary_check(q, k, cos, sin, unsqueeze_dim, name);
  TORCH_CHECK(apply_rotary_result_dtype(q, cos, sin) == q.scalar_type() &&
                  apply_rotary_result_dtype(k, cos, sin) == k.scalar_type(),
              "posenc.apply_rotary_: the result's dtype (", apply_rotary_result_dtype(q, cos, sin),
              ") is not q's (", q.scalar_type(), "); in place needs cos/sin no wider than q and k");
  TORCH_CHECK(!q.is_same(k), "posenc.apply_rotary_: q and k are the same tensor");
  check_writable(q, k, cos, sin);
  if (apply_rotary_fused_refusal(q, k, cos, sin, unsqueeze_dim, parsed).empty()) {
    apply_rotary_through({q, k}, {q, k}, cos, sin, normalized_unsqueeze_dim(unsqueeze_dim, cos),
                         parsed, device_kernel(q));
    return;
  }
  auto [yq, yk] = apply_rotary_reference(q, k, cos, sin, unsqueeze_dim, name);
  TORCH_CHECK(yq.sizes() == q.sizes() && yk.sizes() == k.sizes(),
              "posenc.apply_rotary_: cos/sin of shape ", cos.sizes(),
              " broadcast the result to a larger shape than q ", q.sizes(), " or k ", k.sizes(),
              "; in place cannot grow them: use apply_rotary");
  q.copy_(yq);
  k.copy_(yk);
}

// Which path apply_rotary takes for these inputs, and why: "fused" or "reference: <reason>".
std::string apply_rotary_route_kernel(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      int64_t unsqueeze_dim, c10::string_view layout) {
  const RopeLayout parsed = apply_rotary_check(q, k, cos, sin, unsqueeze_dim, std::string(layout));
  const std::string why = apply_rotary_fused_refusal(q, k, cos, sin, unsqueeze_dim, parsed);
  return why.empty() ? "fused" : "reference: " + why;
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "apply_rotary(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
      "str layout=\"half\") -> (Tensor, Tensor)");
  m.def(
      "apply_rotary_(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
      "str layout=\"half\") -> ()");
  // The specification, callable on its own (tests compare every path with it).
  m.def(
      "apply_rotary_reference(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
      "str layout=\"half\") -> (Tensor, Tensor)");
  m.impl("apply_rotary_reference", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(apply_rotary_reference_kernel));
  // Which path apply_rotary takes and why (inspection; tests assert the fused one is taken).
  m.def(
      "apply_rotary_route(Tensor q, Tensor k, Tensor cos, Tensor sin, int unsqueeze_dim=1, "
      "str layout=\"half\") -> str",
      TORCH_FN(apply_rotary_route_kernel));
}

// CPU and CUDA: rope_rotate's kernel of the device where apply_rotary_fused_refusal takes the
// inputs (on CUDA only where the library has the CUDA glue), else the reference.
POSENC_LIBRARY_IMPL(CPU, m) {
  m.impl("apply_rotary", TORCH_FN(apply_rotary_kernel));
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace));
}

POSENC_LIBRARY_IMPL(CUDA, m) {
  m.impl("apply_rotary", TORCH_FN(apply_rotary_kernel));
  m.impl("apply_rotary_", TORCH_FN(apply_rotary_inplace));
}

}  // namespace posenc::ops
