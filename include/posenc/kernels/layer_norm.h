// A residual add and the layer norm after it, as one pass forward and one backward (the pre-norm
// transformer's `h = x + r; y = LayerNorm(h)`, Ba et al. 2016; torch.nn.LayerNorm's definition):
//
//   h = x + r
//   mu = mean(h),  var = mean((h - mu)^2)   (biased, over the last dim D)
//   rstd = 1 / sqrt(var + eps),   xhat = (h - mu) rstd
//   y = xhat w + b
//
// backward, with dh_in the gradient reaching h from its other use (the residual stream) and
// g = dy w:
//   dh = rstd (g - mean(g) - xhat mean(g xhat)) + dh_in,   dx = dr = dh
//   dw = sum over rows of dy xhat,  db = sum over rows of dy
//
// Forward one pass per row over 8 or 16 float lanes (AVX2 or AVX-512, the CPU level chosen at run
// time): h written once, its mean and variance by two sums over the row (two-pass, as a row of D <=
// kMaxLayerNormDim floats stays in L1), y written; mu and rstd saved per row. The backward reads
// dy, dh_in and h once and writes dh; dw and db are summed per block of kLayerNormRowBlock rows and
// the blocks added in order, so the result does not depend on the thread count. ATen does the same
// as add + layer_norm
// + native_layer_norm_backward + the autograd engine's accumulation of dh_in: four passes forward
// and backward. Results differ from ATen's by rounding (its mean and variance by Welford's
// recurrence, ours by sums): tests/test_layer_norm.cpp holds both to a float64 evaluation.
//
//   x, r: [..., D] float32 CPU contiguous, same shape; weight, bias: [D]; D % 8 == 0 and
//   D <= kMaxLayerNormDim (add_layer_norm_fused_supported); anything else takes the reference.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace posenc {

/// Widest row the fused passes take (a row and its gradient stay in L1).
constexpr int64_t kMaxLayerNormDim = 8192;
/// Rows per block of the weight and bias gradients' partial sums (fixed: thread-independent).
constexpr int64_t kLayerNormRowBlock = 64;

/// Whether the fused passes take these inputs (CPU float32 contiguous, D % 8 == 0, CPU level
/// avx2 or avx512).
bool add_layer_norm_fused_supported(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& weight, const at::Tensor& bias);

/// The specification: h = x + r, y = at::layer_norm(h, {D}, weight, bias, eps); autograd-able.
std::tuple<at::Tensor, at::Tensor> add_layer_norm_reference(const at::Tensor& x,
                                                            const at::Tensor& r,
                                                            const at::Tensor& weight,
                                                            const at::Tensor& bias, double eps);

/// (h, y) with autograd: the fused passes where supported, else the reference.
std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& r,
                                                  const at::Tensor& weight, const at::Tensor& bias,
                                                  double eps);

namespace detail {
/// Forward pass: returns (h, y, mean [rows], rstd [rows]).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward_cpu(
    const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
    double eps);
/// Backward pass: returns (dh, dweight, dbias); dh_in may be undefined (no gradient through h).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& dy, const at::Tensor& dh_in, const at::Tensor& h, const at::Tensor& mean,
    const at::Tensor& rstd, const at::Tensor& weight);
/// The forward pass into the caller's tensors: h and y of x's shape, mean and rstd [rows], each
/// contiguous float32 CPU, overlapping no input and no other output.
void add_layer_norm_forward_cpu_out(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps,
                                    at::Tensor& h, at::Tensor& y, at::Tensor& mean,
                                    at::Tensor& rstd);
/// The backward pass into the caller's tensors: dh of h's shape, dweight and dbias [D], as above.
void add_layer_norm_backward_cpu_out(const at::Tensor& dy, const at::Tensor& dh_in,
                                     const at::Tensor& h, const at::Tensor& mean,
                                     const at::Tensor& rstd, const at::Tensor& weight,
                                     at::Tensor& dh, at::Tensor& dweight, at::Tensor& dbias);
}  // namespace detail

}  // namespace posenc
