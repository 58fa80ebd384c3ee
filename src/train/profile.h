// Where a training step's time goes: LibTorch's profiler (Kineto, CPU activities) over a window
// of steps, every op's *self* time (its duration minus its children's, per thread) summed into
// categories, and the rest of the wall time (autograd engine, dispatch, allocator, the loop
// itself) as one line. An op's category comes from the innermost posenc scope around it
// (posenc::data, posenc::rotary, posenc::clip, posenc::optimizer: RECORD_USER_SCOPE in the code),
// else from its own name or its innermost named ancestor (aten::addmm and AddmmBackward0 are
// matmuls, ...). Worker threads of an op's parallel region are not seen by the profiler: an op's
// time is its wall time on the training thread, which is what the step waits for.
//   posenc train CONFIG --profile 50     # 10 steps warm-up, 50 profiled; prints the table
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace posenc::train {

struct ProfileRow {
  std::string category;
  double ms_per_step = 0;
  double share = 0;           ///< of the wall time per step
  double calls_per_step = 0;  ///< ops counted (0 for the unattributed line)
};

/// The profiler over a window of steps; one at a time per process.
class StepProfiler {
 public:
  void start();  ///< enables LibTorch's profiler (CPU) and starts the wall clock
  /// Disables it and returns the breakdown per step over `steps` steps, largest first, the
  /// unattributed time last.
  std::vector<ProfileRow> stop(int64_t steps);
  /// After stop(): the ops with the largest self time per step, each named "op (category)",
  /// largest first (at most `count`): the op-by-op view behind the categories.
  std::vector<ProfileRow> largest_ops(size_t count = 15) const;

 private:
  std::vector<ProfileRow> ops_;
  double begin_ = 0;
  bool running_ = false;
};

/// The category of an op: from its scopes (innermost first) and names (own, then ancestors).
/// `names` lists the op and its ancestors, innermost first. Exposed for tests.
std::string profile_category(const std::vector<std::string>& names);

/// The breakdown as a markdown table (category, ms/step, share, ops/step) with a total line.
std::string format_profile(const std::vector<ProfileRow>& rows, int64_t steps);
/// The largest ops as a markdown table (op (category), ms/step, share, calls/step).
std::string format_largest_ops(const std::vector<ProfileRow>& ops);

}  // namespace posenc::train
