// GELU's forward and backward passes: GeluRows over a vector type's lanes (vec_avx2.h: 8,
// vec_avx512.h: 16), PlainGeluRows one value at a time (the scalar level); the math, its source
// and its error are in posenc/kernels/gelu.h. Per value, a = |x| (clamped), two tails of the
// normal distribution as piecewise polynomials (gelu_tables.h, fitted by
// tools/gen_gelu_polynomials.py):
//   Q(a) = Phi(-a)                  forward   y  = relu(x) - a Q(a)              (one rounding)
//   S(a) = Phi(-a) - a phi(a)       backward  dx = dy (x < 0 ? S(a) : 1 - S(a))
// A tail on interval n of u = a k: w = fma(a, k, 1.5 2^23) rounds a k to the integer n (its low
// mantissa bits, the table index), t = fma(a, k, 1.5 2^23 - w) = a k - n, then Horner in t with
// the interval's coefficients (a permute per coefficient: vpermps over 8 entries):
//   forward ~20 vector operations, backward ~24 (no division, no exponential, no range checks).
// Every level runs the same IEEE operations in the same order, fused multiply-adds included
// (std::fma in the plain loop; min and max as MINPS / MAXPS order their operands), so a value is
// the same bits at scalar, AVX2 and AVX-512 and does not depend on its position or the tail (the
// last n % lanes values through a masked load and store). Special values: gelu(+inf) = +inf,
// gelu(-inf) = -0 (a clamped, the tail zero there), NaN -> NaN; gelu'(+inf) = 1, gelu'(-inf) = 0.
// stream (gelu_cpu.cpp's choice: out-of-cache outputs, stream_stores.h): the whole vectors go out
// with non-temporal stores from the output's first 64-byte line on (the values before it and the
// tail through normal masked stores); the values do not change.
// GeluRows is instantiated only inside a vector type's target region (kernels_avx2.cpp,
// kernels_avx512.cpp); PlainGeluRows by kernels_scalar.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gelu_tables.h"

namespace posenc::detail {
namespace {

/// 1.5 2^23: x + kGeluRound rounds x (|x| < 2^22) to an integer, held in the low mantissa bits.
constexpr float kGeluRound = 12582912.0f;

template <class Vec>
struct GeluRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;

