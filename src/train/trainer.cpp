// The training loop behind `posenc train`; contract in posenc/train/trainer.h. AdamW with the
// schedule of schedule.h, global-norm clipping; the epoch's order depends on (seed, epoch) and a
// step's randomness on (seed, step) only, so a resumed run continues bit for bit. The pieces
// around the loop live beside it: schedule.h (settings, learning rate, parameter groups),
// checkpoint.h (save and resume), log.h (metrics.csv, comparison report), progress.h,
// run_folder.h (lock, names), tasks/registry.cpp (the tasks), compare.cpp (comparisons).
#include "posenc/train/trainer.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "log.h"
#include "posenc/config/config_reader.h"
#include "posenc/core/encoder.h"
#include "posenc/core/errors.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/plot.h"
#include "progress.h"
#include "run_folder.h"
#include "schedule.h"

namespace posenc::train {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_interrupted{false};

// SIGINT (Ctrl-C) and SIGTERM (what SLURM, Kubernetes and systemd send before a kill) both
// save a checkpoint at the end of the step and stop; a second signal kills at once.
extern "C" void on_interrupt(int) {
  g_interrupted = true;
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// The running sums of the log interval in progress, so a resumed run logs the same rows.
struct LogWindow {
  double loss_sum = 0, metric_sum = 0;
  int64_t loss_count = 0, metric_count = 0;
  at::Tensor to_tensor() const {
    return torch::tensor(
        {loss_sum, metric_sum, static_cast<double>(loss_count), static_cast<double>(metric_count)},
        torch::kDouble);
  }
  static LogWindow from_tensor(const at::Tensor& t) {
    auto a = t.accessor<double, 1>();
    return {a[0], a[1], static_cast<int64_t>(a[2]), static_cast<int64_t>(a[3])};
  }
  /// The metrics.csv row of the interval ending at `step`; starts the next interval.
  LogRow take_row(int64_t step, int64_t steps_per_epoch, double lr, const std::string& metric) {
    LogRow row{{"step", static_cast<double>(step)},
               {"epoch", static_cast<double>(step) / static_cast<double>(steps_per_epoch)},
               {"lr", lr},
               {"train_loss", loss_sum / static_cast<double>(loss_count)},
               {"train_" + metric, metric_count ? metric_sum / static_cast<double>(metric_count)
                                                : std::numeric_limits<double>::quiet_NaN()}};
    loss_sum = metric_sum = 0;
    loss_count = metric_count = 0;
    return row;
  }
};

// One optimizer step at learning rate lr on the batch `indices`; returns the loss (a non-finite
// loss is an error naming the run and the step).
double optimizer_step(Task& task, torch::optim::AdamW& optimizer, const TrainSettings& settings,
                      const at::Tensor& indices, double lr, double* metric, const std::string& name,
                      int64_t step) {
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  auto loss = task.train_loss(indices, metric);
  const double value = loss.item<double>();
  TORCH_CHECK(std::isfinite(value), name, ": the loss is ", value, " at step ", step,
              "; lower the learning rate");
  optimizer.zero_grad();
  loss.backward();
  if (settings.clip_grad_norm > 0)
    torch::nn::utils::clip_grad_norm_(task.model()->parameters(), settings.clip_grad_norm);
  optimizer.step();
  return value;
}

// Runs `what` with the task's model in eval mode and without gradients, then back to training.
template <typename Fn>
auto in_eval_mode(Task& task, Fn what) {
  auto model = task.model();
  model->eval();
  torch::NoGradGuard no_grad;
  auto result = what();
  model->train();
  return result;
}

Metrics evaluate(Task& task) {
  return in_eval_mode(task, [&task] { return task.evaluate(); });
}

std::string format_metric(double value) {
  std::ostringstream out;
  out << std::setprecision(4) << value;
  return out.str();
}

nlohmann::json metrics_json(const Metrics& metrics) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : metrics) out[k] = v;
  return out;
}

