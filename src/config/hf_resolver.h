// The HF resolver's state and its steps (posenc/config/hf_config.h's from_hf_config): one
// Resolver per config.json resolution. hf_resolve_steps.cpp holds run() and its named steps (the
// RoPE's type, head size, layout, theta, partial rotary, context, block values, sections),
// hf_config.cpp the rules that prepare the file (the class's defaults for absent keys, unread
// keys, head_dim's rules, the scaling block) and the public entry points. Internal to
// src/config; no public header includes it.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "posenc/config/hf_architectures.h"
#include "posenc/config/hf_config.h"
#include "posenc/config/hf_generated_rules.h"
#include "posenc/functional/rope_scaling.h"

namespace posenc::hf_resolve {

// Top-level keys the resolution reads; every other key is listed as ignored.
extern const std::set<std::string> kPositionKeys;
// Keys of a rope_scaling / rope_parameters block that posenc's rope encoder takes.
extern const std::set<std::string> kBlockKeys;
/// A JSON value's type and its first characters, for error lines.
std::string describe(const nlohmann::json& v);

class Resolver {
 public:
  Resolver(const nlohmann::json& config, const HfConfigOptions& options)
      : options_(options), origin_(options.origin) {
    TORCH_CHECK(config.is_object(), origin_,
                ": expected a JSON object (a model's config.json), got ", describe(config));
    root_ = &config;
    // Multimodal configs keep the text model's RoPE under text_config (Qwen2-VL in transformers 5).
    if (!has(config, "rope_theta") && !has(config, "rope_scaling") &&
        !has(config, "rope_parameters") && has(config, "text_config") &&
        config["text_config"].is_object()) {
      text_ = &config["text_config"];
      prefix_ = "text_config.";
    }
  }
  HfResolution run();

 private:
  // The resolution so far, handed from step to step (the resolved values themselves, with their
  // sources, are in resolved_ and sources_).
  struct Step {
    nlohmann::json block;   ///< the RoPE block resolved (scaling_block: flat, or a layer type's)
    std::string rule;       ///< "model type '<type>' (<its row's source>)", for messages
    std::string head_rule;  ///< the head size's rule (the row's, or the generated head_size's)
    std::string rope_type = "default";
    std::string type_key;  ///< the block's key naming the type: "rope_type" or legacy "type"
    /// rope_type's scaling unit (rope_scaling.h), for the facts it holds (what it depends on);
    /// nullptr where rope_type names none (rope_scaling_from_string refuses it later)
    const RopeScalingUnit* unit = nullptr;
    bool yarn_renamed = false;      ///< Phi-3's legacy 'yarn' / 'su' read as 'longrope'
    bool ntk_alpha = false;         ///< HunYuan's 'dynamic' with a non-zero alpha
    bool axial = false;             ///< a vision tower's 2D (or 3D) rotary
    std::vector<int64_t> sections;  ///< M-RoPE sections (the block's or the class's default)
    bool sections_defaulted = false;
    std::string_view mrope_layout;  ///< generated mrope_layout (empty: the block's own layout)
    int64_t head_dim = 0;
    bool took_head_dim = false;     ///< the head-size rule read head_dim itself
    bool head_from_layers = false;  ///< per_layer_config gave this layer type its head size
    bool has_max = false;           ///< max_position_embeddings (or its alias) is known
    bool file_max = false;          ///< ... given by the file, not a class default
    std::string alias;              ///< the key the class reads as max_position_embeddings
    bool by_alias = false;          ///< the file gives that key
    const HfMaxPositionRules* max_rules = nullptr;  ///< generated max_position_rules
  };
  std::string from_block(const std::string& key) const { return block_name_ + "." + key; }

