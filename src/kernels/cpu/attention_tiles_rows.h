// The tiled CPU attention's tile products as register-blocked micro-kernels over a vector type
// (vec_avx2.h, vec_avx512.h), the operands in the packed layouts of attention_tiles.h:
//   scores      S = scale Q K^T for `rows` (<= R) query rows against a key tile: rows x (NV
//               vectors) float32 accumulators, per d one load of NV key vectors (16-key panels,
//               d-major) and `rows` broadcasts of the packed query block's column d; scaled as
//               the strip is stored.
//   accumulate  O = alpha O + P V for `rows` rows of the probability strip, read where the softmax
//               left it (row-major, in L1): rows x NV accumulators over a chunk of O's columns
//               started from alpha O, per key one load of NV value vectors (16-column panels,
//               key-major) and `rows` broadcasts of P's column; no copy or packing of P.
//   accumulate_transposed  the same with the strip read transposed (O = alpha O + P^T X: the
//               backward's dV += P^T dO and dK += dS^T Q, R keys a call, P's rows broadcast).
// Each kernel is compiled once per row count 1..R (`kRows`, chosen by a chain of compares per
// call): a short call (the last rows of a query block, the last keys of a key block) computes and
// reads its own rows only, never the strip's or the packed block's lanes past them (stale or
// padding memory: nothing read there could reach an output, but a checker would flag the read and
// a tail call would spend R rows' work on fewer). Full calls (kRows = R) are the same code as
// before the split.
// The classic GotoBLAS/BLIS micro-kernel shape (K. Goto, R. van de Geijn, "Anatomy of
// high-performance matrix multiplication", ACM TOMS 2008; BLIS' sgemm micro-kernels), here with
// the attention's operands packed once per head (K, V) or query block (Q) and the softmax between
// the two products (FlashAttention's tile loop, T. Dao et al. 2022). Each product is a sum over
// d (or keys) in order with one fused multiply-add per term, so the values differ from MKL's
// blocked sums by rounding only, and a row's values do not depend on how many rows share its call.
// Meant to be instantiated inside its vector type's target region.
#pragma once

#include <cstdint>

#include "attention_tiles.h"

namespace posenc::detail {

template <class Vec, int R, int NV>
struct AttentionTileRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;

  // The address of column (key or value column) c of the panels at p, whose panels are
  // panel_stride floats apart; the element of row t (d or key) is at + t * 16.
  static inline __attribute__((always_inline)) const float* column(const float* p,
                                                                   int64_t panel_stride,
                                                                   int64_t c) {
    return p + (c / kTilePanel) * panel_stride + c % kTilePanel;
  }

  // W vectors of scores for columns [c0, c0 + W * kLanes), query rows [0, kRows).
  template <int W, int kRows>
  static inline __attribute__((always_inline)) void scores_block(const float* qp, const float* kp,
                                                                 int64_t dim, int64_t c0,
                                                                 float scale, float* s,
                                                                 int64_t lds) {
    const float* kv[W];
    for (int w = 0; w < W; ++w) kv[w] = column(kp, kTilePanel * dim, c0 + w * kLanes);
    // The scale reaches the epilogue through memory (read after a compiler barrier), so that it
    // holds no register through the loop: at the AVX2 level 12 accumulators, W key vectors and a
    // broadcast fill all 16 ymm registers, and a scale kept in one spilled a key vector.
    float scale_mem = scale;
    asm volatile("" : : "r"(&scale_mem) : "memory");
    V acc[kRows][W];
    for (int r = 0; r < kRows; ++r)
      for (int w = 0; w < W; ++w) acc[r][w] = Vec::zero();
#pragma GCC unroll 4
    for (int64_t d = 0; d < dim; ++d) {
      V k[W];
      for (int w = 0; w < W; ++w) k[w] = Vec::load(kv[w] + d * kTilePanel);
      const float* q = qp + d * R;  // the packed block's stride is R whatever kRows
      for (int r = 0; r < kRows; ++r) {
        const V qb = Vec::set1(q[r]);
        for (int w = 0; w < W; ++w) acc[r][w] = Vec::fmadd(qb, k[w], acc[r][w]);
      }
    }
    asm volatile("" : : : "memory");
    const V sc = Vec::set1(scale_mem);
    for (int r = 0; r < kRows; ++r)
      for (int w = 0; w < W; ++w)
        Vec::store(s + r * lds + c0 + w * kLanes, Vec::mul(acc[r][w], sc));
  }

  template <int kRows>
  static void scores_rows(const float* qp, const float* kp, int64_t panels, int64_t dim,
                          float scale, float* s, int64_t lds) {
    const int64_t cols = panels * kTilePanel;
    int64_t c0 = 0;
    for (; c0 + NV * kLanes <= cols; c0 += NV * kLanes)
      scores_block<NV, kRows>(qp, kp, dim, c0, scale, s, lds);
    for (; c0 < cols; c0 += kLanes) scores_block<1, kRows>(qp, kp, dim, c0, scale, s, lds);
  }

