// A model's HF transformers config.json -> the posenc RoPE config it implies, resolved the way
// transformers resolves it (modeling_rope_utils.py: RotaryEmbeddingConfigMixin.
// convert_rope_params_to_dict / standardize_rope_params and the _compute_*_parameters functions):
//
//   rope_theta         rope_parameters.rope_theta > top-level rope_theta > rotary_emb_base
//                      (GPT-NeoX) > transformers' default_theta 10000 (with a warning)
//   head_dim           qk_rope_head_dim (DeepSeek: the rotary part of a head) > head_dim >
//                      hidden_size / num_attention_heads
//   partial rotary     rope_parameters.partial_rotary_factor > partial_rotary_factor >
//                      rotary_pct (GPT-NeoX) > rotary_dim / head_dim (GPT-J, CodeGen) > 1
//   scaling block      rope_parameters (transformers 5; nested per layer type when its keys are
//                      the config's layer_types) or the legacy rope_scaling; "type" = "rope_type";
//                      "mrope" = default frequencies over mrope_section (Qwen2-VL)
//   L0 (llama3, yarn, longrope)  a top-level original_max_position_embeddings (Phi-3) > the
//                      block's > max_position_embeddings
//   layout             rope_interleave (DeepSeek-V3) or the model family's modelling code (table
//                      in hf_config.cpp, each row citing its file); "half" otherwise
//   softmax scale      DeepSeek's yarn: the attention multiplies 1/sqrt(d) by
//                      mscale(factor, mscale_all_dim)^2 (modeling_deepseek_v3.py), reported here
//
// Keys not about positions (architectures, vocab_size, ...) are ignored and listed. A value a
// scaling needs that the config lacks (max_position_embeddings for dynamic, yarn and longrope) is
// an error naming the key and where transformers would read it. Multimodal configs whose text
// model sits under text_config are read from there.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/config/registry.h"

namespace posenc {

struct HfConfigOptions {
  /// For per-layer-type rope_parameters ({"full_attention": {...}, "sliding_attention": {...}}):
  /// which one to take. Empty: the only one, or an error listing them.
  std::string layer_type;
  /// "float32" to compute angles as HF does (bit for bit), "float64" (default) exact.
  std::string angle_dtype = "float64";
  /// Where the config came from, for messages ("config.json", a path).
  std::string origin = "config.json";
};

struct HfResolution {
  /// The posenc encoder config: {"type": "rope", every value explicit}. build_encoder takes it.
  nlohmann::ordered_json config;
  /// For each key of `config`: where its value came from ("config.json: rope_scaling.factor",
  /// "derived: hidden_size / num_attention_heads = 4096 / 32", "transformers default").
  nlohmann::ordered_json sources;
  /// Top-level keys read as not about positions (ignored, as transformers' RoPE code ignores them).
  std::vector<std::string> ignored_keys;
  /// Things a porter should know (a default taken, a key transformers only warns about).
  std::vector<std::string> warnings;
  /// Multiplier on the attention's 1/sqrt(d) that the model applies outside RoPE (1 unless the
  /// model is DeepSeek-style yarn with mscale_all_dim).
  double softmax_scale_multiplier = 1.0;
  std::string model_type;
  std::string layer_type;  ///< the layer type resolved ("" when not nested)
};

/// Resolves a parsed config.json. Errors name the origin, the key, expected and actual.
HfResolution from_hf_config(const nlohmann::json& config, const HfConfigOptions& options = {});
/// Reads a config.json file (JSON or YAML) and resolves it; options.origin becomes the path.
HfResolution load_hf_config(const std::string& path, HfConfigOptions options = {});
/// The encoder the resolution describes (a Rope); `context` sizes must agree with it if given.
PositionalEncoding build_encoder(const HfResolution& resolution, const ModelContext& context = {});
/// The resolution as one JSON object: {model_type, layer_type, config, sources, ignored_keys,
/// warnings, softmax_scale_multiplier}.
nlohmann::ordered_json to_json(const HfResolution& resolution);

}  // namespace posenc
