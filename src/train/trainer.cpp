// The training loop behind `posenc train`; contract in posenc/train/trainer.h.
//   lr(step) = lr * (step + 1) / warmup                                     step < warmup
//            = lr * (r + (1 - r) * (1 + cos(pi * (step - warmup) / (total - warmup))) / 2)  after
// (linear warmup, then cosine decay to r = min_lr_ratio; Loshchilov & Hutter 2017), AdamW
// (Loshchilov & Hutter 2019) with weight decay on matrices only, global-norm clipping.
#include "posenc/train/trainer.h"

#include <caffe2/serialize/inline_container.h>
#include <fcntl.h>
#include <sys/file.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "log.h"
#include "posenc/config/config_reader.h"
#include "posenc/core/encoder.h"
#include "posenc/core/errors.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/plot.h"

namespace posenc::train {

std::unique_ptr<Task> make_image_classification(const nlohmann::json& config);
std::unique_ptr<Task> make_language_model(const nlohmann::json& config);
std::unique_ptr<Task> make_forecast(const nlohmann::json& config);
std::unique_ptr<Task> make_video_classification(const nlohmann::json& config);
std::unique_ptr<Task> make_text_video_matching(const nlohmann::json& config);

namespace fs = std::filesystem;

std::vector<std::string> task_types() {
  return {"forecast", "image_classification", "language_model", "text_video_matching",
          "video_classification"};
}

std::unique_ptr<Task> make_task(const nlohmann::json& config) {
  TORCH_CHECK(config.contains("task") && config.at("task").is_object() &&
                  config.at("task").contains("type"),
              "config: a 'task' section with a 'type' is required");
  TORCH_CHECK(config.contains("model") && config.at("model").is_object(),
              "config: a 'model' section is required");
  const auto type = config.at("task").at("type").get<std::string>();
  if (type == "image_classification") return make_image_classification(config);
  if (type == "language_model") return make_language_model(config);
  if (type == "forecast") return make_forecast(config);
  if (type == "video_classification") return make_video_classification(config);
  if (type == "text_video_matching") return make_text_video_matching(config);
  std::string known;
  for (const auto& t : task_types()) known += (known.empty() ? "" : ", ") + t;
  TORCH_CHECK(false, "task: unknown type '", type, "'; known types: ", known);
}

namespace {

std::atomic<bool> g_interrupted{false};

// SIGINT (Ctrl-C) and SIGTERM (what SLURM, Kubernetes and systemd send before a kill) both
// save a checkpoint at the end of the step and stop; a second signal kills at once.
extern "C" void on_interrupt(int) {
  g_interrupted = true;
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

constexpr int64_t kMaxThreads = 1024;  // intra-op threads a run may ask for

// One run per folder at a time: an advisory flock on <folder>/.posenc.lock, held for the run's
// life (released by the kernel if the process dies). A second run is refused with the PID of
// the first, which the lock file holds.
class RunFolderLock {
 public:
  explicit RunFolderLock(const std::string& folder) {
    const std::string path = folder + "/.posenc.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int why = errno;
      const std::string message = "cannot open '" + path + "': " + std::strerror(why);
      if (is_environment_errno(why)) throw EnvironmentError(message);
      TORCH_CHECK(false, message);
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char holder[32] = {0};
      const auto n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      ::close(fd_);
      std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "unknown";
      while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
      TORCH_CHECK(false, "'", folder, "' is in use by another posenc run (PID ", pid,
                  "); wait for it to finish, or train into another folder (--out)");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0) {
      [[maybe_unused]] auto written = ::pwrite(fd_, pid.data(), pid.size(), 0);
    }
  }
  ~RunFolderLock() { ::close(fd_); }
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  int fd_ = -1;
};

// Run and comparison entry names become folder names: one path component, no '..'.
void check_run_name(const std::string& name, const std::string& where) {
  TORCH_CHECK(!name.empty() && name.size() <= 128 && name != "." && name != ".." &&
                  name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
                  name.find('\0') == std::string::npos && name.front() != '-',
              where, ": run name '", name,
              "' must be 1 to 128 characters, not start with '-', and hold no '/', '\\' or '..' "
              "(it names a folder)");
}

struct TrainSettings {
  int64_t epochs = 1, batch_size = 64, warmup_steps = 0, max_steps = 0, log_every = 50;
  int64_t eval_every = 1, threads = 0;
  double lr = 1e-3, min_lr_ratio = 0.0, weight_decay = 0.05, clip_grad_norm = 1.0;
};

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
  r.finish();
  TORCH_CHECK(s.epochs >= 1 && s.batch_size >= 1 && s.log_every >= 1 && s.eval_every >= 1,
              "train: epochs, batch_size, log_every and eval_every must be >= 1, got ", s.epochs,
              ", ", s.batch_size, ", ", s.log_every, ", ", s.eval_every);
  TORCH_CHECK(s.threads >= 0 && s.threads <= kMaxThreads,
              "train: 'threads' must be 0 (all cores) or 1 to ", kMaxThreads, ", got ", s.threads);
  TORCH_CHECK(s.lr > 0 && s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1 && s.warmup_steps >= 0 &&
                  s.max_steps >= 0 && s.weight_decay >= 0 && s.clip_grad_norm >= 0,
              "train: lr must be > 0, min_lr_ratio in [0, 1], the others >= 0");
  return s;
}

double learning_rate(const TrainSettings& s, int64_t step, int64_t total) {
  if (step < s.warmup_steps) {
    return s.lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const double span = static_cast<double>(std::max<int64_t>(1, total - s.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - s.warmup_steps) / span);
  return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress)));
}

