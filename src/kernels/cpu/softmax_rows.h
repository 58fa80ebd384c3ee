// Row primitives of the tiled CPU attention's softmax (online in the forward, recomputed from
// the log-sum-exp in the backward), in plain C++ (any x86-64) and in AVX2+FMA intrinsics, the
// latter chosen at run time when the CPU has them (as the short kernel and ATen's kernels are):
//   row_max(x, n)         max_c x[c] (-inf for n = 0)
//   exp_sub_sum(x, n, m)  x[c] <- exp(x[c] - m) in place; returns sum_c x[c]
// The AVX2 exp is Cephes' single-precision expf (S. L. Moshier, Cephes Math Library, expf.c:
// exp(x) = 2^n exp(g), n = round(x / ln 2), g = x - n ln 2 in two parts (C1 + C2 = ln 2),
// exp(g) = 1 + g + g^2 P(g) with P of degree 5; relative error <= 2^-22 over the float range).
// Arguments below ln(FLT_MIN) = -87.34 give 0 (the masked -inf scores: exactly 0), NaN stays NaN;
// the sum is taken in 8 lanes and then across them.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace posenc::detail {

struct PlainSoftmaxRows {
  static float row_max(const float* x, int64_t n) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < n; ++c) m = std::max(m, x[c]);
    return m;
  }
  static float exp_sub_sum(float* x, int64_t n, float m) {
    float sum = 0.0f;
    for (int64_t c = 0; c < n; ++c) {
      x[c] = std::exp(x[c] - m);
      sum += x[c];
    }
    return sum;
  }
};

struct Avx2SoftmaxRows {
  static inline __attribute__((target("avx2,fma"))) float hsum(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static inline __attribute__((target("avx2,fma"))) float hmax(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // Cephes expf on 8 lanes (see the file's head).
  static inline __attribute__((target("avx2,fma"))) __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3365447505531f);  // ln(FLT_MIN)
    const __m256 hi = _mm256_set1_ps(88.3762626647949f);   // ln(FLT_MAX)
    const __m256 below = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, _mm256_min_ps(hi, x));  // x second: a NaN passes through
    __m256 n = _mm256_floor_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);  // 2^n
    return _mm256_andnot_ps(below, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
  }
  static inline __attribute__((target("avx2,fma"))) float row_max(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + c));
    float out = hmax(m);
    for (; c < n; ++c) out = std::max(out, x[c]);
    return out;
  }
  static inline __attribute__((target("avx2,fma"))) float exp_sub_sum(float* x, int64_t n,
                                                                      float m) {
    const __m256 shift = _mm256_set1_ps(m);
    __m256 acc = _mm256_setzero_ps();
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + c), shift));
      _mm256_storeu_ps(x + c, e);
      acc = _mm256_add_ps(acc, e);
    }
    if (c < n) {  // the last 1..7 values through the same polynomial (masked load and store)
      alignas(32) int32_t lanes[8];
      for (int l = 0; l < 8; ++l) lanes[l] = c + l < n ? -1 : 0;
      const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), shift)),
                                     _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(x + c, mask, e);
      acc = _mm256_add_ps(acc, e);
    }
    return hsum(acc);
  }
};

/// Whether this CPU runs the AVX2+FMA versions (asked once).
inline bool cpu_has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

}  // namespace posenc::detail
