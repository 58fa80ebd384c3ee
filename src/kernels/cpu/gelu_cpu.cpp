// GELU's forward and backward passes on 8 float lanes; the math, its source and its error are
// in posenc/kernels/gelu.h. Per lane, z = x / sqrt 2 (x * M_SQRT1_2, as ATen):
//   t = 1 / (1 + p |z|),  e = exp(-z^2),  erf(z) = sign(z) (1 - t P(t) e)
//   forward   y  = (x / 2) (1 + erf(z))
//   backward  dx = dy ((1 + erf(z)) / 2 + x e / sqrt(2 pi))      (e = exp(-x^2 / 2) = phi sqrt(2
//   pi))
// Chunks of kGeluGrain elements per thread: a tensor below that runs on the calling thread
// without waking the pool (the main job's MLP activations, 2048 x 192, are two chunks).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "parallel.h"
#include "posenc/kernels/gelu.h"
#include "softmax_rows.h"

namespace posenc {

namespace {

/// Elements per parallel chunk (a chunk below this stays on the calling thread).
constexpr int64_t kGeluGrain = 1 << 16;

struct Erf8 {
  __m256 erf;  // erf(z)
  __m256 e;    // exp(-z^2)
};

inline __attribute__((target("avx2,fma"))) Erf8 erf8(__m256 z) {
  const __m256 neg_zero = _mm256_set1_ps(-0.0f);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_and_ps(neg_zero, z);
  const __m256 a = _mm256_xor_ps(sign, z);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), a, one));
  __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(1.061405429f), t, _mm256_set1_ps(-1.453152027f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(1.421413741f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(-0.284496736f));
  r = _mm256_fmadd_ps(r, t, _mm256_set1_ps(0.254829592f));
  const __m256 e = detail::Avx2SoftmaxRows::exp8(_mm256_xor_ps(neg_zero, _mm256_mul_ps(z, z)));
  // 1 - r t e, then the sign of z
  const __m256 erf_abs = _mm256_fmadd_ps(_mm256_xor_ps(neg_zero, _mm256_mul_ps(r, t)), e, one);
  return {_mm256_xor_ps(sign, erf_abs), e};
}

const float kSqrtHalf = static_cast<float>(M_SQRT1_2);
const float kInvSqrtTwoPi = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);

// Lanes where x is -inf / +-inf: there the products below are inf * 0, and the limits hold.
inline __attribute__((target("avx2,fma"))) __m256 is_negative_infinity(__m256 x) {
  return _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ);
}
inline __attribute__((target("avx2,fma"))) __m256 is_infinity(__m256 x) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_cmp_ps(a, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ);
}

// gelu(-inf) = lim x Phi(x) = -0 (as gelu(-3e38) = -0), not -inf * 0; gelu(+inf) = +inf.
inline __attribute__((target("avx2,fma"))) __m256 gelu8(__m256 x) {
  const Erf8 f = erf8(_mm256_mul_ps(x, _mm256_set1_ps(kSqrtHalf)));
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)),
                                 _mm256_add_ps(_mm256_set1_ps(1.0f), f.erf));
  return _mm256_blendv_ps(y, _mm256_set1_ps(-0.0f), is_negative_infinity(x));
}

// gelu'(+-inf) = Phi(+-inf) = 1 / 0 (x phi(x) -> 0), not Phi + inf * 0.
inline __attribute__((target("avx2,fma"))) __m256 gelu_backward8(__m256 dy, __m256 x) {
  const Erf8 f = erf8(_mm256_mul_ps(x, _mm256_set1_ps(kSqrtHalf)));
  const __m256 cdf =
      _mm256_mul_ps(_mm256_set1_ps(0.5f), _mm256_add_ps(_mm256_set1_ps(1.0f), f.erf));
  const __m256 pdf = _mm256_mul_ps(_mm256_set1_ps(kInvSqrtTwoPi), f.e);
  const __m256 slope = _mm256_blendv_ps(_mm256_fmadd_ps(x, pdf, cdf), cdf, is_infinity(x));
  return _mm256_mul_ps(dy, slope);
}

// y[i] = gelu(x[i]) for i in [0, n); the last 1..7 through a zero-padded lane block.
__attribute__((target("avx2,fma"))) void gelu_span(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float in[8] = {}, out[8];
    std::memcpy(in, x + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm256_store_ps(out, gelu8(_mm256_load_ps(in)));
    std::memcpy(y + i, out, sizeof(float) * static_cast<size_t>(n - i));
  }
}

__attribute__((target("avx2,fma"))) void gelu_backward_span(const float* dy, const float* x,
                                                            float* dx, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dx + i, gelu_backward8(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float g[8] = {}, in[8] = {}, out[8];
    std::memcpy(g, dy + i, sizeof(float) * static_cast<size_t>(n - i));
    std::memcpy(in, x + i, sizeof(float) * static_cast<size_t>(n - i));
    _mm256_store_ps(out, gelu_backward8(_mm256_load_ps(g), _mm256_load_ps(in)));
    std::memcpy(dx + i, out, sizeof(float) * static_cast<size_t>(n - i));
  }
}

void check_input(const char* what, const at::Tensor& x) {
  TORCH_CHECK(gelu_fused_supported(x), "gelu_fused: ", what,
              " must be a contiguous float32 CPU tensor on a CPU with AVX2+FMA, got ",
              x.scalar_type(), " on ", x.device(), x.is_contiguous() ? "" : " (not contiguous)");
}

}  // namespace

bool gelu_fused_supported(const at::Tensor& x) {
  return x.defined() && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
         x.layout() == at::kStrided && x.is_contiguous() && detail::cpu_has_avx2_fma();
}

at::Tensor gelu_forward_cpu(const at::Tensor& x) {
  check_input("x", x);
  auto y = at::empty_like(x);
  const float* in = x.const_data_ptr<float>();
  float* out = y.mutable_data_ptr<float>();
  detail::parallel_for(0, x.numel(), kGeluGrain,
                       [&](int64_t b, int64_t e) { gelu_span(in + b, out + b, e - b); });
  return y;
}

at::Tensor gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  check_input("x", x);
  check_input("grad", grad);
  TORCH_CHECK(grad.sizes() == x.sizes(), "gelu_fused: grad ", grad.sizes(), " and x ", x.sizes(),
              " differ in shape");
  auto dx = at::empty_like(x);
  const float* g = grad.const_data_ptr<float>();
  const float* in = x.const_data_ptr<float>();
  float* out = dx.mutable_data_ptr<float>();
  detail::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t b, int64_t e) {
    gelu_backward_span(g + b, in + b, out + b, e - b);
  });
  return dx;
}

at::Tensor gelu_reference(const at::Tensor& x) { return at::gelu(x); }

}  // namespace posenc
