// GELU (Hendrycks & Gimpel 2016), the exact form torch::gelu computes by default:
//   gelu(x)  = x Phi(x) = x / 2 (1 + erf(x / sqrt 2))
//   gelu'(x) = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// as one pass over the activations forward and one backward, on 8 or 16 float lanes (the CPU
// level, AVX2 or AVX-512, chosen at run time: posenc/kernels/cpu_capability.h; the scalar level,
// other dtypes and layouts take the reference). erf is taken as
// ATen's AVX2 Vectorized<float>::erf takes it (Abramowitz & Stegun 7.1.26:
// erf(a) = 1 - t (p1 + t (p2 + t (p3 + t (p4 + t p5)))) exp(-a^2), t = 1 / (1 + p a), absolute
// error <= 1.5e-7), with Cephes' expf for the exponential; the backward reuses exp(-x^2 / 2) of
// erf for phi (ATen computes it twice and takes a scalar-precision path per call: its GELU
// backward is ~3x a copy of the same bytes per element, this pass ~1x). Results differ from
// ATen's own vectorized gelu / gelu_backward by the exponential's rounding only (2e-7 |x| + 1e-7)
// and stay within A&S's bound of the float64 GELU (tests/test_gelu.cpp). at::gelu itself takes
// oneDNN's eltwise_gelu_erf for contiguous float32 by default, another approximation per CPU
// (on AVX-512 ~3e-7 |x| off the float64 GELU): the two meet within 1e-6 |x| + 1e-7.
// Special values follow the mathematics: gelu(+inf) = +inf, gelu(-inf) = -0, gelu'(+inf) = 1,
// gelu'(-inf) = 0, NaN -> NaN, where ATen gives NaN at -inf (inf * 0) and in the backward at
// both infinities (and oneDNN's forward on AVX-512 at +inf too).
//
//   x, grad: [...] float32 CPU, contiguous (gelu_fused_supported); any other input -> reference.
#pragma once

#include <ATen/core/Tensor.h>

namespace posenc {

/// Whether the fused CPU pass takes x (CPU, float32, contiguous, at CPU level avx2 or avx512).
bool gelu_fused_supported(const at::Tensor& x);
/// gelu(x), one pass (x as gelu_fused_supported takes it).
at::Tensor gelu_forward_cpu(const at::Tensor& x);
/// grad * gelu'(x), one pass (grad and x of one shape, both as gelu_fused_supported takes them).
at::Tensor gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x);

/// The specification: at::gelu (exact form), autograd-able.
at::Tensor gelu_reference(const at::Tensor& x);
/// gelu(x) with autograd: the fused passes where gelu_fused_supported, else the reference.
at::Tensor gelu_fused(const at::Tensor& x);

}  // namespace posenc
