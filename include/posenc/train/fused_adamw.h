// torch::optim::AdamW with its step as one fused multi-tensor pass (include/posenc/kernels/
// adamw.h): the same options, parameter groups, per-parameter state (AdamWParamState: step,
// exp_avg, exp_avg_sq) and therefore the same checkpoints (a FusedAdamW saves what an AdamW
// loads, in C++ and, through posenc's checkpoint, in Python). Parameters it cannot fuse (not
// float32 CPU contiguous, sparse gradients, amsgrad) make the whole step LibTorch's own.
//
//   FusedAdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.05));
//   loss.backward();  clip_grad_norm_fused(model->parameters(), 1.0);  opt.step();
#pragma once

#include <torch/optim/adamw.h>

#include <vector>

namespace posenc::train {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  /// One AdamW update of every parameter with a gradient.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Whether the last step() ran fused (false: it was torch::optim::AdamW::step).
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

/// torch::nn::utils::clip_grad_norm_ (norm 2) as two fused passes over all gradients; returns
/// the total norm before clipping.
double clip_grad_norm_fused(const std::vector<at::Tensor>& parameters, double max_norm);

}  // namespace posenc::train
