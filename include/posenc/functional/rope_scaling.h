// RoPE scaling types as units: one RopeScalingUnit per HF rope_type holds everything posenc knows
// about it — its names, the block keys it takes, the config.json values it depends on, its
// checks, its frequencies in exact float64 and in transformers' float32 arithmetic, and its
// attention factor — and one table lists them (transformers' ROPE_INIT_FUNCTIONS plus its
// per-type validators, modeling_rope_utils.py). rope.h's to_string/rope_scaling_from_string/
// rope_scaling_takes/rope_factor/rope_frequencies, the registry's dependency check and the HF
// resolver all read this table; nothing else switches on RopeScaling.
//
// Adding a type: CONTRIBUTING.md ("A RoPE scaling type").
#pragma once

#include <string>
#include <vector>

#include "posenc/functional/rope.h"

namespace posenc {

/// What a unit's frequency function reads.
struct RopeScalingContext {
  const RopeOptions& options;  ///< the whole RoPE (theta, head_dim, partial rotary, scaling)
  int64_t rotary_dim;          ///< r
  int64_t seq_len;             ///< -1: no longer than the original context
};

/// A value the type reads from elsewhere in config.json, which a pasted block must bring.
struct RopeScalingDependency {
  std::string key;     ///< e.g. "original_max_position_embeddings"
  std::string why;     ///< where transformers reads it, for the error line
  bool unless_factor;  ///< only needed when the block gives no 'factor'
};

struct RopeScalingUnit {
  RopeScaling type;
  std::string name;                  ///< transformers' rope_type
  std::vector<std::string> aliases;  ///< older spellings read as this type ("su")
  std::string reference;             ///< the transformers function it reproduces
  /// The block keys it takes (transformers' required and optional keys, beyond rope_type,
  /// rope_theta and partial_rotary_factor, which every type takes).
  std::vector<std::string> keys = {};
  std::vector<RopeScalingDependency> dependencies = {};
  /// Whether 'factor' scales (checked > 0 and finite); false: default and proportional.
  bool scales = true;
  /// Whether a factor below 1 is allowed (linear, longrope).
  bool factor_below_one = false;
  /// Whether the rotary dim is the whole head whatever partial_rotary_factor says (proportional:
  /// the pairs past the factor turn at frequency 0).
  bool rotates_whole_head = false;
  /// The factor when the block gives none; nullptr: 'factor' is required.
  double (*default_factor)(const RopeScalingOptions&) = nullptr;
  /// Type-specific checks (beyond the factor's), errors naming the key; may be nullptr.
  void (*validate)(const RopeScalingOptions&, const RopeOptions&, int64_t rotary_dim) = nullptr;
  /// inv_freq [r/2] float64 and the attention scaling.
  RopeFrequencies (*exact)(const RopeScalingContext&) = nullptr;
  /// inv_freq [r/2] float32, op for op as transformers computes it (equal to the bit).
  RopeFrequencies (*hf32)(const RopeScalingContext&) = nullptr;
};

/// Every type, in the order of the RopeScaling enum.
const std::vector<RopeScalingUnit>& rope_scaling_units();
/// The unit of a type (the one lookup).
const RopeScalingUnit& rope_scaling_unit(RopeScaling type);

/// theta^(-2i/denominator) for i < dim/2: [dim/2] float64 (exact), float32 (transformers'
/// `1.0 / (base ** (arange(0, dim, 2).float() / denominator))`, to the bit) or float64_peer (the
/// same formula in float64: diffusers' get_1d_rotary_pos_embed with freqs_dtype float64).
at::Tensor rope_ladder(double theta, int64_t dim, int64_t denominator, RopeAngleDtype dtype);

}  // namespace posenc
