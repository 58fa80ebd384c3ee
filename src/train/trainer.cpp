// `posenc train`: a run config in, a trained model and its run folder out; contract in
// posenc/train/trainer.h. This file opens the run (identity, settings, threads, folder lock, task,
// optimizer), resumes it, hands it to the loop and writes the summary. The pieces live beside it:
// loop.h (the training loop, signals, evaluation), schedule.h (settings, learning rate, parameter
// groups), checkpoint.h (save and resume), log.h (metrics.csv, comparison report), summary.h
// (curves, summary.json, printed result), progress.h, run_folder.h (lock, names),
// tasks/task_registry.cpp (the tasks), compare.cpp (comparisons).
#include "posenc/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <set>
#include <thread>

#include "device.h"
#include "loop.h"
#include "posenc/config/config_reader.h"
#include "posenc/core/encoder.h"
#include "posenc/core/errors.h"
#include "posenc/core/threads.h"
#include "posenc/io/durable_file.h"
#include "posenc/io/input_digest.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/fused_adamw.h"
#include "posenc/version.h"
#include "summary.h"

namespace posenc::train {

namespace fs = std::filesystem;

namespace {

// The top level of a run config (unknown keys refused): name, seed, output folder, and where its
// parameters come from.
struct Identity {
  uint64_t seed = 0;
  std::string init_from;  ///< resolved weights path ("" for a fresh start)
  bool evaluate_only = false;
};

Identity read_identity(const nlohmann::json& config, const RunOptions& options, RunResult& result) {
  ConfigReader top(config, "config");
  Identity identity;
  result.name = top.string("name", "run");
  const int64_t seed = top.integer("seed", 0);
  TORCH_CHECK(seed >= 0, "config: 'seed' must be >= 0, got ", seed);
  identity.seed = static_cast<uint64_t>(seed);
  const auto configured_output = top.string("output", "runs/" + result.name);
  result.output = options.output.empty() ? configured_output : options.output;
  const auto from = top.string("init_from", "");
  identity.evaluate_only = top.boolean("evaluate_only", false);
  for (const char* key :
       {"task", "model", "encoder", "train", "description", "runs", "default_run"}) {
    top.allow(key);
  }
  top.finish();
  // --init-from wins over the config's; an entry name is resolved next to this run's folder.
  if (!options.init_from.empty()) {
    identity.init_from = options.init_from;
  } else if (!from.empty()) {
    identity.init_from = resolve_init_from(from, result.output);
    TORCH_CHECK(!is_entry_reference(from) || fs::exists(identity.init_from), "config: init_from '",
                from, "': no '", identity.init_from, "' (the entry '", from,
                "' must finish training first; `posenc compare` runs the entries in order)");
  }
  TORCH_CHECK(!identity.evaluate_only || !identity.init_from.empty(), "config: run '", result.name,
              "': evaluate_only needs weights to evaluate (init_from: an entry or a weights.pt)");
  return identity;
}

// Intra-op threads: train.threads; else, for one rank of several, the cores shared by the ranks
// on this machine unless OMP_NUM_THREADS says otherwise (torchrun sets it to 1), as a PyTorch job
// runs; else every core.
void use_threads(const TrainSettings& settings, const DistributedOptions& distributed) {
  if (settings.threads > 0) {
    at::set_num_threads(static_cast<int>(settings.threads));
  } else if (distributed.world_size > 1) {
    const char* omp = std::getenv("OMP_NUM_THREADS");
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int threads = omp != nullptr && std::atoi(omp) > 0
                            ? std::atoi(omp)
                            : std::max(1, cores / distributed.local_world_size);
    at::set_num_threads(threads);
  } else {
    use_all_cores();
  }
}

// The model's parameters and buffers moved to `device` (the seeded initialization happened on
// the CPU, so a run starts from the same weights on every device); the task told.
void place_on_device(Task& task, c10::Device device) {
  task.set_device(device);
  if (device.is_cpu()) return;
  task.model()->to(device);
}

// Where the model's parameters are, as summary.json reports it (read off the tensors, not the
// config: what a run says is where it ran).
std::string model_device(torch::nn::Module& model) {
  const auto params = model.parameters();
  return params.empty() ? "cpu" : params.front().device().str();
}

void check_batch_split(const TrainSettings& settings, int world) {
  TORCH_CHECK(settings.batch_size % world == 0, "train: batch_size (", settings.batch_size,
              ") must be a multiple of the number of ranks (", world,
              "): each rank takes batch_size / ranks examples of every batch");
}

// A classifier's class names, label order, into the run folder (classes.json: a JSON array).
void write_class_names(const Task& task, const std::string& output) {
  const auto names = task.class_names();
  if (!names.empty()) write_file_atomically(output + "/classes.json", nlohmann::json(names).dump());
}

// Everything a run holds before its first step; the folder is locked for the run's life (by rank
// 0 alone in a data-parallel run: the other ranks write nothing).
Run open_run(const nlohmann::json& config, const RunOptions& options, RunResult& result,
             std::shared_ptr<DataParallel> ranks) {
  Run run;
  run.ranks = std::move(ranks);
  const auto identity = read_identity(config, options, result);
  run.seed = identity.seed;
  run.settings = read_settings(config);
  check_settings_can_train(run.settings);
  const int world = run.ranks->world_size();
  check_batch_split(run.settings, world);
  run.rank_batch = run.settings.batch_size / world;
  use_threads(run.settings, options.distributed);
  check_run_name(result.name, "config");
  run.name = result.name;
  run.output = result.output;
  if (run.ranks->lead()) {
    fs::create_directories(run.output);
    run.lock = std::make_unique<RunFolderLock>(run.output);
  }
  run.checkpoint = run.output + "/checkpoint.pt";
  run.csv = run.output + "/metrics.csv";
  run.config_text = config.dump();
  torch::manual_seed(run.seed);
  run.task = make_task(config);
  if (run.ranks->lead()) {
    write_class_names(*run.task, run.output);
    // the resolved config, for `posenc export RUN` (posenc/train/export_timm.h)
    write_file_atomically(run.output + "/config.json", config.dump(2) + "\n");
  }
  auto model = run.task->model();
  // before the optimizer and the weight average take their tensors
  place_on_device(*run.task, run.ranks->device());
  if (!identity.init_from.empty()) load_parameters(identity.init_from, *model);
  result.metric_name = run.task->metric_name();
  for (const auto& p : model->parameters()) result.parameters += p.numel();
  result.device = model_device(*model);
  auto groups = parameter_groups(*model, run.settings.weight_decay, run.settings.lr);
  if (run.settings.fused_optimizer)
    run.optimizer = std::make_unique<FusedAdamW>(std::move(groups));
  else
    run.optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups));
  if (run.settings.ema_decay > 0)
    run.ema = std::make_unique<WeightAverage>(*model, run.settings.ema_decay);
  run.counts = step_counts(run.settings, run.task->train_size());
  if (run.ranks->active()) {
    auto* group = run.ranks.get();
    run.task->set_ranks({run.ranks->rank(), world, [group](std::vector<double> sums) {
                           return group->sum(std::move(sums), "evaluation");
                         }});
  }
  return run;
}