std::string clock_text(double seconds) {
  const auto total = static_cast<int64_t>(std::max(0.0, seconds));
  std::ostringstream out;
  if (total >= 3600) out << total / 3600 << ":" << std::setw(2) << std::setfill('0');
  out << (total / 60) % 60 << ":" << std::setw(2) << std::setfill('0') << total % 60;
  return out.str();
}

// A one-line progress bar on stderr (redrawn in place on a terminal, a line every 10% else).
class ProgressBar {
 public:
  ProgressBar(std::string name, int64_t total, int64_t start, bool quiet)
      : name_(std::move(name)),
        total_(total),
        start_(start),
        quiet_(quiet),
        tty_(isatty(fileno(stderr)) != 0),
        begin_(std::chrono::steady_clock::now()) {}

  void update(int64_t step, int64_t epoch, int64_t epochs, double loss, double metric,
              const std::string& metric_name) {
    if (quiet_) return;
    const double seconds = elapsed();
    const auto now_decile = (step * 10) / std::max<int64_t>(1, total_);
    if (!tty_ && now_decile == last_decile_ && step != total_) return;
    if (tty_ && seconds - last_draw_ < 0.2 && step != total_) return;
    last_decile_ = now_decile;
    last_draw_ = seconds;
    const double rate = static_cast<double>(step - start_) / std::max(1e-9, seconds);
    const double eta = static_cast<double>(total_ - step) / std::max(1e-9, rate);
    constexpr int kCells = 24;
    const int filled = static_cast<int>(kCells * step / std::max<int64_t>(1, total_));
    std::ostringstream line;
    line << name_ << " epoch " << epoch + 1 << "/" << epochs << " [" << std::string(filled, '#')
         << std::string(kCells - filled, '.') << "] " << step << "/" << total_ << " " << std::fixed
         << std::setprecision(1) << rate << " it/s ETA " << clock_text(eta) << " loss "
         << std::setprecision(4) << loss;
    if (std::isfinite(metric)) line << " " << metric_name << " " << std::setprecision(3) << metric;
    if (tty_) {
      std::cerr << "\r" << line.str() << "\033[K" << std::flush;
    } else {
      std::cerr << line.str() << "\n";
    }
  }
  void message(const std::string& text) {
    if (quiet_) return;
    if (tty_) std::cerr << "\r\033[K";
    std::cerr << text << "\n";
  }
  void finish() {
    if (!quiet_ && tty_) std::cerr << "\n";
  }

