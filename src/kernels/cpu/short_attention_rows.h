// The short-sequence CPU attention's loops (contract in include/posenc/kernels/short_attention.h;
// entry points in short_attention_cpu.cpp). One work item = one (batch, head): its rotated q and
// k rows are copied into the thread's scratch once, the N x N scores are computed there, and the
// output (forward) or dq, dk, dv (backward) rows of that head are written directly; items write
// disjoint rows, so no atomics. When the problem has a probabilities buffer (gradients needed),
// the forward writes each head's P there and the backward reads it instead of recomputing S and
// its exponentials from the log-sum-exp (saves one of its five products, K's transpose and the
// exponentials). Two forms: the plain loops (dot products and weighted sums, any
// CPU; kernels_scalar.cpp) and the vector form over a vector type's lanes (small matrix products;
// vec_avx2.h: 8, vec_avx512.h: 16; kernels_avx2.cpp, kernels_avx512.cpp, each inside its target
// region). Sums run in a fixed order per element: a result does not depend on the thread count
// (at 16 lanes the dot products' partial sums are grouped differently than at 8).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "rope_rows.h"
#include "rotate_row.h"
#include "short_attention_cpu.h"
#include "softmax_rows.h"

namespace posenc::detail {
namespace {

#ifndef POSENC_INLINE
#define POSENC_INLINE inline __attribute__((always_inline))
#endif

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The two primitives the plain path's loops are made of (any x86-64; a loop whose accumulator
// lives in memory is bound by store-to-load forwarding: measured 5x slower at N = 16, D = 32).
// The vector path further down takes its products as small matrix products and keeps only
// ShortAttentionVec::dot (one per row of the backward).
struct PlainOps {
  // a . b over d values, 8 partial sums in a fixed order
  static POSENC_INLINE float dot(const float* a, const float* b, int64_t d) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
  }
  // dst[0..d) = sum_t w[t * ws] * rows[t * rs + 0..d), t < count
  static POSENC_INLINE void weighted_sum(const float* w, int64_t ws, const float* rows, int64_t rs,
                                         int64_t count, int64_t d, float* dst) {
    std::fill(dst, dst + d, 0.0f);
    for (int64_t t = 0; t < count; ++t) {
      const float a = w[t * ws];
      const float* r = rows + t * rs;
      for (int64_t e = 0; e < d; ++e) dst[e] += a * r[e];
    }
  }
};

// Rows of q or k of head (b, h), rotated when the problem has tables, into dst rows ld apart.
POSENC_INLINE void load_rows_to(const ShortAttentionProblem& p, const float* base,
                                const int64_t* stride, int64_t b, int64_t h, float* dst,
                                int64_t ld) {
  for (int64_t i = 0; i < p.n; ++i) {
    const float* src = base + b * stride[0] + i * stride[1] + h * stride[2];
    if (p.cos != nullptr)
      rotate_row(src, dst + i * ld, p.dim, p.cos + i * p.pairs, p.sin + i * p.pairs, p.pairs,
                 p.interleaved, 1.0f);
    else
      std::memcpy(dst + i * ld, src, sizeof(float) * p.dim);
  }
}

POSENC_INLINE const float* v_row(const ShortAttentionProblem& p, int64_t b, int64_t j, int64_t h) {
  return p.v + b * p.v_stride[0] + j * p.v_stride[1] + h * p.v_stride[2];
}

// Row i of head (b, h) of dq, dk, dv (grad_stride; all 0: contiguous [B, N, H, D]).
POSENC_INLINE int64_t grad_offset(const ShortAttentionProblem& p, int64_t b, int64_t i, int64_t h) {
  if (p.grad_stride[1] == 0) return ((b * p.n + i) * p.heads + h) * p.dim;
  return b * p.grad_stride[0] + i * p.grad_stride[1] + h * p.grad_stride[2];
}

// [B, N, H, D] contiguous: row i of head (b, h).
POSENC_INLINE int64_t row_offset(const ShortAttentionProblem& p, int64_t b, int64_t i, int64_t h) {
  return ((b * p.n + i) * p.heads + h) * p.dim;
}

// exp(x) for x <= 0 (a score minus its row's maximum), branch-free so the row loops vectorize:
// x = k ln 2 + r, |r| <= ln 2 / 2, exp(r) by Cephes' expf polynomial (relative error ~1e-7),
// times 2^k built in the exponent bits. Below -87 the result is held at exp(-87) ~ 1.6e-38
// (a weight 1e-38 of the row's largest: zero for any float sum).
POSENC_INLINE float exp_nonpositive(float x) {
  x = std::max(x, -87.0f);
  const float k = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(k) + 127) << 23;
  return y * __builtin_bit_cast(float, bits);
}

