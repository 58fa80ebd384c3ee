// spawn_process (src/cli/spawn.h), the one posix_spawn starter of `train --nproc`, `compare --jobs`
// and test_distributed.cpp: each option reaches the child, read back from the child's own view
// in /proc (its process group: field 5 of /proc/PID/stat; its ignored signals: SigIgn in
// /proc/PID/status, bit N-1 for signal N), and a start that fails is its error number, no child.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli/spawn.h"

namespace posenc::cli {
namespace {

namespace fs = std::filesystem;

// Runs `sh -c script` with `options` (output into a file of the test's own), waits for it and
// returns what it wrote; the exit status must be 0.
std::string run_shell(const std::string& script, SpawnOptions options, const std::string& name) {
  const fs::path log = fs::temp_directory_path() /
                       ("posenc_spawn_" + name + "_" + std::to_string(getpid()) + ".log");
  options.output_file = log.string();
  const Spawned child = spawn_process({"/bin/sh", "-c", script},
                                      environment_with({}, {"POSENC_SPAWN_TEST=1"}), options);
  EXPECT_EQ(child.error, 0);
  EXPECT_GT(child.pid, 0);
  int status = -1;
  EXPECT_EQ(waitpid(child.pid, &status, 0), child.pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  fs::remove(log);
  return text.str();
}

TEST(Spawn, StdoutAndStderrGoToTheOutputFileAndTheEnvironmentIsTheOneGiven) {
  const std::string text =
      run_shell("echo out; echo err >&2; echo \"$POSENC_SPAWN_TEST\"", {}, "output");
  EXPECT_EQ(text, "out\nerr\n1\n");
}

// The child's process group, as the child sees it ("<pid>\n<pgid>\n").
const char* kPidAndGroup = "echo $$; cut -d' ' -f5 /proc/$$/stat";

TEST(Spawn, ProcessGroupIsTheParentsOrANewOneOrAGivenOne) {
  // default: the parent's group (compare --jobs: Ctrl-C in the terminal reaches the children)
  std::string text = run_shell(kPidAndGroup, {}, "group_parent");
  EXPECT_EQ(text.substr(text.find('\n') + 1), std::to_string(getpgrp()) + "\n");
  // 0: a new group the child leads (rank 0 of train --nproc)
  SpawnOptions options;
  options.process_group = 0;
  text = run_shell(kPidAndGroup, options, "group_new");
  const std::string pid = text.substr(0, text.find('\n'));
  EXPECT_NE(pid, std::to_string(getpgrp()));
  EXPECT_EQ(text, pid + "\n" + pid + "\n");
  // > 0: that group (the other ranks join rank 0's); its leader stays alive meanwhile
  const Spawned leader = spawn_process({"/bin/sleep", "30"}, environment_with({}, {}), options);
  ASSERT_EQ(leader.error, 0);
  options.process_group = leader.pid;
  text = run_shell(kPidAndGroup, options, "group_given");
  kill(leader.pid, SIGKILL);
  waitpid(leader.pid, nullptr, 0);
  EXPECT_EQ(text.substr(text.find('\n') + 1), std::to_string(leader.pid) + "\n");
}

// Whether the child ignores SIGINT (bit 1 of the SigIgn mask its /proc status shows).
bool child_ignores_sigint(const SpawnOptions& options, const std::string& name) {
  const std::string text = run_shell("grep SigIgn /proc/$$/status", options, name);
  EXPECT_EQ(text.rfind("SigIgn:", 0), 0u) << text;
  const unsigned long long mask = std::strtoull(text.c_str() + 7, nullptr, 16);
  return (mask >> (SIGINT - 1)) & 1u;
}

TEST(Spawn, DefaultSignalsAreNotInheritedIgnored) {
  // compare ignores Ctrl-C while it waits for its runs; an ignored signal survives exec
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ASSERT_EQ(sigaction(SIGINT, &ignore, &previous), 0);
  const bool inherited = child_ignores_sigint({}, "signals_inherited");
  SpawnOptions options;
  options.default_signals = {SIGINT, SIGTERM};
  const bool reset = child_ignores_sigint(options, "signals_default");
  sigaction(SIGINT, &previous, nullptr);
  EXPECT_TRUE(inherited);
  EXPECT_FALSE(reset);
}

TEST(Spawn, AStartThatFailsIsItsErrorNumberAndNoChild) {
  Spawned child = spawn_process({}, {});
  EXPECT_EQ(child.error, EINVAL);
  EXPECT_EQ(child.pid, 0);
  child = spawn_process({"/nonexistent/posenc"}, {});
  EXPECT_EQ(child.error, ENOENT);
  EXPECT_EQ(child.pid, 0);
  SpawnOptions options;
  options.output_file = "/nonexistent/folder/log";  // opened in the child, before exec
  child = spawn_process({"/bin/true"}, {}, options);
  EXPECT_EQ(child.error, ENOENT);
  EXPECT_EQ(child.pid, 0);
  options = {};
  options.default_signals = {12345};  // no such signal
  child = spawn_process({"/bin/true"}, {}, options);
  EXPECT_EQ(child.error, EINVAL);
}

TEST(Spawn, AnEnvironmentEntryWithoutNameAndValueIsRefusedNotAnEmptyEnvironment) {
  // an entry without '=' once made the prefix "" and dropped every inherited variable
  EXPECT_THROW(environment_with({}, {"POSENC_SPAWN_TEST"}), c10::Error);
  EXPECT_THROW(environment_with({}, {"=1"}), c10::Error);
  EXPECT_THROW(environment_with({""}, {}), c10::Error);
  EXPECT_THROW(environment_with({"A=B"}, {}), c10::Error);
  const auto env = environment_with({}, {"POSENC_SPAWN_TEST=1"});
  EXPECT_GT(env.size(), 1u);  // the inherited ones kept
}

}  // namespace
}  // namespace posenc::cli
