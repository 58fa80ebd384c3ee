// What tools/gen_hf_architectures.py learned from each transformers model type's own config and
// rotary classes by calling them (pinned transformers kHfArchitecturesTransformers), as a typed
// table: one HfGeneratedRules row per model type (src/config/hf_generated_rules.inc, generated;
// the same rows as JSON in tests/fixtures/hf_architectures/generated_rules.json, which
// tests/test_hf_architectures.cpp compares with the compiled table row by row).
//
// A row holds two kinds of facts:
//   - defaults: what the config class uses for a key posenc reads when a config.json leaves it
//     out (a constant of the class: rope_theta, head_dim, its default rope_parameters blocks, ...;
//     keys it derives, such as head_dim from hidden_size, are not listed); the resolver fills them
//     into the file (src/config/hf_config.cpp's fill_absent_defaults);
//   - rules: how the classes read a file (head_dim's rules, the keys their head size comes from,
//     which rope types they refuse, which keys their rotary never reads, the pair layout their
//     attention rotates, ...), each a field the resolver's step that owns the value reads by name
//     (src/config/hf_resolve_steps.cpp).
// A misspelt rule is a compile error; a field the generator does not know stops the generator.
// Python's None (a class attribute set to None, not left unset) is HfNone where it differs from
// an unset key (std::nullopt around the value).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

