// Reading the files a user names (configs, data, weights): regular files only. A FIFO, a device, a
// socket or a folder given where a file belongs is one line naming it and its kind, never a read
// that blocks forever or streams without end: the file is opened without blocking (O_NONBLOCK),
// checked with fstat, and only then read. A file larger than the caller's limit is refused before
// it is read. Failures follow posenc/core/errors.h: a missing or wrong-kind file is bad input
// (c10::Error, exit 2); EIO, EACCES and their kind are an EnvironmentError (exit 1).
#pragma once

#include <cstdint>
#include <string>

namespace posenc {

/// Refuses anything but an existing regular file; `what` names it in messages ("config file").
void require_regular_file(const std::string& path, const std::string& what);

/// The whole file, after require_regular_file's checks; at most max_bytes (the caller's named
/// limit, given in the message as `limit_name`).
std::string read_regular_file(const std::string& path, const std::string& what, int64_t max_bytes,
                              const std::string& limit_name);

}  // namespace posenc
