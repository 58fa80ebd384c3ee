// Short-sequence CPU attention with RoPE inside (contract in
// include/posenc/kernels/short_attention.h): the parallel loop over (batch, head) items; each
// chunk of items runs through the CPU level's loops (short_attention_rows.h: the plain
// dot-product form, or small matrix products over 8 or 16 vector lanes; cpu_kernels.h).
#include "short_attention_cpu.h"

#include <algorithm>
#include <cstdint>

#include "cpu_kernels.h"
#include "parallel.h"

namespace posenc::detail {

namespace {

// Items per parallel chunk: at least ~32k multiply-adds each.
int64_t grain(const ShortAttentionProblem& p) {
  return std::max<int64_t>(1, 32768 / std::max<int64_t>(1, p.n * p.n * p.dim));
}

}  // namespace

void short_attention_forward_cpu(const ShortAttentionProblem& p, float* out, float* lse) {
  const auto forward = cpu_kernels().short_attention_forward;
  parallel_for(0, p.batch * p.heads, grain(p),
               [&](int64_t begin, int64_t end) { forward(p, begin, end, out, lse); });
}

void short_attention_backward_cpu(const ShortAttentionProblem& p, const float* out,
                                  const float* lse, const float* grad_out, float* dq, float* dk,
                                  float* dv) {
  const auto backward = cpu_kernels().short_attention_backward;
  parallel_for(0, p.batch * p.heads, grain(p), [&](int64_t begin, int64_t end) {
    backward(p, begin, end, out, lse, grad_out, dq, dk, dv);
  });
}

}  // namespace posenc::detail
