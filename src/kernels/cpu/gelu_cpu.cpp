// GELU's forward and backward passes at the CPU level (the loops: gelu_rows.h, one table entry per
// level, cpu_kernels.h: vector lanes at AVX2 and AVX-512, one value at a time at the scalar level,
// the same bits at each); the math, its source and its error are in posenc/kernels/gelu.h. The
// *_out entries write into the caller's tensor (the benchmarks' preallocated outputs; an output
// may be an input, element for element, never a partial overlap).
// Chunks of kGeluGrain elements per thread: a tensor below that runs on the calling thread
// without waking the pool (the main job's MLP activations, 2048 x 192, are two chunks).
// An output of kStreamMinBytes or more, not the input itself, is written with non-temporal stores
// (stream_stores.h: no read-for-ownership of lines that would not stay in the cache anyway); a
// smaller one stays in the cache for the op that reads it next. The values are the same.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu_kernels.h"
#include "parallel.h"
#include "posenc/kernels/gelu.h"
#include "stream_stores.h"

namespace posenc {

namespace {

/// Elements per parallel chunk (a chunk below this stays on the calling thread).
constexpr int64_t kGeluGrain = 1 << 16;

void check_input(const char* what, const at::Tensor& x) {
  TORCH_CHECK(gelu_fused_supported(x), "gelu_fused: ", what,
              " must be a contiguous float32 CPU tensor, got ", x.scalar_type(), " on ", x.device(),
              x.is_contiguous() ? "" : " (not contiguous)");
}

void check_output(const char* what, const at::Tensor& out, const at::Tensor& x) {
  check_input(what, out);
  TORCH_CHECK(out.sizes() == x.sizes(), "gelu_fused: ", what, " ", out.sizes(), " and x ",
              x.sizes(), " differ in shape");
  at::assert_no_partial_overlap(out, x);
}

// Whether a pass writing `out` (not in place) streams it: out of cache.
bool stream_output(const at::Tensor& out, const at::Tensor& x) {
  return out.nbytes() >= static_cast<size_t>(detail::kStreamMinBytes) &&
         out.const_data_ptr() != x.const_data_ptr();
}

}  // namespace

bool gelu_fused_supported(const at::Tensor& x) {
  return x.defined() && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         x.layout() == at::kStrided && x.is_contiguous() && detail::cpu_kernels().gelu != nullptr;
}

void gelu_forward_cpu_out(const at::Tensor& x, at::Tensor& y) {
  check_input("x", x);
  check_output("y", y, x);
  const float* in = x.const_data_ptr<float>();
  float* out = y.mutable_data_ptr<float>();
  const auto gelu = detail::cpu_kernels().gelu;
  const bool stream = stream_output(y, x);
  detail::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t b, int64_t e) {
    gelu(in + b, out + b, e - b, stream);
    if (stream) detail::stream_fence();
  });
}

at::Tensor gelu_forward_cpu(const at::Tensor& x) {
  check_input("x", x);
  auto y = at::empty_like(x);
  gelu_forward_cpu_out(x, y);
  return y;
}

void gelu_backward_cpu_out(const at::Tensor& grad, const at::Tensor& x, at::Tensor& dx) {
  check_input("x", x);
  check_input("grad", grad);
  TORCH_CHECK(grad.sizes() == x.sizes(), "gelu_fused: grad ", grad.sizes(), " and x ", x.sizes(),
              " differ in shape");
  check_output("dx", dx, x);
  at::assert_no_partial_overlap(dx, grad);
  const float* g = grad.const_data_ptr<float>();
  const float* in = x.const_data_ptr<float>();
  float* out = dx.mutable_data_ptr<float>();
  const auto gelu_backward = detail::cpu_kernels().gelu_backward;
  const bool stream = stream_output(dx, x) && dx.const_data_ptr() != grad.const_data_ptr();
  detail::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t b, int64_t e) {
    gelu_backward(g + b, in + b, out + b, e - b, stream);
    if (stream) detail::stream_fence();
  });
}

at::Tensor gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  check_input("x", x);
  auto dx = at::empty_like(x);
  gelu_backward_cpu_out(grad, x, dx);
  return dx;
}

at::Tensor gelu_reference(const at::Tensor& x) { return at::gelu(x); }

}  // namespace posenc
