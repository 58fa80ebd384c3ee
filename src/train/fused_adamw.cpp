// FusedAdamW: torch::optim::AdamW's bookkeeping (groups, lazily created state, step counts) with
// the arithmetic of all parameters in one kernel call (include/posenc/kernels/adamw.h, whose
// header states the update). Contract in include/posenc/train/fused_adamw.h.
#include "posenc/train/fused_adamw.h"

#include <torch/torch.h>

#include "posenc/kernels/adamw.h"

namespace posenc::train {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {  // first, as torch::optim::AdamW: the closure makes the gradients
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  bool amsgrad = false;
  for (auto& group : param_groups())
    amsgrad |= static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad();
  if (amsgrad) {
    last_step_fused_ = false;
    torch::optim::AdamW::step();  // the closure has run
    return loss;
  }
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<torch::optim::AdamWParamState*> states;
  std::vector<AdamWHyper> hyper;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {  // torch::optim::AdamW's first-step state: zero moments, step 0
        auto created = std::make_unique<torch::optim::AdamWParamState>();
        created->step(0);
        created->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        created->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(created);
      }
      auto* s = static_cast<torch::optim::AdamWParamState*>(slot.get());
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s->exp_avg());
      exp_avg_sqs.push_back(s->exp_avg_sq());
      states.push_back(s);
      hyper.push_back({o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
                       o.weight_decay(), s->step()});
    }
  }
  last_step_fused_ = adamw_step_fused_supported(params, grads, exp_avgs, exp_avg_sqs);
  if (!last_step_fused_) {  // LibTorch's step continues from the same states
    torch::optim::AdamW::step();
    return loss;
  }
  adamw_step_fused(params, grads, exp_avgs, exp_avg_sqs, hyper);
  for (auto* s : states) s->step(s->step() + 1);
  return loss;
}

double clip_grad_norm_fused(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grad_norm_clip_fused_(grads, max_norm);
}

}  // namespace posenc::train
