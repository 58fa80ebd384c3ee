// The training loop; contract in loop.h.
#include "loop.h"

#include <ATen/record_function.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "posenc/io/durable_file.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/train/checkpoint.h"
#include "posenc/train/fused_adamw.h"
#include "precision.h"
#include "profile.h"
#include "progress.h"
#include "summary.h"

namespace posenc::train {

namespace {

std::atomic<bool> g_interrupted{false};

// The stop grace limit: a step (or an evaluation) still under way this long after the signal
// (a step of a 10^6-token context runs for minutes) ends the process at once, as a kill would.
// Nothing is lost that a kill -9 would not lose: every file is replaced atomically, and --resume
// continues from the last checkpoint. POSENC_STOP_GRACE (seconds, 1 to 3600) overrides it.
constexpr unsigned kStopGraceSeconds = 30;
unsigned g_grace_seconds = kStopGraceSeconds;

unsigned stop_grace_seconds() {
  const char* text = std::getenv("POSENC_STOP_GRACE");
  if (text == nullptr || *text == '\0') return kStopGraceSeconds;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  TORCH_CHECK(*end == '\0' && value >= 1 && value <= 3600,
              "POSENC_STOP_GRACE must be a whole number of seconds from 1 to 3600, got '", text,
              "'");
  return static_cast<unsigned>(value);
}

// SIGALRM, armed by the first stop signal: the step did not end within the grace. write(2) and
// _exit are async-signal-safe; the exit code is the one of a run stopped by a signal.
extern "C" void on_grace_over(int) {
  constexpr char kLine[] =
      "posenc: stopped: no step ended within the stop grace (POSENC_STOP_GRACE) after the "
      "signal; the steps since the last checkpoint are not saved: --resume continues from it, if "
      "one was saved\n";
  [[maybe_unused]] const auto written = write(2, kLine, sizeof kLine - 1);
  _exit(130);
}

// Where the run stands, for the one handler of SIGINT, SIGTERM and SIGHUP (on_stop_signal).
enum StopPhase : int {
  kOutside = 0,  ///< no StopSignals scope: the default action (as before any run)
  kPreparing,    ///< before the first step: exit at once
  kTraining,     ///< in train_loop: stop after the step, saving a checkpoint
  kFinishing,    ///< after the loop (final evaluation, weights, summary): the default action
};
std::atomic<int> g_phase{kOutside};
std::atomic<bool> g_speaks{true};  // whether this process writes the preparation stop line
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<bool>::is_always_lock_free,
              "the signal handler reads them");

// The line of a stop before the first step, per signal (a handler cannot format one).
template <size_t N>
void write_line(const char (&line)[N]) {
  [[maybe_unused]] const auto written = write(2, line, N - 1);
}
void write_preparation_stop(int signal) {
  constexpr char kTail[] =
      " before the first step; nothing was trained or saved (run it again, with --resume to "
      "continue from the last checkpoint if it has one)\n";
  if (signal == SIGINT)
    write_line("posenc: stopped: SIGINT (Ctrl-C)");
  else if (signal == SIGTERM)
    write_line("posenc: stopped: SIGTERM");
  else
    write_line("posenc: stopped: SIGHUP (the terminal or the launching posenc is gone)");
  write_line(kTail);
}

// SIGINT (Ctrl-C) and SIGTERM (what SLURM, Kubernetes and systemd send before a kill) in the loop
// both save a checkpoint at the end of the step and stop; a second signal kills at once, and so
// does the end of the stop grace.
void on_interrupt() {
  if (!g_interrupted.exchange(true)) alarm(g_grace_seconds);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
}

// SIGHUP: the terminal or the posenc that started this run is gone (a child of `train --nproc` or
// `compare --jobs` gets it when its parent dies: PR_SET_PDEATHSIG, which the kernel may deliver
// more than once); save and stop, however many arrive (the grace is armed once).
void on_hangup() {
  if (!g_interrupted.exchange(true)) alarm(g_grace_seconds);
}

// Before the first step (reading and decoding the data, building the model, reading a
// checkpoint, waiting for the other ranks at the rendezvous or the agreement) nothing has been
// trained that a stop could save and nothing is being written but the folder's lock, so a stop
// signal ends the process at once: one line, exit 130 as a stop in the loop. Waiting for the
// preparation to end instead could take minutes (a large data set, a rank that never comes:
// train.rank_timeout_s). write(2) and _exit are async-signal-safe.
extern "C" void on_stop_signal(int signal) {
  switch (g_phase.load()) {
    case kPreparing:
      if (g_speaks.load()) write_preparation_stop(signal);
      _exit(130);
    case kTraining:
      if (signal == SIGHUP)
        on_hangup();
      else
        on_interrupt();
      return;
    default:  // outside the scopes, or after the loop: what the signal did before posenc handled it
      std::signal(signal, SIG_DFL);
      raise(signal);
  }
}

using Handler = void (*)(int);
Handler install(int signal, Handler handler) {
  const Handler previous = std::signal(signal, handler);
  return previous == SIG_ERR ? SIG_DFL : previous;
}

// Installs the handlers for the loop's life and restores the previous ones after.
class InterruptScope {
 public:
  InterruptScope() {
    g_interrupted = false;
    g_grace_seconds = stop_grace_seconds();
    alarm_ = install(SIGALRM, on_grace_over);
    phase_ = g_phase.exchange(kTraining);
    int_ = install(SIGINT, on_stop_signal);
    term_ = install(SIGTERM, on_stop_signal);
    hup_ = install(SIGHUP, on_stop_signal);
  }
  ~InterruptScope() {
    alarm(0);
    // within StopSignals (posenc train): the handler stays, with the default action after the loop
    g_phase = phase_ == kOutside ? kOutside : kFinishing;
    std::signal(SIGALRM, alarm_);
    std::signal(SIGINT, int_);
    std::signal(SIGTERM, term_);
    std::signal(SIGHUP, hup_);
  }

