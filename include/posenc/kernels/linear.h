// A linear layer, and a transformer's MLP (linear -> GELU -> linear), each as one autograd node
// with a hand-written backward: the same products as at::linear (Python's F.linear: one addmm
// with the bias) and at::gelu, fewer passes and autograd nodes around them.
//
//   linear:  y = x W^T + b                       x [..., K], W [N, K], b [N] -> y [..., N]
//     backward (dy [M, N], M = rows of x):  dx = dy W,  dW = dy^T x,  db = sum over rows of dy
//   MLP:     h = x W1^T + b1,  a = gelu(h),  y = a W2^T + b2
//     backward:  da = dy W2,  dW2 = dy^T a,  db2 = sum rows dy,  dh = da * gelu'(h),
//                dW1 = dh^T x,  db1 = sum rows dh,  dx = dh W1
//
// What they save against at::linear + gelu_fused + at::linear: the products are posenc's own
// register-blocked micro-kernels (src/kernels/cpu/linear_gemm.h; at the AVX2 and AVX-512 levels,
// where the product's output width is a multiple of the vector: 8 or 16 floats) with the bias as
// the forward accumulators' start (no bias pass), dx written without MKL's beta = 0 zeroing pass,
// and db summed over the same chunks of dy as dW = dy^T x, while they are in cache; elsewhere
// (the scalar level, other widths, POSENC_LINEAR_GEMM=mkl) MKL's through at::addmm_out / at::mm,
// the forward filling each output's rows with the bias (a row copy per row) and letting MKL
// accumulate into them (sgemm with beta = 1, as addmm does after ATen's broadcast copy_ of the
// bias, which costs several times the row copies). The backward writes dW directly in the
// weight's [N, K] layout (no transposed view for the gradient accumulator to copy), computes dh
// in place over da, and the MLP is one node where the composition had seven (two views and an
// addmm per layer, GELU's). The own products sum in another order than MKL's blocked sums: forward
// and gradients equal the composition's to float32 rounding, not to the bit (the tests hold both
// to a float64 evaluation); they do not depend on the thread count or the inputs' alignment. On
// MKL's route the forward is the same bits as at::linear (the same bias copy, then the same addmm
// with beta = 1) and the gradients equal it to rounding (other transposition flags).
//
// Under create_graph (grad mode on inside the backward) the backward's ops are ATen's
// differentiable ones (mm, sum, gelu_backward; the MLP recomputes h and a from its saved inputs
// by addmm and gelu, so their graph reaches x and the weights), so second-order gradients are
// autograd's.
// Taken for float32 CPU tensors with a bias, outside CPU autocast (under autocast the composition
// runs, so the products are bf16 as autocast casts them); anything else runs the composition
// (linear_reference / mlp_gelu_reference), which is also the specification the tests hold these
// to (tests/test_linear.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace posenc {

/// Whether linear_fused's own node takes these (float32 CPU, bias defined, W [N, K] contiguous
/// with N, K > 0, x [..., K], not under CPU autocast).
bool linear_fused_supported(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// The specification: at::linear(x, weight, bias).
at::Tensor linear_reference(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// y = x weight^T + bias with autograd: one node where linear_fused_supported, else at::linear.
at::Tensor linear_fused(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

/// The specification: at::linear(gelu_fused(at::linear(x, w1, b1)), w2, b2).
at::Tensor mlp_gelu_reference(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                              const at::Tensor& w2, const at::Tensor& b2);

/// fc2(gelu(fc1(x))) with autograd: one node (the fused GELU's passes inside) where both layers
/// are linear_fused_supported and the GELU's fused pass takes float32 CPU; else the reference.
at::Tensor mlp_gelu_fused(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                          const at::Tensor& w2, const at::Tensor& b2);

}  // namespace posenc
