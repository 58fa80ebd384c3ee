// A training task: data + model + loss + evaluation, built from the `task` and `model` sections
// of a run config. The trainer (posenc/train/trainer.h) owns the loop, the optimizer, the
// schedule, checkpoints and logs; a task only answers "the loss of these examples" and "how good
// is the model now".
//
// Tasks (task.type):
//   image_classification   ViT on Fashion-MNIST patches, 2D positions; after training, accuracy at
//                          other resolutions (learned tables resampled, RoPE extrapolates)
//   language_model         causal byte LM on Gutenberg books; after training, perplexity at longer
//                          contexts (train short, test long; Press et al. 2022)
//   forecast               the next readings of a real CSV series from its last ones, positions as
//                          real timestamps or as plain indices; MAE in the data's units
//   video_classification   direction of motion of moving Fashion-MNIST clips, tubelets with
//                          (t, h, w) positions (or a subset of the axes)
//   text_video_matching    which of K captions describes a clip, one mixed stream per pair
//   retrieval              key-value retrieval over bytes ("lost in the middle"): exact-match
//                          recall of a record by its depth in the prompt and the prompt's length
//   audio_language         spoken-language identification from AST patches of log-mel spectrograms
//                          (frequency, time in seconds); after training, the test with the speech
//                          moved later in time
//   audio_video_text       one stream of a turning clip, a spoken direction word and a caption
//                          (TMRoPE's time-aligned layout or a sequential one): does the word name
//                          the motion while it is spoken? After training, clips of other lengths
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace posenc::train {

/// Named values in a fixed order ("loss", "accuracy", ...).
using Metrics = std::vector<std::pair<std::string, double>>;
double metric_value(const Metrics& metrics, const std::string& name);

/// One row of a task's after-training evaluation (e.g. {"context", 512} -> {"ppl", 3.1}).
struct GeneralizationRow {
  std::string setting;  ///< "context 512", "scale 1.5x"
  double x = 0;         ///< the setting as a number (512, 1.5), for plots
  Metrics metrics;
};

/// A two-way table of one metric a task measures after training (e.g. recall by the depth of the
/// record x the length of the prompt). The trainer writes it into the run folder as <name>.md and
/// a heatmap <name>.png and into summary.json; `posenc compare` puts every run's side by side
/// (results_<name>.md, results_<name>.png).
struct DetailTable {
  std::string name;                  ///< file stem, e.g. "recall_by_depth"
  std::string title;                 ///< what the values are, e.g. "exact-match recall"
  std::string row_label, col_label;  ///< "depth of the record", "records in the prompt"
  std::vector<std::string> rows, cols;
  std::vector<std::vector<double>> values;  ///< [rows][cols]
  double lo = 0, hi = 1;                    ///< the colour scale, the same for every run
};

/// The ranks of a data-parallel run as a task sees them. Evaluation: each rank evaluates every
/// world_size-th batch and the sums are added up across ranks before they are divided.
/// Training: train_loss gets this rank's slice of the global batch; a task whose data is drawn
/// per batch (the LM's windows) draws the whole batch from step_seed and takes its slice, so the
/// ranks together see what one process would. The trainer sets it (set_ranks); by default one
/// process does everything.
struct TaskRanks {
  int rank = 0, world_size = 1;
  /// Element-wise sums over the ranks (the same on every rank); empty: one process.
  std::function<std::vector<double>(std::vector<double>)> sum;
  /// Whether evaluation batch number `batch` is this rank's.
  bool mine(int64_t batch) const { return batch % world_size == rank; }
  std::vector<double> total(std::vector<double> values) const {
    return sum ? sum(std::move(values)) : values;
  }
};

class Task {
 public:
  virtual ~Task() = default;
  /// The model (every trainable parameter lives under it).
  virtual std::shared_ptr<torch::nn::Module> model() = 0;
  /// Examples per epoch (the trainer permutes indices in [0, train_size)).
  virtual int64_t train_size() const = 0;
  /// Mean loss over the examples `indices` [b] (model in training mode); `metric` receives the
  /// batch's primary metric where meaningful (accuracy), else NaN.
  virtual at::Tensor train_loss(const at::Tensor& indices, double* metric) = 0;
  /// Held-out evaluation (the trainer sets eval mode and no-grad): "loss" first, then others.
  virtual Metrics evaluate() = 0;
  /// After training: the task's generalization test (other resolutions, longer contexts).
  virtual std::vector<GeneralizationRow> generalization() { return {}; }
  /// After generalization(): two-way tables of what it measured (none by default).
  virtual std::vector<DetailTable> details() { return {}; }
  /// The metric that summarizes a run ("accuracy", "ppl", "mae").
  virtual std::string metric_name() const = 0;
  /// A classifier's class names, label order (the trainer writes them to classes.json in the run
  /// folder and `posenc eval` prints them); empty for other tasks.
  virtual std::vector<std::string> class_names() const { return {}; }
  /// An image (or video) classifier's logits [F, K] for image files (clips), decoded and
  /// normalized as its held-out ones are (model in eval mode, no grad); other tasks refuse.
  virtual at::Tensor classify_files(const std::vector<std::string>& files);
  /// An image classifier's input: {"channels", "image_size", "pad", "patch", "mean", "std"}
  /// (null for other tasks), for exporting the model (posenc/train/export_timm.h).
  virtual nlohmann::json image_input() const { return nullptr; }
  /// Data-parallel runs: this rank, the evaluation batches that are its, how sums combine.
  void set_ranks(TaskRanks ranks) { ranks_ = std::move(ranks); }
  /// Where the model computes (train.device; the trainer has moved the model there). The task's
  /// data stays in host memory and each batch's tensors move at the model's door (on_device);
  /// Positions stay in host memory: encoders build their tables from them there, in float64, and
  /// move the tables to the device of the tensors they meet.
  void set_device(c10::Device device) { device_ = device; }
  /// Before every train_loss: the seed of this step's global batch, the same on every rank (the
  /// trainer has seeded torch's generator with it, plus the rank in a data-parallel run).
  void set_step_seed(uint64_t seed) { step_seed_ = seed; }

 protected:
  /// `t` on the model's device (itself when it is there already).
  at::Tensor on_device(const at::Tensor& t) const { return t.to(device_); }

  TaskRanks ranks_;
  uint64_t step_seed_ = 0;
  c10::Device device_{c10::kCPU};
};

/// Builds the task of a run config (sections task, model, encoder; the data is loaded here).
std::unique_ptr<Task> make_task(const nlohmann::json& config);
/// The known task types.
std::vector<std::string> task_types();

}  // namespace posenc::train