// With --resume and a checkpoint: the model, optimizer, step, clock, log window and log rows.
LoopState resume(Run& run, const RunOptions& options) {
  LoopState state;
  if (!options.resume || !fs::exists(run.checkpoint)) return state;
  auto resumed =
      load_checkpoint(run.checkpoint, *run.task->model(), *run.optimizer, run.config_text);
  state.step = resumed.step;
  state.elapsed = resumed.elapsed;
  state.window = LogWindow::from_tensor(resumed.log_window);
  if (run.ema) {
    TORCH_CHECK(!resumed.ema.empty(), "resume: '", run.checkpoint,
                "' holds no weight average but train.ema_decay is set; start afresh");
    run.ema->load(resumed.ema, run.checkpoint);
  }
  if (run.ranks->lead() && fs::exists(run.csv)) state.log.read_csv(run.csv, state.step);
  if (run.ranks->lead())
    std::cerr << run.name << ": resuming at step " << state.step << " of " << run.counts.total
              << "\n";
  return state;
}

// A data-parallel run starts every rank from rank 0's weights, at the same step; then the
// gradients of every backward are averaged across the ranks.
// The first key (a dotted path) where two configs differ, with both values.
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b,
                             const std::string& path) {
  if (a.is_object() && b.is_object()) {
    std::set<std::string> keys;
    for (const auto& item : a.items()) keys.insert(item.key());
    for (const auto& item : b.items()) keys.insert(item.key());
    for (const auto& k : keys) {
      const std::string at = path.empty() ? k : path + "." + k;
      if (!a.contains(k) || !b.contains(k))
        return "'" + at + "': " + (a.contains(k) ? a[k].dump() : "absent") + " vs " +
               (b.contains(k) ? b[k].dump() : "absent");
      if (a[k] != b[k]) return first_difference(a[k], b[k], at);
    }
    return "";
  }
  auto shown = [](const nlohmann::json& v) {
    auto text = v.dump();
    return text.size() > 60 ? text.substr(0, 57) + "..." : text;
  };
  return "'" + (path.empty() ? std::string("(the config)") : path) + "': " + shown(a) + " vs " +
         shown(b);
}

