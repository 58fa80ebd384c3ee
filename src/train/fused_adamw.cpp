// FusedAdamW: torch::optim::AdamW's bookkeeping (groups, lazily created state, step counts) with
// the arithmetic of all parameters in one kernel call (include/posenc/kernels/adamw.h, whose
// header states the update). Contract in include/posenc/train/fused_adamw.h.
#include "posenc/train/fused_adamw.h"

#include <torch/torch.h>

#include "posenc/kernels/adamw.h"

namespace posenc::train {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  // Decided before the closure runs, so a fallback does not evaluate it twice.
  bool fusable = true;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    if (o.amsgrad()) fusable = false;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto& g = p.grad();
      if (!p.device().is_cpu() || p.scalar_type() != at::kFloat || !p.is_contiguous() ||
          g.is_sparse() || !g.is_contiguous() || g.scalar_type() != at::kFloat)
        fusable = false;
      auto found = state_.find(p.unsafeGetTensorImpl());
      if (found != state_.end()) {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        if (!s.exp_avg().is_contiguous() || !s.exp_avg_sq().is_contiguous() ||
            s.exp_avg().scalar_type() != at::kFloat || s.exp_avg_sq().scalar_type() != at::kFloat)
          fusable = false;
      }
    }
  }
  if (!fusable) {
    last_step_fused_ = false;
    return torch::optim::AdamW::step(closure);
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<AdamWHyper> hyper;
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {  // as torch::optim::AdamW: zero moments at the first step
        auto created = std::make_unique<torch::optim::AdamWParamState>();
        created->step(0);
        created->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        created->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(created);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(s.exp_avg());
      exp_avg_sqs.push_back(s.exp_avg_sq());
      hyper.push_back({o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
                       o.weight_decay(), s.step()});
      s.step(s.step() + 1);
    }
  }
  adamw_step_fused(params, grads, exp_avgs, exp_avg_sqs, hyper);
  last_step_fused_ = true;
  return loss;
}

double clip_grad_norm_fused(const std::vector<at::Tensor>& parameters, double max_norm) {
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grad_norm_clip_fused_(grads, max_norm);
}

}  // namespace posenc::train
