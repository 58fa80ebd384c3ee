// Data-parallel training (src/train/distributed/, `posenc train --nproc N`, torchrun's variables)
// as a user runs it: ranks are real `posenc` processes talking c10d/Gloo over loopback, one
// intra-op thread each. Checked: 2 ranks at global batch B train the smoke LM and the smoke ViT
// as 1 process at batch B does (equal up to the order of float sums), the ranks hold bitwise
// equal weights, a stopped and resumed 2-rank run ends where a straight one does, the
// rendezvous through torchrun's variables (rank 0 hosting the store) and through torchrun's agent
// store (hosted here by the test), a rank killed with SIGKILL named by the survivor within the
// timeout and the run resumed afterwards, a rank whose collective fails on a Gloo worker thread
// for a reason of its own (its error quoted by the other, no rank called lost), and the bad
// inputs (a batch the ranks do not divide, an unreachable store, malformed variables) as one line
// each.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "cli/spawn.h"  // the starter posenc train --nproc and compare --jobs use
#include "posenc/train/trainer.h"
#include "support/run_files.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string folder(const std::string& name) {
  auto path = fs::temp_directory_path() / ("posenc_dp_" + std::to_string(getpid()) + "_" + name);
  fs::remove_all(path);
  return path.string();
}

std::string smoke(const std::string& name) {
  return std::string(POSENC_CONFIGS_DIR) + "/smoke/" + name + ".yaml";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A free TCP port on loopback (bound, read, closed: nobody listens on it afterwards).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  close(fd);
  return ntohs(address.sin_port);
}

// `posenc ARGS` with extra environment variables; stdout and stderr go to `log`.
pid_t start(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
            const std::string& log) {
  std::vector<std::string> words = {POSENC_TOOL_PATH};
  words.insert(words.end(), args.begin(), args.end());
  posenc::cli::SpawnOptions options;
  options.output_file = log;
  // a variable given in extra_env replaces the inherited one
  const auto child = posenc::cli::spawn_process(
      words, posenc::cli::environment_with({"RANK", "WORLD_SIZE"}, extra_env), options);
  EXPECT_EQ(child.error, 0) << words[0] << ": " << std::strerror(child.error);
  return child.pid;
}

int finish(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run(const std::vector<std::string>& args, const std::string& log,
        const std::vector<std::string>& env = {}) {
  return finish(start(args, env, log));
}

// Options every run here takes: one thread per rank, no augmentation (its draws are per rank).
std::vector<std::string> train_args(const std::string& config, const std::string& out,
                                    std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"train",   config,  "--out",          out,
                                   "--quiet", "--set", "train.threads=1"};
  if (config.find("vit") != std::string::npos)
    args.insert(args.end(), {"--set", "task.crop_padding=0", "--set", "task.flip=false"});
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// The weights of two runs agree as the tolerance asks (rtol 1e-5, atol 1e-6) for all but
// a handful of elements: AdamW divides each update by sqrt(v) + 1e-8, so an element whose exact
// gradient is within ~1e-8 of zero turns the rounding of a different summation order into a
// visible step (seen: 1 element of 9,482 in the ViT, 1.7e-6 off). Those few are bounded by 1e-4.
void expect_close_weights(const std::string& a_path, const std::string& b_path) {
  auto a = read_weights(a_path);
  auto b = read_weights(b_path);
  ASSERT_EQ(a.size(), b.size());
  int64_t elements = 0, outside = 0;
  for (const auto& [name, tensor] : a) {
    const auto& other = b.at(name);
    ASSERT_EQ(tensor.sizes(), other.sizes()) << name;
    auto off = (tensor - other).abs() > (1e-6 + 1e-5 * other.abs());
    outside += off.sum().item<int64_t>();
    elements += tensor.numel();
    EXPECT_LE((tensor - other).abs().max().item<double>(), 1e-4) << name;
  }
  EXPECT_LE(outside, std::max<int64_t>(2, elements / 1000)) << outside << " of " << elements;
}

std::vector<int64_t> checksums(const std::string& out) {
  auto summary = nlohmann::json::parse(read_text(out + "/summary.json"));
  EXPECT_EQ(summary.at("ranks").at("world_size").get<int>(), 2);
  return summary.at("ranks").at("weight_checksums").get<std::vector<int64_t>>();
}

class TwoRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoRanks, EqualOneProcessAtTheSameGlobalBatch) {
  const auto config = smoke(GetParam());
  const auto one = folder(GetParam() + "_one"), two = folder(GetParam() + "_two");
  const std::vector<std::string> steps = {"--set", "train.max_steps=20"};
  ASSERT_EQ(run(train_args(config, one, steps), one + ".log"), 0) << read_text(one + ".log");
  ASSERT_EQ(
      run(train_args(config, two, {"--set", "train.max_steps=20", "--nproc", "2"}), two + ".log"),
      0)
      << read_text(two + ".log");
  expect_close_weights(two + "/weights.pt", one + "/weights.pt");
  const auto a = train_losses(one), b = train_losses(two);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << i;
  const auto sums = checksums(two);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0], sums[1]);  // the ranks' final weights, bit for bit
  // only rank 0 wrote: one progress-free log, one run folder with one set of files
  EXPECT_TRUE(fs::exists(two + "/checkpoint.pt"));
}

