// Run folders: one run per folder at a time (an advisory flock), run names that are safe folder
// names, and the class names a classifier's weights were trained with. Internal to the trainer.
#pragma once

#include <string>
#include <vector>

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

/// A classifier's class names now (the task's, read from the data as it is) against those its
/// weights were trained with: classes.json beside the weights (written by the run). A class
/// folder or label renamed, added or removed since training would name and score the outputs
/// wrongly without a word: refused in one line naming the first difference. Nothing to check
/// without class names or without a classes.json there (weights from elsewhere).
void check_class_names(const std::vector<std::string>& now, const std::string& weights);

}  // namespace posenc::train