  // rows in [1, kRows]: the kernel compiled for exactly that many rows.
  template <int kRows>
  static inline __attribute__((always_inline)) void scores_dispatch(int64_t rows, const float* qp,
                                                                    const float* kp, int64_t panels,
                                                                    int64_t dim, float scale,
                                                                    float* s, int64_t lds) {
    if constexpr (kRows > 1) {
      if (rows < kRows) return scores_dispatch<kRows - 1>(rows, qp, kp, panels, dim, scale, s, lds);
    }
    scores_rows<kRows>(qp, kp, panels, dim, scale, s, lds);
  }

  static void scores(const float* qp, const float* kp, int64_t panels, int64_t dim, float scale,
                     float* s, int64_t lds, int64_t rows) {
    if (rows <= 0) return;
    scores_dispatch<R>(rows, qp, kp, panels, dim, scale, s, lds);
  }

  // W vectors of O's columns [e0, e0 + W * kLanes) for rows [0, kRows); the strip's element
  // (row r, inner index c) at s[r * lds + c], or (transposed) s[c * lds + r].
  template <int W, bool kTransposed, int kRows>
  static inline __attribute__((always_inline)) void accumulate_block(const float* s, int64_t lds,
                                                                     int64_t cols, const float* vp,
                                                                     int64_t vstride, int64_t e0,
                                                                     const float* alpha, float* o,
                                                                     int64_t ldo) {
    const float* vv[W];
    for (int w = 0; w < W; ++w) vv[w] = column(vp, vstride, e0 + w * kLanes);
    V acc[kRows][W];
    for (int r = 0; r < kRows; ++r) {
      const V a = Vec::set1(alpha[r]);
      for (int w = 0; w < W; ++w) acc[r][w] = Vec::mul(a, Vec::load(o + r * ldo + e0 + w * kLanes));
    }
#pragma GCC unroll 4
    for (int64_t c = 0; c < cols; ++c) {
      V v[W];
      for (int w = 0; w < W; ++w) v[w] = Vec::load(vv[w] + c * kTilePanel);
      const float* p = kTransposed ? s + c * lds : s + c;
      for (int r = 0; r < kRows; ++r) {
        const V pb = Vec::set1(p[kTransposed ? r : r * lds]);
        for (int w = 0; w < W; ++w) acc[r][w] = Vec::fmadd(pb, v[w], acc[r][w]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int w = 0; w < W; ++w) Vec::store(o + r * ldo + e0 + w * kLanes, acc[r][w]);
  }

  template <bool kTransposed, int kRows>
  static void accumulate_rows(const float* s, int64_t lds, int64_t cols, const float* vp,
                              int64_t vstride, int64_t dim_v, const float* alpha, float* o,
                              int64_t ldo) {
    int64_t e0 = 0;
    for (; e0 + NV * kLanes <= dim_v; e0 += NV * kLanes)
      accumulate_block<NV, kTransposed, kRows>(s, lds, cols, vp, vstride, e0, alpha, o, ldo);
    for (; e0 < dim_v; e0 += kLanes)
      accumulate_block<1, kTransposed, kRows>(s, lds, cols, vp, vstride, e0, alpha, o, ldo);
  }

  // rows in [1, kRows]: the kernel compiled for exactly that many rows.
  template <bool kTransposed, int kRows>
  static inline __attribute__((always_inline)) void accumulate_dispatch(
      int64_t rows, const float* s, int64_t lds, int64_t cols, const float* vp, int64_t vstride,
      int64_t dim_v, const float* alpha, float* o, int64_t ldo) {
    if constexpr (kRows > 1) {
      if (rows < kRows)
        return accumulate_dispatch<kTransposed, kRows - 1>(rows, s, lds, cols, vp, vstride, dim_v,
                                                           alpha, o, ldo);
    }
    accumulate_rows<kTransposed, kRows>(s, lds, cols, vp, vstride, dim_v, alpha, o, ldo);
  }

  static void accumulate(const float* s, int64_t lds, int64_t rows, int64_t cols, const float* vp,
                         int64_t vstride, int64_t dim_v, const float* alpha, float* o,
                         int64_t ldo) {
    if (rows <= 0) return;
    accumulate_dispatch<false, R>(rows, s, lds, cols, vp, vstride, dim_v, alpha, o, ldo);
  }

  static void accumulate_transposed(const float* s, int64_t lds, int64_t rows, int64_t cols,
                                    const float* vp, int64_t vstride, int64_t dim_v,
                                    const float* alpha, float* o, int64_t ldo) {
    if (rows <= 0) return;
    accumulate_dispatch<true, R>(rows, s, lds, cols, vp, vstride, dim_v, alpha, o, ldo);
  }

  static constexpr AttentionTileKernels table() {
    return {R, &scores, &accumulate, &accumulate_transposed};
  }
};

}  // namespace posenc::detail
