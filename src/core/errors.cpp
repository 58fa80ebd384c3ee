// Which errno values say the environment failed rather than the input (posenc/core/errors.h): the
// one classification the file readers (io/), the run folder and the tool's exit code share.
#include "posenc/core/errors.h"

#include <cerrno>

namespace posenc {

bool is_environment_errno(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EROFS:
    case EACCES:
    case EPERM:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return true;
    default:
      return false;
  }
}

}  // namespace posenc
