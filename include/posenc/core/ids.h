// Integer ids carried beside positions: a token's variate (which series of a multivariate
// sample it belongs to) and its sample (which of the series packed into one sequence), as the
// time-series foundation models pack their batches (Moirai's variate_id / sample_id, uni2ts).
//
//   ids       [N] or [B, N], integers (stored in any real dtype; floats must be whole numbers)
//   sample    a packed row holds several samples, each one contiguous run of tokens:
//             ids 0 0 0 1 1 2 2 2 is packed; 0 0 1 1 0 is not (sample 0 resumes at index 4)
//   time      inside one (sample, variate) the timestamps never go backwards
//
// Every check stops at the first bad element and says, in one line, which tensor, which index
// and why: "sample_ids: sample 0 is not one contiguous run (it resumes at index [0, 4])". Bad ids
// are bad input: a c10::ValueError (TORCH_CHECK_VALUE), so Python callers get a ValueError.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace posenc {

/// "[b, n]" / "[n]": the multi-index of flat element `flat` of a tensor of these sizes.
std::string index_text(int64_t flat, at::IntArrayRef sizes);

/// Checks that `ids` ([N] or [B, N], any real dtype) hold integers in [0, limit) (limit <= 0: no
/// upper bound); the error names `name` and the first bad index, e.g.
/// "variate_ids: 2.5 at index [0, 3] is not an integer". Returns the ids as int64 on ids' device.
at::Tensor checked_ids(const at::Tensor& ids, const std::string& name, int64_t limit = 0);

/// checked_ids, then: each id of a row forms one contiguous run (packed samples). Returns int64.
at::Tensor checked_sample_ids(const at::Tensor& ids, const std::string& name = "sample_ids");

/// Timestamps `times` (same shape as the ids) never decrease between consecutive tokens of the
/// same (sample, variate) in a row; the error names `name`, the index and both values.
void check_times_per_sample(const at::Tensor& times, const at::Tensor& sample_ids,
                            const at::Tensor& variate_ids, const std::string& name = "times");

}  // namespace posenc
