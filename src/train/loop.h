// The training loop: from the current step to the last one, one AdamW step per batch (schedule.h),
// a metrics.csv row every log_every steps, evaluation and a checkpoint at the end of every
// eval_every-th epoch, and a clean stop (checkpoint saved) on SIGINT/SIGTERM or --stop-after (a
// signal before the first step: StopSignals, an exit at once). The epoch's order depends on
// (seed, epoch) and a step's randomness on (seed, step) only, so a resumed run continues bit for
// bit. In a data-parallel run (distributed/data_parallel.h) every rank runs
// this loop on its shard of each global batch; the ranks agree on each step's loss and on
// stopping, and only rank 0 writes. Internal to the trainer.
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <string>

#include "distributed/data_parallel.h"
#include "ema.h"
#include "log.h"
#include "posenc/train/task.h"
#include "posenc/train/trainer.h"
#include "run_folder.h"
#include "schedule.h"

namespace posenc::train {

/// The running sums of the log interval in progress, so a resumed run logs the same rows.
struct LogWindow {
  double loss_sum = 0, metric_sum = 0;
  int64_t loss_count = 0, metric_count = 0;
  at::Tensor to_tensor() const;  ///< [4] float64, as checkpoints keep it
  static LogWindow from_tensor(const at::Tensor& t);
  /// The metrics.csv row of the interval ending at `step`; starts the next interval.
  LogRow take_row(int64_t step, int64_t steps_per_epoch, double lr, const std::string& metric);
};

/// What a run holds while it trains (built by run_training, read by the loop).
struct Run {
  std::string name, output, checkpoint, csv;  ///< checkpoint.pt and metrics.csv in output
  std::string config_text;                    ///< the run config as JSON: checkpoints carry it
  uint64_t seed = 0;
  TrainSettings settings;
  StepCounts counts;
  std::unique_ptr<RunFolderLock> lock;  ///< held for the run's life
  std::unique_ptr<Task> task;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<WeightAverage> ema;   ///< with train.ema_decay > 0
  std::shared_ptr<DataParallel> ranks;  ///< this process's place in the run (world 1: alone)
  int64_t rank_batch = 0;               ///< examples per step on this rank: batch_size / world
};

/// Where the loop stands: restored from a checkpoint on resume, advanced by train_loop.
struct LoopState {
  int64_t step = 0;
  double elapsed = 0;  ///< seconds of training so far, across resumes
  LogWindow window;
  TrainingLog log;
  /// The evaluation at the last step (empty until the loop reaches it): the run's final metrics,
  /// not computed a second time.
  Metrics final_eval;
};

/// SIGINT, SIGTERM and SIGHUP over one `posenc train` run, from before its rendezvous to its end.
/// Before the first step (loading and decoding the data, building the model, reading the
/// checkpoint, waiting for the other ranks) a signal ends the process at once: one line (from
/// `speaks`: a process alone or rank 0; the other ranks exit without a word, as they do when rank
/// 0 announces a stop in the loop) and exit 130, as a stop in the loop; nothing has been trained
/// and nothing is written then but the folder's lock. In train_loop: a checkpoint after the step
/// (InterruptScope in loop.cpp). After the loop: the signal's default action. The previous
/// handlers come back at the end of the scope.
class StopSignals {
 public:
  explicit StopSignals(bool speaks);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool speaks_ = true;
  int phase_ = 0;
  void (*int_)(int) = nullptr;
  void (*term_)(int) = nullptr;
  void (*hup_)(int) = nullptr;
};

/// Trains from state.step to run.counts.total; returns false when stopped early (a signal or
/// options.stop_after), after saving metrics.csv, the checkpoint, weights.pt and curves.png.
bool train_loop(Run& run, LoopState& state, const RunOptions& options);

/// The task's evaluation, in eval mode without gradients (the model returns to training).
Metrics evaluate(Task& task);
/// The task's generalization rows, likewise.
std::vector<GeneralizationRow> generalization(Task& task);

}  // namespace posenc::train
