// Key-value retrieval prompts over bytes: the synthetic task of "Lost in the Middle" (Liu et al.
// 2023, section 3: JSON key-value retrieval), in a form a byte-level model learns in minutes.
//
//   haystack "records":  N records "KK=VV;"  (KK: two capital letters, distinct within a prompt;
//                        VV: two digits), then the query "?KK=" naming the gold record's key;
//                        the answer is the gold record's VV.
//       bytes: 6 N (haystack) + 4 (query) = prompt; + 2 (answer)
//       depth of the gold record g in [0, N): g / (N - 1)
//   haystack "text":     the same 6 N haystack bytes are book text (held-out Gutenberg bytes with
//                        '=', '?' and ';' made spaces, so the record is the only one), with one
//                        record "KK=VV;" written over it at byte offset o = round(depth * (6 N -
//                        6)).
//
// Example (N = 3, gold g = 1):  "QF=07;HB=42;ZZ=90;?HB=" -> "42"
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace posenc::text {

/// Where the gold record hides.
enum class Haystack { kRecords, kText };
Haystack haystack_from_string(const std::string& name);  ///< "records" | "text"

/// Bytes of one record "KK=VV;" and of the query "?KK=".
constexpr int64_t kRecordBytes = 6, kQueryBytes = 4, kAnswerBytes = 2;
/// Distinct keys (26 x 26 letter pairs): the most records a prompt can hold.
constexpr int64_t kMaxRecords = 26 * 26;

struct RetrievalBatch {
  at::Tensor prompts;  ///< [B, 6 N + 4] int64 bytes, ending with the query "?KK="
  at::Tensor answers;  ///< [B, 2] int64: the gold value's two digits
  at::Tensor depths;   ///< [B] float64: where the gold record starts, as a fraction in [0, 1]
};

/// The prompt length for N records: 6 N + 4.
inline int64_t retrieval_prompt_bytes(int64_t records) {
  return kRecordBytes * records + kQueryBytes;
}

/// `count` prompts of `records` records. `depth` in [0, 1] puts every gold record at that depth
/// (records: index round(depth (N - 1)); text: byte round(depth (6 N - 6))); nullopt draws it
/// uniformly per prompt. `filler` (int64 bytes, at least 6 N long) is required for kText.
/// Everything random comes from `generator`.
RetrievalBatch make_retrieval_batch(int64_t count, int64_t records, Haystack haystack,
                                    std::optional<double> depth, at::Generator generator,
                                    const at::Tensor& filler = {});

}  // namespace posenc::text
