// Run folder lock and run names; see run_folder.h.
#include "run_folder.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "posenc/core/errors.h"

namespace posenc::train {

RunFolderLock::RunFolderLock(const std::string& folder) {
  const std::string path = folder + "/.posenc.lock";
  // O_NOFOLLOW: a lock that is a symbolic link is refused, never written through (its target
  // could be any file the user can write); O_NONBLOCK: a FIFO there cannot stall the open.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0 && errno == ELOOP)
    TORCH_CHECK(false, "'", path,
                "' is a symbolic link; posenc writes nothing in a run folder through a link: "
                "remove it");
  struct stat st {};
  if (fd_ >= 0 && (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode))) {
    ::close(fd_);
    TORCH_CHECK(false, "'", path, "' is not a regular file; remove it");
  }
  // a hard link shares its inode with another name: writing the PID would write that file too
  if (fd_ >= 0 && st.st_nlink > 1) {
    ::close(fd_);
    TORCH_CHECK(false, "'", path, "' is a hard link (", st.st_nlink,
                " names for one file); posenc writes nothing in a run folder through a link: "
                "remove it");
  }
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
RunFolderLock::~RunFolderLock() { ::close(fd_); }

void check_run_name(const std::string& name, const std::string& where) {
  TORCH_CHECK(!name.empty() && name.size() <= 128 && name != "." && name != ".." &&
                  name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
                  name.find('\0') == std::string::npos && name.front() != '-',
              where, ": run name '", name,
              "' must be 1 to 128 characters, not start with '-', and hold no '/', '\\' or '..' "
              "(it names a folder)");
}

void check_class_names(const std::vector<std::string>& now, const std::string& weights) {
  if (now.empty() || weights.empty()) return;
  const auto path = (std::filesystem::path(weights).parent_path() / "classes.json").string();
  if (!std::filesystem::is_regular_file(path)) return;
  std::ifstream in(path);
  const auto saved = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  bool names = saved.is_array();
  for (size_t i = 0; names && i < saved.size(); ++i) names = saved[i].is_string();
  TORCH_CHECK(names, "'", path, "' is not a JSON array of class names (posenc train writes it)");
  const auto trained = saved.get<std::vector<std::string>>();
  if (trained == now) return;
  size_t i = 0;
  while (i < now.size() && i < trained.size() && now[i] == trained[i]) ++i;
  std::ostringstream differ;
  if (i < now.size() && i < trained.size())
    differ << "class " << i << " is '" << now[i] << "' now, '" << trained[i] << "' in " << path;
  else
    differ << now.size() << " classes now, " << trained.size() << " in " << path;
  TORCH_CHECK(false,
              "the data's classes differ from those the weights were trained with: ", differ.str(),
              " (a class folder or label renamed, added or removed since training: the outputs "
              "would be named and scored wrongly)");
}

}  // namespace posenc::train