// Before any tensor moves, the ranks agree on what they compute: the run config as a resume
// compares it (seed, model, task, train, data) and posenc's version. A mismatch is bad input
// (exit 2) on every rank, naming the first key that differs; without this, ranks with other
// seeds trained apart and exited 0, and ranks with other model shapes died inside Gloo.
void agree_on_the_config(Run& run) {
  auto mine = nlohmann::json::parse(run_config_for_comparison(run.config_text));
  mine["(posenc version)"] = POSENC_VERSION;  // a key of its own: named like any other difference
  // how the gradients are all-reduced: a resume may change it, but every rank must do the same
  // (ranks that disagree wait on different collectives until the rank timeout)
  const auto& s = run.settings;
  mine["train.gradient_sync"] = s.gradient_sync;
  mine["train.bucket_mb"] = s.bucket_mb;
  mine["train.find_unused_parameters"] = s.find_unused_parameters;
  // what was read: the data's bytes (posenc/io/input_digest.h), so a rank given other data
  // (another POSENC_DATA_DIR) is refused instead of training apart
  mine["(data read: bytes:hash)"] = input_digest();
  const auto all = run.ranks->gather_text("config", mine.dump(), "agreeing on the run config");
  const int64_t me = run.ranks->rank();
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::string why = "differs";
    try {
      why += " at " +
             first_difference(nlohmann::json::parse(all[r]), nlohmann::json::parse(all[0]), "");
    } catch (const nlohmann::json::exception&) {  // not a posenc rank's text
    }
    TORCH_CHECK(false, run.name, ": rank ", me, ": rank ", r, "'s config ", why, " (rank ", r,
                "'s value first); every rank must run the same config with the same posenc; "
                "nothing was trained");
  }
}

void join_ranks(Run& run, const LoopState& state) {
  auto& ranks = *run.ranks;
  if (!ranks.active()) return;
  agree_on_the_config(run);
  const auto steps = ranks.gather(state.step, "agreeing on the step to start from");
  for (size_t r = 0; r < steps.size(); ++r) {
    if (steps[r] == steps[0]) continue;
    throw EnvironmentError(run.name + ": rank " + std::to_string(r) + " starts at step " +
                           std::to_string(steps[r]) + " but rank 0 at step " +
                           std::to_string(steps[0]) + "; every rank resumes from '" +
                           run.checkpoint + "', which must be in a folder they all read");
  }
  auto& model = *run.task->model();
  ranks.broadcast_module(model);
  const auto& s = run.settings;
  ranks.sync_gradients(model, gradient_sync_from_string(s.gradient_sync),
                       static_cast<int64_t>(s.bucket_mb * 1024 * 1024), s.find_unused_parameters);
}

RunResult train_run(const nlohmann::json& config, RunOptions options,
                    std::shared_ptr<DataParallel> ranks) {
  RunResult result;
  const bool lead = ranks->lead();
  if (!lead) options.quiet = true;  // one progress bar: rank 0's
  Run run = open_run(config, options, result, ranks);
  LoopState state = resume(run, options);
  join_ranks(run, state);
  const bool finished = train_loop(run, state, options);
  result.steps = state.step;
  result.seconds = state.elapsed;
  result.world_size = ranks->world_size();
  if (!finished) {
    if (lead)
      std::cerr << run.name << ": stopped at step " << state.step << " of " << run.counts.total
                << "; checkpoint saved to " << run.checkpoint << " (continue with --resume)\n";
    return result;
  }
  {
    WeightAverage::Swap averaged(run.ema.get());  // with train.ema_decay: the average's results
    // the loop's evaluation at the last step when it ran (not when resumed at the end)
    result.final_metrics = state.final_eval.empty() ? evaluate(*run.task) : state.final_eval;
    result.generalization = generalization(*run.task);
    result.details = run.task->details();
    if (ranks->active())
      result.rank_checksums =
          ranks->gather(weights_checksum(*run.task->model()), "comparing the final weights");
    if (lead) save_weights(run.output + "/weights.pt", *run.task->model());
  }
  result.finished = true;
  if (lead) {
    write_summary(result, config);
    print_result(result);
  }
  return result;
}

}  // namespace