  // tail(a) = sum_j table[j][n] t^j (table: Vec::table8 of each coefficient row)
  template <int kDegree>
  static inline __attribute__((always_inline)) V tail(const V* table, V a, V scale) {
    const V round = Vec::set1(kGeluRound);
    const V w = Vec::fmadd(a, scale, round);
    const V t = Vec::fmadd(a, scale, Vec::sub(round, w));
    V r = Vec::lookup8(table[kDegree], w);
    for (int j = kDegree - 1; j >= 0; --j) r = Vec::fmadd(r, t, Vec::lookup8(table[j], w));
    return r;
  }
  // a = min(clamp, |x|), NaN kept (MINPS returns its second operand when either is NaN)
  static inline __attribute__((always_inline)) V clamped_abs(V x, float clamp) {
    return Vec::min(Vec::set1(clamp), Vec::andnot(Vec::set1(-0.0f), x));
  }
  // gelu(x) = relu(x) - a Q(a); relu as MAXPS(-0, x): -0 for x < 0, x otherwise (NaN kept)
  static inline __attribute__((always_inline)) V forward(V x, const V* q) {
    const V a = clamped_abs(x, kGeluQClamp);
    const V tail_q = tail<kGeluQDegree>(q, a, Vec::set1(kGeluQScale));
    return Vec::fnmadd(a, tail_q, Vec::max(Vec::set1(-0.0f), x));
  }
  // gelu'(x) dy = (x < 0 ? S(a) : 1 - S(a)) dy
  static inline __attribute__((always_inline)) V backward(V dy, V x, const V* s) {
    const V tail_s = tail<kGeluSDegree>(s, clamped_abs(x, kGeluSClamp), Vec::set1(kGeluSScale));
    return Vec::mul(dy, Vec::select_sign(x, tail_s, Vec::sub(Vec::set1(1.0f), tail_s)));
  }
  // Values of the output before its first 64-byte line (at most n): stored normally, so the
  // streamed vectors after them start on a line (and at 8 lanes fill each line with two stores).
  static int64_t before_line(const float* out, int64_t n) {
    const auto misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(out) % 64);
    return misaligned == 0 ? 0 : std::min<int64_t>(n, (64 - misaligned) / 4);
  }
  // One whole vector: streamed (non-temporal) or stored.
  template <bool kStream>
  static inline __attribute__((always_inline)) void put(float* p, V v) {
    if constexpr (kStream) {
      Vec::stream(p, v);
    } else {
      Vec::store(p, v);
    }
  }
  // Each loop: (when streaming) the values before the output's first line through a masked store,
  // the whole vectors, the last n % lanes through a masked store.
  template <bool kStream>
  static void span_impl(const float* x, float* y, int64_t n) {
    V q[kGeluQDegree + 1];
    for (int j = 0; j <= kGeluQDegree; ++j) q[j] = Vec::table8(kGeluQ[j]);
    const int64_t head = kStream ? before_line(y, n) : 0;
    for (int64_t j = 0; j < head; j += kLanes) {
      const int64_t m = std::min(kLanes, head - j);  // up to 15 values: two pieces at 8 lanes
      Vec::store_first(y + j, forward(Vec::load_first(x + j, m), q), m);
    }
    int64_t i = head;
    for (; i + kLanes <= n; i += kLanes) put<kStream>(y + i, forward(Vec::load(x + i), q));
    if (i < n) Vec::store_first(y + i, forward(Vec::load_first(x + i, n - i), q), n - i);
  }
  template <bool kStream>
  static void backward_span_impl(const float* dy, const float* x, float* dx, int64_t n) {
    V s[kGeluSDegree + 1];
    for (int j = 0; j <= kGeluSDegree; ++j) s[j] = Vec::table8(kGeluS[j]);
    const int64_t head = kStream ? before_line(dx, n) : 0;
    for (int64_t j = 0; j < head; j += kLanes) {
      const int64_t m = std::min(kLanes, head - j);
      Vec::store_first(dx + j, backward(Vec::load_first(dy + j, m), Vec::load_first(x + j, m), s),
                       m);
    }
    int64_t i = head;
    for (; i + kLanes <= n; i += kLanes)
      put<kStream>(dx + i, backward(Vec::load(dy + i), Vec::load(x + i), s));
    if (i < n)
      Vec::store_first(dx + i,
                       backward(Vec::load_first(dy + i, n - i), Vec::load_first(x + i, n - i), s),
                       n - i);
  }
  // y[i] = gelu(x[i]) for i in [0, n); stream: non-temporal stores (the caller fences)
  static void span(const float* x, float* y, int64_t n, bool stream) {
    if (stream)
      span_impl<true>(x, y, n);
    else
      span_impl<false>(x, y, n);
  }
  // dx[i] = dy[i] gelu'(x[i]) for i in [0, n); stream as span's
  static void backward_span(const float* dy, const float* x, float* dx, int64_t n, bool stream) {
    if (stream)
      backward_span_impl<true>(dy, x, dx, n);
    else
      backward_span_impl<false>(dy, x, dx, n);
  }
};

// The same operations on one value at a time (std::fma: one rounding, as the vector FMAs).
struct PlainGeluRows {
  template <int kDegree>
  static float tail(const float (*table)[16], float a, float scale) {
    const float w = std::fma(a, scale, kGeluRound);
    const float t = std::fma(a, scale, kGeluRound - w);
    uint32_t bits;
    std::memcpy(&bits, &w, sizeof bits);
    const uint32_t n = bits & 7u;
    float r = table[kDegree][n];
    for (int j = kDegree - 1; j >= 0; --j) r = std::fma(r, t, table[j][n]);
    return r;
  }
  // MINPS(clamp, |x|): clamp < |x| ? clamp : |x| (NaN kept)
  static float clamped_abs(float x, float clamp) {
    const float s = std::fabs(x);
    return clamp < s ? clamp : s;
  }
  static float forward(float x) {
    const float a = clamped_abs(x, kGeluQClamp);
    const float relu = -0.0f > x ? -0.0f : x;  // MAXPS(-0, x)
    return std::fma(-a, tail<kGeluQDegree>(kGeluQ, a, kGeluQScale), relu);
  }
  static float backward(float dy, float x) {
    const float s = tail<kGeluSDegree>(kGeluS, clamped_abs(x, kGeluSClamp), kGeluSScale);
    return dy * (std::signbit(x) ? s : 1.0f - s);
  }
  // stream: ignored (plain stores at the scalar level)
  static void span(const float* x, float* y, int64_t n, bool /*stream*/) {
    for (int64_t i = 0; i < n; ++i) y[i] = forward(x[i]);
  }
  static void backward_span(const float* dy, const float* x, float* dx, int64_t n,
                            bool /*stream*/) {
    for (int64_t i = 0; i < n; ++i) dx[i] = backward(dy[i], x[i]);
  }
};

}  // namespace
}  // namespace posenc::detail
