// Text into byte tokens + Positions, for byte-level language models.
// Corpus: public-domain Project Gutenberg books that Debian ships as test data (Moby Dick in
// golang-github-colinmarc-hdfs-dev; The Adventures of Sherlock Holmes and Tom Sawyer in
// golang-github-pierrec-lz4-dev); scripts/setup.sh takes the files out with apt-get download +
// dpkg-deb -x, no install.
// strip_gutenberg: drops a UTF-8 byte-order mark, turns CRLF into LF, keeps what lies after the
// "*** START OF" line and before the first of "*** END OF", "End of Project Gutenberg" or
// "End of the Project Gutenberg" (the license and the producer's footer).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "posenc/core/positions.h"

namespace posenc::text {

/// The whole file as bytes; an unreadable file is an error naming it.
/// A text file's bytes, at most kMaxTextBytes (a regular file; a FIFO or device is refused).
inline constexpr int64_t kMaxTextBytes = int64_t{1} << 30;  // the text file limit: 1 GiB
std::string read_text(const std::string& path);
/// The book without the Gutenberg header and footer (see above).
std::string strip_gutenberg(const std::string& text);

/// Bytes as tokens: vocabulary 256, no unknowns, lossless.
struct ByteTokenizer {
  static constexpr int64_t kVocabSize = 256;
  at::Tensor encode(const std::string& text) const;  ///< [N] int64
  std::string decode(const at::Tensor& tokens) const;
};

struct TextWindows {
  at::Tensor inputs;    ///< [count, length] int64
  at::Tensor targets;   ///< [count, length] int64: the next byte of each input
  Positions positions;  ///< Positions::sequence(length)
};
/// `count` windows of `length` tokens at random offsets (torch's generator, so seeded by
/// torch::manual_seed, or `generator`), each with its next-token targets.
TextWindows sample_windows(const at::Tensor& tokens, int64_t length, int64_t count,
                           std::optional<at::Generator> generator = std::nullopt);

}  // namespace posenc::text
