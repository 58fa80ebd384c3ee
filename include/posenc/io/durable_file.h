// Durable, atomic writes of the files posenc produces (weights, checkpoints, logs, summaries,
// plots): a temp file in the same folder, created new (O_EXCL | O_NOFOLLOW: never through a link),
// written and fsync'ed, renamed over the target, then the folder fsync'ed. A crash at any moment
// leaves the old file or the new one, never a mix; a failure (disk full, read-only) removes the
// temp file and is one line naming the path and the cause (an EnvironmentError: exit 1).
// Fault injection for tests/fault_injection.sh: POSENC_FAULT_AT="before_rename:NAME:K" or
// "after_rename:NAME:K" ends the process as kill -9 would at the K-th write of a file named NAME.
#pragma once

#include <string>

namespace posenc {

/// Writes `text` to `path` atomically and durably (above). `path` must be a regular file or new
/// (a symlink, FIFO or device is refused, not replaced). With `keep_previous`, the file being
/// replaced stays reachable under that name (a hard link made before the rename).
void write_file_atomically(const std::string& path, const std::string& text,
                           const std::string& keep_previous = "");

}  // namespace posenc