  // Whether a scaling unit reads `key` from elsewhere in config.json (its dependencies: yarn,
  // llama3 and longrope the original context; dynamic the context; yarn and longrope the context
  // for a factor the block leaves out). `unless_factor`: only a dependency of that kind.
  static bool depends_on(const RopeScalingUnit& unit, const std::string& key,
                         std::optional<bool> unless_factor = std::nullopt) {
    return std::any_of(unit.dependencies.begin(), unit.dependencies.end(), [&](const auto& d) {
      return d.key == key && (!unless_factor || d.unless_factor == *unless_factor);
    });
  }
  static const RopeScalingUnit* unit_named(const std::string& rope_type);
  void resolve_model_type(HfResolution& out);
  void resolve_rope_type(HfResolution& out, const HfArchitecture& arch, Step& s);
  void resolve_sections(HfResolution& out, const HfArchitecture& arch, Step& s);
  void record_rope_type(HfResolution& out, const HfArchitecture& arch, const Step& s);
  int64_t head_per_head(const std::string& size_key, const std::string& heads_key,
                        const std::string& rule);
  int64_t head_from_key(const std::string& key, const std::string& rule);
  int64_t head_from_memory_attention(const std::string& rule);
  HfHeadSize head_size(const HfArchitecture& arch) const;
  void resolve_head_size(HfResolution& out, const HfArchitecture& arch, Step& s);
  void generic_head_size(HfHeadSize head, Step& s, const std::string& rule);
  void resolve_layout(HfResolution& out, const HfArchitecture& arch, const Step& s);
  bool file_gives_theta() const;
  void refuse_block_without_theta(const HfResolution& out, const Step& s) const;
  void resolve_theta(HfResolution& out, const HfArchitecture& arch, const Step& s);
  void resolve_partial(HfResolution& out, const HfArchitecture& arch, const Step& s);
  void resolve_max_position(const HfResolution& out, Step& s);
  void resolve_original_context(const HfResolution& out, const Step& s);
  void resolve_block_numbers(HfResolution& out, const Step& s);
  void resolve_block_lists(HfResolution& out, const HfArchitecture& arch, const Step& s);
  void record_sections(HfResolution& out, const Step& s);
  void warn_unread_block_keys(HfResolution& out, const HfArchitecture& arch, const Step& s);
  void resolve_softmax_scale(HfResolution& out, const Step& s);
  HfResolution finish(HfResolution& out);
  void resolve_axial(HfResolution& out, const HfArchitecture& arch, int64_t head_dim);

  const nlohmann::json& model() const {
    if (patched_.is_object()) return patched_;
    return text_ ? *text_ : *root_;
  }
  void composite_text_config(HfResolution& out);

  // Whether the model type's rotary class never reads `key` of a config.json (generated
  // unread_keys, tools/gen_hf_architectures.py's reads_probe: GPT-J's and CodeGen's tables
  // hard-code their base; ESM's reads only the top-level rope_theta).
  bool unread(const std::string& key) const {
    const auto& keys = rules().unread_keys;
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  }
  // The model type's generated rules (hf_generated_rules.h); an empty row where the generator
  // recorded none.
  const HfGeneratedRules& rules() const {
    static const HfGeneratedRules kNone{.model_type = ""};
    const auto* own = hf_generated_rules(model_type_);
    return own != nullptr ? *own : kNone;
  }
  void check_rotary_gate(const HfResolution& out) const;
  void refuse_rejected_values(const HfResolution& out) const;
  void ignore_unread_keys(HfResolution& out);
  void refuse_unread_partial(const HfResolution& out) const;
  void apply_length_mscale(const nlohmann::json& block);
  void fill_absent_defaults(HfResolution& out, const HfArchitecture& arch);
  HfClassDefaults class_defaults();
  void fill_default_blocks(const HfArchitecture& arch, const nlohmann::json& c,
                           nlohmann::json& patched);
  bool fill_legacy_scaling(HfResolution& out, const nlohmann::json& c, nlohmann::json& patched);
  void fill_absent_keys(const HfArchitecture& arch, const nlohmann::json& c,
                        nlohmann::json& patched, bool legacy_partial_set);
  void refuse_class_failures(const HfResolution& out, const nlohmann::json& file) const;
  void apply_head_dim_rules(HfResolution& out);
  void partial_from_layer_heads(HfResolution& out, const nlohmann::json& c, int64_t head_dim);
  void check_qk_parts(const nlohmann::json& c, int64_t head_dim) const;
  void check_head_dim_rules(const HfResolution& out, const nlohmann::json& c,
                            const std::string& rope_type, int64_t head_dim, bool took_head_dim,
                            bool other_head) const;
  const HfArchitecture& architecture(HfResolution& out);
  static bool has(const nlohmann::json& o, const std::string& key) {
    return o.is_object() && o.contains(key) && !o.at(key).is_null();
  }
  std::map<int64_t, std::string> layer_indices(const nlohmann::json& overrides) const;
  std::optional<std::pair<std::string, int64_t>> layer_type_override(const nlohmann::json& c,
                                                                     const std::string& key) const;
  std::string where(const std::string& key) const {
    if (defaulted_.count(key))
      return "transformers default of model type '" + model_type_ + "' (" + prefix_ + key +
             " is absent from " + options_.origin + "; its config class's value)";
    return options_.origin + ": " + prefix_ + key;
  }

