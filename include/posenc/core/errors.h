// Two kinds of failure, told apart so a caller (and the `posenc` tool's exit code) can act on
// them: bad input — a config, an argument, a file's content — is a c10::Error from TORCH_CHECK
// (exit 2); a failure of the environment — disk full, no permission, out of memory, an I/O
// error — is an EnvironmentError (exit 1). Both name the file or key and what was found.
#pragma once

#include <stdexcept>
#include <string>

namespace posenc {

class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// true for errno values that say the environment failed rather than the input (ENOSPC, EDQUOT,
/// EIO, EROFS, EACCES, EPERM, ENOMEM, EMFILE, ENFILE).
bool is_environment_errno(int error);

}  // namespace posenc
