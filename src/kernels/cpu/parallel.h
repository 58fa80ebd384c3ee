// at::parallel_for for the CPU kernels, with the fork and the join of its OpenMP team made
// visible to ThreadSanitizer. LibTorch's wheel runs parallel_for on GNU OpenMP (libgomp), which
// is not built with TSan: the happens-before edges of `#pragma omp parallel` (the calling thread's
// writes before the region, the team's writes before the join) are invisible to it, so every
// kernel reading its arguments in the team would be reported as a race. Under TSan the calling
// thread releases a token before the region and acquires it after; each worker acquires it
// before running its chunk and releases it after: exactly the edges libgomp's barriers provide.
// Races between workers stay visible. Without TSan this is at::parallel_for itself.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace posenc::detail {

#if defined(__SANITIZE_THREAD__)
// The token's address must be known to a worker without reading the closure (that read would
// itself come before the acquire): one token for every kernel call.
inline char parallel_token = 0;
#endif

template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(&parallel_token);
  at::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    __tsan_acquire(&parallel_token);
    f(b, e);
    __tsan_release(&parallel_token);
  });
  __tsan_acquire(&parallel_token);
#else
  at::parallel_for(begin, end, grain, f);
#endif
}

}  // namespace posenc::detail
