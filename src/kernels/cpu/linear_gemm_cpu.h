// Internal: the drivers of the linear layers' own float32 products (linear_gemm.h explains the
// products and their math; linear_gemm_cpu.cpp splits them across threads), called by the linear
// layers' autograd (src/kernels/autograd/linear_autograd.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "linear_gemm.h"

namespace posenc::detail {

// The drivers (linear_gemm_cpu.cpp). own_linear_gemm(): this level's table, or null where the
// level has none or POSENC_LINEAR_GEMM=mkl (a value other than "own", "mkl" or unset is refused).
const LinearGemmKernels* own_linear_gemm();
// Whether the own products take a product whose output columns number cols: float32 kernels
// exist here and cols is a multiple of their lanes.
bool linear_gemm_takes(int64_t cols);
// y [M, N] = x [M, K] W^T + b (x, W [N, K], b [N], y contiguous float32; N a multiple of lanes);
// where gelu_out is given, also gelu_out = gelu(y) (the fused GELU pass's values, cpu_kernels.h)
void linear_forward_own(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& y, at::Tensor* gelu_out = nullptr);
// dx [M, K] = dy [M, N] W [N, K] (K a multiple of lanes); where gelu_input h is given, dx =
// (dy W) * gelu'(h) (the fused GELU backward pass's values)
void linear_input_grad_own(const at::Tensor& dy, const at::Tensor& weight, at::Tensor& dx,
                           const at::Tensor* gelu_input = nullptr);
// dW [N, K] = dy^T x and, where db is defined, db [N] = sum over rows of dy (K a multiple of lanes;
// dW and db written, not accumulated)
void linear_weight_grad_own(const at::Tensor& dy, const at::Tensor& x, at::Tensor& dw,
                            at::Tensor* db);

}  // namespace posenc::detail