namespace posenc {

/// Python's None: a value the class sets to None, which differs from one it does not set.
struct HfNone {};
inline constexpr HfNone kHfNone{};

/// A value the class sets, None included.
template <typename T>
struct HfOrNone {
  constexpr HfOrNone(HfNone) {}  // NOLINT(google-explicit-constructor): kHfNone in the table
  constexpr HfOrNone(T v) : value(v) {}   // NOLINT(google-explicit-constructor)
  std::optional<T> value = std::nullopt;  ///< nullopt: None
};

/// One rope_parameters block of a config class's defaults, as config.json carries it.
struct HfDefaultBlock {
  std::string_view layer_type = {};  ///< "" for a flat block, else the layer type it belongs to
  bool no_rope = false;              ///< the layer type's block is None (a layer without RoPE)
  std::string_view rope_type = {};   ///< empty: the block names none
  std::optional<double> rope_theta = std::nullopt;
  /// The class takes a file's top-level rope_theta into this block (else keeps its own theta).
  bool rope_theta_from_file = false;
  std::optional<double> partial_rotary_factor = std::nullopt;
  std::optional<double> factor = std::nullopt;
  std::optional<int64_t> original_max_position_embeddings = std::nullopt;
  std::optional<int64_t> max_position_embeddings = std::nullopt;
  std::optional<double> attention_factor = std::nullopt;
  std::optional<double> beta_fast = std::nullopt;
  std::optional<double> beta_slow = std::nullopt;
  std::optional<double> mscale = std::nullopt;
  std::optional<double> mscale_all_dim = std::nullopt;
  std::optional<bool> truncate = std::nullopt;
  std::optional<double> low_freq_factor = std::nullopt;
  std::optional<double> high_freq_factor = std::nullopt;
  std::optional<double> llama_4_scaling_beta = std::nullopt;
  std::vector<int64_t> mrope_section = {};
};

/// The config class's value for a key a config.json leaves out (unset: the class has none, or
/// derives it).
struct HfClassDefaults {
  std::optional<double> rope_theta = std::nullopt;
  std::optional<double> partial_rotary_factor = std::nullopt;
  std::optional<int64_t> head_dim = std::nullopt;
  std::optional<int64_t> global_head_dim = std::nullopt;
  std::optional<int64_t> max_position_embeddings = std::nullopt;
  std::optional<bool> rope_interleave = std::nullopt;
  /// Its default rope_parameters for a file with neither rope_parameters nor rope_scaling: one
  /// flat block (layer_type "") or one per layer type; empty: none.
  std::vector<HfDefaultBlock> rope_parameters = {};
};

/// A set of transformers' rope types (ROPE_INIT_FUNCTIONS' names).
struct HfRopeTypes {
  bool linear = false;
  bool dynamic = false;
  bool yarn = false;
  bool longrope = false;
  bool llama3 = false;
  /// Whether the set holds `rope_type` (a name outside the five: no).
  bool names(std::string_view rope_type) const;
};

/// Block keys the config class requires per rope type (KeyError without them).
struct HfRequiredBlockKeys {
  std::vector<std::string_view> linear = {};
  std::vector<std::string_view> dynamic = {};
  std::vector<std::string_view> yarn = {};
  std::vector<std::string_view> longrope = {};
  std::vector<std::string_view> llama3 = {};
  /// The keys `rope_type` requires (none for a type outside the five).
  const std::vector<std::string_view>& of(std::string_view rope_type) const;
};

/// Where a model type's rotary head size (the r that partial_rotary_factor multiplies) comes from:
/// the generated head_size (tools/gen_hf_architectures.py's head_size_rule: which keys of a
/// config.json size the model type's rotary tables), or a hand-written row's (hf_architectures.h)
/// where the probe cannot see it. A file's head_dim beside another rule's keys is the rotary
/// table's, checked against that head (the resolver's head_dim rules).
enum class HfHeadSize {
  kGeneric,           ///< qk_rope_head_dim > head_dim > hidden_size / num_attention_heads
  kHeadDim,           ///< head_dim > hidden_size / num_attention_heads; qk_rope_head_dim unread
  kGlobalHeadDim,     ///< full_attention layers: global_head_dim (default 512); others generic
  kKvChannels,        ///< kv_channels (JetMoE)
  kAttentionHeadDim,  ///< attention_head_dim (Zamba2)
  kDModelPerHead,     ///< d_model / n_heads (DBRX)
  kDecoderHeads,      ///< hidden_size / decoder_num_attention_heads (Moonshine)
  kRotaryDim,         ///< rotary_dim of n_embd / n_head or hidden_size / num_attention_heads
  kMemoryAttention,   ///< memory_attention_hidden_size / (memory_attention_downsample_rate x
                      ///< memory_attention_num_attention_heads) (SAM 2/3 and EdgeTAM trackers)
};
/// The generator's name of a head-size rule (generated_rules.json's "head_size": the key or keys
/// the model type's rotary classes size their tables by: "head_dim", "qk_rope_head_dim",
/// "d_model / n_heads", ...).
std::string_view hf_head_size_name(HfHeadSize head);

/// What the class does with a "head_dim": null in the file.
enum class HfNullHeadDim {
  kNotProbed,  ///< not recorded: the null is left as the file has it
  kNone,       ///< None: transformers' default, linear and llama3 ropes take hidden / heads
  kRaises,     ///< a typed field: the file does not load
  kDerived,    ///< hidden_size / num_attention_heads (ERNIE 4.5)
};

/// How the class takes a file's head_dim (generator's head_dim_rules).
struct HfHeadDimRules {
  HfNullHeadDim null_head_dim = HfNullHeadDim::kNotProbed;
  bool head_dim_overridden = false;  ///< the class sets head_dim itself: the file's is unread
  bool head_dim_raises = false;      ///< the class fails on any head_dim key
  /// The key head_dim is an alias of (JetMoE: kv_channels): the file's head_dim replaces it.
  std::string_view head_dim_alias_of = {};
  bool absent_head_dim_none = false;  ///< a file without head_dim leaves it None
};

/// transformers 4's top-level rope_scaling where the class departs from the standard conversion.
struct HfLegacyScaling {
  bool reads_scaling = true;         ///< false: the class never reads rope_scaling (refused)
  bool rope_theta_from_file = true;  ///< false: a top-level rope_theta is not the block's theta
  std::optional<HfOrNone<double>> rope_theta =
      std::nullopt;  ///< the theta the class gives the block instead
  /// the theta a file without a top-level rope_theta gets (Ministral 3: its attribute's)
  std::optional<double> absent_rope_theta = std::nullopt;
  /// the factor of the default block a rope_scaling replaced (None: the whole head)
  std::optional<HfOrNone<double>> partial_rotary_factor = std::nullopt;
  /// the same for a file's own flat rope_parameters block without a factor (Moonshine Streaming)
  std::optional<HfOrNone<double>> block_partial_rotary_factor = std::nullopt;
};

/// Where the class takes max_position_embeddings from, and what original context it fills.
struct HfMaxPositionRules {
  /// the key the class reads as max_position_embeddings (GPT-J: n_positions); empty: none
  std::string_view max_position_alias = {};
  /// the original_max_position_embeddings the class gives a block without one when the file
  /// gives the alias (None: none, transformers fails)
  std::optional<HfOrNone<int64_t>> alias_original = std::nullopt;
  /// ... when the file gives max_position_embeddings itself
  std::optional<HfOrNone<int64_t>> unset_original = std::nullopt;
};

/// A modeling file that builds its rotary only for one value of a key (ESM).
struct HfRotaryGate {
  std::string_view key = {};     ///< empty: no gate
  std::string_view rotary = {};  ///< the value that builds the rotary
  std::optional<std::string_view> absent =
      std::nullopt;  ///< the class's default for the key (nullopt: None)
};

/// Spellings the model type's config or rotary class refuses (its strict fields, its pow).
struct HfRejectedValues {
  bool rope_theta_string = false;
  bool rope_theta_integer = false;  ///< a float-typed field (DINOv3)
  bool block_rope_theta_string = false;
  bool head_dim_float = false;
  bool max_position_embeddings_float = false;
  bool rope_type_su = false;     ///< a legacy name ROPE_INIT_FUNCTIONS does not know
  bool rope_type_mrope = false;  ///< the same
};

/// The rope_theta the class gives a block of the file without one, per layer type ("" flat).
struct HfLayerTheta {
  std::string_view layer_type;
  double rope_theta;
};

struct HfGeneratedRules {
  std::string_view model_type;
  HfClassDefaults defaults = {};
  /// A composite's own defaults for its text_config ({**its kwargs, **file}: Voxtral's text
  /// model without rope_theta is 1e8, not Llama's 1e4); they count as the file's.
  HfClassDefaults text_config_defaults = {};
  std::vector<HfLayerTheta> block_rope_theta = {};
  /// Layer types ("" flat, "*" any) whose block the class leaves without rope_theta when the
  /// file gives none (transformers then fails: KeyError)
  std::vector<std::string_view> block_theta_missing = {};
  std::optional<HfHeadDimRules> head_dim_rules =
      std::nullopt;  ///< unset: not probed (not a rotary type)
  /// Where its rotary classes take the head size from (unset: none of HfHeadSize's rules, or no
  /// rotary class built on its own config: the row's, else the generic rule).
  std::optional<HfHeadSize> head_size = std::nullopt;
  std::optional<HfLegacyScaling> legacy_rope_scaling =
      std::nullopt;  ///< set: the class takes rope blocks
  std::optional<HfMaxPositionRules> max_position_rules = std::nullopt;
  std::vector<int64_t> mrope_default_section = {};  ///< M-RoPE sections of a block without any
  std::string_view mrope_layout = {};     ///< "contiguous"/"interleaved" M-RoPE, as its code does
  bool null_rope_scaling_unsets = false;  ///< "rope_scaling": null unsets the blocks (fails)
  HfRopeTypes original_not_filled = {};   ///< no original context filled into such a block
  std::string_view pair_layout = {};      ///< "half"/"interleaved" as its attention rotates
  HfRequiredBlockKeys required_block_keys = {};
  bool rope_theta_raises = false;  ///< a top-level rope_theta alone fails (zipped with layers)
  HfRopeTypes rope_types_rejected = {};  ///< its config or rotary class raises on these
  HfRotaryGate rotary_gate = {};
  HfRopeTypes top_original_unread = {};  ///< a top-level original context is not read for these
  /// config.json keys its rotary class never reads ("rope_theta", "rope_parameters.rope_theta",
  /// "rope_parameters", "rope_scaling", "partial_rotary_factor")
  std::vector<std::string_view> unread_keys = {};
  HfRejectedValues values_rejected = {};
};

/// The model type's row; nullptr when the generator recorded nothing for it.
const HfGeneratedRules* hf_generated_rules(std::string_view model_type);
/// Every row, sorted by model type.
const std::vector<HfGeneratedRules>& hf_generated_rule_rows();

/// A block as config.json carries it (rope_theta_from_file left out; null for no_rope).
nlohmann::json hf_default_block_json(const HfDefaultBlock& block);
/// The defaults as config.json keys (rope_parameters with each block's rope_theta_from_file).
nlohmann::json to_json(const HfClassDefaults& defaults);
/// The row in the generator's JSON shape (tests/fixtures/hf_architectures/generated_rules.json).
nlohmann::json to_json(const HfGeneratedRules& rules);

}  // namespace posenc
