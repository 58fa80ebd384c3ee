// spawn_process and environment_with (spawn.h): posix_spawn with the attributes and file actions
// SpawnOptions asks for, each set up, used and destroyed here, so no starter repeats them.
#include "spawn.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>

#include <cerrno>

extern char** environ;

namespace posenc::cli {

namespace {

// posix_spawn's attributes and file actions, destroyed on every return path.
struct Attributes {
  posix_spawnattr_t value;
  Attributes() { posix_spawnattr_init(&value); }
  ~Attributes() { posix_spawnattr_destroy(&value); }
  Attributes(const Attributes&) = delete;
  Attributes& operator=(const Attributes&) = delete;
};

struct FileActions {
  posix_spawn_file_actions_t value;
  FileActions() { posix_spawn_file_actions_init(&value); }
  ~FileActions() { posix_spawn_file_actions_destroy(&value); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
};

// The attributes options ask for (0, or the error number of the call that failed).
int set_attributes(const SpawnOptions& options, posix_spawnattr_t& attributes) {
  short flags = 0;
  if (!options.default_signals.empty()) {
    sigset_t defaults;
    sigemptyset(&defaults);
    for (const int signal : options.default_signals)
      if (sigaddset(&defaults, signal) != 0) return EINVAL;
    if (const int err = posix_spawnattr_setsigdefault(&attributes, &defaults)) return err;
    flags |= POSIX_SPAWN_SETSIGDEF;
  }
  if (options.process_group >= 0) {
    if (const int err = posix_spawnattr_setpgroup(&attributes, options.process_group)) return err;
    flags |= POSIX_SPAWN_SETPGROUP;
  }
  return posix_spawnattr_setflags(&attributes, flags);
}

// stdout into output_file (opened in the child), stderr a copy of it.
int set_file_actions(const SpawnOptions& options, posix_spawn_file_actions_t& actions) {
  if (options.output_file.empty()) return 0;
  if (const int err = posix_spawn_file_actions_addopen(&actions, 1, options.output_file.c_str(),
                                                       O_WRONLY | O_CREAT | O_TRUNC, 0644))
    return err;
  return posix_spawn_file_actions_adddup2(&actions, 1, 2);
}

// argv / envp for posix_spawn: pointers into the strings, null-terminated. posix_spawn takes
// char* const[] (C's historical type) and does not write through them.
std::vector<char*> pointers(const std::vector<std::string>& strings) {
  std::vector<char*> result;
  result.reserve(strings.size() + 1);
  for (const auto& s : strings) result.push_back(const_cast<char*>(s.c_str()));
  result.push_back(nullptr);
  return result;
}

}  // namespace

Spawned spawn_process(const std::vector<std::string>& words, const std::vector<std::string>& env,
                      const SpawnOptions& options) {
  if (words.empty()) return {0, EINVAL};
  Attributes attributes;
  FileActions actions;
  if (const int err = set_attributes(options, attributes.value)) return {0, err};
  if (const int err = set_file_actions(options, actions.value)) return {0, err};
  auto argv = pointers(words);
  auto envp = pointers(env);
  pid_t pid = 0;
  const int err = posix_spawn(&pid, words[0].c_str(), &actions.value, &attributes.value,
                              argv.data(), envp.data());
  return err == 0 ? Spawned{pid, 0} : Spawned{0, err};
}

std::vector<std::string> environment_with(const std::vector<std::string>& unset,
                                          const std::vector<std::string>& set) {
  std::vector<std::string> prefixes;  // "NAME=" of every variable replaced or removed
  for (const auto& name : unset) prefixes.push_back(name + "=");
  for (const auto& entry : set) {
    const auto eq = entry.find('=');  // without '=' the prefix would be "" and drop every entry
    TORCH_CHECK(eq != std::string::npos && eq > 0, "environment_with: \"", entry,
                "\" is not NAME=value");
    prefixes.push_back(entry.substr(0, eq + 1));
  }
  for (const auto& name : unset)
    TORCH_CHECK(!name.empty() && name.find('=') == std::string::npos, "environment_with: \"", name,
                "\" is not a variable name");
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool dropped = false;
    for (const auto& prefix : prefixes) dropped = dropped || entry.rfind(prefix, 0) == 0;
    if (!dropped) env.push_back(entry);
  }
  env.insert(env.end(), set.begin(), set.end());
  return env;
}

}  // namespace posenc::cli
