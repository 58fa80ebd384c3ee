// What posenc knows of each transformers model type's rotary embedding: one table, one row per
// model type that needs more than the generic rule, checked against every model type's own rotary
// class by tests/test_hf_architectures.cpp (fixtures from tools/gen_hf_architectures.py, pinned
// transformers kHfArchitecturesTransformers).
//
// The generic rule (a model type without a row or a generated rule): head size =
// qk_rope_head_dim > head_dim > hidden_size / num_attention_heads; partial_rotary_factor >
// rotary_pct > 1 (1 for the default rope of the model types whose class ignores it); rotate_half
// pairs (i, i + r/2); rope_interleave decides the layout only for the model types whose code reads
// it (and for unknown ones).
// A row says what the generator cannot probe (posenc/config/hf_generated_rules.h holds what it
// can: defaults, unread keys, the keys the head size comes from, the pair layout its attention
// rotates): the head size where the probe cannot see it (HfHeadSize: Gemma 4's per-layer
// global_head_dim), its pair layout where the rotation could not be run, flags, or why posenc
// refuses it. The model types transformers ships are known by name: one without a rotary class
// is refused (its positions are not RoPE), one posenc has never seen resolves by the generic rule
// with a warning naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "posenc/config/hf_generated_rules.h"

namespace posenc {

inline constexpr std::string_view kHfArchitecturesTransformers = "5.24.0";

/// How a vision tower's rotary (rope_type 'axial') lays the position axes over the head, as its
/// class's compute_axial_rope_parameters and recomposition_frequencies build cos/sin. Positions
/// are (row, column) per patch, (time, row, column) for kTimeRowsColumns. One unit per variant
/// (hf_axial_unit: its sections, their layout and axes, its frequencies).
enum class HfAxial {
  kRowsThenColumns,         ///< cat(rows, cols): one ladder theta^(-2i/(r/2)) per axis (Qwen2-VL)
  kColumnsThenRows,         ///< cat(cols, rows), per-axis ladders (Step 3.7, Inkling 2)
  kColumnsRowsAlternating,  ///< cols, rows, cols, ... pair by pair, per-axis ladders (Kimi-K2.5)
  kRowsEvenColumnsOdd,      ///< one ladder theta^(-2i/Dh): rows its even, columns its odd (Pixtral)
  kTimeRowsColumns,  ///< time, rows, cols runs of (Dh / 3) / 2 pairs each, per-axis ladders over
                     ///< 2 ((Dh / 3) / 2) dims; the head's last dims pass through (MiniMax-M3)
  kColumnsThenRowsFixedGrid,  ///< cat(cols, rows) at (row + 1, column + 1) per patch, (0, 0) for
                              ///< the class token; its class reads no rope_type (Llama 4 vision)
  kPatchCentres,  ///< cat(rows, cols) at patch centres in [-1, 1]: angle (2 pi c) theta^(-4i/Dh)
                  ///< (DINOv3; its config.json has no rope_type, the rotary is 2D whatever it says)
};

/// What posenc's RoPE options are for one HfAxial variant.
struct HfAxialUnit {
  HfAxial axial;
  std::string_view name;
  int64_t axes;     ///< position axes: 2 (row, column) or 3 (time, row, column)
  bool whole_head;  ///< the class sizes its rotary from the head, ignoring the factor
  std::string_view section_layout;         ///< "contiguous" or "interleaved" (RopeSectionLayout)
  std::vector<int64_t> section_axes = {};  ///< the axis each section reads (empty: in order)
  bool dealt;  ///< one ladder over the rotary part dealt to the axes (RopeFrequencyOrder::kDealt);
               ///< else one ladder per axis (per_axis_frequencies)
  std::string_view source;      ///< the transformers code it follows
  double position_scale = 1.0;  ///< angle = (s p) inv_freq (DINOv3: 2 pi)
  bool any_rope_type = false;   ///< a tower whatever rope_type says (DINOv3: none, or 'default')
};
const HfAxialUnit& hf_axial_unit(HfAxial axial);

struct HfArchitecture {
  std::string_view model_type;
  /// Where the head size comes from, written only where the generator's probe cannot see it
  /// (kGeneric: the generated head_size, else the generic rule).
  HfHeadSize head = HfHeadSize::kGeneric;
  /// "half" (rotate_half) or "interleaved" (pairs (2i, 2i+1)), written only where the generator
  /// could not probe the model type's rotation (its generated pair_layout decides elsewhere;
  /// empty: that, else rotate_half); rope_interleave overrides it where the code reads it.
  std::string_view layout = {};
  /// Non-empty: posenc refuses this model type, for this reason.
  std::string_view refusal = {};
  /// The transformers code the row follows (models/<type>/modeling_<type>.py: what).
  std::string_view source;
  /// The model type's rotary class reads rope_type 'dynamic' with a non-zero 'alpha' as
  /// 'ntk_alpha' (HunYuan: a fixed stretch of the base, not dynamic NTK).
  bool dynamic_with_alpha_is_ntk_alpha = false;
  /// The modeling file reads config.rope_interleave (DeepSeek-V3 and its kin); elsewhere the key
  /// is ignored, as transformers ignores it.
  bool reads_rope_interleave = false;
  /// Non-empty: a config.json without per-layer-type rope_parameters is refused, for this reason
  /// (the config class builds them from flat keys with rules posenc does not mirror).
  std::string_view flat_refusal = {};
  /// Non-empty: a config.json whose flat (not per-layer-type) RoPE block scales (a rope_type
  /// other than 'default') is refused, for this reason (OLMo 3 scales full attention only).
  std::string_view flat_scaling_refusal = {};
  /// The config class renames a legacy rope_type 'yarn' (and 'su') to 'longrope' (Phi-3).
  bool yarn_is_longrope = false;
  /// The config class merges a legacy rope_scaling into a block that keeps rope_type 'default', so
  /// its 'type' alias is never read (Gemma 3): such a block is refused, not guessed.
  bool type_alias_unread = false;
  /// The config class reads GPT-NeoX's legacy keys rotary_emb_base (the theta) and rotary_pct
  /// (the partial factor) and not a top-level rope_theta; no other class reads them.
  bool reads_neox_keys = false;
  /// The config class recomputes every block's partial_rotary_factor as its layer type's
  /// qk_rope_head_dim / head_dim (per_layer_config, else the top level), whatever the block says
  /// (dots3's convert_rope_params_to_dict).
  bool partial_from_layer_heads = false;
  /// A scaled rope's cos/sin are scaled by the block's short_mscale (long_mscale past
  /// original_max_position_embeddings), both required numbers, and the rotary forward takes
  /// short_factor at every length (PhiMoE: rope_init_fn called without a sequence length).
  bool longrope_mscale_by_length = false;
  /// A vision tower's axis layout (rope_type 'axial'; default: cat(rows, cols)).
  HfAxial axial = HfAxial::kRowsThenColumns;
  /// The model type is a vision tower: its config class's default rope_type is 'axial' (a file
  /// without one gets it) and its rotary class raises on any other.
  bool tower = false;
  /// The config class derives an absent head_dim as qk_nope_head_dim + qk_rope_head_dim and an
  /// absent partial_rotary_factor as qk_rope_head_dim / head_dim (Mistral 4): a file without them
  /// whose parts give other values than the class defaults is refused (Resolver::check_qk_parts).
  bool head_from_qk_parts = false;
};

/// The row for a model type: its own, or the generic rule's (whether transformers has the model
/// type, and a rotary class for it, is hf_model_type_status's answer).
const HfArchitecture* find_hf_architecture(std::string_view model_type);

enum class HfModelTypeStatus { kRotary, kNoRotary, kUnchecked, kUnknown };
/// kRotary: transformers' modeling file has a rotary class (checked); kNoRotary: it has none;
/// kUnchecked: transformers has the type but no modeling file of its own; kUnknown: not a model
/// type of the pinned transformers.
HfModelTypeStatus hf_model_type_status(std::string_view model_type);

/// Whether the model type's rotary class computes its default rope over the whole head, ignoring
/// partial_rotary_factor (Llama's compute_default_rope_parameters and its copies; generated by
/// tools/gen_hf_architectures.py's partial probe, src/config/hf_model_types.inc).
bool hf_default_rope_ignores_partial(std::string_view model_type);

/// Whether the model type's config class leaves a top-level partial_rotary_factor of a config.json
/// out of rope_parameters, where its rotary class reads the factor (Gemma 3, GPT-NeoX, ...): such
/// a key is unread by transformers (generated, src/config/hf_model_types.inc).
bool hf_top_level_partial_unread(std::string_view model_type);

/// The model type transformers builds a composite's text_config as when the file's text_config
/// names none (LLaVA's: "llama"); empty when the composite has none (generated).
std::string_view hf_text_config_model_type(std::string_view composite_model_type);

/// Whether the composite's config class builds text_config from text keys at the top level of a
/// config.json without one (Qwen2-VL, transformers 4's layout); others ignore such keys
/// (generated).
bool hf_flat_text_carried(std::string_view composite_model_type);

/// Whether the model type's config class gives a flat rope_local_base_freq to the sliding-window
/// layers (Gemma 3 and its kin); others ignore the key (generated).
bool hf_reads_local_base_freq(std::string_view model_type);

/// The model types of each status (for the tests and `posenc inspect --hf-architectures`).
std::vector<std::string> hf_model_types(HfModelTypeStatus status);
/// What a model type's config class uses for keys a config.json leaves out, and how its classes
/// read a file, probed from transformers: hf_generated_rules (posenc/config/hf_generated_rules.h).
/// Every row with more than the generic rule.
std::vector<HfArchitecture> hf_architecture_rows();
std::string to_string(HfHeadSize head);

}  // namespace posenc
