// RoPE on one row over a vector type's lanes (vec_avx2.h: 8, vec_avx512.h: 16); the callers and
// the contract are rope_cpu.cpp and include/posenc/kernels/rope_fused.h. s already carries the
// direction's sign; y may alias x (every vector is loaded before it is stored). Products and sums
// round separately (no fused multiply-add; the level TUs are compiled with -ffp-contract=off), as
// eager PyTorch's float32 ops do, so a float32 result equals `x * cos + rotate_half(x) * sin` to
// the bit at every level:
//   half:        a = x[i..), b = x[i+F..); y_a = a c - b s, y_b = b c + a s
//   interleaved: v = a0 b0 a1 b1 ..; y = v * (c0 c0 c1 c1 ..) -/+ swap(v) * (s0 s0 s1 s1 ..)
// stream: non-temporal stores (out of place, rows aligned to 4 vectors, F a multiple of the
// lanes: stream_ok): the output bypasses the cache and is not read first, so the pass moves the
// bytes copy_ moves. bfloat16 / float16 rows (half layout) are rotated in float32 and rounded
// once, or (round_each) every product is rounded to the storage type before the sum, as eager's
// three ops round; conversions as c10::BFloat16 / c10::Half (round to nearest even).
// Included only inside a vector type's target region.
#pragma once

#include <cstdint>
#include <cstring>

namespace posenc::detail {
namespace {

template <class Vec>
struct RopeRows {
  using V = typename Vec::V;
  static constexpr int64_t kLanes = Vec::kLanes;

  template <bool kStream>
  static inline __attribute__((always_inline)) void put(float* p, V v) {
    if constexpr (kStream) {
      Vec::stream(p, v);
    } else {
      Vec::store(p, v);
    }
  }

  static bool stream_ok(const float* x, const float* y, int64_t f) {
    return x != y && reinterpret_cast<uintptr_t>(y) % (4 * kLanes) == 0 && f % kLanes == 0;
  }

  template <bool kStream>
  static void f32(const float* x, float* y, const float* c, const float* s, int64_t f,
                  bool interleaved) {
    int64_t i = 0;
    if (!interleaved) {
      // two vectors at a time: at 8 lanes each 64-byte output line is written by two consecutive
      // stores, so streaming stores leave the write-combining buffers as full lines
      for (; i + 2 * kLanes <= f; i += 2 * kLanes) {
        const V a0 = Vec::load(x + i), a1 = Vec::load(x + i + kLanes);
        const V b0 = Vec::load(x + i + f), b1 = Vec::load(x + i + f + kLanes);
        const V c0 = Vec::load(c + i), c1 = Vec::load(c + i + kLanes);
        const V s0 = Vec::load(s + i), s1 = Vec::load(s + i + kLanes);
        put<kStream>(y + i, Vec::sub(Vec::mul(a0, c0), Vec::mul(b0, s0)));
        put<kStream>(y + i + kLanes, Vec::sub(Vec::mul(a1, c1), Vec::mul(b1, s1)));
        put<kStream>(y + i + f, Vec::add(Vec::mul(b0, c0), Vec::mul(a0, s0)));
        put<kStream>(y + i + f + kLanes, Vec::add(Vec::mul(b1, c1), Vec::mul(a1, s1)));
      }
      for (; i + kLanes <= f; i += kLanes) {
        const V a = Vec::load(x + i), b = Vec::load(x + i + f);
        const V cv = Vec::load(c + i), sv = Vec::load(s + i);
        const V ya = Vec::sub(Vec::mul(a, cv), Vec::mul(b, sv));
        const V yb = Vec::add(Vec::mul(b, cv), Vec::mul(a, sv));
        put<kStream>(y + i, ya);
        put<kStream>(y + i + f, yb);
      }
      if (i < f) {  // the last F % lanes pairs (never when streaming: F is a multiple)
        const int64_t n = f - i;
        const V a = Vec::load_first(x + i, n), b = Vec::load_first(x + i + f, n);
        const V cv = Vec::load_first(c + i, n), sv = Vec::load_first(s + i, n);
        const V ya = Vec::sub(Vec::mul(a, cv), Vec::mul(b, sv));
        const V yb = Vec::add(Vec::mul(b, cv), Vec::mul(a, sv));
        Vec::store_first(y + i, ya, n);
        Vec::store_first(y + i + f, yb, n);
      }
      return;
    }
    constexpr int64_t kPairs = kLanes / 2;
    for (; i + kPairs <= f; i += kPairs) {
      const V v = Vec::load(x + 2 * i);
      const V cd = Vec::dup_pairs(c + i), sd = Vec::dup_pairs(s + i);
      put<kStream>(y + 2 * i, Vec::sub_add(Vec::mul(v, cd), Vec::mul(Vec::swap_pairs(v), sd)));
    }
    for (; i < f; ++i) {  // the last pairs, one at a time (the same roundings)
      const float a = x[2 * i], b = x[2 * i + 1];
      y[2 * i] = a * c[i] - b * s[i];
      y[2 * i + 1] = b * c[i] + a * s[i];
    }
  }

