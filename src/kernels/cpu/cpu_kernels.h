// Internal: the fused CPU kernels' inner loops, one table per CPU capability
// (posenc/kernels/cpu_capability.h), as ATen's DispatchStub keeps one function per capability.
// The loops are written once over a vector type (vec_avx2.h: 8 float lanes, vec_avx512.h: 16)
// in the *_rows.h headers, and compiled per level by kernels_avx2.cpp and kernels_avx512.cpp
// inside a `#pragma GCC target` region (the Highway way: only the functions defined in the
// region take the wider instructions; LibTorch's and the standard library's inline functions
// keep the baseline, so no copy of them built for AVX-512 can reach a CPU without it);
// kernels_scalar.cpp fills the plain level from the plain loops. A kernel asks cpu_kernels()
// once per call (its one dispatch point) and calls the entries; a null entry has no pass at that
// level (the caller takes its reference). The tables are raw pointers only: no tensors.
#pragma once

#include <cstdint>

#include "posenc/kernels/cpu_capability.h"
#include "short_attention_cpu.h"

namespace posenc::detail {

/// One AdamW parameter's constants, rounded to float as ATen rounds the reference ops' scalars
/// (adamw_cpu.cpp).
struct AdamWConstants {
  bool decay;
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bc2, eps, neg_step;
};

struct CpuKernels {
  CpuCapability capability;
  // softmax rows (softmax_rows.h): max_c x[c]; x[c] <- exp(x[c] - m), returns the sum
  float (*row_max)(const float* x, int64_t n);
  float (*exp_sub_sum)(float* x, int64_t n, float m);
  // GELU (gelu_rows.h): y = gelu(x); dx = dy gelu'(x), over n values (the same bits at every
  // level); stream: non-temporal stores from the output's first 64-byte line on (the caller
  // fences, stream_stores.h; ignored at kScalar), the same bits
  void (*gelu)(const float* x, float* y, int64_t n, bool stream);
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n, bool stream);
  // add + LayerNorm rows of d % 8 == 0 values (layer_norm_rows.h); null at kScalar. stream:
  // non-temporal stores of h, y / dh (rows on 64-byte lines, d % 16 == 0; the caller fences,
  // stream_stores.h), the same bits
  void (*layer_norm_forward_row)(const float* x, const float* r, const float* w, const float* b,
                                 float* h, float* y, int64_t d, float eps, float* mean, float* rstd,
                                 bool stream);
  void (*layer_norm_backward_row)(const float* dy, const float* dh_in, const float* h,
                                  const float* w, float mu, float s, float* dh, float* dw,
                                  float* db, int64_t d, bool stream);
  // RoPE rows (rope_rows.h), s carrying the direction's sign; y may be x. float32: half or
  // interleaved layout, stream: non-temporal stores (y != x, aligned; rope_f32_stream_ok);
  // bfloat16 / float16 bits, half layout, round_each: eager's rounding of every product.
  // Null at kScalar (rope_cpu.cpp's plain loops).
  void (*rope_f32)(const float* x, float* y, const float* c, const float* s, int64_t f,
                   bool interleaved, bool stream);
  bool (*rope_f32_stream_ok)(const float* x, const float* y, int64_t f);
  void (*rope_bf16)(const uint16_t* x, uint16_t* y, const float* c, const float* s, int64_t f,
                    bool round_each);
  void (*rope_f16)(const uint16_t* x, uint16_t* y, const float* c, const float* s, int64_t f,
                   bool round_each);
  // short attention items [begin, end) of (batch, head) (short_attention_rows.h)
  void (*short_attention_forward)(const ShortAttentionProblem& p, int64_t begin, int64_t end,
                                  float* out, float* lse);
  void (*short_attention_backward)(const ShortAttentionProblem& p, int64_t begin, int64_t end,
                                   const float* out, const float* lse, const float* grad_out,
                                   float* dq, float* dk, float* dv);
  // AdamW over n elements; sum of squares in double (adamw_rows.h)
  void (*adamw)(const AdamWConstants& c, float* p, const float* g, float* m, float* v, int64_t n);
  double (*sum_squares)(const float* g, int64_t n);
};

/// The table of one level (kAvx512 / kAvx2 only where this build targets x86-64).
const CpuKernels& cpu_kernels_at(CpuCapability capability);
/// The table of cpu_capability(): the kernels' dispatch point.
inline const CpuKernels& cpu_kernels() {
  static const CpuKernels& chosen = cpu_kernels_at(cpu_capability());
  return chosen;
}

// Defined by kernels_scalar.cpp, kernels_avx2.cpp, kernels_avx512.cpp.
extern const CpuKernels kScalarKernels;
extern const CpuKernels kAvx2Kernels;
extern const CpuKernels kAvx512Kernels;

}  // namespace posenc::detail
