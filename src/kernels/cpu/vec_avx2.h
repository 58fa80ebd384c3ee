// Internal: 8 float lanes of AVX2 + FMA + F16C, the vector type the fused CPU kernels' loops are
// written over (cpu_kernels.h; vec_avx512.h has the same operations on 16 lanes). Included only
// inside a `#pragma GCC target("avx2,fma,f16c")` region (kernels_avx2.cpp). Every operation is
// one or a few intrinsics with IEEE single-precision results (no approximations), so a loop gives
// the same value per lane at either width; only reductions (hsum, hmax) and the order of a sum
// over lanes depend on the width.
//   mask M: a float vector, all ones in the lanes where it holds
//   first(n): lanes 0..n-1; load_first / store_first: only those lanes (the rest read as 0)
//   fmadd(a, b, c) = a b + c, fnmadd(a, b, c) = c - a b (one rounding)
//   dup_pairs(p) = p0 p0 p1 p1 p2 p2 p3 p3;  swap_pairs(v) = v1 v0 v3 v2 ..;
//   sub_add(a, b) = a0 - b0, a1 + b1, a2 - b2, ..
//   bfloat16 <- float32 rounds to nearest even (a NaN stays a quiet NaN), float16 through F16C,
//   as c10::BFloat16 and c10::Half convert.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace posenc::detail {
namespace {

#ifndef POSENC_VEC_INLINE
#define POSENC_VEC_INLINE static inline __attribute__((always_inline))
#endif

struct VecAvx2 {
  using V = __m256;
  using M = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr const char* kName = "avx2";

  POSENC_VEC_INLINE V zero() { return _mm256_setzero_ps(); }
  POSENC_VEC_INLINE V set1(float a) { return _mm256_set1_ps(a); }
  POSENC_VEC_INLINE V load(const float* p) { return _mm256_loadu_ps(p); }
  POSENC_VEC_INLINE void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  POSENC_VEC_INLINE void stream(float* p, V v) { _mm256_stream_ps(p, v); }
  POSENC_VEC_INLINE M first(int64_t n) {
    const auto k = static_cast<int32_t>(std::clamp<int64_t>(n, 0, kLanes));
    return _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  POSENC_VEC_INLINE V load_first(const float* p, int64_t n) {
    return _mm256_maskload_ps(p, _mm256_castps_si256(first(n)));
  }
  POSENC_VEC_INLINE void store_first(float* p, V v, int64_t n) {
    _mm256_maskstore_ps(p, _mm256_castps_si256(first(n)), v);
  }
  POSENC_VEC_INLINE V add(V a, V b) { return _mm256_add_ps(a, b); }
  POSENC_VEC_INLINE V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  POSENC_VEC_INLINE V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  POSENC_VEC_INLINE V div(V a, V b) { return _mm256_div_ps(a, b); }
  POSENC_VEC_INLINE V min(V a, V b) { return _mm256_min_ps(a, b); }
  POSENC_VEC_INLINE V max(V a, V b) { return _mm256_max_ps(a, b); }
  POSENC_VEC_INLINE V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  POSENC_VEC_INLINE V fnmadd(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  POSENC_VEC_INLINE V floor(V a) { return _mm256_floor_ps(a); }
  POSENC_VEC_INLINE V and_(V a, V b) { return _mm256_and_ps(a, b); }
  POSENC_VEC_INLINE V xor_(V a, V b) { return _mm256_xor_ps(a, b); }
  POSENC_VEC_INLINE V andnot(V a, V b) { return _mm256_andnot_ps(a, b); }  // ~a & b
  POSENC_VEC_INLINE M less(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  POSENC_VEC_INLINE M equal(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  POSENC_VEC_INLINE M is_nan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  POSENC_VEC_INLINE V select(M m, V yes, V no) { return _mm256_blendv_ps(no, yes, m); }
  POSENC_VEC_INLINE V keep(M m, V v) { return _mm256_and_ps(m, v); }  // v where m, else 0
  // yes in the lanes where x's sign bit is set (x < 0, -0, a NaN with the sign bit), else no
  POSENC_VEC_INLINE V select_sign(V x, V yes, V no) { return _mm256_blendv_ps(no, yes, x); }
  // 8-entry tables (GELU's piecewise polynomials, gelu_rows.h): table8(p) holds p[0..7] (16
  // floats at p, p[8..15] zero: vec_avx512.h loads them all); lookup8(table, index) = table[n]
  // per lane, n the low 3 bits of index's bits (vec_avx512.h: the low 4, the same for n < 8)
  POSENC_VEC_INLINE V table8(const float* p) { return _mm256_loadu_ps(p); }
  POSENC_VEC_INLINE V lookup8(V table, V index) {
    return _mm256_permutevar8x32_ps(table, _mm256_castps_si256(index));
  }
  POSENC_VEC_INLINE float hsum(V v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  POSENC_VEC_INLINE float hmax(V v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // 2^n for integral n in [-126, 127] (the exponent bits)
  POSENC_VEC_INLINE V pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  // RoPE's interleaved layout (4 pairs per vector)
  POSENC_VEC_INLINE V dup_pairs(const float* p) {
    const __m128 c4 = _mm_loadu_ps(p);
    return _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
  }
  POSENC_VEC_INLINE V swap_pairs(V v) { return _mm256_permute_ps(v, 0xB1); }
  POSENC_VEC_INLINE V sub_add(V a, V b) { return _mm256_addsub_ps(a, b); }
  // bfloat16 and float16 bits
  POSENC_VEC_INLINE V load_bf16(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  POSENC_VEC_INLINE V load_f16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // v rounded to bfloat16, still as float32 (low 16 bits zero)
  POSENC_VEC_INLINE V round_bf16(V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i bias =
        _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)),
                         _mm256_set1_epi32(0x7FFF));
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(u, bias),
                                             _mm256_set1_epi32(static_cast<int>(0xFFFF0000)));
    return _mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                            _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), is_nan(v));
  }
  POSENC_VEC_INLINE V round_f16(V v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  POSENC_VEC_INLINE void store_bf16(uint16_t* p, V v) {
    const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(round_bf16(v)), 16);
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(p),
        _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1)));
  }
  POSENC_VEC_INLINE void store_f16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

}  // namespace
}  // namespace posenc::detail