 private:
  double elapsed() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin_).count();
  }
  std::string name_;
  int64_t total_, start_;
  bool quiet_, tty_;
  std::chrono::steady_clock::time_point begin_;
  int64_t last_decile_ = -1;
  double last_draw_ = -1;
};

// Parameters in two AdamW groups: matrices decay, vectors (biases, norms, tokens) do not.
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
};

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

}  // namespace

RunResult run_training(const nlohmann::json& run_config, const RunOptions& options) {
  nlohmann::json config = run_config;
  for (const auto& assignment : options.overrides) apply_override(config, assignment);
  ConfigReader top(config, "config");
  RunResult result;
  result.name = top.string("name", "run");
  const int64_t seed_value = top.integer("seed", 0);
  TORCH_CHECK(seed_value >= 0, "config: 'seed' must be >= 0, got ", seed_value);
  const auto seed = static_cast<uint64_t>(seed_value);
  const auto configured_output = top.string("output", "runs/" + result.name);
  result.output = options.output.empty() ? configured_output : options.output;
  for (const char* key :
       {"task", "model", "encoder", "train", "description", "runs", "default_run"}) {
    top.allow(key);
  }
  top.finish();
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

  const int64_t steps_per_epoch = std::max<int64_t>(1, task->train_size() / settings.batch_size);
  const int64_t epochs = settings.max_steps > 0
                             ? (settings.max_steps + steps_per_epoch - 1) / steps_per_epoch
                             : settings.epochs;
  const int64_t total = settings.max_steps > 0 ? settings.max_steps : epochs * steps_per_epoch;
  const std::string checkpoint = result.output + "/checkpoint.pt";
  const std::string csv = result.output + "/metrics.csv";
  const std::string config_text = config.dump();
  int64_t step = 0;
  double elapsed_before = 0;
  TrainingLog log(task->metric_name());
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
    for (auto& group : optimizer.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    }
    double metric = std::numeric_limits<double>::quiet_NaN();
    auto indices = order.narrow(0, in_epoch * settings.batch_size, settings.batch_size);
    auto loss = task->train_loss(indices, &metric);
    const double loss_value = loss.item<double>();
    TORCH_CHECK(std::isfinite(loss_value), result.name, ": the loss is ", loss_value, " at step ",
                step, "; lower the learning rate");
    optimizer.zero_grad();
    loss.backward();
    if (settings.clip_grad_norm > 0) {
      torch::nn::utils::clip_grad_norm_(model->parameters(), settings.clip_grad_norm);
    }
    optimizer.step();
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
      LogRow row{
          {"step", static_cast<double>(step)},
          {"epoch", static_cast<double>(step) / static_cast<double>(steps_per_epoch)},
          {"lr", lr},
          {"train_loss", loss_sum / loss_count},
          {"train_" + task->metric_name(),
           metric_count ? metric_sum / metric_count : std::numeric_limits<double>::quiet_NaN()}};
      loss_sum = metric_sum = 0;
      loss_count = metric_count = 0;
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
  std::cout << result.name << ": " << result.steps << " steps in " << clock_text(result.seconds)
            << ", " << result.parameters << " parameters;";
  for (const auto& [k, v] : result.final_metrics) std::cout << " " << k << " " << format_metric(v);
  std::cout << "\n";
  for (const auto& row : result.generalization) {
    std::cout << "  " << row.setting << ":";
    for (const auto& [k, v] : row.metrics) std::cout << " " << k << " " << format_metric(v);
    std::cout << "\n";
  }
  return result;
}

nlohmann::json select_run(const nlohmann::json& config, const std::string& run) {
  nlohmann::json base = config;
  base.erase("runs");
  std::string wanted = run;
  if (wanted.empty() && base.contains("default_run")) wanted = base.at("default_run");
  base.erase("default_run");
  if (wanted.empty()) return base;
  TORCH_CHECK(config.contains("runs") && config.at("runs").is_array(),
              "config: no 'runs' list, so there is no run '", wanted, "'");
  std::string known;
  for (const auto& entry : config.at("runs")) {
    ConfigReader r(entry, "runs entry");
    const auto name = r.string("name", "");
    TORCH_CHECK(!name.empty(), "config: every entry of 'runs' needs a 'name'");
    known += (known.empty() ? "" : ", ") + name;
    if (name != wanted) continue;
    if (auto encoder = r.object("encoder")) base["encoder"] = *encoder;
    if (auto overrides = r.object("overrides")) base.merge_patch(*overrides);
    r.finish();
    const std::string parent =
        config.value("output", "runs/" + config.value("name", std::string("run")));
    base["name"] = name;
    base["output"] = parent + "/" + name;
    return base;
  }
  TORCH_CHECK(false, "config: no run named '", wanted, "'; the runs are: ", known);
}

