// `posenc train` and `posenc compare`: the config-driven trainer (posenc/train/trainer.h) from
// the command line.
//   posenc train   CONFIG [--run NAME] [--set key.path=value]... [--out DIR] [--resume]
//                  [--stop-after STEPS] [--profile STEPS] [--quiet] [--nproc N]
// A data-parallel run: `--nproc N` (nproc.cpp), or one process per rank started by torchrun or
// SLURM with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...).
//   posenc compare CONFIG [--set key.path=value]... [--out DIR] [--resume] [--quiet] [--jobs N]
//   posenc eval    CONFIG --weights W [--run NAME] [--set key.path=value]... [--out DIR]
//                  [--image FILE]... | [--video FILE]...   (classify files: one JSON line each)
//   posenc export  RUN --to timm [--out DIR]   (posenc/train/export_timm.h)
// `train --init-from W` starts from the parameters of W (weights.pt or checkpoint.pt; the encoder
// config may differ from the one W was trained with); `eval` evaluates W without training.
// With --jobs N > 1, compare runs each entry as `posenc train CONFIG --run NAME` in a child
// process (N at a time, cores/N intra-op threads each; for machines with more cores than one
// small run uses well), then builds the same comparison from the runs' summary.json files.
// Stopping it: Ctrl-C reaches the children through the process group; SIGTERM or SIGHUP sent to
// the compare process alone (kill PID, a scheduler) is passed on to every running child, no new
// run starts, and compare exits 130 once they have saved their checkpoints (continue with
// --resume). A child is never left training on its own.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "cli.h"
#include "posenc/core/errors.h"
#include "posenc/train/export_timm.h"
#include "posenc/train/trainer.h"
#include "spawn.h"

namespace posenc::cli {

namespace {

// compare --jobs: the running children, for the signal handler (kMaxJobs = --jobs's limit).
constexpr int kMaxJobs = 64;
volatile sig_atomic_t g_compare_stop = 0;
volatile pid_t g_compare_children[kMaxJobs] = {};

void pass_stop_to_children(int signal) {
  g_compare_stop = 1;
  for (int i = 0; i < kMaxJobs; ++i)
    if (g_compare_children[i] > 0) kill(g_compare_children[i], signal == SIGHUP ? SIGTERM : signal);
}

void track_child(pid_t pid, bool running) {
  for (int i = 0; i < kMaxJobs; ++i) {
    if (running ? g_compare_children[i] == 0 : g_compare_children[i] == pid) {
      g_compare_children[i] = running ? pid : 0;
      return;
    }
  }
}

train::RunOptions run_options(const TrainArgs& args) {
  train::RunOptions options;
  options.output = args.output;
  options.resume = args.resume;
  options.stop_after = args.stop_after;
  options.profile_steps = args.profile_steps;
  options.quiet = args.quiet;
  options.overrides = args.overrides;
  options.init_from = args.init_from;
  return options;
}

// A run config: a mapping of sections (an empty file reads as null).
nlohmann::json load_run_config(const std::string& path) {
  auto config = load_config(path);
  TORCH_CHECK(
      config.is_object(), "config '", path,
      "': expected a mapping with 'task', 'model' and 'train' sections, got ",
      config.is_null() ? std::string("nothing (an empty file)") : std::string(config.type_name()));
  return config;
}

}  // namespace

std::vector<std::string> child_environment(const std::vector<std::string>& unset,
                                           const std::vector<std::string>& set) {
  std::vector<std::string> added = set;
  added.push_back(std::string(kParentPidVariable) + "=" + std::to_string(getpid()));
  return environment_with(unset, added);
}

void follow_parent() {
  const char* text = std::getenv(kParentPidVariable);
  if (text == nullptr) return;
  const std::string value(text);
  pid_t parent = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parent);
  TORCH_CHECK(
      !value.empty() && error == std::errc() && end == value.data() + value.size() && parent > 1,
      "environment: ", kParentPidVariable, "='", value,
      "' must be the pid of the posenc that started this run (set by --nproc and "
      "compare --jobs; unset it to run on your own)");
  // PR_SET_PDEATHSIG first, then the check: a parent that died in between is caught by getppid
  if (prctl(PR_SET_PDEATHSIG, SIGHUP) != 0 || getppid() != parent) {
    throw EnvironmentError(std::string("train: the posenc that started this run (pid ") + text +
                           ") is gone; not starting");
  }
}

