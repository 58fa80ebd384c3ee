// LibTorch's intra-op threads: how many cores this process may use, and all of them for LibTorch
// (which may start with one). The trainer, the tool, the tests and the benchmarks call it first.
#pragma once

namespace posenc {

/// Sets LibTorch's intra-op threads to the cores available (LibTorch may start with 1).
void use_all_cores();

}  // namespace posenc
