// Training settings and schedule; see schedule.h.
#include "schedule.h"

#include <torch/torch.h>

#include <cmath>
#include <utility>

#include "device.h"
#include "posenc/config/config_reader.h"
#include "precision.h"

namespace posenc::train {

TrainSettings read_settings(const nlohmann::json& config) {
  TrainSettings s;
  if (!config.contains("train")) return s;
  ConfigReader r(config.at("train"), "train");
  s.epochs = r.integer("epochs", s.epochs);
  s.batch_size = r.integer("batch_size", s.batch_size);
  s.warmup_steps = r.integer("warmup_steps", s.warmup_steps);
  s.max_steps = r.integer("max_steps", s.max_steps);
  s.log_every = r.integer("log_every", s.log_every);
  s.eval_every = r.integer("eval_every", s.eval_every);
  s.threads = r.integer("threads", s.threads);
  s.lr = r.number("lr", s.lr);
  s.min_lr_ratio = r.number("min_lr_ratio", s.min_lr_ratio);
  s.weight_decay = r.number("weight_decay", s.weight_decay);
  s.clip_grad_norm = r.number("clip_grad_norm", s.clip_grad_norm);
  s.fused_optimizer = r.boolean("fused_optimizer", s.fused_optimizer);
  s.ema_decay = r.number("ema_decay", s.ema_decay);
  s.device = r.string("device", s.device);
  s.precision = r.string("precision", s.precision);
  s.rank_timeout_s = r.number("rank_timeout_s", s.rank_timeout_s);
  s.gradient_sync = r.string("gradient_sync", s.gradient_sync);
  s.bucket_mb = r.number("bucket_mb", s.bucket_mb);
  s.find_unused_parameters = r.boolean("find_unused_parameters", s.find_unused_parameters);
  r.finish();
  TORCH_CHECK(s.epochs >= 1 && s.batch_size >= 1 && s.log_every >= 1 && s.eval_every >= 1,
              "train: epochs, batch_size, log_every and eval_every must be >= 1, got ", s.epochs,
              ", ", s.batch_size, ", ", s.log_every, ", ", s.eval_every);
  TORCH_CHECK(s.batch_size <= kMaxBatchSize, "train: batch_size ", s.batch_size,
              " is over the batch limit kMaxBatchSize = ", kMaxBatchSize);
  TORCH_CHECK(s.threads >= 0 && s.threads <= kMaxThreads,
              "train: 'threads' must be 0 (all cores) or 1 to ", kMaxThreads, ", got ", s.threads);
  TORCH_CHECK(s.lr > 0, "train: lr must be > 0, got ", s.lr);
  TORCH_CHECK(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1,
              "train: min_lr_ratio must be in [0, 1], got ", s.min_lr_ratio);
  for (const auto& [key, value] :
       {std::pair<const char*, double>{"warmup_steps", static_cast<double>(s.warmup_steps)},
        {"max_steps", static_cast<double>(s.max_steps)},
        {"weight_decay", static_cast<double>(s.weight_decay)},
        {"clip_grad_norm", static_cast<double>(s.clip_grad_norm)}})
    TORCH_CHECK(value >= 0, "train: ", key, " must be >= 0, got ", value);
  TORCH_CHECK(s.rank_timeout_s >= 1 && s.rank_timeout_s <= kMaxRankTimeoutS,
              "train: rank_timeout_s must be in [1, ", kMaxRankTimeoutS, "] seconds, got ",
              s.rank_timeout_s);
  TORCH_CHECK(s.bucket_mb > 0 && s.bucket_mb <= kMaxBucketMb, "train: bucket_mb must be in (0, ",
              kMaxBucketMb, "], got ", s.bucket_mb);
  TORCH_CHECK(s.gradient_sync == "overlap" || s.gradient_sync == "after_backward",
              "train: gradient_sync must be 'overlap' or 'after_backward', got '", s.gradient_sync,
              "'");
  check_device_setting(s.device);
  check_precision_value(s.precision);
  TORCH_CHECK(s.ema_decay >= 0 && s.ema_decay < 1,
              "train: ema_decay must be in [0, 1) (0: off), got ", s.ema_decay);
  return s;
}

void check_settings_can_train(const TrainSettings& s) {
  check_precision_can_train(s.precision, s.device);
}

StepCounts step_counts(const TrainSettings& s, int64_t train_size) {
  TORCH_CHECK(s.batch_size <= train_size, "train: batch_size (", s.batch_size,
              ") is larger than the training set (", train_size, " examples)");
  const int64_t per_epoch = std::max<int64_t>(1, train_size / s.batch_size);
  TORCH_CHECK(s.max_steps <= kMaxTrainSteps, "train: max_steps is ", s.max_steps,
              "; the step limit is ", kMaxTrainSteps);
  const int64_t epochs = s.max_steps > 0 ? (s.max_steps + per_epoch - 1) / per_epoch : s.epochs;
  int64_t total = s.max_steps;
  if (s.max_steps == 0)  // epochs x steps per epoch, in int64 with the overflow checked
    TORCH_CHECK(!__builtin_mul_overflow(epochs, per_epoch, &total) && total <= kMaxTrainSteps,
                "train: epochs (", epochs, ") x steps per epoch (", per_epoch,
                ") is over the step limit of ", kMaxTrainSteps, " steps");
  return {per_epoch, epochs, total};
}

double learning_rate(const TrainSettings& s, int64_t step, int64_t total) {
  if (step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, total - s.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
}

std::vector<torch::optim::OptimizerParamGroup> parameter_groups(torch::nn::Module& model,
                                                                double weight_decay, double lr) {
  std::vector<at::Tensor> decay, no_decay;
  for (auto& p : model.parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(lr).weight_decay(weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(lr).weight_decay(0.0)));
  return groups;
}

}  // namespace posenc::train