 private:
  int phase_ = kOutside;
  Handler alarm_ = SIG_DFL, int_ = SIG_DFL, term_ = SIG_DFL, hup_ = SIG_DFL;
};

// One optimizer step at learning rate lr on this rank's part `indices` of the batch; returns the
// batch's loss (the mean over the ranks; a non-finite loss is an error naming the run and the
// step). `stop` receives whether any rank has been asked to stop (so all stop after this step).
double optimizer_step(Run& run, const at::Tensor& indices, double lr, double* metric, int64_t step,
                      bool* stop) {
  for (auto& group : run.optimizer->param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  auto& ranks = *run.ranks;
  ranks.before_forward();
  at::Tensor loss;
  {  // train.precision: bf16 runs the forward and the loss under CPU autocast (precision.h)
    CpuAutocastScope autocast(run.settings.precision == "bf16");
    loss = run.task->train_loss(indices, metric);
  }
  double value = loss.item<double>();
  *stop = g_interrupted;
  if (ranks.active()) {  // equal shards: the batch's mean is the mean of the ranks' means
    RECORD_USER_SCOPE("posenc::ranks");
    const auto sums =
        ranks.sum({value, *metric, *stop ? 1.0 : 0.0}, "step " + std::to_string(step) + "'s loss");
    value = sums[0] / ranks.world_size();
    *metric = sums[1] / ranks.world_size();
    *stop = sums[2] > 0;
  }
  TORCH_CHECK(std::isfinite(value), run.name, ": the loss is ", value, " at step ", step,
              "; lower the learning rate");
  {
    RECORD_USER_SCOPE("posenc::zero_grad");
    run.optimizer->zero_grad();
  }
  ranks.backward(loss, step);
  if (run.settings.clip_grad_norm > 0) {
    RECORD_USER_SCOPE("posenc::clip");
    if (run.settings.fused_optimizer)
      clip_grad_norm_fused(run.task->model()->parameters(), run.settings.clip_grad_norm);
    else
      torch::nn::utils::clip_grad_norm_(run.task->model()->parameters(),
                                        run.settings.clip_grad_norm);
  }
  RECORD_USER_SCOPE("posenc::optimizer");
  run.optimizer->step();
  return value;
}

template <typename Fn>
auto in_eval_mode(Task& task, Fn what) {
  auto model = task.model();
  model->eval();
  torch::NoGradGuard no_grad;
  auto result = what();
  model->train();
  return result;
}

// Every rank must hold the same weights (and weight average): a difference is a bug, never a
// result, and stops the run before anything is saved.
void check_ranks_agree(Run& run, int64_t step) {
  if (!run.ranks->active()) return;
  int64_t sum = weights_checksum(*run.task->model());
  if (run.ema) {
    WeightAverage::Swap averaged(run.ema.get());
    sum = sum * 31 + weights_checksum(*run.task->model());
  }
  const auto sums =
      run.ranks->gather(sum, "comparing the ranks' weights at step " + std::to_string(step));
  for (size_t r = 1; r < sums.size(); ++r) {
    TORCH_CHECK(sums[r] == sums[0], run.name, ": at step ", step, " rank ", r,
                "'s weights differ from rank 0's (checksums ", sums[r], " vs ", sums[0],
                "); the ranks must stay equal: this is a bug, please report it");
  }
}

// Logs, then saves: the rows first, so a checkpoint never covers rows that are not on disk
// (resume truncates metrics.csv to the checkpoint's step: rows past it are neither lost nor
// doubled).
void save_all(Run& run, const LoopState& state) {
  check_ranks_agree(run, state.step);
  if (!run.ranks->lead()) return;
  state.log.write_csv(run.csv);
  save_checkpoint(run.checkpoint, *run.task->model(), *run.optimizer,
                  {state.step, state.elapsed, state.window.to_tensor(), run.config_text,
                   run.ema ? run.ema->named() : std::map<std::string, at::Tensor>{}});
  WeightAverage::Swap averaged(run.ema.get());  // weights.pt: the weights evaluations use
  save_weights(run.output + "/weights.pt", *run.task->model());
  write_curves(run.output + "/curves.png", state.log, run.task->metric_name(), run.name);
}

}  // namespace

StopSignals::StopSignals(bool speaks) {
  speaks_ = g_speaks.exchange(speaks);
  phase_ = g_phase.exchange(kPreparing);
  int_ = install(SIGINT, on_stop_signal);
  term_ = install(SIGTERM, on_stop_signal);
  hup_ = install(SIGHUP, on_stop_signal);
}

StopSignals::~StopSignals() {
  std::signal(SIGINT, int_);
  std::signal(SIGTERM, term_);
  std::signal(SIGHUP, hup_);
  g_phase = phase_;
  g_speaks = speaks_;
}

at::Tensor LogWindow::to_tensor() const {
  return torch::tensor(
      {loss_sum, metric_sum, static_cast<double>(loss_count), static_cast<double>(metric_count)},
      torch::kDouble);
}

LogWindow LogWindow::from_tensor(const at::Tensor& t) {
  auto a = t.accessor<double, 1>();
  return {a[0], a[1], static_cast<int64_t>(a[2]), static_cast<int64_t>(a[3])};
}

LogRow LogWindow::take_row(int64_t step, int64_t steps_per_epoch, double lr,
                           const std::string& metric) {
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

Metrics evaluate(Task& task) {
  return in_eval_mode(task, [&task] { return task.evaluate(); });
}

std::vector<GeneralizationRow> generalization(Task& task) {
  return in_eval_mode(task, [&task] { return task.generalization(); });
}

bool train_loop(Run& run, LoopState& state, const RunOptions& options) {
  const auto& [steps_per_epoch, epochs, total] = run.counts;
  const auto& s = run.settings;
  const auto metric_name = run.task->metric_name();
  InterruptScope interrupts;
  const double elapsed_before = state.elapsed;
  const auto begin = std::chrono::steady_clock::now();
  auto clock = [&] {
    state.elapsed = elapsed_before +
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  };
  ProgressBar bar(run.name, total, state.step, options.quiet);
  auto& w = state.window;
  at::Tensor order;
  int64_t order_epoch = -1;
  run.task->model()->train();
  // --profile N: steps [first + kProfileWarmup, + N) under the profiler, then a stop.
  constexpr int64_t kProfileWarmup = 10;
  const int64_t profile_from = options.profile_steps > 0 ? state.step + kProfileWarmup : -1;
  const int64_t profile_to = profile_from + options.profile_steps;
  StepProfiler profiler;
  while (state.step < total) {
    if (state.step == profile_from) profiler.start();
    const int64_t epoch = state.step / steps_per_epoch, in_epoch = state.step % steps_per_epoch;
    if (epoch != order_epoch) {  // the epoch's order depends on (seed, epoch) only
      torch::manual_seed(run.seed * 1000003 + static_cast<uint64_t>(epoch));
      order = torch::randperm(run.task->train_size(), torch::kLong);
      order_epoch = epoch;
    }
    // a step's randomness: (seed, step), and the rank in a data-parallel run (each rank draws its
    // own crops and dropout masks; rank 0 draws what one process would)
    const uint64_t step_seed = run.seed * 7919 + 1000000007ULL + static_cast<uint64_t>(state.step);
    torch::manual_seed(step_seed +
                       static_cast<uint64_t>(run.ranks->rank()) * 0x9E3779B97F4A7C15ULL);
    run.task->set_step_seed(step_seed);
    const double lr = learning_rate(s, state.step, total);
    double metric = std::numeric_limits<double>::quiet_NaN();
    // this rank's slice of the global batch (ranks in order: together the one-process batch)
    auto indices = order.narrow(0, in_epoch * s.batch_size + run.ranks->rank() * run.rank_batch,
                                run.rank_batch);
    bool asked_to_stop = false;
    w.loss_sum += optimizer_step(run, indices, lr, &metric, state.step, &asked_to_stop);
    if (run.ema) run.ema->update(state.step + 1);
    ++w.loss_count;
    if (std::isfinite(metric)) {
      w.metric_sum += metric;
      ++w.metric_count;
    }
    const int64_t step = ++state.step;
    bar.update(step, epoch, epochs, w.loss_sum / w.loss_count,
               w.metric_count ? w.metric_sum / w.metric_count : metric, metric_name);
    const bool epoch_end = step % steps_per_epoch == 0 || step == total;
    const bool evaluate_now = (epoch_end && ((epoch + 1) % s.eval_every == 0)) || step == total;
    if (step % s.log_every == 0 || evaluate_now) {
      auto row = w.take_row(step, steps_per_epoch, lr, metric_name);
      if (evaluate_now) {
        std::ostringstream text;
        text << run.name << " step " << step << " eval:";
        WeightAverage::Swap averaged(run.ema.get());
        const auto metrics = evaluate(*run.task);
        for (const auto& [k, v] : metrics) {
          row.emplace_back("eval_" + k, v);
          text << " " << k << " " << format_metric(v);
        }
        if (step == total) state.final_eval = metrics;
        bar.message(text.str());
      }
      clock();
      row.emplace_back("elapsed_s", state.elapsed);
      state.log.add(row);
    }
    if (step == profile_to) {
      const auto rows = profiler.stop(options.profile_steps);  // (before largest_ops)
      const auto text = "CPU kernels: " + posenc::cpu_capability_description() +
                        "; precision: " + run.settings.precision + "\n\n" +
                        format_profile(rows, options.profile_steps) + "\n" +
                        format_largest_ops(profiler.largest_ops());
      if (run.ranks->lead()) write_file_atomically(run.output + "/profile.md", text);
      bar.message(run.name + ": profile of steps " + std::to_string(profile_from) + ".." +
                  std::to_string(profile_to) + " (written to " + run.output + "/profile.md)\n" +
                  text);
    }
    // A signal that came after the forward (during the backward or the optimizer's step) is
    // seen here by a process alone, so it stops after this step, not one more; ranks stop
    // together, after the step whose loss sum carried the flag.
    if (!run.ranks->active() && g_interrupted) asked_to_stop = true;
    if (asked_to_stop) alarm(0);  // the step ended within the grace: save as asked
    const bool stop = asked_to_stop || (options.stop_after > 0 && step >= options.stop_after) ||
                      step == profile_to;
    clock();
    if (evaluate_now || stop) save_all(run, state);
    if (stop && step < total) {
      bar.finish();
      return false;
    }
  }
  bar.finish();
  clock();
  return true;
}

}  // namespace posenc::train
