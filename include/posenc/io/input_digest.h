// A digest of the data a process has read: every data reader (text, IDX images, CSV series,
// audio) adds the bytes it read, in the order it read them, so two processes that read the same
// data in the same order hold the same digest whatever the files' paths. The ranks of a
// data-parallel run compare it before step 1 (src/train/trainer.cpp agree_on_the_config): a rank
// given other data (another POSENC_DATA_DIR) is refused instead of training apart.
//   digest = "<bytes noted>:<hash>", the hash FNV-1a 64 over the bytes' 64-bit words (hex)
#pragma once

#include <cstddef>
#include <string>

namespace posenc {

/// Adds `bytes` bytes at `data` to this process's input digest (thread-safe).
void note_input(const void* data, size_t bytes);
/// "<bytes noted>:<hash in hex>" of everything noted so far.
std::string input_digest();

}  // namespace posenc
