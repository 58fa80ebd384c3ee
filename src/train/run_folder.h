// Run folders: one run per folder at a time (an advisory flock), and run names that are safe
// folder names. Internal to the trainer.
#pragma once

#include <string>

namespace posenc::train {

// One run per folder at a time: an advisory flock on <folder>/.posenc.lock, held for the run's
// life (released by the kernel if the process dies). A second run is refused with the PID of
// the first, which the lock file holds.
class RunFolderLock {
 public:
  explicit RunFolderLock(const std::string& folder);
  ~RunFolderLock();
  RunFolderLock(const RunFolderLock&) = delete;
  RunFolderLock& operator=(const RunFolderLock&) = delete;

 private:
  int fd_ = -1;
};

/// Run and comparison entry names become folder names: one path component, no '..'.
void check_run_name(const std::string& name, const std::string& where);

}  // namespace posenc::train