int run_train(const TrainArgs& args) {
  follow_parent();
  auto config = train::select_run(load_run_config(args.config), args.run);
  if (args.nproc > 1) {  // a config error is one line here, not one per rank
    train::check_run_config(config, args.overrides, static_cast<int>(args.nproc));
    return launch_ranks(args);
  }
  auto options = run_options(args);
  options.distributed = train::distributed_from_environment();  // torchrun's, or --nproc's
  auto result = train::run_training(config, options);
  return result.finished || args.stop_after > 0 || args.profile_steps > 0 ? 0 : 130;
}

int run_eval(const TrainArgs& args) {
  auto config = train::select_run(load_run_config(args.config), args.run);
  TORCH_CHECK(args.images.empty() || args.videos.empty(),
              "eval: give --image or --video, not both (a run classifies one kind of file)");
  if (!args.images.empty() || !args.videos.empty()) {
    // one JSON line per file: the class, its probability, every logit (9 digits: float32 exact)
    const bool video = !args.videos.empty();
    const auto& files = video ? args.videos : args.images;
    std::vector<std::string> classes;
    auto logits =
        train::classify_image_files(config, run_options(args), args.weights, files, &classes);
    auto p = logits.softmax(-1);
    for (size_t i = 0; i < files.size(); ++i) {
      const auto row = logits[static_cast<int64_t>(i)].to(torch::kDouble).contiguous();
      const int64_t best = row.argmax().item<int64_t>();
      nlohmann::ordered_json line = {
          {video ? "video" : "image", files[i]},
          {"class", best < static_cast<int64_t>(classes.size()) ? classes[best] : ""},
          {"label", best},
          {"probability", p[static_cast<int64_t>(i)][best].item<double>()},
          {"logits",
           std::vector<double>(row.data_ptr<double>(), row.data_ptr<double>() + row.numel())}};
      std::cout << line.dump() << "\n";
    }
    return 0;
  }
  train::run_evaluation(config, run_options(args), args.weights);
  return 0;
}

int run_export(const std::string& run, const std::string& to, const std::string& out) {
  TORCH_CHECK(to == "timm", "export: --to must be 'timm', got '", to, "'");
  const auto folder = train::export_run_to_timm(run, out);
  std::cout << "export: " << folder << "/model.safetensors and " << folder
            << "/timm.json (timm.create_model(model_name, pretrained=False, **model_args))\n";
  return 0;
}