INSTANTIATE_TEST_SUITE_P(Smoke, TwoRanks, ::testing::Values("lm", "vit"));

TEST(DataParallel, StoppedAndResumedEndsWhereAStraightRunDoes) {
  const auto config = smoke("lm");
  const auto straight = folder("straight"), resumed = folder("resumed");
  ASSERT_EQ(run(train_args(config, straight, {"--nproc", "2"}), straight + ".log"), 0);
  ASSERT_EQ(
      run(train_args(config, resumed, {"--nproc", "2", "--stop-after", "11"}), resumed + ".log"), 0)
      << read_text(resumed + ".log");
  ASSERT_EQ(run(train_args(config, resumed, {"--nproc", "2", "--resume"}), resumed + "2.log"), 0)
      << read_text(resumed + "2.log");
  auto a = read_weights(straight + "/weights.pt"), b = read_weights(resumed + "/weights.pt");
  for (const auto& [name, tensor] : a) EXPECT_TRUE(torch::equal(tensor, b.at(name))) << name;
  EXPECT_EQ(train_losses(straight), train_losses(resumed));
  EXPECT_EQ(checksums(straight), checksums(resumed));
}

// torchrun's variables set by hand: rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT.
TEST(DataParallel, TorchrunVariablesByHand) {
  const auto config = smoke("lm");
  const auto out = folder("torchrun"), reference = folder("torchrun_ref");
  const auto port = std::to_string(free_port());
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(
        start(train_args(config, out),
              {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r),
               "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port},
              out + std::to_string(r) + ".log"));
  }
  EXPECT_EQ(finish(ranks[0]), 0) << read_text(out + "0.log");
  EXPECT_EQ(finish(ranks[1]), 0) << read_text(out + "1.log");
  ASSERT_EQ(run(train_args(config, reference, {"--nproc", "2"}), reference + ".log"), 0);
  EXPECT_EQ(checksums(out), checksums(reference));  // the same run, another rendezvous
}