void check_run_config(const nlohmann::json& run_config, const std::vector<std::string>& overrides,
                      int world_size) {
  nlohmann::json config = run_config;
  for (const auto& assignment : overrides) apply_override(config, assignment);
  const auto settings = read_settings(config);
  check_settings_can_train(settings);
  check_batch_split(settings, world_size);
  check_device_setting(settings.device, world_size);
}

namespace {

// The model of `config` with the parameters its init_from names (or options.init_from),
// evaluated; summary.json into the run's output folder (+ suffix).
RunResult evaluate_weights(const nlohmann::json& config, const RunOptions& options,
                           const std::string& suffix) {
  RunResult result;
  const auto identity = read_identity(config, options, result);
  result.output += suffix;
  const auto settings = read_settings(config);
  const auto device = training_device(settings.device, DistributedOptions{});  // before any file
  use_threads(settings, DistributedOptions{});
  check_run_name(result.name, "config");
  fs::create_directories(result.output);
  RunFolderLock lock(result.output);
  torch::manual_seed(identity.seed);
  auto task = make_task(config);
  check_class_names(task->class_names(), identity.init_from);  // before classes.json is written
  write_class_names(*task, result.output);
  if (const auto names = task->class_names(); !names.empty()) {
    std::cout << result.name << ": " << names.size() << " classes:";
    for (size_t i = 0; i < names.size(); ++i) std::cout << (i ? ", " : " ") << i << " " << names[i];
    std::cout << "\n";
  }
  auto model = task->model();
  place_on_device(*task, device);
  load_parameters(identity.init_from, *model);
  result.metric_name = task->metric_name();
  for (const auto& p : model->parameters()) result.parameters += p.numel();
  result.device = model_device(*model);
  result.final_metrics = evaluate(*task);  // seconds stays 0: the time columns are training's
  result.generalization = generalization(*task);
  result.details = task->details();
  result.finished = true;
  write_summary(result, config);
  print_result(result);
  return result;
}

}  // namespace

RunResult run_evaluation(const nlohmann::json& run_config, const RunOptions& options,
                         const std::string& weights) {
  nlohmann::json config = run_config;
  for (const auto& assignment : options.overrides) apply_override(config, assignment);
  RunOptions from_weights = options;
  from_weights.init_from = weights;
  // never over the run's own summary.json unless --out says where
  return evaluate_weights(config, from_weights, options.output.empty() ? "/eval" : "");
}

at::Tensor classify_image_files(const nlohmann::json& run_config, const RunOptions& options,
                                const std::string& weights, const std::vector<std::string>& files,
                                std::vector<std::string>* classes) {
  nlohmann::json config = run_config;
  for (const auto& assignment : options.overrides) apply_override(config, assignment);
  const auto settings = read_settings(config);
  const auto device = training_device(settings.device, DistributedOptions{});
  use_threads(settings, DistributedOptions{});
  auto task = make_task(config);
  check_class_names(task->class_names(), weights);
  auto model = task->model();
  place_on_device(*task, device);
  load_parameters(weights, *model);
  if (classes) *classes = task->class_names();
  model->eval();
  torch::NoGradGuard no_grad;
  return task->classify_files(files).to(torch::kCPU);
}

RunResult run_training(const nlohmann::json& run_config, const RunOptions& options) {
  nlohmann::json config = run_config;
  for (const auto& assignment : options.overrides) apply_override(config, assignment);
  if (config.contains("evaluate_only") && config.at("evaluate_only").is_boolean() &&
      config.at("evaluate_only").get<bool>()) {
    TORCH_CHECK(options.distributed.world_size == 1, "config: run '",
                config.value("name", std::string("run")),
                "' is evaluate_only: run it in one process, not as one rank of ",
                options.distributed.world_size);
    return evaluate_weights(config, options, "");
  }
  // a stop signal from here to the first step ends the process at once (one line, exit 130)
  StopSignals stop_signals(options.distributed.rank == 0);
  std::shared_ptr<DataParallel> ranks;
  {
    const auto settings = read_settings(config);
    check_settings_can_train(settings);
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(settings.rank_timeout_s * 1000));
    ranks = std::make_shared<DataParallel>(options.distributed, timeout,
                                           training_device(settings.device, options.distributed));
  }
  try {
    return train_run(config, options, ranks);
  } catch (const std::exception& e) {  // the other ranks quote it instead of "lost rank"
    ranks->report_failure(e.what());
    throw;
  }
}

}  // namespace posenc::train
