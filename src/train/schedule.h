// Training settings (the config's `train` section) and the optimization schedule:
//   lr(step) = lr * (step + 1) / warmup                                     step < warmup
//            = lr * (r + (1 - r) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2)  after
// (linear warmup, then cosine decay to r = min_lr_ratio; Loshchilov & Hutter 2017), AdamW
// (Loshchilov & Hutter 2019) with weight decay on matrices only. Internal to the trainer.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace posenc::train {

inline constexpr int64_t kMaxThreads = 1024;                // intra-op threads a run may ask for
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 20;  // examples per step (all ranks)
/// The step limit: epochs x steps per epoch, or train.max_steps (10^12: years at any speed).
inline constexpr int64_t kMaxTrainSteps = 1'000'000'000'000;

struct TrainSettings {
  int64_t epochs = 1, batch_size = 64, warmup_steps = 0, max_steps = 0, log_every = 50;
  int64_t eval_every = 1, threads = 0;
  double lr = 1e-3, min_lr_ratio = 0.0, weight_decay = 0.05, clip_grad_norm = 1.0;
  double ema_decay = 0;         ///< weight average (ema.h); 0: off
  bool fused_optimizer = true;  ///< FusedAdamW + clip_grad_norm_fused (false: LibTorch's own)
  std::string device = "cpu";   ///< "cpu", "cuda" or "cuda:N" (device.h)
  /// "float32", or "bf16": the training forward (model and loss) under autocast to bfloat16 on
  /// the CPU (precision.h); parameters, gradients, AdamW and evaluation stay float32.
  std::string precision = "float32";
  // Data-parallel runs (distributed/data_parallel.h); ignored by one process.
  double rank_timeout_s = 300;            ///< rendezvous and every collective; a lost rank
  std::string gradient_sync = "overlap";  ///< "overlap" (c10d Reducer) or "after_backward"
  double bucket_mb = 25;                  ///< gradient bucket size (DDP's default)
  bool find_unused_parameters = false;    ///< reduce parameters a step did not use (DDP's flag)
};

inline constexpr double kMaxRankTimeoutS = 86400;  // train.rank_timeout_s: at most a day
inline constexpr double kMaxBucketMb = 1024;       // train.bucket_mb

/// The `train` section, checked (unknown keys and out-of-range values are errors). What every
/// command that reads a run checks; training checks check_settings_can_train as well.
TrainSettings read_settings(const nlohmann::json& config);
/// What only training needs of this process (precision.h: bf16 on a CPU with native bfloat16).
void check_settings_can_train(const TrainSettings& s);
struct StepCounts {
  int64_t steps_per_epoch, epochs, total;
};
/// Steps per epoch, epochs and total steps for a training set of `train_size` examples
/// (max_steps, when set, wins over epochs); a batch larger than the set is an error.
StepCounts step_counts(const TrainSettings& s, int64_t train_size);
/// The learning rate at `step` of `total`.
double learning_rate(const TrainSettings& s, int64_t step, int64_t total);
/// Parameters in two AdamW groups: matrices decay, vectors (biases, norms, tokens) do not.
std::vector<torch::optim::OptimizerParamGroup> parameter_groups(torch::nn::Module& model,
                                                                double weight_decay, double lr);

}  // namespace posenc::train
