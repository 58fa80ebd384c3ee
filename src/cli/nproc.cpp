// `posenc train CONFIG --nproc N`: a data-parallel run of N ranks on this machine, as
// `torchrun --standalone --nproc-per-node=N` would start it. Each rank is a fresh process (spawned,
// not forked: LibTorch has threads by then) running `posenc train` with torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and a FileStore in a private temporary folder
// for the rendezvous (no port to find, none to collide). The cores are split between the ranks
// (train.threads = cores / N unless --set gives it). The ranks share a process group of their own:
// Ctrl-C (SIGINT) or SIGTERM to this launcher is passed on once to all of them, so they agree to
// stop after the same step and rank 0 saves the checkpoint; a second one kills them at once. Before
// the first step (ranks still starting, reading their data, meeting) it stops them at once, exit
// 130 (loop.h's StopSignals); no rank is started after it.
// Only rank 0 shows a progress bar. A rank that dies is named here with its exit status; the others
// stop by themselves with an error naming it (train.rank_timeout_s bounds the wait).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "cli.h"
#include "posenc/core/errors.h"
#include "spawn.h"

namespace posenc::cli {

namespace {

volatile sig_atomic_t g_ranks_group = 0;  // the ranks' process group, for the signal handler
volatile sig_atomic_t g_signal = 0;       // the first signal passed on (or due: no rank yet)

extern "C" void pass_signal_on(int signal) {
  if (g_signal == 0) g_signal = signal;
  if (g_ranks_group > 0) kill(-static_cast<pid_t>(g_ranks_group), signal);
}

// The variables a rank runs with: ours, and the launcher's environment without any of them
// (nor torchrun's rendezvous variables, which would point a rank at another run's store).
std::vector<std::string> rank_environment(int rank, int world, const std::string& store_file) {
  return child_environment(
      {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"},
      {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world),
       "LOCAL_RANK=" + std::to_string(rank), "LOCAL_WORLD_SIZE=" + std::to_string(world),
       "POSENC_STORE_FILE=" + store_file});
}

std::vector<std::string> rank_arguments(const TrainArgs& args, int rank, int64_t threads) {
  std::vector<std::string> words = {"/proc/self/exe", "train", args.config};
  if (!args.run.empty()) words.insert(words.end(), {"--run", args.run});
  if (!args.output.empty()) words.insert(words.end(), {"--out", args.output});
  if (threads > 0) words.insert(words.end(), {"--set", "train.threads=" + std::to_string(threads)});
  for (const auto& o : args.overrides) words.insert(words.end(), {"--set", o});
  if (args.resume) words.push_back("--resume");
  if (!args.init_from.empty()) words.insert(words.end(), {"--init-from", args.init_from});
  if (args.stop_after > 0)
    words.insert(words.end(), {"--stop-after", std::to_string(args.stop_after)});
  if (args.profile_steps > 0)
    words.insert(words.end(), {"--profile", std::to_string(args.profile_steps)});
  if (args.quiet || rank > 0) words.push_back("--quiet");
  return words;
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  const int signal = WTERMSIG(status);
  const char* name = strsignal(signal);
  return "was killed by signal " + std::to_string(signal) + " (" + (name ? name : "?") + ")";
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

int launch_ranks(const TrainArgs& args) {
  const int world = static_cast<int>(args.nproc);
  TORCH_CHECK(std::getenv("RANK") == nullptr && std::getenv("WORLD_SIZE") == nullptr,
              "train: --nproc ", world,
              " in a process that is already a rank (RANK/WORLD_SIZE are set, as torchrun "
              "does): use one launcher or the other");
  bool threads_given = false;
  for (const auto& o : args.overrides) threads_given |= o.rfind("train.threads=", 0) == 0;
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  const int64_t threads = threads_given ? 0 : std::max<int64_t>(1, cores / world);

  std::string folder = (std::filesystem::temp_directory_path() / "posenc-ranks-XXXXXX").string();
  if (mkdtemp(folder.data()) == nullptr)
    throw EnvironmentError("train: cannot create a temporary folder for the ranks' store in '" +
                           std::filesystem::temp_directory_path().string() +
                           "': " + std::strerror(errno));
  const std::string store_file = folder + "/store";
  std::cerr << "train: " << world << " ranks, "
            << (threads ? std::to_string(threads) + " thread(s) each (cores / ranks)"
                        : std::string("threads as --set gives them"))
            << std::endl;

  struct sigaction pass {
  }, previous_int{}, previous_term{};
  pass.sa_handler = pass_signal_on;
  sigemptyset(&pass.sa_mask);
  sigaction(SIGINT, &pass, &previous_int);
  sigaction(SIGTERM, &pass, &previous_term);

  std::map<pid_t, int> rank_of;
  std::string spawn_error;
  g_signal = 0;
  // a signal while the ranks start: no more of them (a rank started after it would wait at the
  // rendezvous for ranks that stopped)
  for (int rank = 0; rank < world && spawn_error.empty() && g_signal == 0; ++rank) {
    SpawnOptions options;
    options.default_signals = {SIGINT, SIGTERM};                // caught here, to be passed on
    options.process_group = static_cast<pid_t>(g_ranks_group);  // 0: a new group, rank 0's
    const Spawned child = spawn_process(rank_arguments(args, rank, threads),
                                        rank_environment(rank, world, store_file), options);
    if (child.error != 0) {
      spawn_error =
          "train: cannot start rank " + std::to_string(rank) + ": " + std::strerror(child.error);
      break;
    }
    if (rank == 0) g_ranks_group = child.pid;
    rank_of[child.pid] = rank;
  }
  if (!spawn_error.empty() && g_ranks_group > 0) kill(-static_cast<pid_t>(g_ranks_group), SIGKILL);
  const bool stopped_while_starting =
      spawn_error.empty() && g_signal != 0 && static_cast<int>(rank_of.size()) < world;
  // again, for a signal that came before rank 0's group was known to the handler
  if (stopped_while_starting && g_ranks_group > 0)
    kill(-static_cast<pid_t>(g_ranks_group), g_signal);
  if (stopped_while_starting && rank_of.empty())
    std::cerr << "posenc: stopped: " << strsignal(g_signal)
              << " before any rank was started; nothing was trained or saved\n";

  std::map<int, int> status_of;  // rank -> wait status
  int first_failure = -1;
  while (status_of.size() < rank_of.size()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = rank_of.find(pid);
    if (it == rank_of.end()) continue;
    status_of[it->second] = status;
    const int code = exit_code(status);
    if (code != 0 && code != 130) {
      std::cerr << "train: rank " << it->second << " (pid " << pid << ") " << describe(status)
                << "\n";
      if (first_failure < 0) first_failure = it->second;
    }
  }
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  g_ranks_group = 0;
  std::error_code ignored;
  std::filesystem::remove_all(folder, ignored);
  TORCH_CHECK(spawn_error.empty(), spawn_error);
  if (first_failure >= 0) return exit_code(status_of[first_failure]);
  if (stopped_while_starting) return 130;  // as a stop in training
  for (const auto& [rank, status] : status_of) {
    if (exit_code(status) != 0) return exit_code(status);  // 130: stopped, checkpoint saved
  }
  return 0;
}

}  // namespace posenc::cli
