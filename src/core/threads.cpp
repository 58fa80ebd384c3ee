// LibTorch's intra-op threads set to the cores available (include/posenc/core/threads.h).
#include "posenc/core/threads.h"

#include <ATen/Parallel.h>

#include <thread>

namespace posenc {

void use_all_cores() {
  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0) at::set_num_threads(static_cast<int>(cores));
}

}  // namespace posenc