void write_curves(const std::string& path, const TrainingLog& log, const std::string& metric,
                  const std::string& title) {
  Panel loss{title + ": loss", "step", "loss", {}, false};
  loss.series.push_back({"train", log.column("step"), log.column("train_loss")});
  loss.series.push_back({"eval", log.column("step"), log.column("eval_loss")});
  Panel quality{title + ": " + metric, "step", metric, {}, false};
  auto train_metric = log.column("train_" + metric);
  if (std::any_of(train_metric.begin(), train_metric.end(),
                  [](double v) { return std::isfinite(v); })) {
    quality.series.push_back({"train", log.column("step"), train_metric});
  }
  quality.series.push_back({"eval", log.column("step"), log.column("eval_" + metric)});
  plot_panels(path, {loss, quality});
}

// summary.json: what the run reached, at what cost, with which encoder.
void write_summary(const RunResult& result, const nlohmann::json& config) {
  nlohmann::json summary = {{"name", result.name},
                            {"steps", result.steps},
                            {"seconds", result.seconds},
                            {"parameters", result.parameters},
                            {"metric", result.metric_name},
                            {"final", metrics_json(result.final_metrics)},
                            {"encoder", config.value("encoder", nlohmann::json(nullptr))}};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : result.generalization) {
    rows.push_back(
        {{"setting", row.setting}, {"x", row.x}, {"metrics", metrics_json(row.metrics)}});
  }
  summary["generalization"] = rows;
  write_file_atomically(result.output + "/summary.json", summary.dump(2) + "\n");
}

void print_result(const RunResult& result) {
  std::cout << result.name << ": " << result.steps << " steps in " << clock_text(result.seconds)
            << ", " << result.parameters << " parameters;";
  for (const auto& [k, v] : result.final_metrics) std::cout << " " << k << " " << format_metric(v);
  std::cout << "\n";
  for (const auto& row : result.generalization) {
    std::cout << "  " << row.setting << ":";
    for (const auto& [k, v] : row.metrics) std::cout << " " << k << " " << format_metric(v);
    std::cout << "\n";
  }
}

// The run's name, seed and output folder from the config's top level (unknown keys refused).
uint64_t read_identity(const nlohmann::json& config, const RunOptions& options, RunResult& result) {
  ConfigReader top(config, "config");
  result.name = top.string("name", "run");
  const int64_t seed = top.integer("seed", 0);
  TORCH_CHECK(seed >= 0, "config: 'seed' must be >= 0, got ", seed);
  const auto configured_output = top.string("output", "runs/" + result.name);
  result.output = options.output.empty() ? configured_output : options.output;
  for (const char* key :
       {"task", "model", "encoder", "train", "description", "runs", "default_run"}) {
    top.allow(key);
  }
  top.finish();
  return static_cast<uint64_t>(seed);
}

}  // namespace

