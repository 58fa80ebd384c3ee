// Durable, atomic file writes; see posenc/io/durable_file.h.
#include "posenc/io/durable_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "posenc/core/errors.h"

namespace posenc {

namespace {
// Bad input (a missing folder) is a c10::Error; a failing disk an EnvironmentError.
[[noreturn]] void fail_write(const std::string& what, int error) {
  const std::string message = what + ": " + std::strerror(error);
  if (is_environment_errno(error)) throw EnvironmentError(message);
  TORCH_CHECK(false, message);
}

// Fault injection for tests (tests/fault_injection.sh): POSENC_FAULT_AT="before_rename:NAME:K"
// or "after_rename:NAME:K" ends the process at once, as kill -9 would (_exit: no destructors, no
// flush), at the K-th atomic write of a file named NAME. Unset, it costs one getenv per write.
void fault_point(const char* when, const std::string& path) {
  static const char* spec = std::getenv("POSENC_FAULT_AT");
  if (!spec) return;
  static int count = 0;
  const auto slash = path.find_last_of('/');
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string prefix = std::string(when) + ":" + name + ":";
  const std::string wanted(spec);
  if (wanted.rfind(prefix, 0) != 0) return;
  if (++count == std::atoi(wanted.c_str() + prefix.size())) _exit(137);
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

void write_file_atomically(const std::string& path, const std::string& contents,
                           const std::string& keep_previous) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0) {
    TORCH_CHECK(S_ISREG(info.st_mode), "'", path,
                "' exists and is not a regular file (a link, FIFO, device or folder); refusing to "
                "replace it");
  }
  const std::string temp = path + ".tmp";
  // a stale temp file (or a link planted there) is removed, never written through: O_EXCL and
  // O_NOFOLLOW create a new regular file or fail
  ::unlink(temp.c_str());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) fail_write("cannot write '" + path + "'", errno);
  const char* data = contents.data();
  size_t left = contents.size();
  int error = 0;
  while (left > 0 && error == 0) {
    const ssize_t written = ::write(fd, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error = written < 0 ? errno : EIO;
      break;
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
  if (error == 0 && ::fsync(fd) != 0) error = errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    fail_write("cannot write '" + path + "'", error);
  }
  if (!keep_previous.empty() && ::lstat(path.c_str(), &info) == 0) {
    ::unlink(keep_previous.c_str());
    if (::link(path.c_str(), keep_previous.c_str()) != 0) {
      const int why = errno;
      ::unlink(temp.c_str());
      fail_write("cannot keep '" + path + "' as '" + keep_previous + "'", why);
    }
  }
  fault_point("before_rename", path);
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int why = errno;
    ::unlink(temp.c_str());
    fail_write("cannot move '" + temp + "' to '" + path + "'", why);
  }
  const int dir = ::open(folder_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {  // the rename is durable once the folder is
    ::fsync(dir);
    ::close(dir);
  }
  fault_point("after_rename", path);
}

}  // namespace posenc
