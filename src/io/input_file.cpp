// Regular-file reads that cannot block; see posenc/io/input_file.h.
#include "posenc/io/input_file.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "posenc/core/errors.h"

namespace posenc {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "a special file";
}

[[noreturn]] void fail(int why, const std::string& path, const std::string& what,
                       const char* doing) {
  const std::string message =
      std::string("cannot ") + doing + " " + what + " '" + path + "': " + std::strerror(why);
  if (why == ENOENT || why == ENOTDIR || why == ENAMETOOLONG || why == ELOOP)
    TORCH_CHECK(false, message);
  if (is_environment_errno(why)) throw EnvironmentError(message);
  TORCH_CHECK(false, message);
}

[[noreturn]] void refuse(const std::string& path, const std::string& what, mode_t mode) {
  TORCH_CHECK(false, what, " '", path, "' is ", kind_of(mode),
              ", not a regular file; posenc reads ", what, "s from regular files only");
}

// An open descriptor of a regular file, closed on scope exit.
struct RegularFile {
  RegularFile(const std::string& path, const std::string& what) {
    // A socket cannot be opened at all (ENXIO, "No such device or address") and opening a device
    // may act on it: anything but a regular file is named from stat before any open. A missing
    // path falls through to open, whose errno is the message; fstat below covers a swap between.
    struct stat before {};
    if (::stat(path.c_str(), &before) == 0 && !S_ISREG(before.st_mode))
      refuse(path, what, before.st_mode);
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) fail(errno, path, what, "open");
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int why = errno;
      ::close(fd);
      fail(why, path, what, "inspect");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      refuse(path, what, st.st_mode);
    }
    size = static_cast<int64_t>(st.st_size);
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  ~RegularFile() { ::close(fd); }
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  int fd = -1;
  int64_t size = 0;
};

}  // namespace

void require_regular_file(const std::string& path, const std::string& what) {
  RegularFile file(path, what);
}

std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes,
                              const std::string& limit_name) {
  RegularFile file(path, what);
  TORCH_CHECK(file.size <= max_bytes, what, " '", path, "' has ", file.size, " bytes; ", limit_name,
              " is ", max_bytes, " bytes");
  std::string text;
  text.reserve(static_cast<size_t>(file.size));
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(file.fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(errno, path, what, "read");
    }
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
    TORCH_CHECK(static_cast<int64_t>(text.size()) <= max_bytes, what, " '", path, "' grew past ",
                limit_name, " (", max_bytes, " bytes) while being read");
  }
  return text;
}

}  // namespace posenc