namespace {

// Starts `posenc train` for one entry; returns the child's pid.
pid_t spawn_run(const TrainArgs& args, const std::string& run, const std::string& output,
                int64_t threads) {
  std::vector<std::string> words = {"/proc/self/exe",
                                    "train",
                                    args.config,
                                    "--run",
                                    run,
                                    "--out",
                                    output,
                                    "--quiet",
                                    "--set",
                                    "train.threads=" + std::to_string(threads),
                                    "--set",
                                    "output=" + output};
  for (const auto& o : args.overrides) words.insert(words.end(), {"--set", o});
  if (args.resume) words.push_back("--resume");
  SpawnOptions options;
  // the parent ignores Ctrl-C while it waits; the child must not
  options.default_signals = {SIGINT};
  // with POSENC_PARENT_PID: a child stops when compare dies
  const Spawned child = spawn_process(words, child_environment({}, {}), options);
  TORCH_CHECK(child.error == 0, "compare: cannot start the run '", run,
              "': ", std::strerror(child.error));
  return child.pid;
}

int run_compare_parallel(const TrainArgs& args) {
  const auto config = load_run_config(args.config);
  const auto entries = train::comparison_entries(config);
  const auto options = run_options(args);
  const std::string folder = train::comparison_folder(config, options);
  std::filesystem::create_directories(folder);
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = std::max<int64_t>(1, cores / args.jobs);
  std::cout << "compare: " << entries.size() << " runs, " << args.jobs << " at a time, " << threads
            << " thread(s) each" << std::endl;  // flushed before the children write
  // Ctrl-C reaches the children (same process group); they save a checkpoint and exit 130.
  // SIGTERM / SIGHUP to this process alone: passed on (pass_stop_to_children).
  TORCH_CHECK(args.jobs <= kMaxJobs, "compare: --jobs must be <= ", kMaxJobs, ", got ", args.jobs);
  struct sigaction ignore {
  }, pass{}, previous{}, previous_term{}, previous_hup{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGINT, &ignore, &previous);
  pass.sa_handler = pass_stop_to_children;
  sigemptyset(&pass.sa_mask);
  sigaction(SIGTERM, &pass, &previous_term);
  sigaction(SIGHUP, &pass, &previous_hup);
  g_compare_stop = 0;
  std::map<pid_t, std::string> running;
  std::map<std::string, int> status_of;
  // An entry that starts from another's weights (init_from: NAME) waits for it; if that one
  // failed, it does not start (exit status 2, said below).
  std::vector<std::string> waiting(entries.begin(), entries.end());
  while (!waiting.empty() || !running.empty()) {
    for (auto it = waiting.begin();
         it != waiting.end() && static_cast<int64_t>(running.size()) < args.jobs;) {
      const auto from = train::entry_dependency(config, *it);
      if (!from.empty() && !status_of.count(from)) {
        ++it;  // still training (or waiting itself)
        continue;
      }
      if (g_compare_stop) {
        std::cerr << "compare: run '" << *it << "' not started: stopped by a signal\n";
        status_of[*it] = 130;
      } else if (!from.empty() && status_of[from] != 0) {
        std::cerr << "compare: run '" << *it << "' not started: it starts from '" << from
                  << "', which did not finish\n";
        status_of[*it] = 2;
      } else {
        const pid_t pid = spawn_run(args, *it, folder + "/" + *it, threads);
        running[pid] = *it;
        track_child(pid, true);
        if (g_compare_stop) kill(pid, SIGTERM);  // the signal came while it was starting
      }
      it = waiting.erase(it);
    }
    if (running.empty()) continue;  // every entry left was just resolved (init_from: earlier only)
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;  // a signal passed on: keep waiting for them
    if (pid < 0) break;
    track_child(pid, false);
    auto it = running.find(pid);
    if (it == running.end()) continue;
    status_of[it->second] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    running.erase(it);
  }
  sigaction(SIGINT, &previous, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  sigaction(SIGHUP, &previous_hup, nullptr);
  std::vector<train::RunResult> results;
  int worst = 0;
  for (const auto& run : entries) {
    const int code = status_of.count(run) ? status_of[run] : 2;
    if (code != 0) {
      std::cerr << "compare: run '" << run << "' exited with " << code << "\n";
      worst = worst == 0 || code == 130 ? code : worst;
      continue;
    }
    results.push_back(train::read_run_result(folder + "/" + run));
  }
  if (!results.empty()) {
    train::write_comparison(folder, config.value("name", std::string("compare")), results);
    std::cout << "comparison written to " << folder << "/results.md\n";
  }
  return worst;
}

}  // namespace

int run_compare(const TrainArgs& args) {
  TORCH_CHECK(train::distributed_from_environment().world_size == 1,
              "compare: this process is one rank of a data-parallel run (RANK/WORLD_SIZE are "
              "set); compare trains its entries one process each: train one entry per launch "
              "(posenc train CONFIG --run NAME) under torchrun instead");
  if (args.jobs > 1) return run_compare_parallel(args);
  const auto config = load_run_config(args.config);
  const auto options = run_options(args);
  auto results = train::run_comparison(config, options);
  const std::string folder = train::comparison_folder(config, options);
  std::cout << "comparison written to " << folder << "/results.md\n";
  for (const auto& r : results) {
    if (!r.finished) return 130;
  }
  return 0;
}

}  // namespace posenc::cli
