// Fused RoPE on the CPU: one parallel pass over tokens; per token the F (cos, sin) values are
// read once and applied to every head of every input (q and k). float32 rows use AVX2+FMA
// intrinsics when the CPU has them (checked at run time), other dtypes and CPUs a scalar loop
// the compiler vectorizes (-O3). Specification: rope_apply (src/functional/rope.cpp); contract in
// include/posenc/kernels/rope.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "posenc/kernels/rope.h"

namespace posenc {

namespace {

// Scalar rotation of one row; s already carries the direction's sign. y may alias x (each pair
// is read before it is written). kRoundEach: every product is rounded to T before the sum, as
// eager PyTorch's `x * cos + rotate_half(x) * sin` rounds (three ops, each rounding to x's dtype);
// otherwise reduced types are rotated in float32 and rounded once. float32 and float64 rows give
// the same bits either way (this file is compiled with -ffp-contract=off: no fused multiply-add).
template <typename T, typename Acc, bool kRoundEach>
void rotate_row_scalar(const T* x, T* y, const float* c, const float* s, int64_t begin, int64_t f,
                       bool interleaved) {
  const int64_t step = interleaved ? 1 : f;
  for (int64_t i = begin; i < f; ++i) {
    const int64_t ia = interleaved ? 2 * i : i;
    const int64_t ib = ia + step;
    const Acc a = static_cast<Acc>(x[ia]), b = static_cast<Acc>(x[ib]);
    if constexpr (kRoundEach) {
      const auto r = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
      y[ia] = static_cast<T>(r(a * c[i]) - r(b * s[i]));
      y[ib] = static_cast<T>(r(b * c[i]) + r(a * s[i]));
    } else {
      y[ia] = static_cast<T>(a * c[i] - b * s[i]);
      y[ib] = static_cast<T>(b * c[i] + a * s[i]);
    }
  }
}

#if defined(__x86_64__)
// AVX2, 8 floats at a time (y may alias x: every vector is loaded before it is stored). Products
// and sums round separately (no fused multiply-add), as eager PyTorch's float32 ops do, so the
// result equals `x * cos + rotate_half(x) * sin` to the bit.
//   half:        a = x[i..i+8), b = x[i+F..); y_a = a c - b s, y_b = b c + a s
//   interleaved: v = a0 b0 a1 b1 ..; y = v * (c0 c0 c1 c1 ..) -/+ swap(v) * (s0 s0 s1 s1 ..)
// stream: non-temporal stores (out of place, 32-byte aligned rows): the output bypasses the cache
// and is not read first, so the pass moves the bytes copy_ moves.
template <bool kStream>
__attribute__((target("avx2,fma"))) inline void store8(float* p, __m256 v) {
  if constexpr (kStream) {
    _mm256_stream_ps(p, v);
  } else {
    _mm256_storeu_ps(p, v);
  }
}

template <bool kStream>
__attribute__((target("avx2,fma"))) void rotate_row_f32_avx2(const float* x, float* y,
                                                             const float* c, const float* s,
                                                             int64_t f, bool interleaved) {
  int64_t i = 0;
  if (!interleaved) {
    // 16 at a time: each 64-byte output line is written by two consecutive stores, so streaming
    // stores leave the write-combining buffers as full lines.
    for (; i + 16 <= f; i += 16) {
      const __m256 a0 = _mm256_loadu_ps(x + i), a1 = _mm256_loadu_ps(x + i + 8);
      const __m256 b0 = _mm256_loadu_ps(x + i + f), b1 = _mm256_loadu_ps(x + i + f + 8);
      const __m256 c0 = _mm256_loadu_ps(c + i), c1 = _mm256_loadu_ps(c + i + 8);
      const __m256 s0 = _mm256_loadu_ps(s + i), s1 = _mm256_loadu_ps(s + i + 8);
      store8<kStream>(y + i, _mm256_sub_ps(_mm256_mul_ps(a0, c0), _mm256_mul_ps(b0, s0)));
      store8<kStream>(y + i + 8, _mm256_sub_ps(_mm256_mul_ps(a1, c1), _mm256_mul_ps(b1, s1)));
      store8<kStream>(y + i + f, _mm256_add_ps(_mm256_mul_ps(b0, c0), _mm256_mul_ps(a0, s0)));
      store8<kStream>(y + i + f + 8, _mm256_add_ps(_mm256_mul_ps(b1, c1), _mm256_mul_ps(a1, s1)));
    }
    for (; i + 8 <= f; i += 8) {
      const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + f);
      const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
      const __m256 ya = _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv));
      const __m256 yb = _mm256_add_ps(_mm256_mul_ps(b, cv), _mm256_mul_ps(a, sv));
      store8<kStream>(y + i, ya);
      store8<kStream>(y + i + f, yb);
    }
  } else {
    for (; i + 4 <= f; i += 4) {
      const __m256 v = _mm256_loadu_ps(x + 2 * i);
      const __m128 c4 = _mm_loadu_ps(c + i), s4 = _mm_loadu_ps(s + i);
      const __m256 cd = _mm256_set_m128(_mm_unpackhi_ps(c4, c4), _mm_unpacklo_ps(c4, c4));
      const __m256 sd = _mm256_set_m128(_mm_unpackhi_ps(s4, s4), _mm_unpacklo_ps(s4, s4));
      const __m256 swapped = _mm256_permute_ps(v, 0xB1);  // b0 a0 b1 a1 ...
      store8<kStream>(y + 2 * i,
                      _mm256_addsub_ps(_mm256_mul_ps(v, cd), _mm256_mul_ps(swapped, sd)));
    }
  }
  rotate_row_scalar<float, float, false>(x, y, c, s, i, f, interleaved);
}
// __builtin_cpu_init must run first when this is evaluated during static initialization.
const bool kHasAvx2 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}();
const bool kHasF16c = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
}();