  // bfloat16 (kBf16) or float16 rows, half layout
  template <bool kBf16>
  static inline __attribute__((always_inline)) V load_bits(const uint16_t* p) {
    if constexpr (kBf16) {
      return Vec::load_bf16(p);
    } else {
      return Vec::load_f16(p);
    }
  }
  template <bool kBf16>
  static inline __attribute__((always_inline)) V round_bits(V v) {
    if constexpr (kBf16) {
      return Vec::round_bf16(v);
    } else {
      return Vec::round_f16(v);
    }
  }
  template <bool kBf16>
  static inline __attribute__((always_inline)) void store_bits(uint16_t* p, V v) {
    if constexpr (kBf16) {
      Vec::store_bf16(p, v);
    } else {
      Vec::store_f16(p, v);
    }
  }
  // pairs [i, i + lanes) of a row: xa = x + i, xb = x + i + F (and y likewise)
  template <bool kBf16>
  static inline __attribute__((always_inline)) void reduced_block(const uint16_t* xa,
                                                                  const uint16_t* xb, uint16_t* ya,
                                                                  uint16_t* yb, const float* c,
                                                                  const float* s, bool round_each) {
    const V a = load_bits<kBf16>(xa), b = load_bits<kBf16>(xb);
    const V cv = Vec::load(c), sv = Vec::load(s);
    V ac = Vec::mul(a, cv), bs = Vec::mul(b, sv);
    V bc = Vec::mul(b, cv), as = Vec::mul(a, sv);
    if (round_each) {
      ac = round_bits<kBf16>(ac);
      bs = round_bits<kBf16>(bs);
      bc = round_bits<kBf16>(bc);
      as = round_bits<kBf16>(as);
    }
    store_bits<kBf16>(ya, Vec::sub(ac, bs));
    store_bits<kBf16>(yb, Vec::add(bc, as));
  }
  template <bool kBf16>
  static void reduced(const uint16_t* x, uint16_t* y, const float* c, const float* s, int64_t f,
                      bool round_each) {
    int64_t i = 0;
    for (; i + kLanes <= f; i += kLanes)
      reduced_block<kBf16>(x + i, x + i + f, y + i, y + i + f, c + i, s + i, round_each);
    if (i < f) {  // the last pairs through zero-padded copies (the same operations per lane)
      const auto n = static_cast<size_t>(f - i);
      uint16_t xa[kLanes] = {}, xb[kLanes] = {}, ya[kLanes], yb[kLanes];
      float cv[kLanes] = {}, sv[kLanes] = {};
      std::memcpy(xa, x + i, n * sizeof(uint16_t));
      std::memcpy(xb, x + i + f, n * sizeof(uint16_t));
      std::memcpy(cv, c + i, n * sizeof(float));
      std::memcpy(sv, s + i, n * sizeof(float));
      reduced_block<kBf16>(xa, xb, ya, yb, cv, sv, round_each);
      std::memcpy(y + i, ya, n * sizeof(uint16_t));
      std::memcpy(y + i + f, yb, n * sizeof(uint16_t));
    }
  }

  // the table's entries (cpu_kernels.h)
  static void f32_entry(const float* x, float* y, const float* c, const float* s, int64_t f,
                        bool interleaved, bool stream) {
    if (stream)
      f32<true>(x, y, c, s, f, interleaved);
    else
      f32<false>(x, y, c, s, f, interleaved);
  }
  static void bf16_entry(const uint16_t* x, uint16_t* y, const float* c, const float* s, int64_t f,
                         bool round_each) {
    reduced<true>(x, y, c, s, f, round_each);
  }
  static void f16_entry(const uint16_t* x, uint16_t* y, const float* c, const float* s, int64_t f,
                        bool round_each) {
    reduced<false>(x, y, c, s, f, round_each);
  }
};

}  // namespace
}  // namespace posenc::detail
