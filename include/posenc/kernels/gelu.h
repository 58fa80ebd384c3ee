// GELU (Hendrycks & Gimpel 2016), the exact form torch::gelu computes by default:
//   gelu(x)  = x Phi(x) = x / 2 (1 + erf(x / sqrt 2))
//   gelu'(x) = Phi(x) + x phi(x),   phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
// as one pass over the activations forward and one backward, at the CPU level chosen at run time
// (posenc/kernels/cpu_capability.h: 8 float lanes at AVX2, 16 at AVX-512, one value at a time at
// the scalar level; other dtypes and layouts take the reference), the same bits at every level.
// No erf and no exponential: with a = |x|, gelu(x) = relu(x) - a Q(a) and gelu'(x) = S(a) for
// x < 0, 1 - S(a) otherwise, where Q(a) = Phi(-a) and S(a) = Phi(-a) - a phi(a) = gelu'(-a) are
// the normal distribution's tails (gelu(x) - gelu(-x) = x), each a piecewise polynomial over 8
// intervals of a (degree 6 for Q, 7 for S, Horner with fused multiply-adds; Q taken as zero past
// a = 5.4 where it is below 3.4e-8, S past 6.0, below 3.6e-8), fitted against float64 erfc / exp
// by tools/gen_gelu_polynomials.py (weighted minimax, coefficients in src/kernels/cpu/
// gelu_tables.h). Error of the float32 evaluation: |Q - Phi(-a)| <= 5.2e-8 and |S - gelu'(-a)|
// <= 5.4e-8 (absolute; relative 6e-4 where they are below 1e-3, so the tail keeps its sign), then
// one rounding: |y - gelu(x)| <= 5.2e-8 |x| + half an ulp of y, and the slope within 5.4e-8 plus
// its roundings (tests/test_gelu.cpp holds both to the float64 GELU). ATen's own vectorized gelu
// (Abramowitz & Stegun 7.1.26 erf, |error| <= 1.5e-7, with a division and Sleef's expf) and
// at::gelu as a user gets it (oneDNN's eltwise_gelu_erf for contiguous float32, another
// approximation per CPU: on AVX-512 ~3e-7 |x| off the float64 GELU) are each within their own,
// wider bounds of the same float64 GELU; tests/test_gelu.cpp compares both live.
// Special values follow the mathematics: gelu(+inf) = +inf, gelu(-inf) = -0, gelu'(+inf) = 1,
// gelu'(-inf) = 0, NaN -> NaN, where ATen gives NaN at -inf (inf * 0) and in the backward at
// both infinities (and oneDNN's forward on AVX-512 at +inf too).
//
//   x, grad: [...] float32 CPU, contiguous (gelu_fused_supported); any other input -> reference.
#pragma once

#include <ATen/core/Tensor.h>

namespace posenc {

/// Whether the fused CPU pass takes x (CPU, float32, contiguous).
bool gelu_fused_supported(const at::Tensor& x);
/// gelu(x), one pass (x as gelu_fused_supported takes it).
at::Tensor gelu_forward_cpu(const at::Tensor& x);
/// gelu(x) into y (x's shape, as gelu_fused_supported takes it; y may be x, no partial overlap).
void gelu_forward_cpu_out(const at::Tensor& x, at::Tensor& y);
/// grad * gelu'(x), one pass (grad and x of one shape, both as gelu_fused_supported takes them).
at::Tensor gelu_backward_cpu(const at::Tensor& grad, const at::Tensor& x);
/// grad * gelu'(x) into dx (x's shape; dx may be grad or x, no partial overlap).
void gelu_backward_cpu_out(const at::Tensor& grad, const at::Tensor& x, at::Tensor& dx);

/// The specification: at::gelu (exact form), autograd-able.
at::Tensor gelu_reference(const at::Tensor& x);
/// gelu(x) with autograd: the fused passes where gelu_fused_supported, else the reference.
at::Tensor gelu_fused(const at::Tensor& x);

}  // namespace posenc