// bfloat16 and float16 rows (half layout), 8 at a time in float32. Conversions as ATen's:
// bfloat16 <- float32 rounds to nearest even (a NaN stays a NaN), float16 through F16C.
// round_each: every product is rounded to the storage type before the sum (eager's three ops).
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// v rounded to bfloat16, still as float32 (low 16 bits zero)
__attribute__((target("avx2,fma,f16c"))) inline __m256 round8(__m256 v, const c10::BFloat16*) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bias = _mm256_add_epi32(
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(u, bias), _mm256_set1_epi32(static_cast<int>(0xFFFF0000)));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_ps(_mm256_castsi256_ps(rounded),
                          _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), nan);
}
__attribute__((target("avx2,fma,f16c"))) inline __m256 round8(__m256 v, const c10::Half*) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
__attribute__((target("avx2,fma,f16c"))) inline void store8(c10::BFloat16* p, __m256 v) {
  const __m256i bits = _mm256_srli_epi32(_mm256_castps_si256(round8(v, p)), 16);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
__attribute__((target("avx2,fma,f16c"))) inline void store8(c10::Half* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <typename T>
__attribute__((target("avx2,fma,f16c"))) void rotate_row_reduced_avx2(const T* x, T* y,
                                                                      const float* c,
                                                                      const float* s, int64_t f,
                                                                      bool round_each_op) {
  int64_t i = 0;
  for (; i + 8 <= f; i += 8) {
    const __m256 a = load8(x + i), b = load8(x + i + f);
    const __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
    __m256 ac = _mm256_mul_ps(a, cv), bs = _mm256_mul_ps(b, sv);
    __m256 bc = _mm256_mul_ps(b, cv), as = _mm256_mul_ps(a, sv);
    if (round_each_op) {
      ac = round8(ac, x);
      bs = round8(bs, x);
      bc = round8(bc, x);
      as = round8(as, x);
    }
    store8(y + i, _mm256_sub_ps(ac, bs));
    store8(y + i + f, _mm256_add_ps(bc, as));
  }
  if (round_each_op) {
    rotate_row_scalar<T, float, true>(x, y, c, s, i, f, /*interleaved=*/false);
  } else {
    rotate_row_scalar<T, float, false>(x, y, c, s, i, f, /*interleaved=*/false);
  }
}
#else
const bool kHasAvx2 = false;
const bool kHasF16c = false;
#endif

template <typename T>
void rotate_any_row(const T* x, T* y, const float* c, const float* s, int64_t f, bool interleaved,
                    bool round_each_op) {
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, float>) {
    if (kHasAvx2) {
      // streaming needs every 8-float store 32-byte aligned and no tail
      const bool aligned = reinterpret_cast<uintptr_t>(y) % 32 == 0 && f % 8 == 0;
      if (x != y && aligned) {
        rotate_row_f32_avx2<true>(x, y, c, s, f, interleaved);
      } else {
        rotate_row_f32_avx2<false>(x, y, c, s, f, interleaved);
      }
      return;
    }
  }
#endif
#if defined(__x86_64__)
  if constexpr (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>) {
    if (kHasAvx2 && kHasF16c && !interleaved) {
      rotate_row_reduced_avx2<T>(x, y, c, s, f, round_each_op);
      return;
    }
  }
#endif
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (round_each_op) {
    rotate_row_scalar<T, Acc, true>(x, y, c, s, 0, f, interleaved);
  } else {
    rotate_row_scalar<T, Acc, false>(x, y, c, s, 0, f, interleaved);
  }
}

void check_input(const at::Tensor& x, const at::Tensor& reference, const at::Tensor& cos,
                 const char* what) {
  TORCH_CHECK(x.dim() == 4, "rope_fused: ", what, " must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), "rope_fused: ", what, " must be on the CPU, got ", x.device());
  TORCH_CHECK(x.size(0) == reference.size(0) && x.size(1) == reference.size(1),
              "rope_fused: ", what, " has [B, N] = [", x.size(0), ", ", x.size(1),
              "] but the first input has [", reference.size(0), ", ", reference.size(1), "]");
  TORCH_CHECK(2 * cos.size(-1) <= x.size(3), "rope_fused: rotary width 2F=", 2 * cos.size(-1),
              " exceeds head_dim=", x.size(3), " of ", what);
}

}  // namespace

void rope_rotate_cpu(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos_in, const at::Tensor& sin_in, RopeLayout layout,
                     bool inverse, bool round_each_op) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(),
              "rope_fused: need as many outputs as inputs, got ", inputs.size(), " and ",
              outputs.size());
  const auto& first = inputs[0];
  TORCH_CHECK(cos_in.sizes() == sin_in.sizes(),
              "rope_fused: cos and sin shapes differ: ", cos_in.sizes(), " vs ", sin_in.sizes());
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.dim() == 3,
              "rope_fused: cos/sin must be [N, F] or [B, N, F], got ", cos_in.sizes());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(inputs[i], first, cos_in, i == 0 ? "q" : "k");
    TORCH_CHECK(outputs[i].sizes() == inputs[i].sizes() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "rope_fused: output ", i, " must match its input's shape and dtype");
    TORCH_CHECK(inputs[i].scalar_type() == first.scalar_type(), "rope_fused: q is ",
                first.scalar_type(), " but k is ", inputs[i].scalar_type());
    TORCH_CHECK(inputs[i].stride(3) == 1 && outputs[i].stride(3) == 1,
                "rope_fused: the last dim must be contiguous");
  }
  const int64_t batch = first.size(0), tokens = first.size(1);
  TORCH_CHECK(cos_in.size(-2) == tokens, "rope_fused: cos/sin have ", cos_in.size(-2),
              " positions but the inputs have N=", tokens);
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.size(0) == batch, "rope_fused: cos/sin batch ",
              cos_in.size(0), " does not match B=", batch);
  auto cos = cos_in.to(at::kFloat).contiguous();
  auto sin =
      inverse ? sin_in.to(at::kFloat).contiguous().neg() : sin_in.to(at::kFloat).contiguous();
  const int64_t f = cos.size(-1);
  const bool batched_table = cos.dim() == 3;
  const bool interleaved = layout == RopeLayout::kInterleaved;
  const float* cos_data = cos.data_ptr<float>();
  const float* sin_data = sin.data_ptr<float>();
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, first.size(2) * first.size(3)));
  // Head-major storage ([B, H, N, Dh] contiguous, viewed as [B, N, H, Dh]): walk each head's
  // tokens in memory order instead (one stream per thread, not H strided ones).
  const bool head_major = first.size(2) > 1 && first.stride(2) > first.stride(1);
  if (head_major) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, first.scalar_type(), "rope_fused", [&] {
          for (size_t t = 0; t < inputs.size(); ++t) {
            const auto& x = inputs[t];
            const auto& y = outputs[t];
            const int64_t heads = x.size(2), dh = x.size(3);
            const int64_t rows_grain = std::max<int64_t>(1, grain / std::max<int64_t>(1, heads));
            detail::parallel_for(0, batch * heads, rows_grain, [&](int64_t begin, int64_t end) {
              for (int64_t bh = begin; bh < end; ++bh) {
                const int64_t b = bh / heads, h = bh % heads;
                const scalar_t* xb =
                    x.const_data_ptr<scalar_t>() + b * x.stride(0) + h * x.stride(2);
                scalar_t* yb = y.data_ptr<scalar_t>() + b * y.stride(0) + h * y.stride(2);
                for (int64_t n = 0; n < tokens; ++n) {
                  const int64_t row = (batched_table ? b * tokens + n : n) * f;
                  const scalar_t* xr = xb + n * x.stride(1);
                  scalar_t* yr = yb + n * y.stride(1);
                  rotate_any_row<scalar_t>(xr, yr, cos_data + row, sin_data + row, f, interleaved,
                                           round_each_op);
                  if (xr != yr)
                    for (int64_t d = 2 * f; d < dh; ++d) yr[d] = xr[d];
                }
              }
#if defined(__x86_64__)
              _mm_sfence();
#endif
            });
          }
        });
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, first.scalar_type(), "rope_fused", [&] {
    detail::parallel_for(0, batch * tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        const int64_t b = token / tokens, n = token % tokens;
        const int64_t row = (batched_table ? token : n) * f;
        const float* c = cos_data + row;
        const float* s = sin_data + row;
        for (size_t t = 0; t < inputs.size(); ++t) {
          const auto& x = inputs[t];
          const auto& y = outputs[t];
          const scalar_t* xb = x.const_data_ptr<scalar_t>() + b * x.stride(0) + n * x.stride(1);
          scalar_t* yb = y.data_ptr<scalar_t>() + b * y.stride(0) + n * y.stride(1);
          const int64_t heads = x.size(2), dh = x.size(3);
          const bool alias = xb == yb;
          for (int64_t h = 0; h < heads; ++h) {
            const scalar_t* xr = xb + h * x.stride(2);
            scalar_t* yr = yb + h * y.stride(2);
            rotate_any_row<scalar_t>(xr, yr, c, s, f, interleaved, round_each_op);
            if (!alias)
              for (int64_t d = 2 * f; d < dh; ++d) yr[d] = xr[d];
          }
        }
      }
#if defined(__x86_64__)
      _mm_sfence();  // order the streaming stores before the pass is seen as done
#endif
    });
  });
}

}  // namespace posenc
