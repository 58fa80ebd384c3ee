// Internal: 16 float lanes of AVX-512 F + BW + VL + DQ, the operations of vec_avx2.h (see there
// for each one's meaning) on the wider unit, with masks as __mmask16. Included only inside a
// `#pragma GCC target` region with those units (kernels_avx512.cpp). Element-wise results equal
// vec_avx2.h's lane for lane (the same IEEE operations); hsum and hmax reduce 16 lanes.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace posenc::detail {
namespace {

#ifndef POSENC_VEC_INLINE
#define POSENC_VEC_INLINE static inline __attribute__((always_inline))
#endif

struct VecAvx512 {
  using V = __m512;
  using M = __mmask16;
  static constexpr int64_t kLanes = 16;
  static constexpr const char* kName = "avx512";

  POSENC_VEC_INLINE V zero() { return _mm512_setzero_ps(); }
  POSENC_VEC_INLINE V set1(float a) { return _mm512_set1_ps(a); }
  POSENC_VEC_INLINE V load(const float* p) { return _mm512_loadu_ps(p); }
  POSENC_VEC_INLINE void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  POSENC_VEC_INLINE void stream(float* p, V v) { _mm512_stream_ps(p, v); }
  POSENC_VEC_INLINE M first(int64_t n) {
    const auto k = static_cast<uint32_t>(std::clamp<int64_t>(n, 0, kLanes));
    return static_cast<M>((1u << k) - 1u);
  }
  POSENC_VEC_INLINE V load_first(const float* p, int64_t n) {
    return _mm512_maskz_loadu_ps(first(n), p);
  }
  POSENC_VEC_INLINE void store_first(float* p, V v, int64_t n) {
    _mm512_mask_storeu_ps(p, first(n), v);
  }
  POSENC_VEC_INLINE V add(V a, V b) { return _mm512_add_ps(a, b); }
  POSENC_VEC_INLINE V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  POSENC_VEC_INLINE V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  POSENC_VEC_INLINE V div(V a, V b) { return _mm512_div_ps(a, b); }
  POSENC_VEC_INLINE V min(V a, V b) { return _mm512_min_ps(a, b); }
  POSENC_VEC_INLINE V max(V a, V b) { return _mm512_max_ps(a, b); }
  POSENC_VEC_INLINE V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  POSENC_VEC_INLINE V fnmadd(V a, V b, V c) { return _mm512_fnmadd_ps(a, b, c); }
  POSENC_VEC_INLINE V floor(V a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  }
  POSENC_VEC_INLINE V and_(V a, V b) { return _mm512_and_ps(a, b); }
  POSENC_VEC_INLINE V xor_(V a, V b) { return _mm512_xor_ps(a, b); }
  POSENC_VEC_INLINE V andnot(V a, V b) { return _mm512_andnot_ps(a, b); }  // ~a & b
  POSENC_VEC_INLINE M less(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  POSENC_VEC_INLINE M equal(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  POSENC_VEC_INLINE M is_nan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  POSENC_VEC_INLINE V select(M m, V yes, V no) { return _mm512_mask_blend_ps(m, no, yes); }
  POSENC_VEC_INLINE V keep(M m, V v) { return _mm512_maskz_mov_ps(m, v); }
  POSENC_VEC_INLINE V select_sign(V x, V yes, V no) {
    return _mm512_mask_blend_ps(_mm512_movepi32_mask(_mm512_castps_si512(x)), no, yes);
  }
  POSENC_VEC_INLINE V table8(const float* p) { return _mm512_loadu_ps(p); }  // p[0..15]
  POSENC_VEC_INLINE V lookup8(V table, V index) {
    return _mm512_permutexvar_ps(_mm512_castps_si512(index), table);
  }
  // halves added as vec_avx2.h's hsum adds its 8 lanes: (lo + hi) then the AVX2 tree
  POSENC_VEC_INLINE float hsum(V v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  POSENC_VEC_INLINE float hmax(V v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  POSENC_VEC_INLINE V pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // RoPE's interleaved layout (8 pairs per vector)
  POSENC_VEC_INLINE V dup_pairs(const float* p) {
    const __m512i index = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    return _mm512_permutexvar_ps(index, _mm512_castps256_ps512(_mm256_loadu_ps(p)));
  }
  POSENC_VEC_INLINE V swap_pairs(V v) { return _mm512_permute_ps(v, 0xB1); }
  POSENC_VEC_INLINE V sub_add(V a, V b) {
    return _mm512_mask_add_ps(_mm512_sub_ps(a, b), 0xAAAA, a, b);  // odd lanes: a + b
  }
  // bfloat16 and float16 bits
  POSENC_VEC_INLINE V load_bf16(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  POSENC_VEC_INLINE V load_f16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  POSENC_VEC_INLINE V round_bf16(V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i bias =
        _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1)),
                         _mm512_set1_epi32(0x7FFF));
    const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(u, bias),
                                             _mm512_set1_epi32(static_cast<int>(0xFFFF0000)));
    return _mm512_mask_blend_ps(is_nan(v), _mm512_castsi512_ps(rounded),
                                _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000)));
  }
  POSENC_VEC_INLINE V round_f16(V v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  POSENC_VEC_INLINE void store_bf16(uint16_t* p, V v) {
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_bf16(v)), 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bits));
  }
  POSENC_VEC_INLINE void store_f16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
};

}  // namespace
}  // namespace posenc::detail
