// The fused CPU kernels' loops at the scalar level (cpu_kernels.h), for any CPU: the plain
// softmax rows (std::exp), the short attention's dot-product form, the AdamW loop and sum of
// squares as the compiler vectorizes them for the baseline ISA (SSE2 on x86-64), GELU's plain
// loops (gelu_rows.h: the vector levels' operations one value at a time, std::fma included, so the
// same bits as AVX2 and AVX-512) and RoPE's plain rows in rope_cpu.cpp (null here). Add +
// LayerNorm has no plain pass: null entries, its callers take the ATen reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "adamw_rows.h"
#include "cpu_kernels.h"
#include "gelu_rows.h"
#include "short_attention_rows.h"
#include "softmax_rows.h"

namespace posenc::detail {

const CpuKernels kScalarKernels = {
    CpuCapability::kScalar,
    &PlainSoftmaxRows::row_max,
    &PlainSoftmaxRows::exp_sub_sum,
    &PlainGeluRows::span,
    &PlainGeluRows::backward_span,
    nullptr,  // layer_norm_forward_row
    nullptr,  // layer_norm_backward_row
    nullptr,  // rope_f32
    nullptr,  // rope_f32_stream_ok
    nullptr,  // rope_bf16
    nullptr,  // rope_f16
    &short_attention_forward_plain,
    &short_attention_backward_plain,
    &adamw_update,
    &sum_squares_plain,
};

const CpuKernels& cpu_kernels_at(CpuCapability capability) {
#if defined(__x86_64__)
  switch (capability) {
    case CpuCapability::kAvx512:
      return kAvx512Kernels;
    case CpuCapability::kAvx2:
      return kAvx2Kernels;
    case CpuCapability::kScalar:
      break;
  }
#else
  (void)capability;
#endif
  return kScalarKernels;
}

}  // namespace posenc::detail
