// Test entry point: LibTorch on every core, then GoogleTest. A POSENC_CPU_CAPABILITY above what
// this CPU has (CTest's unit_cpu_avx512 on an AVX2 machine) skips the whole run: exit 77, CTest's
// SKIP_RETURN_CODE for those entries, with the one line that says why.
#include <gtest/gtest.h>

#include <cstdio>

#include "posenc/core/threads.h"
#include "posenc/kernels/cpu_capability.h"

int main(int argc, char** argv) {
  if (const auto forced = posenc::cpu_capability_requested();
      forced.has_value() && *forced > posenc::cpu_capability_detected()) {
    std::printf("skipped: POSENC_CPU_CAPABILITY=%s but this CPU's widest level is %s\n",
                posenc::to_string(*forced), posenc::to_string(posenc::cpu_capability_detected()));
    return 77;
  }
  posenc::use_all_cores();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
