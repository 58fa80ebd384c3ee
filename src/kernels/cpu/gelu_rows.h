// GELU's forward and backward passes over a vector type's lanes (vec_avx2.h: 8, vec_avx512.h:
// 16; the math, its source and its error are in posenc/kernels/gelu.h). Per lane,
// z = x / sqrt 2 (x * M_SQRT1_2, as ATen):
//   t = 1 / (1 + p |z|),  e = exp(-z^2),  erf(z) = sign(z) (1 - t P(t) e)
//   forward   y  = (x / 2) (1 + erf(z))
//   backward  dx = dy ((1 + erf(z)) / 2 + x e / sqrt(2 pi))   (e = exp(-x^2 / 2) = phi sqrt(2 pi))
// The same operations per lane at either width: a value does not depend on the level, its
// position or the tail (the last n % lanes values through a masked load and store).
// Included only inside a vector type's target region (kernels_avx2.cpp, kernels_avx512.cpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "softmax_rows.h"

namespace posenc::detail {
namespace {

template <class Vec>
struct GeluRows {
  using V = typename Vec::V;
  using M = typename Vec::M;
  static constexpr int64_t kLanes = Vec::kLanes;
  struct Erf {
    V erf;  // erf(z)
    V e;    // exp(-z^2)
  };
  static inline __attribute__((always_inline)) Erf erf(V z) {
    const V neg_zero = Vec::set1(-0.0f);
    const V one = Vec::set1(1.0f);
    const V sign = Vec::and_(neg_zero, z);
    const V a = Vec::xor_(sign, z);
    const V t = Vec::div(one, Vec::fmadd(Vec::set1(0.3275911f), a, one));
    V r = Vec::fmadd(Vec::set1(1.061405429f), t, Vec::set1(-1.453152027f));
    r = Vec::fmadd(r, t, Vec::set1(1.421413741f));
    r = Vec::fmadd(r, t, Vec::set1(-0.284496736f));
    r = Vec::fmadd(r, t, Vec::set1(0.254829592f));
    const V e = VecSoftmaxRows<Vec>::exp(Vec::xor_(neg_zero, Vec::mul(z, z)));
    // 1 - r t e, then the sign of z
    const V erf_abs = Vec::fmadd(Vec::xor_(neg_zero, Vec::mul(r, t)), e, one);
    return {Vec::xor_(sign, erf_abs), e};
  }
  static constexpr float kSqrtHalf = static_cast<float>(M_SQRT1_2);
  static constexpr float kInvSqrtTwoPi = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);

  // Lanes where x is -inf / +-inf: there the products below are inf * 0, and the limits hold.
  static inline __attribute__((always_inline)) M is_negative_infinity(V x) {
    return Vec::equal(x, Vec::set1(-INFINITY));
  }
  static inline __attribute__((always_inline)) M is_infinity(V x) {
    return Vec::equal(Vec::andnot(Vec::set1(-0.0f), x), Vec::set1(INFINITY));
  }
  // gelu(-inf) = lim x Phi(x) = -0 (as gelu(-3e38) = -0), not -inf * 0; gelu(+inf) = +inf.
  static inline __attribute__((always_inline)) V forward(V x) {
    const Erf f = erf(Vec::mul(x, Vec::set1(kSqrtHalf)));
    const V y = Vec::mul(Vec::mul(x, Vec::set1(0.5f)), Vec::add(Vec::set1(1.0f), f.erf));
    return Vec::select(is_negative_infinity(x), Vec::set1(-0.0f), y);
  }
  // gelu'(+-inf) = Phi(+-inf) = 1 / 0 (x phi(x) -> 0), not Phi + inf * 0.
  static inline __attribute__((always_inline)) V backward(V dy, V x) {
    const Erf f = erf(Vec::mul(x, Vec::set1(kSqrtHalf)));
    const V cdf = Vec::mul(Vec::set1(0.5f), Vec::add(Vec::set1(1.0f), f.erf));
    const V pdf = Vec::mul(Vec::set1(kInvSqrtTwoPi), f.e);
    const V slope = Vec::select(is_infinity(x), cdf, Vec::fmadd(x, pdf, cdf));
    return Vec::mul(dy, slope);
  }
  // y[i] = gelu(x[i]) for i in [0, n)
  static void span(const float* x, float* y, int64_t n) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes) Vec::store(y + i, forward(Vec::load(x + i)));
    if (i < n) Vec::store_first(y + i, forward(Vec::load_first(x + i, n - i)), n - i);
  }
  // dx[i] = dy[i] gelu'(x[i]) for i in [0, n)
  static void backward_span(const float* dy, const float* x, float* dx, int64_t n) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      Vec::store(dx + i, backward(Vec::load(dy + i), Vec::load(x + i)));
    if (i < n)
      Vec::store_first(
          dx + i, backward(Vec::load_first(dy + i, n - i), Vec::load_first(x + i, n - i)), n - i);
  }
};

}  // namespace
}  // namespace posenc::detail