// The rows of a head (b, h) are N <= 64: scores by dot products, outputs and gradients as
// weighted sums of rows, each with its accumulators in registers (Ops).
template <class Ops>
POSENC_INLINE void forward_items(const ShortAttentionProblem& p, int64_t begin, int64_t end,
                                 float* out, float* lse) {
  const int64_t n = p.n, d = p.dim, np = short_attention_padded(n);
  std::vector<float> scratch(2 * n * d + n);
  float* Q = scratch.data();
  float* K = Q + n * d;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / p.heads, h = item % p.heads;
    load_rows_to(p, p.q, p.q_stride, b, h, Q, d);
    load_rows_to(p, p.k, p.k_stride, b, h, K, d);
    float* saved = p.probabilities != nullptr ? p.probabilities + item * np * np : nullptr;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t cols = p.causal ? i + 1 : n;
      float* row = saved != nullptr ? saved + i * np : K + n * d;  // P's row i
      float m = kNegInf;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] = Ops::dot(Q + i * d, K + j * d, d) * p.scale;
        m = std::max(m, row[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        row[j] = exp_nonpositive(row[j] - m);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < cols; ++j) row[j] *= inv;
      if (saved != nullptr) std::fill(row + cols, row + np, 0.0f);
      if (lse != nullptr) lse[item * n + i] = m + std::log(sum);
      Ops::weighted_sum(row, 1, v_row(p, b, 0, h), p.v_stride[1], cols, d,
                        out + row_offset(p, b, i, h));
    }
    if (saved != nullptr) std::fill(saved + n * np, saved + np * np, 0.0f);
  }
}

// dst row = src row rotated back (R^T) when the problem has tables, else copied.
POSENC_INLINE void unrotate_row(const ShortAttentionProblem& p, int64_t i, const float* src,
                                float* dst) {
  if (p.cos != nullptr)
    rotate_row(src, dst, p.dim, p.cos + i * p.pairs, p.sin + i * p.pairs, p.pairs, p.interleaved,
               -1.0f);
  else
    std::memcpy(dst, src, sizeof(float) * p.dim);
}

