// An exponential moving average of the weights (Polyak & Juditsky 1992), with timm's warmup of
// the decay (ModelEmaV3: early averages do not drag in the random initialization):
//   d_t = min(decay, (1 + t) / (10 + t)),   ema <- d_t * ema + (1 - d_t) * p   after update t
// (t = 1, 2, ... counts optimizer updates). With `train.ema_decay` > 0 the trainer evaluates,
// reports and writes weights.pt from the average; checkpoint.pt keeps the average beside the raw
// weights, so a resumed run continues it exactly. Internal to the trainer.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <vector>

namespace posenc::train {

class WeightAverage {
 public:
  /// Starts the average at the model's current parameters.
  WeightAverage(torch::nn::Module& model, double decay);
  /// Folds in the parameters after update number `updates` (1 for the first update).
  void update(int64_t updates);
  /// The averaged tensors by parameter name (what checkpoint.pt stores under "ema").
  std::map<std::string, at::Tensor> named() const;
  /// Restores from a checkpoint's "ema" entry: every parameter name, shapes equal; errors name
  /// `origin`.
  void load(const std::map<std::string, at::Tensor>& named, const std::string& origin);

  /// While alive, the model holds the averaged weights (its own are put back after).
  class Swap {
   public:
    explicit Swap(WeightAverage* average);  ///< null: nothing swapped
    ~Swap();
    Swap(const Swap&) = delete;
    Swap& operator=(const Swap&) = delete;

   private:
    void exchange();
    WeightAverage* average_;
  };

 private:
  double decay_;
  std::vector<std::string> names_;
  // params_: the model's own tensors, detached at each use (an encoder's adapt() may set_data them)
  std::vector<at::Tensor> params_, average_;
};

}  // namespace posenc::train
