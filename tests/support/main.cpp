// Test entry point: LibTorch on every core, then GoogleTest.
#include <gtest/gtest.h>

#include "posenc/core/encoder.h"

int main(int argc, char** argv) {
  posenc::use_all_cores();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