template <class Ops>
POSENC_INLINE void backward_items(const ShortAttentionProblem& p, int64_t begin, int64_t end,
                                  const float* out, const float* lse, const float* grad_out,
                                  float* dq, float* dk, float* dv) {
  const int64_t n = p.n, d = p.dim, np = short_attention_padded(n);
  const int64_t token_stride = p.heads * d;  // of out, grad_out, dq, dk, dv
  std::vector<float> scratch(3 * n * d + 2 * n * n);
  float* Q = scratch.data();
  float* K = Q + n * d;
  float* tmp = K + n * d;
  float* dS = tmp + n * d;  // [N, N] score gradients times scale
  // [N, N] probabilities, rows ld apart (0 above the causal diagonal): the forward's, or here
  const bool saved = p.probabilities != nullptr;
  const int64_t ld = saved ? np : n;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / p.heads, h = item % p.heads;
    float* P = saved ? p.probabilities + item * np * np : dS + n * n;
    load_rows_to(p, p.q, p.q_stride, b, h, Q, d);
    load_rows_to(p, p.k, p.k_stride, b, h, K, d);
    for (int64_t i = 0; i < n; ++i) {
      const float* doi = grad_out + row_offset(p, b, i, h);
      const float di = Ops::dot(doi, out + row_offset(p, b, i, h), d);
      const float l = saved ? 0.0f : lse[item * n + i];
      const int64_t cols = p.causal ? i + 1 : n;
      float* pi = P + i * ld;
      float* dsi = dS + i * n;
      for (int64_t j = 0; j < cols; ++j) {
        if (!saved) pi[j] = exp_nonpositive(Ops::dot(Q + i * d, K + j * d, d) * p.scale - l);
        dsi[j] = pi[j] * (Ops::dot(doi, v_row(p, b, j, h), d) - di) * p.scale;
      }
      if (!saved) std::fill(pi + cols, pi + n, 0.0f);
      std::fill(dsi + cols, dsi + n, 0.0f);
      Ops::weighted_sum(dsi, 1, K, d, cols, d, tmp);  // dq'_i = sum_j dS_ij k'_j
      unrotate_row(p, i, tmp, dq + grad_offset(p, b, i, h));
    }
    for (int64_t j = 0; j < n; ++j) {
      Ops::weighted_sum(dS + j, n, Q, d, n, d, tmp);  // dk'_j = sum_i dS_ij q'_i
      unrotate_row(p, j, tmp, dk + grad_offset(p, b, j, h));
      Ops::weighted_sum(P + j, ld, grad_out + row_offset(p, b, 0, h), token_stride, n, d,
                        dv + grad_offset(p, b, j, h));  // dv_j = sum_i P_ij dout_i
    }
  }
}

// ---- vector form: a head's products as small matrix products ------------------------------
// Every product of the forward and the backward is C[r, 0:w) = sum_t A[r, t] B[t, 0:w) over the
// thread's zero-padded scratch (rows a multiple of 4, widths of 8):
//   S = Q' K'^T (B = K' transposed),  out = P V,  dP = dout V^T,  dq' = dS K',
//   dk' = dS^T Q',  dv = P^T dout  (A read transposed in place: A[r, t] = dS[t, r], P[t, r]).
// Where N % 8 == 0 and D % 8 == 0 (no padding: the main job's N = 16, D = 32) V, dout, out and
// dv are read and written in place through their strides instead of copied through scratch;
// where D % 8 == 0 the forward reads V in place. Neither changes a sum: the same bits. The
// rotations of q, k (R) and of dq', dk' (R^T: the sine negated once per call) take RopeRows'
// vector rows (rope_rows.h: the same products and differences as rotate_row, whole vectors).
// A block of 4 rows x 2 vectors keeps 8 accumulators in registers over t: no horizontal sums
// (the dot-product form above pays one per score: measured 4-5x slower at N = 16, D = 32); at 16
// lanes a width of 8 (mod 16) is one masked vector. Softmax rows as softmax_rows.h.

POSENC_INLINE int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

template <class Vec>
struct ShortAttentionVec {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;

  // a . b over d values: two vectors of partial sums, then across the lanes, then the tail
  static POSENC_INLINE float dot(const float* a, const float* b, int64_t d) {
    V s0 = Vec::zero(), s1 = Vec::zero();
    int64_t i = 0;
    for (; i + 2 * kLanes <= d; i += 2 * kLanes) {
      s0 = Vec::fmadd(Vec::load(a + i), Vec::load(b + i), s0);
      s1 = Vec::fmadd(Vec::load(a + i + kLanes), Vec::load(b + i + kLanes), s1);
    }
    if (i + kLanes <= d) {
      s0 = Vec::fmadd(Vec::load(a + i), Vec::load(b + i), s0);
      i += kLanes;
    }
    float s = Vec::hsum(Vec::add(s0, s1));
    for (; i < d; ++i) s += a[i] * b[i];
    return s;
  }

