// Internal: when the fused CPU passes write their float32 outputs with non-temporal ("streaming")
// stores, and the fence after them. A streaming store (MOVNTPS: _mm256_stream_ps, _mm512_stream_ps)
// writes a whole 64-byte line to memory through the write-combining buffers without first reading
// it into the cache (a normal store's read-for-ownership), so a pass that writes n bytes out of
// cache moves n bytes for them instead of 2n: what glibc's memcpy does above its non-temporal
// threshold (a fraction of the last-level cache). Below the threshold an output stays in the cache
// for the op that reads it next, so normal stores are kept there. Streaming stores are weakly
// ordered: each parallel chunk that streamed ends with stream_fence() (SFENCE) before the pass is
// seen as done by another thread. The values written do not change, only where they go.
// Used by rope_cpu.cpp, gelu_cpu.cpp and layer_norm_cpu.cpp.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace posenc::detail {

/// Bytes written by one pass from which its float32 outputs stream: half the 32 MiB L3 of the
/// AMD EPYC these passes were measured on (bench/bench_kernel_width.cpp, docs/performance.md).
constexpr int64_t kStreamMinBytes = int64_t{16} << 20;

/// Streamed rows start on a 64-byte line (so do the stores that follow, row after row).
constexpr int64_t kStreamAlignBytes = 64;

inline bool line_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kStreamAlignBytes == 0;
}

/// Orders the calling thread's streaming stores before its later stores (the end of a chunk).
inline void stream_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

}  // namespace posenc::detail
