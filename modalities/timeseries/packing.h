// Sensor series as the time-series foundation models feed them to a transformer: patches of
// readings, one token per (patch, variate), several samples packed into one sequence.
//
//   patch-index positions (TimesFM 2.5, transformers' timesfm2_5): position_ids = arange(N) -
//       num_padded, so a context left-padded by k patches starts at -k and its first real patch
//       is 0 whatever the padding (timesfm 3.0.2 / modeling_timesfm2_5.py)
//   variate ids (Moirai, uni2ts' variate_id): which series of a multivariate sample a token is;
//       the binary variate bias (posenc/encoders/variate_bias.h) reads them as the axis "variate"
//   packing (Moirai, uni2ts' sample_id / packed_attention_mask): samples of different lengths
//       laid one after another in rows of max_tokens tokens, each one contiguous run of sample id;
//       attention keeps to a sample (PlanRequest::sample_ids); positions restart in every sample;
//       the rest of a row is padding (its own sample id, key padding false)
//
// A sample's time axis is what the caller chooses: patch indices (the field's recipe) or real
// timestamps of each patch (posenc's: gaps visible). Positions carry the axes ("time",
// "variate"), batched [B, L, 2], so a compose can give RoPE the time axis and the variate bias
// the variate axis.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "posenc/core/positions.h"

namespace posenc::timeseries {

/// TimesFM 2.5's patch positions: [B, n] float64, row b = arange(n) - num_padded[b].
/// num_padded: [B] integers in [0, n] (one line naming the first bad index otherwise).
at::Tensor left_padded_positions(const at::Tensor& num_padded, int64_t n);

/// One sample: n tokens of width P (a patch of P readings of one variate each).
struct PackSample {
  at::Tensor tokens;    ///< [n, P] float32
  at::Tensor time;      ///< [n] float64: the time axis (patch index, or elapsed time)
  at::Tensor variate;   ///< [n] int64 >= 0
  at::Tensor observed;  ///< [n] bool: false = a token to predict (the model sees where only)
};

/// Samples packed into rows: B rows of L = max_tokens tokens.
struct PackedBatch {
  at::Tensor tokens;      ///< [B, L, P] float32 (zeros in padding)
  Positions positions;    ///< [B, L, 2], axes ("time", "variate"); padding at (0, 0)
  at::Tensor sample_ids;  ///< [B, L] int64: 0, 1, .. per row in order; padding the next id
  at::Tensor real;        ///< [B, L] bool: false in padding (the attention's key padding)
  at::Tensor observed;    ///< [B, L] bool: false for tokens to predict (and padding)
  std::vector<int64_t> row, offset;  ///< per sample: its row and first token there
};

/// Packs samples in order into rows of max_tokens tokens: a sample goes into the current row if
/// it fits, else it opens the next one. Samples are checked (shapes, integer variate ids, time
/// not going backwards inside a (sample, variate), observed readings finite: a NaN key would reach
/// the other samples of its row through the attention's 0 * NaN); one line names the sample,
/// tensor and index.
PackedBatch pack_samples(const std::vector<PackSample>& samples, int64_t max_tokens);

}  // namespace posenc::timeseries
