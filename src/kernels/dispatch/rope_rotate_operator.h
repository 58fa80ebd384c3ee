// posenc::rope_rotate, rope_rotate_qk, rope_rotate_ — the C++ library's fused rotation as
// operators in PyTorch's dispatcher (Su et al. 2021, RoFormer eq. 34), per-pair tables:
//
//   (x_a, x_b) -> (x_a c - x_b s, x_b c + x_a s)     pairs (i, i+F) [half] or (2i, 2i+1)
//   dims 2F..Dh-1 copied; inverse: s -> -s (R(theta)^T = R(-theta), the backward)
//
//   x, q, k: [B, N, H, Dh] (any strides, heads of q and k may differ)
//   cos, sin: [N, F] or [B or 1, N, F] float32 (a token's angles x inv_freq, attention scaling
//             folded in; posenc::rope_cos_sin), 2F <= Dh  ->  results [B, N, H, Dh] in x's dtype
//
// The dispatcher is the one dispatch point between devices: CPU -> rope_rotate_cpu
// (src/kernels/cpu/rope_cpu.cpp), CUDA -> the CUDA kernel's glue (src/kernels/cuda/, where the
// LibTorch has CUDA), Autograd -> ../autograd/rope_rotate_autograd.cpp (the backward is the
// operator with `inverse` flipped, so it is itself differentiable; tables that need a gradient take
// the plain-ATen reference rope_apply, the specification). Fake kernels: python/posenc/_meta.py.
// The C++ library's rope_fused, rope_fused_qk and rope_fused_ (posenc/kernels/rope_fused.h) call
// these operators; so do Python (torch.ops.posenc.rope_rotate*) and every caller in between.
//
// The schemas, the per-key registrations and the C++ entry points sit in one translation unit
// (rope_rotate_operator.cpp) so that linking the static core for rope_fused keeps them all; they
// are registered once per process, however many copies of the static core are loaded.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <tuple>

#include "posenc/functional/rope.h"

namespace posenc::ops {

using RopeRotateSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       c10::string_view, bool);
using RopeRotateQkSignature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&,
                                                                 const at::Tensor&,
                                                                 const at::Tensor&,
                                                                 const at::Tensor&,
                                                                 c10::string_view, bool);
using RopeRotateInPlaceSignature = void(at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        c10::string_view, bool);

/// The checks every path shares (one line naming the operator, expected and actual); returns the
/// parsed layout.
RopeLayout check_rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             c10::string_view layout, const char* op, const char* name);
/// The same for q and k together (each checked, then same dtype and batch).
RopeLayout check_rope_rotate_qk(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                                const at::Tensor& sin, c10::string_view layout);

/// The operators' typed handles (looked up once).
const c10::TypedOperatorHandle<RopeRotateSignature>& rope_rotate_op();
const c10::TypedOperatorHandle<RopeRotateQkSignature>& rope_rotate_qk_op();
const c10::TypedOperatorHandle<RopeRotateInPlaceSignature>& rope_rotate_inplace_op();

/// The Autograd kernels (../autograd/rope_rotate_autograd.cpp), registered in
/// rope_rotate_operator.cpp.
at::Tensor rope_rotate_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                c10::string_view layout, bool inverse);
std::tuple<at::Tensor, at::Tensor> rope_rotate_qk_autograd(const at::Tensor& q, const at::Tensor& k,
                                                           const at::Tensor& cos,
                                                           const at::Tensor& sin,
                                                           c10::string_view layout, bool inverse);
void rope_rotate_inplace_autograd(at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  c10::string_view layout, bool inverse);

}  // namespace posenc::ops
