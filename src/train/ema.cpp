// The weight average; see ema.h.
#include "ema.h"

#include <torch/torch.h>

#include <algorithm>

namespace posenc::train {

WeightAverage::WeightAverage(torch::nn::Module& model, double decay) : decay_(decay) {
  TORCH_CHECK(decay > 0 && decay < 1, "train: ema_decay must be in (0, 1) (0: off), got ", decay);
  for (const auto& item : model.named_parameters()) {
    names_.push_back(item.key());
    params_.push_back(item.value());
    average_.push_back(item.value().detach().clone());
  }
}

void WeightAverage::update(int64_t updates) {
  const double t = static_cast<double>(updates);
  const double d = std::min(decay_, (1 + t) / (10 + t));
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> detached;
  detached.reserve(params_.size());
  for (const auto& p : params_) detached.push_back(p.detach());
  at::_foreach_lerp_(average_, detached, 1 - d);  // ema + (1 - d) (p - ema)
}

std::map<std::string, at::Tensor> WeightAverage::named() const {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < names_.size(); ++i) out[names_[i]] = average_[i];
  return out;
}

void WeightAverage::load(const std::map<std::string, at::Tensor>& named,
                         const std::string& origin) {
  TORCH_CHECK(named.size() == names_.size(), "'", origin, "' holds ", named.size(),
              " averaged (ema) tensors but the model has ", names_.size(), " parameters");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < names_.size(); ++i) {
    auto found = named.find(names_[i]);
    TORCH_CHECK(found != named.end(), "'", origin, "' has no averaged (ema) tensor '", names_[i],
                "'");
    TORCH_CHECK(found->second.sizes() == average_[i].sizes(), "'", origin, "': ema tensor '",
                names_[i], "' has shape ", found->second.sizes(), " but the parameter's is ",
                average_[i].sizes());
    average_[i].copy_(found->second);
  }
}

WeightAverage::Swap::Swap(WeightAverage* average) : average_(average) {
  if (average_) exchange();
}

WeightAverage::Swap::~Swap() {
  if (average_) exchange();
}

void WeightAverage::Swap::exchange() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < average_->params_.size(); ++i) {
    auto kept = average_->params_[i].detach().clone();
    average_->params_[i].detach().copy_(average_->average_[i]);
    average_->average_[i].copy_(kept);
  }
}

}  // namespace posenc::train
