// Starting a child process the way posenc's launchers do: posix_spawn (never fork: LibTorch has
// threads by then, and a forked child may find one of their locks held), the program named by a
// path (no PATH search), its environment given whole. The three starters differ only in what
// SpawnOptions holds:
//   `train --nproc N` (nproc.cpp): SIGINT and SIGTERM back to their default action (the launcher
//     catches them to pass them on), every rank in one process group of its own (rank 0 leads it);
//   `compare --jobs N` (train.cpp): SIGINT back to its default (compare ignores Ctrl-C while it
//     waits; the child must stop on it), the parent's process group;
//   tests/test_distributed.cpp: stdout and stderr into a log file.
// Standard library and POSIX only; the tests compile it beside test_distributed.cpp.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace posenc::cli {

/// What one spawned child gets beyond its arguments and environment.
struct SpawnOptions {
  /// Signals set back to their default action in the child (the parent may catch or ignore
  /// them; a caught signal is reset by exec anyway, an ignored one is not). Default: none.
  std::vector<int> default_signals;
  /// The child's process group: -1 the parent's (default), 0 a new group that the child leads,
  /// > 0 that existing group (posix_spawnattr_setpgroup).
  pid_t process_group = -1;
  /// A file the child's stdout and stderr both go to, created or truncated (mode 0644).
  /// Default "": the parent's.
  std::string output_file;
};

/// A started child, or why it did not start.
struct Spawned {
  pid_t pid = 0;  ///< the child's pid; 0 when error != 0
  int error = 0;  ///< 0, or the error number posix_spawn (or setting it up) gave (strerror)
};

/// Starts the program at the path words[0] with the arguments `words` (words[0] included, as
/// argv) and the environment `env` ("NAME=value" each, nothing inherited), as `options` say.
/// An empty `words` is EINVAL. The caller waits for the child (waitpid).
Spawned spawn_process(const std::vector<std::string>& words, const std::vector<std::string>& env,
                      const SpawnOptions& options = {});

/// This process's environment without the variables named in `unset` and those `set` gives
/// ("NAME=value"), then `set`: the environment for spawn_process with a few variables changed.
std::vector<std::string> environment_with(const std::vector<std::string>& unset,
                                          const std::vector<std::string>& set);

}  // namespace posenc::cli