// Ranks started with settings that change the run (a seed, the model's size) agree before any
// tensor moves: every rank exits 2 with one line naming the first key that differs, nothing is
// trained, no Gloo abort (before: other seeds trained apart and exited 0; other model shapes
// died with "terminate called after throwing gloo::EnforceNotMet", exit 134).
TEST(DataParallel, RanksWithDifferentConfigsAreRefusedBeforeStepOne) {
  const auto config = smoke("lm");
  for (const std::string key : {"seed=7", "model.dim=24", "train.gradient_sync=after_backward"}) {
    SCOPED_TRACE(key);
    const auto out = folder("mismatch");
    const auto port = std::to_string(free_port());
    std::vector<pid_t> ranks;
    for (int r = 0; r < 2; ++r) {
      auto args = train_args(config, out);
      if (r == 1) args.insert(args.end(), {"--set", key});
      ranks.push_back(start(args,
                            {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=" + port},
                            out + std::to_string(r) + ".log"));
    }
    const std::string name = key.substr(0, key.find('='));
    for (int r = 0; r < 2; ++r) {
      const int code = finish(ranks[r]);
      const auto log = read_text(out + std::to_string(r) + ".log");
      EXPECT_EQ(code, 2) << log;
      EXPECT_NE(log.find("rank 1's config differs at '" + name + "'"), std::string::npos) << log;
      EXPECT_EQ(log.find("terminate"), std::string::npos) << log;
    }
    EXPECT_FALSE(std::filesystem::exists(out + "/weights.pt"));
  }
}

// Ranks given other data under the same config (another POSENC_DATA_DIR, one byte changed in
// one book) are refused before step one: the digest of the bytes each rank read differs.
// The smoke LM's three books under a data folder of the test's own (returned: its gutenberg/
// folder), each written by `write(source, destination)`.
template <typename Write>
std::filesystem::path copy_books(const std::string& out, Write write) {
  const char* env_data = std::getenv("POSENC_DATA_DIR");
  const std::filesystem::path books =
      std::filesystem::path(env_data != nullptr ? env_data : POSENC_DATA_DIR) / "gutenberg";
  const std::filesystem::path copy = std::filesystem::path(out + "_data") / "gutenberg";
  std::filesystem::remove_all(copy.parent_path());
  std::filesystem::create_directories(copy);
  for (const auto* name : {"moby-dick.txt", "sherlock-holmes.txt", "tom-sawyer.txt"})
    write(books / name, copy / name);
  return copy;
}

// Two ranks of `config`, rank 1 reading its data from `data` (POSENC_DATA_DIR); their exit codes
// and logs.
std::vector<std::pair<int, std::string>> run_two_ranks(const std::string& config,
                                                       const std::string& out,
                                                       const std::filesystem::path& data) {
  const auto port = std::to_string(free_port());
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> env = {"RANK=" + std::to_string(r), "WORLD_SIZE=2",
                                    "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port};
    if (r == 1) env.push_back("POSENC_DATA_DIR=" + data.string());
    ranks.push_back(start(train_args(config, out), env, out + std::to_string(r) + ".log"));
  }
  std::vector<std::pair<int, std::string>> results;
  for (int r = 0; r < 2; ++r) {
    const int code = finish(ranks[r]);
    results.emplace_back(code, read_text(out + std::to_string(r) + ".log"));
  }
  return results;
}

TEST(DataParallel, RanksThatReadOtherDataAreRefusedBeforeStepOne) {
  const auto config = smoke("lm");
  const auto out = folder("other_data");
  const auto copy = copy_books(
      out, [](const auto& from, const auto& to) { std::filesystem::copy_file(from, to); });
  {
    std::fstream book(copy / "tom-sawyer.txt", std::ios::in | std::ios::out | std::ios::binary);
    book.seekp(200000);
    book.put('#');
  }
  for (const auto& [code, log] : run_two_ranks(config, out, copy.parent_path())) {
    EXPECT_EQ(code, 2) << log;
    EXPECT_NE(log.find("rank 1's config differs at '(data read: bytes:hash)'"), std::string::npos)
        << log;
  }
  EXPECT_FALSE(std::filesystem::exists(out + "/weights.pt"));
}

// The digest is of what the ranks train on: the same books with CRLF line ends (normalized on
// reading) agree, and the run trains.
TEST(DataParallel, RanksThatReadTheSameBooksWithOtherLineEndsAgree) {
  const auto config = smoke("lm");
  const auto out = folder("crlf_data");
  const auto copy = copy_books(out, [](const auto& from, const auto& to) {
    std::ifstream in(from, std::ios::binary);
    std::ofstream crlf(to, std::ios::binary);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      crlf << line << "\r\n";
    }
  });
  for (const auto& [code, log] : run_two_ranks(config, out, copy.parent_path()))
    EXPECT_EQ(code, 0) << log;
  EXPECT_TRUE(std::filesystem::exists(out + "/weights.pt"));
}

