// Row primitives of the CPU attention kernels' softmax (online in the tiled forward, recomputed
// from the log-sum-exp in the backward, the short kernel's rows), in plain C++ (any CPU) and over
// a vector type (vec_avx2.h, vec_avx512.h; one table entry per CPU capability, cpu_kernels.h):
//   row_max(x, n)         max_c x[c] (-inf for n = 0)
//   exp_sub_sum(x, n, m)  x[c] <- exp(x[c] - m) in place; returns sum_c x[c]
// The vector exp is Cephes' single-precision expf (S. L. Moshier, Cephes Math Library, expf.c:
// exp(x) = 2^n exp(g), n = round(x / ln 2), g = x - n ln 2 in two parts (C1 + C2 = ln 2),
// exp(g) = 1 + g + g^2 P(g) with P of degree 5; relative error <= 2^-22 over the float range),
// the same value per lane at any width. Arguments below ln(FLT_MIN) = -87.34 give 0 (the masked
// -inf scores: exactly 0), NaN stays NaN (so a NaN score makes exp_sub_sum's sum NaN); the sum
// is taken in the vector's lanes (8 or 16) and then across them, the last n % lanes values through
// a masked load and store. row_max may pass over a NaN (max_ps and std::max return the other
// operand): a row of NaN and -inf gives -inf, which callers must tell from a row without keys
// (attention_cpu.cpp scans such a row for a NaN).
// VecSoftmaxRows is meant to be instantiated inside its vector type's target region only.
#pragma once

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

template <class Vec>
struct VecSoftmaxRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;
  // Cephes expf per lane (see the file's head).
  static inline __attribute__((always_inline)) V exp(V x) {
    const V lo = Vec::set1(-87.3365447505531f);  // ln(FLT_MIN)
    const V hi = Vec::set1(88.3762626647949f);   // ln(FLT_MAX)
    const auto below = Vec::less(x, lo);
    x = Vec::max(lo, Vec::min(hi, x));  // x second: a NaN passes through
    const V n = Vec::floor(Vec::fmadd(x, Vec::set1(1.44269504088896341f), Vec::set1(0.5f)));
    x = Vec::fnmadd(n, Vec::set1(0.693359375f), x);
    x = Vec::fnmadd(n, Vec::set1(-2.12194440e-4f), x);
    V y = Vec::set1(1.9875691500e-4f);
    y = Vec::fmadd(y, x, Vec::set1(1.3981999507e-3f));
    y = Vec::fmadd(y, x, Vec::set1(8.3334519073e-3f));
    y = Vec::fmadd(y, x, Vec::set1(4.1665795894e-2f));
    y = Vec::fmadd(y, x, Vec::set1(1.6666665459e-1f));
    y = Vec::fmadd(y, x, Vec::set1(5.0000001201e-1f));
    y = Vec::fmadd(y, Vec::mul(x, x), Vec::add(x, Vec::set1(1.0f)));
    return Vec::select(below, Vec::zero(), Vec::mul(y, Vec::pow2(n)));
  }
  static float row_max(const float* x, int64_t n) {
    V m = Vec::set1(-std::numeric_limits<float>::infinity());
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes) m = Vec::max(m, Vec::load(x + c));
    float out = Vec::hmax(m);
    for (; c < n; ++c) out = std::max(out, x[c]);
    return out;
  }
  static float exp_sub_sum(float* x, int64_t n, float m) {
    const V shift = Vec::set1(m);
    V acc = Vec::zero();
    int64_t c = 0;
    for (; c + kLanes <= n; c += kLanes) {
      const V e = exp(Vec::sub(Vec::load(x + c), shift));
      Vec::store(x + c, e);
      acc = Vec::add(acc, e);
    }
    if (c < n) {  // the last values through the same polynomial (masked load and store)
      const V e = Vec::keep(Vec::first(n - c), exp(Vec::sub(Vec::load_first(x + c, n - c), shift)));
      Vec::store_first(x + c, e, n - c);
      acc = Vec::add(acc, e);
    }
    return Vec::hsum(acc);
  }
};

}  // namespace posenc::detail
