// What posenc knows of each transformers model type's rotary embedding: one table, one row per
// model type that needs more than the generic rule, checked against every model type's own rotary
// class by tests/test_hf_architectures.cpp (fixtures from tools/gen_hf_architectures.py, pinned
// transformers kHfArchitecturesTransformers).
//
// The generic rule (a model type without a row): head size = qk_rope_head_dim > head_dim >
// hidden_size / num_attention_heads; partial_rotary_factor > rotary_pct > 1; rotate_half pairs
// (i, i + r/2); rope_interleave, where a config sets it, decides the layout.
// A row says where its head size comes from (HfHeadSize), its pair layout as its modeling file's
// apply_rotary_pos_emb rotates them, or why posenc refuses it. The model types transformers ships
// are known by name: one without a rotary class is refused (its positions are not RoPE), one posenc
// has never seen resolves by the generic rule with a warning naming it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace posenc {

inline constexpr std::string_view kHfArchitecturesTransformers = "5.24.0";

/// Where a model type's rotary head size (the r that partial_rotary_factor multiplies) comes from.
enum class HfHeadSize {
  kGeneric,           ///< qk_rope_head_dim > head_dim > hidden_size / num_attention_heads
  kHeadDim,           ///< head_dim > hidden_size / num_attention_heads; qk_rope_head_dim unread
  kGlobalHeadDim,     ///< full_attention layers: global_head_dim (default 512); others generic
  kKvChannels,        ///< kv_channels (JetMoE)
  kAttentionHeadDim,  ///< attention_head_dim (Zamba2)
  kDModelPerHead,     ///< d_model / n_heads (DBRX)
  kDecoderHeads,      ///< hidden_size / decoder_num_attention_heads (Moonshine)
  kRotaryDim,         ///< rotary_dim of n_embd / n_head or hidden_size / num_attention_heads
};

struct HfArchitecture {
  std::string_view model_type;
  HfHeadSize head = HfHeadSize::kGeneric;
  /// "half" (rotate_half) or "interleaved" (pairs (2i, 2i+1)); rope_interleave overrides it.
  std::string_view layout = "half";
  /// Non-empty: posenc refuses this model type, for this reason.
  std::string_view refusal;
  /// The transformers code the row follows (models/<type>/modeling_<type>.py: what).
  std::string_view source;
  /// The model type's rotary class reads rope_type 'dynamic' with a non-zero 'alpha' as
  /// 'ntk_alpha' (HunYuan: a fixed stretch of the base, not dynamic NTK).
  bool dynamic_with_alpha_is_ntk_alpha = false;
};

/// The row for a model type: its own, or the generic rule's (whether transformers has the model
/// type, and a rotary class for it, is hf_model_type_status's answer).
const HfArchitecture* find_hf_architecture(std::string_view model_type);

enum class HfModelTypeStatus { kRotary, kNoRotary, kUnchecked, kUnknown };
/// kRotary: transformers' modeling file has a rotary class (checked); kNoRotary: it has none;
/// kUnchecked: transformers has the type but no modeling file of its own; kUnknown: not a model
/// type of the pinned transformers.
HfModelTypeStatus hf_model_type_status(std::string_view model_type);

/// The model types of each status (for the tests and `posenc inspect --hf-architectures`).
std::vector<std::string> hf_model_types(HfModelTypeStatus status);
/// What a model type's config class uses for keys posenc reads when a config.json leaves them out
/// (rope_theta, partial_rotary_factor, head_dim, global_head_dim, max_position_embeddings,
/// rope_interleave; only constants, not keys the class derives), as a JSON object; nullptr when
/// none is known. Generated from transformers (src/config/hf_defaults.inc).
const nlohmann::json* hf_absent_key_defaults(std::string_view model_type);
/// Every row with more than the generic rule.
std::vector<HfArchitecture> hf_architecture_rows();
std::string to_string(HfHeadSize head);

}  // namespace posenc