RunResult run_training(const nlohmann::json& run_config, const RunOptions& options) {
  nlohmann::json config = run_config;
  for (const auto& assignment : options.overrides) apply_override(config, assignment);
  RunResult result;
  const uint64_t seed = read_identity(config, options, result);
  const auto settings = read_settings(config);
  if (settings.threads > 0) {
    at::set_num_threads(static_cast<int>(settings.threads));
  } else {
    use_all_cores();
  }
  check_run_name(result.name, "config");
  fs::create_directories(result.output);
  RunFolderLock lock(result.output);

  torch::manual_seed(seed);
  auto task = make_task(config);
  auto model = task->model();
  result.metric_name = task->metric_name();
  for (const auto& p : model->parameters()) result.parameters += p.numel();
  torch::optim::AdamW optimizer(parameter_groups(*model, settings.weight_decay, settings.lr));

  const auto counts = step_counts(settings, task->train_size());
  const int64_t steps_per_epoch = counts.steps_per_epoch, epochs = counts.epochs,
                total = counts.total;
  const std::string checkpoint = result.output + "/checkpoint.pt";
  const std::string csv = result.output + "/metrics.csv";
  const std::string config_text = config.dump();
  int64_t step = 0;
  double elapsed_before = 0;
  TrainingLog log;
  LogWindow window;
  if (options.resume && fs::exists(checkpoint)) {
    auto resumed = load_checkpoint(checkpoint, *model, optimizer, config_text);
    step = resumed.step;
    elapsed_before = resumed.elapsed;
    window = LogWindow::from_tensor(resumed.log_window);
    if (fs::exists(csv)) log.read_csv(csv, step);
    std::cerr << result.name << ": resuming at step " << step << " of " << total << "\n";
  }

  g_interrupted = false;
  auto previous_handler = std::signal(SIGINT, on_interrupt);
  auto previous_term_handler = std::signal(SIGTERM, on_interrupt);
  const auto begin = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  };
  ProgressBar bar(result.name, total, step, options.quiet);
  at::Tensor order;
  int64_t order_epoch = -1;
  auto& [loss_sum, metric_sum, loss_count, metric_count] = window;
  bool stopped = false;
  model->train();
  while (step < total) {
    const int64_t epoch = step / steps_per_epoch, in_epoch = step % steps_per_epoch;
    if (epoch != order_epoch) {  // the epoch's order depends on (seed, epoch) only
      torch::manual_seed(seed * 1000003 + static_cast<uint64_t>(epoch));
      order = torch::randperm(task->train_size(), torch::kLong);
      order_epoch = epoch;
    }
    torch::manual_seed(seed * 7919 + 1000000007ULL + static_cast<uint64_t>(step));
    const double lr = learning_rate(settings, step, total);
    double metric = std::numeric_limits<double>::quiet_NaN();
    auto indices = order.narrow(0, in_epoch * settings.batch_size, settings.batch_size);
    const double loss_value =
        optimizer_step(*task, optimizer, settings, indices, lr, &metric, result.name, step);
    ++step;
    loss_sum += loss_value;
    ++loss_count;
    if (std::isfinite(metric)) {
      metric_sum += metric;
      ++metric_count;
    }
    bar.update(step, epoch, epochs, loss_sum / loss_count,
               metric_count ? metric_sum / metric_count : metric, task->metric_name());
    const bool epoch_end = step % steps_per_epoch == 0 || step == total;
    const bool evaluate_now =
        (epoch_end && ((epoch + 1) % settings.eval_every == 0)) || step == total;
    if (step % settings.log_every == 0 || evaluate_now) {
      auto row = window.take_row(step, steps_per_epoch, lr, task->metric_name());
      if (evaluate_now) {
        auto metrics = evaluate(*task);
        std::ostringstream text;
        text << result.name << " step " << step << " eval:";
        for (const auto& [k, v] : metrics) {
          row.emplace_back("eval_" + k, v);
          text << " " << k << " " << format_metric(v);
        }
        bar.message(text.str());
      }
      row.emplace_back("elapsed_s", elapsed());
      log.add(row);
    }
    const bool stop = g_interrupted || (options.stop_after > 0 && step >= options.stop_after);
    if (evaluate_now || stop) {
      // The log rows first: a checkpoint never covers rows that are not on disk (resume truncates
      // metrics.csv to the checkpoint's step, so rows past it are neither lost nor doubled).
      log.write_csv(csv);
      save_checkpoint(checkpoint, *model, optimizer,
                      {step, elapsed(), window.to_tensor(), config_text});
      save_weights(result.output + "/weights.pt", *model);
      write_curves(result.output + "/curves.png", log, task->metric_name(), result.name);
    }
    if (stop && step < total) {
      stopped = true;
      break;
    }
  }
  bar.finish();
  std::signal(SIGINT, previous_handler == SIG_ERR ? SIG_DFL : previous_handler);
  std::signal(SIGTERM, previous_term_handler == SIG_ERR ? SIG_DFL : previous_term_handler);
  result.steps = step;
  result.seconds = elapsed();
  if (stopped) {
    std::cerr << result.name << ": stopped at step " << step << " of " << total
              << "; checkpoint saved to " << checkpoint << " (continue with --resume)\n";
    return result;
  }
  result.final_metrics = evaluate(*task);
  result.generalization = in_eval_mode(*task, [&task] { return task->generalization(); });
  result.finished = true;
  save_weights(result.output + "/weights.pt", *model);
  write_summary(result, config);
  print_result(result);
  return result;
}

}  // namespace posenc::train