// torchrun's agent store: the agent (here, the test) hosts the store; every rank is a client
// under /worker/attempt_<restart count>.
TEST(DataParallel, TorchrunAgentStore) {
  const auto config = smoke("lm");
  const auto out = folder("agent"), reference = folder("agent_ref");
  c10d::TCPStoreOptions options;
  options.port = 0;  // any free port
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(60);
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  const auto port = std::to_string(store->getPort());
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(start(train_args(config, out),
                          {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=" + port, "TORCHELASTIC_USE_AGENT_STORE=True",
                           "TORCHELASTIC_RESTART_COUNT=3"},
                          out + std::to_string(r) + ".log"));
  }
  EXPECT_EQ(finish(ranks[0]), 0) << read_text(out + "0.log");
  EXPECT_EQ(finish(ranks[1]), 0) << read_text(out + "1.log");
  // the ranks met under torchrun's prefix in the agent's store
  bool prefixed = false;
  for (const auto& key : store->listKeys()) prefixed |= key.rfind("/worker/attempt_3/", 0) == 0;
  EXPECT_TRUE(prefixed);
  ASSERT_EQ(run(train_args(config, reference, {"--nproc", "2"}), reference + ".log"), 0);
  EXPECT_EQ(checksums(out), checksums(reference));
}

// kill -9 of rank 1 mid-run: rank 0 stops with an error naming rank 1, well within the timeout;
// the checkpoint on disk is the last good one and `--resume` completes the run.
TEST(DataParallel, KilledRankIsNamedAndTheRunResumes) {
  const auto config = smoke("lm");
  const auto out = folder("killed");
  const auto port = std::to_string(free_port());
  const std::vector<std::string> more = {"--set", "train.max_steps=400", "--set",
                                         "train.rank_timeout_s=60"};
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(start(train_args(config, out, more),
                          {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=" + port},
                          out + std::to_string(r) + ".log"));
  }
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (!fs::exists(out + "/checkpoint.pt") && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(out + "/checkpoint.pt")) << read_text(out + "0.log");
  kill(ranks[1], SIGKILL);
  const auto killed = Clock::now();
  EXPECT_EQ(finish(ranks[1]), 128 + SIGKILL);
  const int code = finish(ranks[0]);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  const auto log = read_text(out + "0.log");
  EXPECT_EQ(code, 1) << log;  // an environment failure
  EXPECT_NE(log.find("lost rank 1"), std::string::npos) << log;
  EXPECT_LT(seconds, 30.0) << "the survivor took " << seconds << " s to stop";
  // resume on 2 fresh ranks (--nproc) from the last good checkpoint
  ASSERT_EQ(
      run(train_args(config, out, {"--set", "train.max_steps=400", "--nproc", "2", "--resume"}),
          out + "_resume.log"),
      0)
      << read_text(out + "_resume.log");
  auto summary = nlohmann::json::parse(read_text(out + "/summary.json"));
  EXPECT_EQ(summary.at("steps").get<int>(), 400);
}

// A collective that fails on one rank for a reason of its own, after the ranks agreed: an
// exception thrown on the Gloo worker thread that completes rank 1's gradient all-reduce of step 3
// (injected: POSENC_FAULT_AT=gloo_worker:1:3; an allocation or a tensor check failing there).
// Rank 1 ends with its own error in one line; rank 0 quotes it; no rank is called lost. Before,
// rank 1 took its own failure for a lost rank: it waited 3 s for a word from rank 0, which had
// gone on to its next collective, and said "lost rank 0 (no word within 3 s: killed, crashed or
// hung)", which rank 0 then quoted.
class WorkerThreadFault : public ::testing::TestWithParam<std::string> {};