  static std::string string_or(const nlohmann::json& o, const std::string& key,
                               const std::string& fallback) {
    return has(o, key) && o[key].is_string() ? o[key].get<std::string>() : fallback;
  }
  std::string string_at(const nlohmann::json& o, const std::string& key,
                        const std::string& name) const {
    TORCH_CHECK(o[key].is_string(), origin_, ": '", prefix_, name, "' must be a string, got ",
                describe(o[key]));
    return o[key].get<std::string>();
  }
  double number_at(const nlohmann::json& o, const std::string& key,
                   const std::string& name = "") const {
    const std::string shown = prefix_ + (name.empty() ? key : name);
    TORCH_CHECK(o[key].is_number(), origin_, ": '", shown, "' must be a number, got ",
                describe(o[key]));
    const double v = o[key].get<double>();
    TORCH_CHECK(std::isfinite(v), origin_, ": '", shown, "' must be finite, got ", v);
    return v;
  }
  int64_t integer_at(const nlohmann::json& o, const std::string& key,
                     const std::string& name = "") const {
    const double v = number_at(o, key, name);
    TORCH_CHECK(std::floor(v) == v && std::abs(v) < 9.0e15, origin_, ": '", prefix_,
                name.empty() ? key : name, "' must be an integer, got ", describe(o[key]));
    return static_cast<int64_t>(v);
  }
  std::vector<int64_t> integers_at(const nlohmann::json& o, const std::string& key,
                                   const std::string& name) const;
  template <typename T>
  void set(const std::string& key, const T& value, const std::string& source) {
    resolved_[key] = value;
    sources_[key] = source;
  }
  void check_flat_layout(const HfArchitecture& arch, const nlohmann::json& flat,
                         const std::string& name) const;
  nlohmann::json local_base_blocks(const HfArchitecture& arch, double class_local);
  nlohmann::json scaling_block(HfResolution& out, const HfArchitecture& arch);
  nlohmann::json pick_layer_type(const nlohmann::json& block,
                                 const std::vector<std::string>& nested);

  HfConfigOptions options_;
  std::string origin_;
  const nlohmann::json* root_ = nullptr;
  const nlohmann::json* text_ = nullptr;
  std::string flat_text_type_;  ///< the text model type a flat composite's top level is read as
  std::set<std::string> composite_keys_;  ///< keys filled from "<composite>/text_config"
  /// the model type's config-class defaults for absent keys, a composite's own text_config
  /// defaults over them (generated; class_defaults)
  HfClassDefaults class_defaults_;

  // The rope_theta the class gives a block of the file without one, for the resolved layer type
  // (the generated block_rope_theta, probed per class); NaN when not known.
  // `layer`: a layer type, or "" for a flat block.
  double class_block_theta(const std::string& layer) const {
    for (const auto& t : rules().block_rope_theta)
      if (t.layer_type == layer) return t.rope_theta;
    return NAN;
  }
  std::string prefix_;
  std::string block_name_;
  std::string layer_type_;
  nlohmann::json synthesized_;
  std::string model_type_;
  nlohmann::json patched_;           // the model's config with absent keys' defaults filled
  std::set<std::string> defaulted_;  // the keys filled
  bool head_dim_kept_ = false;      // the file's head_dim, kept by the class (apply_head_dim_rules)
  bool head_none_ = false;          // the class's head_dim is None (null or absent)
  bool head_null_derived_ = false;  // "head_dim": null, taken as hidden / heads
  nlohmann::ordered_json resolved_ = nlohmann::ordered_json::object();
  nlohmann::ordered_json sources_ = nlohmann::ordered_json::object();
};

}  // namespace posenc::hf_resolve
