// The residual add and layer norm rows over a vector type's lanes (vec_avx2.h: 8, vec_avx512.h:
// 16); the math and its source are in posenc/kernels/layer_norm.h. Rows of d % 8 == 0 values:
// at 16 lanes the last 8 go through a masked load and store. The row's sums are taken in the
// lanes, then across them: the order (and the last bits of mean, rstd and the gradients) depends
// on the width, not on the thread count. Included only inside a vector type's target region.
// Each input row is read from memory once: the forward's three passes over a row (h = x + r and
// its sum; the centred squares; y) and the backward's two (the two row sums and the dw, db
// partials; dh) read it again from L1 (a row of D <= kMaxLayerNormDim floats).
// stream (the caller's choice, layer_norm_cpu.cpp: out-of-cache passes, rows on 64-byte lines and
// d % 16 == 0): the outputs h, y (forward) and dh (backward) are written with non-temporal
// stores (stream_stores.h), so a pass moves only the bytes it reads and writes; the forward then
// takes h again as x + r from the row in L1 (a streamed h has left the cache), the same bits, and
// the backward prefetches dh_in's row during its first pass and the next row's dy and h during its
// second (its three input rows are read in two phases: without them memory idles between).
#pragma once

#include <cmath>
#include <cstdint>

namespace posenc::detail {
namespace {

template <class Vec>
struct LayerNormRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;
  // lanes [j, j + kLanes) of a row of d values, zero past d
  static inline __attribute__((always_inline)) V load(const float* p, int64_t j, int64_t d) {
    return j + kLanes <= d ? Vec::load(p + j) : Vec::load_first(p + j, d - j);
  }
  template <bool kStream = false>
  static inline __attribute__((always_inline)) void store(float* p, int64_t j, int64_t d, V v) {
    if (j + kLanes > d)
      Vec::store_first(p + j, v, d - j);
    else if constexpr (kStream)
      Vec::stream(p + j, v);
    else
      Vec::store(p + j, v);
  }

  // h's lanes [j, j + kLanes) again: from h (in L1 after the first pass), or as x + r when h was
  // streamed (it has left the cache; x and r are in L1)
  template <bool kStream>
  static inline __attribute__((always_inline)) V h_again(const float* x, const float* r,
                                                         const float* h, int64_t j, int64_t d) {
    if constexpr (kStream) {
      return Vec::add(load(x, j, d), load(r, j, d));
    } else {
      return load(h, j, d);
    }
  }

  // One row forward: h = x + r, y = (h - mu) rstd w + b.
  template <bool kStream>
  static inline __attribute__((always_inline)) void forward_row_impl(const float* x, const float* r,
                                                                     const float* w, const float* b,
                                                                     float* h, float* y, int64_t d,
                                                                     float eps, float* mean,
                                                                     float* rstd) {
    V acc = Vec::zero();
    for (int64_t j = 0; j < d; j += kLanes) {
      const V v = Vec::add(load(x, j, d), load(r, j, d));
      store<kStream>(h, j, d, v);
      acc = Vec::add(acc, v);
    }
    const float mu = Vec::hsum(acc) / static_cast<float>(d);
    const V vmu = Vec::set1(mu);
    V acc2 = Vec::zero();
    for (int64_t j = 0; j < d; j += kLanes) {
      V c = Vec::sub(h_again<kStream>(x, r, h, j, d), vmu);
      if (j + kLanes > d) c = Vec::keep(Vec::first(d - j), c);  // past d: 0, not -mu
      acc2 = Vec::fmadd(c, c, acc2);
    }
    const float var = Vec::hsum(acc2) / static_cast<float>(d);
    const float s = 1.0f / std::sqrt(var + eps);
    const V vs = Vec::set1(s);
    for (int64_t j = 0; j < d; j += kLanes) {
      const V xhat = Vec::mul(Vec::sub(h_again<kStream>(x, r, h, j, d), vmu), vs);
      store<kStream>(y, j, d, Vec::fmadd(xhat, load(w, j, d), load(b, j, d)));
    }
    *mean = mu;
    *rstd = s;
  }
  static void forward_row(const float* x, const float* r, const float* w, const float* b, float* h,
                          float* y, int64_t d, float eps, float* mean, float* rstd, bool stream) {
    if (stream)
      forward_row_impl<true>(x, r, w, b, h, y, d, eps, mean, rstd);
    else
      forward_row_impl<false>(x, r, w, b, h, y, d, eps, mean, rstd);
  }

  // The address of p[d + j] for a prefetch, as an integer sum (past the last row it is no element)
  static inline __attribute__((always_inline)) const void* next_row(const float* p, int64_t d,
                                                                    int64_t j) {
    return reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) +
                                         static_cast<uintptr_t>(d + j) * sizeof(float));
  }

  // One row backward: dh = rstd (g - mean(g) - xhat mean(g xhat)) + dh_in, g = dy w;
  // dw += dy xhat, db += dy into the block's partial sums.
  template <bool kStream>
  static inline __attribute__((always_inline)) void backward_row_impl(
      const float* dy, const float* dh_in, const float* h, const float* w, float mu, float s,
      float* dh, float* dw, float* db, int64_t d) {
    const V vmu = Vec::set1(mu);
    const V vs = Vec::set1(s);
    V sum_g = Vec::zero();
    V sum_gx = Vec::zero();
    for (int64_t j = 0; j < d; j += kLanes) {
      // out of cache: dh_in's row on its way while the sums run (the second pass reads it)
      if (kStream && dh_in != nullptr) __builtin_prefetch(dh_in + j, 0, 3);
      const V g_out = load(dy, j, d);  // 0 past d: g and every product below are 0 there
      const V xhat = Vec::mul(Vec::sub(load(h, j, d), vmu), vs);
      const V g = Vec::mul(g_out, load(w, j, d));
      sum_g = Vec::add(sum_g, g);
      sum_gx = Vec::fmadd(g, xhat, sum_gx);
      store(dw, j, d, Vec::fmadd(g_out, xhat, load(dw, j, d)));
      store(db, j, d, Vec::add(load(db, j, d), g_out));
    }
    const float inv_d = 1.0f / static_cast<float>(d);
    const V c_g = Vec::set1(Vec::hsum(sum_g) * inv_d);
    const V c_gx = Vec::set1(Vec::hsum(sum_gx) * inv_d);
    for (int64_t j = 0; j < d; j += kLanes) {
      if constexpr (kStream) {  // and the next row's dy and h (past the last row: dropped)
        __builtin_prefetch(next_row(dy, d, j), 0, 3);
        __builtin_prefetch(next_row(h, d, j), 0, 3);
      }
      const V xhat = Vec::mul(Vec::sub(load(h, j, d), vmu), vs);
      const V g = Vec::mul(load(dy, j, d), load(w, j, d));
      // g - mean(g) - xhat mean(g xhat)
      const V inner = Vec::sub(Vec::sub(g, c_g), Vec::mul(xhat, c_gx));
      V out = Vec::mul(vs, inner);
      if (dh_in != nullptr) out = Vec::add(out, load(dh_in, j, d));
      store<kStream>(dh, j, d, out);
    }
  }
  static void backward_row(const float* dy, const float* dh_in, const float* h, const float* w,
                           float mu, float s, float* dh, float* dw, float* db, int64_t d,
                           bool stream) {
    if (stream)
      backward_row_impl<true>(dy, dh_in, h, w, mu, s, dh, dw, db, d);
    else
      backward_row_impl<false>(dy, dh_in, h, w, mu, s, dh, dw, db, d);
  }
};

}  // namespace
}  // namespace posenc::detail