TEST_P(WorkerThreadFault, IsTheFailingRanksOwnLineAndTheOthersQuoteIt) {
  const auto config = smoke("lm");
  const auto out = folder("worker_fault_" + GetParam());
  const auto port = std::to_string(free_port());
  const std::vector<std::string> more = {"--set", "train.gradient_sync=" + GetParam(), "--set",
                                         "train.rank_timeout_s=60"};
  std::vector<pid_t> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(start(train_args(config, out, more),
                          {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=" + port, "POSENC_FAULT_AT=gloo_worker:1:3"},
                          out + std::to_string(r) + ".log"));
  }
  const std::string error =
      "rank 1: injected fault in the gradient all-reduce of step 3 (POSENC_FAULT_AT)";
  const int code1 = finish(ranks[1]), code0 = finish(ranks[0]);
  const auto log0 = read_text(out + "0.log"), log1 = read_text(out + "1.log");
  EXPECT_EQ(code1, 1) << log1;  // an EnvironmentError, as thrown
  EXPECT_EQ(log1, "posenc: error: " + error + "\n");
  EXPECT_EQ(code0, 1) << log0;
  // rank 0's error (after its "data-parallel: ..." line): rank 1's, quoted, in one line
  const auto at = log0.find("posenc: error: ");
  ASSERT_NE(at, std::string::npos) << log0;
  const auto line0 = log0.substr(at);
  EXPECT_EQ(line0.rfind("posenc: error: rank 0: step 4's loss: rank 1 failed: " + error + " [", 0),
            0u)
      << log0;
  EXPECT_EQ(std::count(line0.begin(), line0.end(), '\n'), 1) << log0;
  EXPECT_EQ(log0.find("lost rank"), std::string::npos) << log0;
}

INSTANTIATE_TEST_SUITE_P(GradientSync, WorkerThreadFault,
                         ::testing::Values("overlap", "after_backward"));

// SIGTERM to the launcher (what SLURM sends before a kill), as Ctrl-C: passed on once to every
// rank, they agree on the step to stop after, rank 0 saves, all exit 130; --resume completes.
TEST(DataParallel, SignalToTheLauncherStopsEveryRankAtTheSameStep) {
  const auto config = smoke("lm");
  const auto out = folder("signal");
  const std::vector<std::string> more = {"--set", "train.max_steps=3000", "--nproc", "2"};
  const pid_t launcher = start(train_args(config, out, more), {}, out + ".log");
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  while (!fs::exists(out + "/metrics.csv") && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  kill(launcher, SIGTERM);
  EXPECT_EQ(finish(launcher), 130) << read_text(out + ".log");
  const auto log = read_text(out + ".log");
  EXPECT_NE(log.find("checkpoint saved to"), std::string::npos) << log;
  const auto stopped = train_losses(out).size();
  ASSERT_GT(stopped, 0u);
  ASSERT_EQ(run(train_args(config, out,
                           {"--set", "train.max_steps=3000", "--nproc", "2", "--resume",
                            "--stop-after", "200"}),
                out + "_resume.log"),
            0)
      << read_text(out + "_resume.log");
  EXPECT_NE(read_text(out + "_resume.log").find("resuming at step"), std::string::npos);
}

TEST(DataParallel, BadInputsAreOneLine) {
  const auto config = smoke("lm");
  const auto out = folder("bad");
  // a global batch the ranks do not divide (smoke LM: 16), refused before any rank starts
  EXPECT_EQ(run(train_args(config, out, {"--nproc", "3"}), out + "_batch.log"), 2);
  EXPECT_EQ(read_text(out + "_batch.log"),
            "posenc: error: train: batch_size (16) must be a multiple of the number of ranks (3): "
            "each rank takes batch_size / ranks examples of every batch\n");
  // nobody hosts the store: rank 1 names the address it tried, within the timeout
  const auto port = std::to_string(free_port());
  const auto begin = Clock::now();
  EXPECT_EQ(run(train_args(config, out, {"--set", "train.rank_timeout_s=2"}), out + "_store.log",
                {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + port}),
            1);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - begin).count(), 30.0);
  const auto store_log = read_text(out + "_store.log");
  EXPECT_NE(store_log.find("posenc: error: rank 1: cannot reach the store at 127.0.0.1:" + port),
            std::string::npos)
      << store_log;
  EXPECT_EQ(std::count(store_log.begin(), store_log.end(), '\n'), 1) << store_log;
  // malformed variables: one line naming the variable and its value
  EXPECT_EQ(run(train_args(config, out), out + "_env.log", {"RANK=x", "WORLD_SIZE=2"}), 2);
  EXPECT_EQ(read_text(out + "_env.log"),
            "posenc: error: environment: RANK='x' must be an integer in [0, 1]\n");
  EXPECT_EQ(run(train_args(config, out), out + "_env2.log", {"RANK=2", "WORLD_SIZE=2"}), 2);
  EXPECT_EQ(read_text(out + "_env2.log"),
            "posenc: error: environment: RANK='2' must be an integer in [0, 1]\n");
  EXPECT_EQ(run(train_args(config, out), out + "_env3.log", {"RANK=0", "WORLD_SIZE=2"}), 2);
  EXPECT_EQ(read_text(out + "_env3.log"),
            "posenc: error: environment: WORLD_SIZE is 2 but MASTER_ADDR is not set (the host of "
            "rank 0, or of torchrun's store)\n");
  // train.device: a misspelling, and cuda:N for ranks, refused by the launcher (exit 2)
  EXPECT_EQ(run(train_args(config, out, {"--set", "train.device=gpu"}), out + "_dev.log"), 2);
  EXPECT_EQ(read_text(out + "_dev.log"),
            "posenc: error: train: device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'\n");
  EXPECT_EQ(run(train_args(config, out, {"--nproc", "2", "--set", "train.device=cuda:1"}),
                out + "_dev2.log"),
            2);
  EXPECT_EQ(read_text(out + "_dev2.log"),
            "posenc: error: train: device 'cuda:1' in a data-parallel run of 2 ranks: use 'cuda' "
            "(each rank takes the GPU of its LOCAL_RANK)\n");
  // the variable --nproc and compare give their children: malformed (exit 2), or naming a process
  // that is not the parent (exit 1: the one that started it is gone)
  EXPECT_EQ(run(train_args(config, out), out + "_ppid.log", {"POSENC_PARENT_PID=x1"}), 2);
  EXPECT_EQ(read_text(out + "_ppid.log"),
            "posenc: error: environment: POSENC_PARENT_PID='x1' must be the pid of the posenc that "
            "started this run (set by --nproc and compare --jobs; unset it to run on your own)\n");
  EXPECT_EQ(run(train_args(config, out), out + "_ppid2.log", {"POSENC_PARENT_PID=999999999"}), 1);
  EXPECT_EQ(read_text(out + "_ppid2.log"),
            "posenc: error: train: the posenc that started this run (pid 999999999) is gone; not "
            "starting\n");
  if (torch::cuda::is_available()) return;
  // a GPU asked for where there is none: the environment's failure (exit 1), one line
  EXPECT_EQ(run(train_args(config, out, {"--set", "train.device=cuda"}), out + "_dev3.log"), 1);
  const auto no_gpu = read_text(out + "_dev3.log");
  EXPECT_EQ(no_gpu.rfind("posenc: error: train: device is 'cuda' but ", 0), 0u) << no_gpu;
  EXPECT_EQ(std::count(no_gpu.begin(), no_gpu.end(), '\n'), 1) << no_gpu;
}

