// The linear layers' own products (linear_gemm.h) as register-blocked micro-kernels over a vector
// type (vec_avx2.h, vec_avx512.h): R rows x NV vectors of float32 accumulators started from the
// init rows (the bias, C itself, or zero), per k one load of NV vectors of B's row k and R
// broadcasts of A's column k, one fused multiply-add per term in order over k; stored once.
// Rows not a multiple of R take a narrower block (RR < R rows, the same loop); columns a multiple
// of the vector width (the driver keeps MKL for other widths). The column sums (the bias
// gradient) add the rows in order, NV vectors of columns at a time, the last vector masked.
// The classic GotoBLAS/BLIS micro-kernel (K. Goto, R. van de Geijn, "Anatomy of high-performance
// matrix multiplication", ACM TOMS 2008), as attention_tiles_rows.h, with A read in place (no
// packing: its R rows or R columns stay in L1 across the column blocks). Meant to be instantiated
// inside its vector type's target region.
#pragma once

#include <cstdint>

#include "linear_gemm.h"

namespace posenc::detail {

template <class Vec, int R, int NV>
struct LinearGemmRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;

  // RR rows x W vectors of C at columns [j0, j0 + W * kLanes): A(r, k) = a[r * lda + k], or
  // a[k * lda + r] where kColA.
  template <int RR, int W, bool kColA>
  static inline __attribute__((always_inline)) void block(int64_t depth, const float* a,
                                                          int64_t lda, const float* b, int64_t ldb,
                                                          const float* init, int64_t init_rs,
                                                          float* c, int64_t ldc, int64_t j0) {
    V acc[RR][W];
    for (int r = 0; r < RR; ++r)
      for (int w = 0; w < W; ++w)
        acc[r][w] = init != nullptr ? Vec::load(init + r * init_rs + j0 + w * kLanes) : Vec::zero();
    const float* bp = b + j0;
    if constexpr (kColA) {
#pragma GCC unroll 4
      for (int64_t k = 0; k < depth; ++k) {
        V bv[W];
        for (int w = 0; w < W; ++w) bv[w] = Vec::load(bp + k * ldb + w * kLanes);
        const float* ak = a + k * lda;
        for (int r = 0; r < RR; ++r) {
          const V ab = Vec::set1(ak[r]);
          for (int w = 0; w < W; ++w) acc[r][w] = Vec::fmadd(ab, bv[w], acc[r][w]);
        }
      }
    } else {
#pragma GCC unroll 4
      for (int64_t k = 0; k < depth; ++k) {
        V bv[W];
        for (int w = 0; w < W; ++w) bv[w] = Vec::load(bp + k * ldb + w * kLanes);
        for (int r = 0; r < RR; ++r) {
          const V ab = Vec::set1(a[r * lda + k]);
          for (int w = 0; w < W; ++w) acc[r][w] = Vec::fmadd(ab, bv[w], acc[r][w]);
        }
      }
    }
    for (int r = 0; r < RR; ++r)
      for (int w = 0; w < W; ++w) Vec::store(c + r * ldc + j0 + w * kLanes, acc[r][w]);
  }

  // RR rows, all columns (a multiple of kLanes): NV vectors a block, then single vectors.
  template <int RR, bool kColA>
  static void row_block(int64_t cols, int64_t depth, const float* a, int64_t lda, const float* b,
                        int64_t ldb, const float* init, int64_t init_rs, float* c, int64_t ldc) {
    int64_t j0 = 0;
    for (; j0 + NV * kLanes <= cols; j0 += NV * kLanes)
      block<RR, NV, kColA>(depth, a, lda, b, ldb, init, init_rs, c, ldc, j0);
    for (; j0 < cols; j0 += kLanes)
      block<RR, 1, kColA>(depth, a, lda, b, ldb, init, init_rs, c, ldc, j0);
  }

  // The last rows % R rows: the block of exactly that many rows (RR counts down from R - 1).
  template <int RR, bool kColA>
  static void tail(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                   const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                   int64_t ldc) {
    if constexpr (RR > 0) {
      if (rows == RR) {
        row_block<RR, kColA>(cols, depth, a, lda, b, ldb, init, init_rs, c, ldc);
      } else {
        tail<RR - 1, kColA>(rows, cols, depth, a, lda, b, ldb, init, init_rs, c, ldc);
      }
    }
  }

  template <bool kColA>
  static void product(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                      const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                      int64_t ldc) {
    // where A's row r starts (kColA: its column r) and init's row r
    const int64_t a_row = kColA ? 1 : lda;
    int64_t r0 = 0;
    for (; r0 + R <= rows; r0 += R)
      row_block<R, kColA>(cols, depth, a + r0 * a_row, lda, b, ldb,
                          init != nullptr ? init + r0 * init_rs : nullptr, init_rs, c + r0 * ldc,
                          ldc);
    if (r0 < rows)
      tail<R - 1, kColA>(rows - r0, cols, depth, a + r0 * a_row, lda, b, ldb,
                         init != nullptr ? init + r0 * init_rs : nullptr, init_rs, c + r0 * ldc,
                         ldc);
  }

  static void rows_a(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                     int64_t ldc) {
    product<false>(rows, cols, depth, a, lda, b, ldb, init, init_rs, c, ldc);
  }

  static void cols_a(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                     const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                     int64_t ldc) {
    product<true>(rows, cols, depth, a, lda, b, ldb, init, init_rs, c, ldc);
  }

  static void column_sums(int64_t rows, int64_t cols, const float* a, int64_t lda, float* sums,
                          bool accumulate) {
    for (int64_t j0 = 0; j0 < cols; j0 += NV * kLanes) {
      const int64_t n = cols - j0 < NV * kLanes ? cols - j0 : NV * kLanes;
      V acc[NV];
      for (int w = 0; w < NV; ++w)
        acc[w] = accumulate ? Vec::load_first(sums + j0 + w * kLanes, n - w * kLanes) : Vec::zero();
      if (n == NV * kLanes) {
        for (int64_t r = 0; r < rows; ++r)
          for (int w = 0; w < NV; ++w)
            acc[w] = Vec::add(acc[w], Vec::load(a + r * lda + j0 + w * kLanes));
      } else {
        for (int64_t r = 0; r < rows; ++r)
          for (int w = 0; w < NV; ++w)
            acc[w] =
                Vec::add(acc[w], Vec::load_first(a + r * lda + j0 + w * kLanes, n - w * kLanes));
      }
      for (int w = 0; w < NV; ++w) Vec::store_first(sums + j0 + w * kLanes, acc[w], n - w * kLanes);
    }
  }

  static constexpr LinearGemmKernels table() { return {kLanes, &rows_a, &cols_a, &column_sums}; }
};

}  // namespace posenc::detail