void apply_override(nlohmann::json& config, const std::string& assignment) {
  const auto equals = assignment.find('=');
  TORCH_CHECK(equals != std::string::npos && equals > 0, "--set '", assignment,
              "': expected key.path=value");
  const auto path = assignment.substr(0, equals);
  const auto text = assignment.substr(equals + 1);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    value = text;  // a bare word is a string
  }
  nlohmann::json* node = &config;
  std::istringstream parts(path);
  std::string part;
  std::vector<std::string> keys;
  while (std::getline(parts, part, '.')) keys.push_back(part);
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    if (!node->contains(keys[i]) || !(*node)[keys[i]].is_object())
      (*node)[keys[i]] = nlohmann::json::object();
    node = &(*node)[keys[i]];
  }
  (*node)[keys.back()] = value;
}

std::string comparison_folder(const nlohmann::json& config, const RunOptions& options) {
  if (!options.output.empty()) return options.output;
  return config.value("output", "runs/" + config.value("name", std::string("compare")));
}

std::vector<std::string> comparison_entries(const nlohmann::json& config) {
  TORCH_CHECK(config.contains("runs") && config.at("runs").is_array() && !config.at("runs").empty(),
              "compare: the config needs a non-empty 'runs' list");
  std::vector<std::string> names;
  for (const auto& entry : config.at("runs")) {
    TORCH_CHECK(entry.is_object() && entry.contains("name") && entry.at("name").is_string(),
                "config: every entry of 'runs' needs a 'name' (a string)");
    const auto name = entry.at("name").get<std::string>();
    check_run_name(name, "config: runs");
    TORCH_CHECK(std::find(names.begin(), names.end(), name) == names.end(),
                "config: runs: two entries are named '", name, "'; each needs its own name");
    names.push_back(name);
  }
  return names;
}

RunResult read_run_result(const std::string& output) {
  const std::string path = output + "/summary.json";
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "compare: no '", path, "' (the run did not finish)");
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "compare: '", path, "' is not valid JSON: ", e.what());
  }
  RunResult r;
  r.name = summary.at("name").get<std::string>();
  r.output = output;
  r.finished = true;
  r.steps = summary.at("steps").get<int64_t>();
  r.seconds = summary.at("seconds").get<double>();
  r.parameters = summary.at("parameters").get<int64_t>();
  r.metric_name = summary.at("metric").get<std::string>();
  for (const auto& [k, v] : summary.at("final").items())
    r.final_metrics.emplace_back(k, v.get<double>());
  for (const auto& row : summary.at("generalization")) {
    GeneralizationRow g;
    g.setting = row.at("setting").get<std::string>();
    g.x = row.at("x").get<double>();
    for (const auto& [k, v] : row.at("metrics").items()) g.metrics.emplace_back(k, v.get<double>());
    r.generalization.push_back(g);
  }
  return r;
}

std::vector<RunResult> run_comparison(const nlohmann::json& config, const RunOptions& options) {
  const auto entries = comparison_entries(config);
  const std::string folder = comparison_folder(config, options);
  fs::create_directories(folder);
  std::vector<RunResult> results;
  for (const auto& run : entries) {
    auto run_config = select_run(config, run);
    run_config["output"] = folder + "/" + run;
    RunOptions run_options = options;
    run_options.output = folder + "/" + run;
    results.push_back(run_training(run_config, run_options));
    if (!results.back().finished) break;  // interrupted: keep what finished
  }
  write_comparison(folder, config.value("name", std::string("compare")), results);
  return results;
}

}  // namespace posenc::train
