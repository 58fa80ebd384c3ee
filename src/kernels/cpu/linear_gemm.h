// Internal: posenc's own float32 products for the linear layers' skinny shapes (the main job's
// [2048, 96] x [96, 288 | 192 | 96] and [2048, 192] x [192, 96], forward and backward), one
// table per CPU level with vector units (linear_gemm_rows.h, compiled by kernels_avx2.cpp and
// kernels_avx512.cpp; the scalar level has none and keeps MKL's sgemm), and the drivers that
// split them across threads (linear_gemm_cpu.h, linear_gemm_cpu.cpp). Every product is
//   C[r, j] = init(r, j) + sum_{k < depth} A(r, k) B[k, j]      (in order over k, one FMA a term)
// with B row-major (b[k * ldb + j]), init a row vector (the bias: the forward's accumulator
// starts from it, no separate bias pass), C itself (accumulating over depth chunks) or zero
// (written, not accumulated: no zeroing pass, where MKL's beta = 0 has its `mscale` pass).
//   forward  y = x W^T + b:  A = x (rows), B = W^T packed [K, N], init = b
//   dx = dy W:               A = dy (rows), B = W [N, K],        init = 0
//   dW = dy^T x:             A = dy read by columns (A(n, m) = dy[m, n]), B = x, depth M
//                            in chunks (init = C after the first); db = the column sums of dy
//                            over the same chunks, while they are in cache.
// GotoBLAS/BLIS register blocking (K. Goto, R. van de Geijn, ACM TOMS 2008), as the attention's
// tile kernels (attention_tiles_rows.h). The sums run in another order than MKL's blocked ones:
// the results differ from at::linear's by float32 rounding (tests/test_linear.cpp holds them to
// float64 within a stated tolerance).
#pragma once

#include <cstdint>

namespace posenc::detail {

struct LinearGemmKernels {
  int64_t lanes;  // the column counts these take are multiples of it
  // C[r * ldc + j] = init(r, j) + sum_k a[r * lda + k] b[k * ldb + j]  (A row-major)
  void (*rows_a)(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                 const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                 int64_t ldc);
  // C[r * ldc + j] = init(r, j) + sum_k a[k * lda + r] b[k * ldb + j]  (A read by columns)
  // init(r, j) = init[r * init_rs + j], or 0 where init is null; init may be c itself.
  void (*cols_a)(int64_t rows, int64_t cols, int64_t depth, const float* a, int64_t lda,
                 const float* b, int64_t ldb, const float* init, int64_t init_rs, float* c,
                 int64_t ldc);
  // sums[j] = (accumulate ? sums[j] : 0) + sum_{r < rows} a[r * lda + j] for j < cols (any cols)
  void (*column_sums)(int64_t rows, int64_t cols, const float* a, int64_t lda, float* sums,
                      bool accumulate);
};

// Defined by kernels_avx2.cpp and kernels_avx512.cpp (x86-64 only).
extern const LinearGemmKernels kAvx2LinearGemm;
extern const LinearGemmKernels kAvx512LinearGemm;

}  // namespace posenc::detail
