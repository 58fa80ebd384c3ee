// Fused multi-tensor AdamW and gradient-norm clipping: one parallel pass over every parameter
// instead of ~10 ATen ops per parameter tensor (LibTorch's torch::optim::AdamW::step and
// torch::nn::utils::clip_grad_norm_ issue ~1,700 and ~400 small ops per step for a 4-block ViT).
//
// AdamW (Loshchilov & Hutter 2019), per element, in the order and float roundings of
// torch::optim::AdamW::step (torch/csrc/api/src/optim/adamw.cpp), t = the parameter's step + 1:
//   p <- p * (1 - lr * wd)                                     (decoupled weight decay)
//   m <- m * b1 + (1 - b1) * g
//   v <- v * b2 + (1 - b2) * g * g
//   p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Clipping (torch::nn::utils::clip_grad_norm_, norm 2):
//   n = sqrt(sum over all gradients of g^2);  c = min(1, max_norm / (n + 1e-6));  g <- g * c
// The specifications and test oracles: torch::optim::AdamW and clip_grad_norm_ themselves
// (adamw_step_reference, grad_norm_clip_reference_); tests/test_fused_adamw.cpp compares weights
// after N steps. Sums of squares are taken in double per chunk, so n differs from LibTorch's
// float norm-of-norms by rounding only.
//
//   params, grads, exp_avgs, exp_avg_sqs: float32 CPU tensors, contiguous, same numel per index.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace posenc {

/// AdamW's settings for one parameter tensor (its group's options and its step count before
/// this update).
struct AdamWHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  int64_t step = 0;  ///< updates done so far; this one is step + 1
};

/// Whether the fused kernel takes these tensors (CPU, float32, contiguous, dense, same numel).
bool adamw_step_fused_supported(at::TensorList params, at::TensorList grads,
                                at::TensorList exp_avgs, at::TensorList exp_avg_sqs);
/// One AdamW update of every params[i] in place (exp_avgs, exp_avg_sqs updated too), one
/// parallel pass over all tensors; hyper[i] belongs to params[i].
void adamw_step_fused(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                      at::TensorList exp_avg_sqs, const std::vector<AdamWHyper>& hyper);
/// The same update in ATen ops, op for op as torch::optim::AdamW::step.
void adamw_step_reference(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, const std::vector<AdamWHyper>& hyper);

/// Scales every gradient by min(1, max_norm / (total 2-norm + 1e-6)) in place and returns the
/// total 2-norm (before scaling): one parallel pass for the norm, one for the scale (skipped
/// when c = 1). Undefined gradients are skipped; CPU float32 contiguous gradients are fused, any
/// other list goes through the reference.
double grad_norm_clip_fused_(const std::vector<at::Tensor>& grads, double max_norm);
/// torch::nn::utils::clip_grad_norm_ on the gradients themselves.
double grad_norm_clip_reference_(const std::vector<at::Tensor>& grads, double max_norm);

}  // namespace posenc