// Two ranks on two GPUs (NCCL for the gradients, Gloo for the host tensors) train as one process
// on one GPU does. Needs two GPUs: NCCL refuses two ranks on one device.
TEST(DataParallel, NcclRanksOnTwoGpusEqualOneGpu) {
  if (!torch::cuda::is_available() || torch::cuda::device_count() < 2)
    GTEST_SKIP() << "needs two CUDA devices";
  const auto config = smoke("lm");
  const auto one = folder("nccl_one"), two = folder("nccl_two");
  const std::vector<std::string> gpu = {"--set", "train.max_steps=20", "--set",
                                        "train.device=cuda"};
  ASSERT_EQ(run(train_args(config, one, gpu), one + ".log"), 0) << read_text(one + ".log");
  auto ranks = gpu;
  ranks.insert(ranks.end(), {"--nproc", "2"});
  ASSERT_EQ(run(train_args(config, two, ranks), two + ".log"), 0) << read_text(two + ".log");
  auto a = read_weights(one + "/weights.pt"), b = read_weights(two + "/weights.pt");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, tensor] : a)
    EXPECT_LE((tensor - b.at(name)).abs().max().item<double>(), 1e-3) << name;
  const auto sums = checksums(two);
  ASSERT_EQ(sums.size(), 2u);
  EXPECT_EQ(sums[0], sums[1]);
  for (const auto& out : {one, two})
    EXPECT_EQ(nlohmann::json::parse(read_text(out + "/summary.json")).at("device"), "cuda:0");
}

}  // namespace
}  // namespace posenc::train
