// The fused AdamW pass's loops (adamw_cpu.cpp drives them; the math and its sources are in
// include/posenc/kernels/adamw.h): the update of n elements, and the sum of their squares in
// double for the gradient norm. The update is one plain loop the compiler vectorizes for the
// region it is compiled in (-fno-math-errno lets it use the vector square root; the level TUs
// are compiled with -ffp-contract=off: every product and sum rounds as ATen's reference ops
// round). The sum of squares: plain (four double accumulators), or per vector type, each float
// widened to double and squared with one rounding (FMA) into 4 vectors of double partial sums.
// Included by kernels_scalar.cpp and inside the target regions of kernels_avx2.cpp /
// kernels_avx512.cpp.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "cpu_kernels.h"

namespace posenc::detail {
namespace {

inline void adamw_update(const AdamWConstants& c, float* __restrict p, const float* __restrict g,
                         float* __restrict m, float* __restrict v, int64_t n) {
  if (c.decay)
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * c.decay_factor;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * gi;
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + c.neg_step * (mi / (std::sqrt(vi) / c.sqrt_bc2 + c.eps));
  }
}

// Sum of squares in double: four independent accumulators so the adds do not wait on each other.
inline double sum_squares_plain(const float* g, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) acc[j] += static_cast<double>(g[i + j]) * g[i + j];
  for (; i < n; ++i) acc[0] += static_cast<double>(g[i]) * g[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// The vector types' sum of squares (Vec: vec_avx2.h or vec_avx512.h, instantiated inside its
// target region): at 8 lanes 16 floats per iteration widened to four 4-double FMA accumulators,
// at 16 lanes 32 floats into four 8-double ones.
template <class Vec>
double sum_squares_vec(const float* g, int64_t n) {
  if constexpr (Vec::kLanes == 8) {
    __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
    __m256d a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(g + i + 8);
      const __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
      const __m256d x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      const __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
      const __m256d y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
      a0 = _mm256_fmadd_pd(x0, x0, a0);
      a1 = _mm256_fmadd_pd(x1, x1, a1);
      a2 = _mm256_fmadd_pd(y0, y0, a2);
      a3 = _mm256_fmadd_pd(y1, y1, a3);
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    for (; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
    return sum;
  } else {
    __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
    __m512d a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m512 x = _mm512_loadu_ps(g + i), y = _mm512_loadu_ps(g + i + 16);
      const __m512d x0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
      const __m512d x1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
      const __m512d y0 = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
      const __m512d y1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(y, 1));
      a0 = _mm512_fmadd_pd(x0, x0, a0);
      a1 = _mm512_fmadd_pd(x1, x1, a1);
      a2 = _mm512_fmadd_pd(y0, y0, a2);
      a3 = _mm512_fmadd_pd(y1, y1, a3);
    }
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, _mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
    double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
                 ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    for (; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
    return sum;
  }
}

}  // namespace
}  // namespace posenc::detail