  // lanes [c, c + n) of a row: n == kLanes a full vector, else masked
  template <bool kMasked>
  static POSENC_INLINE V load_cols(const float* p, int64_t n) {
    if constexpr (kMasked) {
      return Vec::load_first(p, n);
    } else {
      return Vec::load(p);
    }
  }
  template <bool kMasked>
  static POSENC_INLINE void store_cols(float* p, V v, int64_t n) {
    if constexpr (kMasked) {
      Vec::store_first(p, v, n);
    } else {
      Vec::store(p, v);
    }
  }

  // A[r + k, t] (k < 4) of the rows a = A + r * lda, or with kTransposed of A^T: a = A + r,
  // A[r + k, t] = a[t * lda + k]
  template <bool kTransposed>
  static POSENC_INLINE float a_at(const float* a, int64_t lda, int64_t k, int64_t t) {
    if constexpr (kTransposed) {
      return a[t * lda + k];
    } else {
      return a[k * lda + t];
    }
  }
  template <bool kTransposed>
  static POSENC_INLINE const float* a_rows(const float* A, int64_t lda, int64_t r) {
    if constexpr (kTransposed) {
      return A + r;
    } else {
      return A + r * lda;
    }
  }

  // columns [c, c + n), n <= kLanes, of 4 rows at a time
  template <bool kMasked, bool kTransposed>
  static POSENC_INLINE void gemm_one_vector(const float* A, int64_t lda, const float* B,
                                            int64_t ldb, int64_t kdim, int64_t rows, int64_t c,
                                            int64_t n, float* C, int64_t ldc) {
    int64_t r = 0;
    // 8 rows at a time: 8 independent sums hide the multiply-add's latency and share each
    // load of B (one column vector: the scores at N <= 16 and 16 lanes)
    for (; r + 8 <= rows; r += 8) {
      V x[8];
      for (auto& xi : x) xi = Vec::zero();
      const float* a = a_rows<kTransposed>(A, lda, r);
      const float* a4 = a_rows<kTransposed>(A, lda, r + 4);
      for (int64_t t = 0; t < kdim; ++t) {
        const V b0 = load_cols<kMasked>(B + t * ldb + c, n);
        x[0] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 0, t)), b0, x[0]);
        x[1] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 1, t)), b0, x[1]);
        x[2] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 2, t)), b0, x[2]);
        x[3] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 3, t)), b0, x[3]);
        x[4] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a4, lda, 0, t)), b0, x[4]);
        x[5] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a4, lda, 1, t)), b0, x[5]);
        x[6] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a4, lda, 2, t)), b0, x[6]);
        x[7] = Vec::fmadd(Vec::set1(a_at<kTransposed>(a4, lda, 3, t)), b0, x[7]);
      }
      for (int k = 0; k < 8; ++k) store_cols<kMasked>(C + (r + k) * ldc + c, x[k], n);
    }
    for (; r < rows; r += 4) {
      V x0 = Vec::zero(), x1 = x0, x2 = x0, x3 = x0;
      const float* a = a_rows<kTransposed>(A, lda, r);
      for (int64_t t = 0; t < kdim; ++t) {
        const V b0 = load_cols<kMasked>(B + t * ldb + c, n);
        x0 = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 0, t)), b0, x0);
        x1 = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 1, t)), b0, x1);
        x2 = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 2, t)), b0, x2);
        x3 = Vec::fmadd(Vec::set1(a_at<kTransposed>(a, lda, 3, t)), b0, x3);
      }
      float* o = C + r * ldc + c;
      store_cols<kMasked>(o, x0, n);
      store_cols<kMasked>(o + ldc, x1, n);
      store_cols<kMasked>(o + 2 * ldc, x2, n);
      store_cols<kMasked>(o + 3 * ldc, x3, n);
    }
  }

  // C[r * ldc + 0:w) = sum_{t < kdim} A[r * lda + t] B[t * ldb + 0:w), r < rows; rows % 4 == 0,
  // w % 8 == 0. kTransposed: A[r, t] = A[t * lda + r] (A^T's rows; the same sums in the same
  // order as over a transposed copy).
  template <bool kTransposed = false>
  static POSENC_INLINE void small_gemm(const float* A, int64_t lda, const float* B, int64_t ldb,
                                       int64_t kdim, int64_t rows, int64_t w, float* C,
                                       int64_t ldc) {
    int64_t c = 0;
    for (; c + 2 * kLanes <= w; c += 2 * kLanes)
      for (int64_t r = 0; r < rows; r += 4) {
        V x00 = Vec::zero(), x01 = x00, x10 = x00, x11 = x00, x20 = x00, x21 = x00, x30 = x00,
          x31 = x00;
        const float* a = a_rows<kTransposed>(A, lda, r);
        for (int64_t t = 0; t < kdim; ++t) {
          const V b0 = Vec::load(B + t * ldb + c);
          const V b1 = Vec::load(B + t * ldb + c + kLanes);
          V s = Vec::set1(a_at<kTransposed>(a, lda, 0, t));
          x00 = Vec::fmadd(s, b0, x00);
          x01 = Vec::fmadd(s, b1, x01);
          s = Vec::set1(a_at<kTransposed>(a, lda, 1, t));
          x10 = Vec::fmadd(s, b0, x10);
          x11 = Vec::fmadd(s, b1, x11);
          s = Vec::set1(a_at<kTransposed>(a, lda, 2, t));
          x20 = Vec::fmadd(s, b0, x20);
          x21 = Vec::fmadd(s, b1, x21);
          s = Vec::set1(a_at<kTransposed>(a, lda, 3, t));
          x30 = Vec::fmadd(s, b0, x30);
          x31 = Vec::fmadd(s, b1, x31);
        }
        float* o = C + r * ldc + c;
        Vec::store(o, x00);
        Vec::store(o + kLanes, x01);
        Vec::store(o + ldc, x10);
        Vec::store(o + ldc + kLanes, x11);
        Vec::store(o + 2 * ldc, x20);
        Vec::store(o + 2 * ldc + kLanes, x21);
        Vec::store(o + 3 * ldc, x30);
        Vec::store(o + 3 * ldc + kLanes, x31);
      }
    for (; c + kLanes <= w; c += kLanes)
      gemm_one_vector<false, kTransposed>(A, lda, B, ldb, kdim, rows, c, kLanes, C, ldc);
    if (c < w)  // the last 8 columns at 16 lanes
      gemm_one_vector<true, kTransposed>(A, lda, B, ldb, kdim, rows, c, w - c, C, ldc);
  }

  // dst[e * ld + i] = src[i * src_ld + e] for i < rows, e < cols rounded up to multiples of 8
  // (blocks of 8 x 8 in registers: unpack, shuffle, permute; AVX2 instructions at either level):
  // both matrices are scratch padded to those multiples, so the extra rows and columns are read
  // and written inside it.
  static POSENC_INLINE void transpose_into(const float* src, int64_t src_ld, int64_t rows,
                                           int64_t cols, float* dst, int64_t ld) {
    for (int64_t i = 0; i < rows; i += 8)
      for (int64_t e = 0; e < cols; e += 8) {
        const float* a = src + i * src_ld + e;
        const __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + src_ld),
                     r2 = _mm256_loadu_ps(a + 2 * src_ld), r3 = _mm256_loadu_ps(a + 3 * src_ld),
                     r4 = _mm256_loadu_ps(a + 4 * src_ld), r5 = _mm256_loadu_ps(a + 5 * src_ld),
                     r6 = _mm256_loadu_ps(a + 6 * src_ld), r7 = _mm256_loadu_ps(a + 7 * src_ld);
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                     t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                     t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                     t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                     u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                     u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                     u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* o = dst + e * ld + i;
        _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(o + ld, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(o + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(o + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(o + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(o + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(o + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(o + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
  }

  // Scratch sizes of one head: nr = np token rows and score columns (n up to a multiple of 8),
  // dp head columns (d up to 8); the padding stays zero.
  struct Pads {
    int64_t nr, np, dp;
    explicit Pads(const ShortAttentionProblem& p)
        : nr(round_up(p.n, 8)), np(nr), dp(round_up(p.dim, 8)) {}
  };

  // Rows i < N of src (src_ld apart) into dst (dst_ld apart), rotated by the problem's tables
  // with the sine table sin (p.sin, or its negation for R^T), or copied; dims from 2F on copied.
  static POSENC_INLINE void rotate_rows(const ShortAttentionProblem& p, const float* sin,
                                        const float* src, int64_t src_ld, float* dst,
                                        int64_t dst_ld) {
    for (int64_t i = 0; i < p.n; ++i) {
      const float* x = src + i * src_ld;
      float* y = dst + i * dst_ld;
      int64_t e = 0;
      if (p.cos != nullptr) {
        RopeRows<Vec>::template f32<false>(x, y, p.cos + i * p.pairs, sin + i * p.pairs, p.pairs,
                                           p.interleaved);
        e = 2 * p.pairs;
      }
      for (; e + kLanes <= p.dim; e += kLanes) Vec::store(y + e, Vec::load(x + e));
      if (e < p.dim) Vec::store_first(y + e, Vec::load_first(x + e, p.dim - e), p.dim - e);
    }
  }
  static POSENC_INLINE const float* head(const ShortAttentionProblem& p, const float* base,
                                         const int64_t* stride, int64_t b, int64_t h) {
    return base + b * stride[0] + h * stride[2];
  }

  // No padding anywhere (N % 8 == 0, D % 8 == 0): V, dout, out, dv in place.
  static POSENC_INLINE bool unpadded(const ShortAttentionProblem& p) {
    return p.n % 8 == 0 && p.dim % 8 == 0;
  }

  static void forward(const ShortAttentionProblem& p, int64_t begin, int64_t end, float* out,
                      float* lse) {
    const int64_t n = p.n, d = p.dim;
    const Pads z(p);
    const bool v_in_place = d % 8 == 0, out_in_place = unpadded(p);
    const int64_t token_stride = p.heads * d;  // of out
    // Q' [nr, dp], K' [np, dp], K'^T [dp, np], V [np, dp], S/P [nr, np], out [nr, dp]
    std::vector<float> scratch(z.nr * z.dp + 3 * z.np * z.dp + z.nr * z.np + z.nr * z.dp, 0.0f);
    float* Q = scratch.data();
    float* K = Q + z.nr * z.dp;
    float* KT = K + z.np * z.dp;
    float* V_ = KT + z.dp * z.np;
    float* O = V_ + z.np * z.dp + z.nr * z.np;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / p.heads, h = item % p.heads;
      // P into the saved probabilities when the backward will read them (nr == np)
      float* S =
          p.probabilities != nullptr ? p.probabilities + item * z.nr * z.np : V_ + z.np * z.dp;
      rotate_rows(p, p.sin, head(p, p.q, p.q_stride, b, h), p.q_stride[1], Q, z.dp);
      rotate_rows(p, p.sin, head(p, p.k, p.k_stride, b, h), p.k_stride[1], K, z.dp);
      transpose_into(K, z.dp, z.np, z.dp, KT, z.np);
      const float* V = V_;
      int64_t ldv = z.dp;
      if (v_in_place) {
        V = v_row(p, b, 0, h);
        ldv = p.v_stride[1];
      } else {
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(V_ + j * z.dp, v_row(p, b, j, h), sizeof(float) * d);
      }
      small_gemm(Q, z.dp, KT, z.np, d, z.nr, z.np, S, z.np);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t cols = p.causal ? i + 1 : n;
        float* si = S + i * z.np;
        for (int64_t j = 0; j < cols; ++j) si[j] *= p.scale;
        const float m = VecSoftmaxRows<Vec>::row_max(si, cols);
        const float sum = VecSoftmaxRows<Vec>::exp_sub_sum(si, cols, m);
        const float inv = 1.0f / sum;
        for (int64_t j = 0; j < cols; ++j) si[j] *= inv;
        std::fill(si + cols, si + z.np, 0.0f);
        if (lse != nullptr) lse[item * n + i] = m + std::log(sum);
      }
      if (out_in_place) {
        small_gemm(S, z.np, V, ldv, n, n, d, out + row_offset(p, b, 0, h), token_stride);
      } else {
        small_gemm(S, z.np, V, ldv, n, z.nr, z.dp, O, z.dp);
        for (int64_t i = 0; i < n; ++i)
          std::memcpy(out + row_offset(p, b, i, h), O + i * z.dp, sizeof(float) * d);
      }
    }
  }

  static void backward(const ShortAttentionProblem& p, int64_t begin, int64_t end, const float* out,
                       const float* lse, const float* grad_out, float* dq, float* dk, float* dv) {
    const int64_t n = p.n, d = p.dim;
    const Pads z(p);
    const bool in_place = unpadded(p), saved = p.probabilities != nullptr;
    const int64_t token_stride = p.heads * d;  // of out, grad_out
    const int64_t grad_token_stride = p.grad_stride[1] == 0 ? token_stride : p.grad_stride[1];
    // Q' [nr, dp], K' [np, dp], K'^T and V^T [dp, np], dout [nr, dp], P and dS [nr, np], one
    // result [np, dp]
    const int64_t sizes[] = {z.nr * z.dp, z.np * z.dp, z.dp * z.np, z.dp * z.np,
                             z.nr * z.dp, z.nr * z.np, z.nr * z.np, z.np * z.dp};
    int64_t total = 0;
    for (const int64_t size : sizes) total += size;
    std::vector<float> scratch(total, 0.0f);
    float* at = scratch.data();
    float* ptr[8];
    for (int i = 0; i < 8; ++i) {
      ptr[i] = at;
      at += sizes[i];
    }
    float *Q = ptr[0], *K = ptr[1], *KT = ptr[2], *VT = ptr[3], *dO_ = ptr[4], *dS = ptr[6],
          *R = ptr[7];
    // -sin: R^T's table (rotate_row's sign * s, exact)
    std::vector<float> neg_sin(p.cos != nullptr ? n * p.pairs : 0);
    for (size_t e = 0; e < neg_sin.size(); ++e) neg_sin[e] = -p.sin[e];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / p.heads, h = item % p.heads;
      // P [nr, np]: the forward's, or recomputed here from S and the log-sum-exp
      float* P = saved ? p.probabilities + item * z.nr * z.np : ptr[5];
      rotate_rows(p, p.sin, head(p, p.q, p.q_stride, b, h), p.q_stride[1], Q, z.dp);
      rotate_rows(p, p.sin, head(p, p.k, p.k_stride, b, h), p.k_stride[1], K, z.dp);
      const float* dO = dO_;
      int64_t lddo = z.dp;
      if (in_place) {
        transpose_into(v_row(p, b, 0, h), p.v_stride[1], n, d, VT, z.np);
        dO = grad_out + row_offset(p, b, 0, h);
        lddo = token_stride;
      } else {
        for (int64_t j = 0; j < n; ++j) {
          std::memcpy(R + j * z.dp, v_row(p, b, j, h), sizeof(float) * d);  // V, padded
          std::memcpy(dO_ + j * z.dp, grad_out + row_offset(p, b, j, h), sizeof(float) * d);
        }
        transpose_into(R, z.dp, z.np, z.dp, VT, z.np);
      }
      if (!saved) {
        transpose_into(K, z.dp, z.np, z.dp, KT, z.np);
        small_gemm(Q, z.dp, KT, z.np, d, z.nr, z.np, P, z.np);  // S (P below)
      }
      small_gemm(dO, lddo, VT, z.np, d, z.nr, z.np, dS, z.np);  // dP (dS below)
      const V scale = Vec::set1(p.scale);
      for (int64_t i = 0; i < n; ++i) {
        const float di = dot(grad_out + row_offset(p, b, i, h), out + row_offset(p, b, i, h), d);
        const V l = Vec::set1(saved ? 0.0f : lse[item * n + i]);
        const V dvec = Vec::set1(di);
        const int64_t cols = p.causal ? i + 1 : n;
        float* pi = P + i * z.np;
        float* dsi = dS + i * z.np;
        for (int64_t j = 0; j < z.np; j += kLanes) {
          const int64_t w = std::min(kLanes, z.np - j);  // 8 for the last vector at 16 lanes
          const V s = w == kLanes ? Vec::load(pi + j) : Vec::load_first(pi + j, w);
          const V g = w == kLanes ? Vec::load(dsi + j) : Vec::load_first(dsi + j, w);
          V pv = s;  // saved: P, 0 above the causal diagonal and in the padding
          if (!saved) {
            // lanes j + 0.. below cols; the rest 0 (causal, padding)
            const auto keep = Vec::first(cols - j);
            pv = Vec::keep(keep, VecSoftmaxRows<Vec>::exp(Vec::sub(Vec::mul(s, scale), l)));
          }
          const V ds = Vec::mul(Vec::mul(pv, Vec::sub(g, dvec)), scale);
          if (w == kLanes) {
            if (!saved) Vec::store(pi + j, pv);
            Vec::store(dsi + j, ds);
          } else {
            if (!saved) Vec::store_first(pi + j, pv, w);
            Vec::store_first(dsi + j, ds, w);
          }
        }
      }
      small_gemm(dS, z.np, K, z.dp, n, z.nr, z.dp, R, z.dp);  // dq'_i = sum_j dS_ij k'_j
      rotate_rows(p, neg_sin.data(), R, z.dp, dq + grad_offset(p, b, 0, h), grad_token_stride);
      small_gemm<true>(dS, z.np, Q, z.dp, n, z.np, z.dp, R, z.dp);  // dk'_j = sum_i dS_ij q'_i
      rotate_rows(p, neg_sin.data(), R, z.dp, dk + grad_offset(p, b, 0, h), grad_token_stride);
      if (in_place) {  // dv_j = sum_i P_ij dout_i
        small_gemm<true>(P, z.np, dO, lddo, n, n, d, dv + grad_offset(p, b, 0, h),
                         grad_token_stride);
      } else {
        small_gemm<true>(P, z.np, dO, lddo, n, z.np, z.dp, R, z.dp);
        for (int64_t j = 0; j < n; ++j)
          std::memcpy(dv + grad_offset(p, b, j, h), R + j * z.dp, sizeof(float) * d);
      }
    }
  }
};

// The plain form's entries (kernels_scalar.cpp).
inline void short_attention_forward_plain(const ShortAttentionProblem& p, int64_t begin,
                                          int64_t end, float* out, float* lse) {
  forward_items<PlainOps>(p, begin, end, out, lse);
}
inline void short_attention_backward_plain(const ShortAttentionProblem& p, int64_t begin,
                                           int64_t end, const float* out, const float* lse,
                                           const float* grad_out, float* dq, float* dk, float* dv) {
  backward_items<PlainOps>(p, begin, end, out, lse, grad_out, dq, dk, dv);
}

}  // namespace
}  // namespace posenc::detail
