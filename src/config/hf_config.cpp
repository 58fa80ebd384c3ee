// config.json -> posenc RoPE config, the rules of posenc/config/hf_config.h. Every value the
// result holds is recorded with its source, so `posenc inspect --hf-config` shows where each
// number came from; nothing falls back to a posenc default without a warning.
#include "posenc/config/hf_config.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "posenc/config/hf_architectures.h"
#include "posenc/config/registry.h"
#include "posenc/functional/rope.h"
#include "posenc/functional/rope_scaling.h"

namespace posenc {

namespace {

// Top-level keys the resolution reads; every other key is listed as ignored.
const std::set<std::string> kPositionKeys{"model_type",
                                          "rope_theta",
                                          "rotary_emb_base",
                                          "rope_scaling",
                                          "rope_parameters",
                                          "head_dim",
                                          "hidden_size",
                                          "num_attention_heads",
                                          "qk_rope_head_dim",
                                          "qk_nope_head_dim",
                                          "partial_rotary_factor",
                                          "rotary_pct",
                                          "rotary_dim",
                                          "max_position_embeddings",
                                          "original_max_position_embeddings",
                                          "rope_interleave",
                                          "layer_types",
                                          "text_config",
                                          "rope_local_base_freq",
                                          "global_head_dim",
                                          "kv_channels",
                                          "attention_head_dim",
                                          "d_model",
                                          "n_heads",
                                          "decoder_num_attention_heads",
                                          "n_embd",
                                          "n_head",
                                          "num_heads",
                                          "embed_dim"};

// Keys of a rope_scaling / rope_parameters block that posenc's rope encoder takes.
const std::set<std::string> kBlockKeys{"rope_type",
                                       "type",
                                       "rope_theta",
                                       "partial_rotary_factor",
                                       "factor",
                                       "original_max_position_embeddings",
                                       "beta_fast",
                                       "beta_slow",
                                       "attention_factor",
                                       "mscale",
                                       "mscale_all_dim",
                                       "truncate",
                                       "low_freq_factor",
                                       "high_freq_factor",
                                       "short_factor",
                                       "long_factor",
                                       "mrope_section",
                                       "mrope_interleaved",
                                       "alpha"};

std::string describe(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + text;
}

// Whether the model type's generated list `rule` (hf_defaults.inc: rope_types_rejected,
// original_not_filled, top_original_unread, ...) names `value`.
bool generated_rule_names(const std::string& model_type, const char* rule,
                          const std::string& value) {
  const auto* own = hf_absent_key_defaults(model_type);
  if (own == nullptr || !own->contains(rule)) return false;
  for (const auto& t : (*own)[rule])
    if (t.is_string() && t.get<std::string>() == value) return true;
  return false;
}

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

  // config.json -> the resolution, as a pipeline of named steps. Each step reads the file
  // (model()), the model type's row (arch) and what the earlier steps resolved (the Step and
  // resolved_), and names the rules it follows; the order is the order transformers' config and
  // rotary classes decide in, so the first refusal is the one transformers would meet first.
  HfResolution run() {
    HfResolution out;
    resolve_model_type(out);
    const HfArchitecture& arch = architecture(out);
    check_rotary_gate(out);
    refuse_rejected_values(out);
    ignore_unread_keys(out);
    refuse_unread_partial(out);
    fill_absent_defaults(out, arch);
    apply_head_dim_rules(out);
    for (const auto& item : root_->items())
      if (!kPositionKeys.count(item.key())) out.ignored_keys.push_back(item.key());

    Step s;
    s.block = scaling_block(out, arch);
    s.rule = "model type '" + out.model_type + "' (" + std::string(arch.source) + ")";
    resolve_rope_type(out, arch, s);
    resolve_sections(out, arch, s);
    record_rope_type(out, arch, s);
    resolve_head_size(out, arch, s);
    resolve_layout(out, arch, s);
    resolve_theta(out, arch, s);
    resolve_partial(out, arch, s);
    resolve_max_position(out, s);
    if (s.unit != nullptr && depends_on(*s.unit, "original_max_position_embeddings"))
      resolve_original_context(out, s);
    if (s.unit != nullptr && depends_on(*s.unit, "max_position_embeddings", false))
      TORCH_CHECK(s.has_max, origin_, ": rope_type '", s.rope_type, "' grows theta past ",
                  "'max_position_embeddings' (top level), which is not given");
    resolve_block_numbers(out, s);
    resolve_block_lists(out, arch, s);
    if (s.axial) resolve_axial(out, arch, s.head_dim);
    record_sections(out, s);
    warn_unread_block_keys(out, arch, s);
    set("angle_dtype", options_.angle_dtype, "option (float64: exact; float32: HF's arithmetic)");
    resolve_softmax_scale(out, s);
    return finish(out);
  }

 private:
  // The resolution so far, handed from step to step (the resolved values themselves, with their
  // sources, are in resolved_ and sources_).
  struct Step {
    nlohmann::json block;  ///< the RoPE block resolved (scaling_block: flat, or a layer type's)
    std::string rule;      ///< "model type '<type>' (<its row's source>)", for messages
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
    const nlohmann::json* mrope = nullptr;  ///< generated mrope_layout / mrope_default_section
    int64_t head_dim = 0;
    bool took_head_dim = false;     ///< the head-size rule read head_dim itself
    bool head_from_layers = false;  ///< per_layer_config gave this layer type its head size
    bool has_max = false;           ///< max_position_embeddings (or its alias) is known
    bool file_max = false;          ///< ... given by the file, not a class default
    std::string alias;              ///< the key the class reads as max_position_embeddings
    bool by_alias = false;          ///< the file gives that key
    const nlohmann::json* max_rules = nullptr;  ///< generated max_position_rules
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
  // The scaling unit transformers' ROPE_INIT_FUNCTIONS names rope_type (its own name; a legacy
  // alias such as 'su' is not one, as transformers 5 does not read it as one).
  static const RopeScalingUnit* unit_named(const std::string& rope_type) {
    for (const auto& unit : rope_scaling_units())
      if (unit.name == rope_type) return &unit;
    return nullptr;
  }

  // Step: which model type's rules apply. A composite's text_config without its own model_type
  // is built by the composite's default text config class (LLaVA's: Llama), whose rules then
  // apply; so are the top-level text keys of a composite whose config class builds text_config
  // from them (generated kTextConfigModelTypes, kFlatTextCarriedModelTypes).
  void resolve_model_type(HfResolution& out) {
    const auto& c0 = model();
    for (const auto* o : {&c0, root_})
      if (has(*o, "model_type"))
        TORCH_CHECK((*o)["model_type"].is_string(), origin_, ": '", o == root_ ? "" : prefix_,
                    "model_type' must be a string, got ", describe((*o)["model_type"]));
    composite_text_config(out);
    out.model_type = string_or(model(), "model_type", "");
    if (out.model_type.empty() && text_ != nullptr)
      out.model_type = std::string(hf_text_config_model_type(string_or(*root_, "model_type", "")));
    if (!flat_text_type_.empty()) out.model_type = flat_text_type_;
    if (out.model_type.empty()) out.model_type = string_or(*root_, "model_type", "");
    model_type_ = out.model_type;
  }

  // Step: rope_type as the model type's config and rotary classes read it. Rules: the row's
  // type_alias_unread (Gemma 3: 'type' never read), yarn_is_longrope (Phi-3),
  // dynamic_with_alpha_is_ntk_alpha (HunYuan: a fixed stretch of the base, not dynamic NTK).
  void resolve_rope_type(HfResolution& out, const HfArchitecture& arch, Step& s) {
    const auto& block = s.block;
    s.type_key = has(block, "rope_type") ? "rope_type" : "type";
    if (has(block, "rope_type")) {
      s.rope_type = string_at(block, "rope_type", from_block("rope_type"));
    } else if (has(block, "type")) {
      s.rope_type = string_at(block, "type", from_block("type"));
    }
    TORCH_CHECK(!arch.type_alias_unread || has(block, "rope_type") || !has(block, "type"), origin_,
                ": refused: ", from_block("type"),
                " names the RoPE type with the legacy 'type' key, "
                "which model type '",
                out.model_type,
                "''s config class never reads (it keeps rope_type 'default' and the scaling is "
                "not applied: ",
                std::string(arch.source), "); write 'rope_type'");
    if (arch.yarn_is_longrope && (s.rope_type == "yarn" || s.rope_type == "su")) {
      s.rope_type = "longrope";
      s.yarn_renamed = true;
    }
    s.ntk_alpha = s.rope_type == "dynamic" && arch.dynamic_with_alpha_is_ntk_alpha &&
                  has(block, "alpha") && number_at(block, "alpha", from_block("alpha")) != 0;
    if (s.ntk_alpha) s.rope_type = "ntk_alpha";
    TORCH_CHECK(s.rope_type != "ntk_alpha" || arch.dynamic_with_alpha_is_ntk_alpha, origin_, ": ",
                from_block(s.type_key),
                " 'ntk_alpha' is HunYuan's rotary classes' own type; transformers' "
                "ROPE_INIT_FUNCTIONS has none, so model type '",
                out.model_type, "' fails on it (KeyError)");
  }

  // Step: M-RoPE sections and vision towers. M-RoPE as the model type's rotary class takes it
  // (generated mrope_default_section and mrope_layout, learned by calling the class on 3-axis
  // positions): its default sections when the block gives none, its layout whatever
  // mrope_interleaved says. A vision tower's rotary (rope_type 'axial', the row's tower and its
  // HfAxial unit's any_rope_type: DINOv3 whatever the file says) is resolved by resolve_axial.
  void resolve_sections(HfResolution& out, const HfArchitecture& arch, Step& s) {
    const auto& block = s.block;
    s.mrope = hf_absent_key_defaults(out.model_type);
    if (s.mrope != nullptr && !s.mrope->contains("mrope_layout")) s.mrope = nullptr;
    if (has(block, "mrope_section")) {
      s.sections = integers_at(block, "mrope_section", from_block("mrope_section"));
    } else if (s.mrope != nullptr && s.rope_type != "axial") {
      s.sections = (*s.mrope)["mrope_default_section"].get<std::vector<int64_t>>();
      s.sections_defaulted = true;
    }
    // a tower's config class gives a file without rope_type 'axial' (its rotary class raises on
    // any other)
    TORCH_CHECK(
        !arch.tower || s.rope_type == "axial" || !(has(block, "rope_type") || has(block, "type")),
        origin_, ": refused: model type '", out.model_type,
        "' takes rope_type 'axial' only; its rotary class raises on '", s.rope_type, "' (",
        std::string(arch.source), ")");
    s.axial = s.rope_type == "axial" || arch.tower || hf_axial_unit(arch.axial).any_rope_type;
    if (s.axial) {
      TORCH_CHECK(s.sections.empty(), origin_, ": ", from_block("rope_type"),
                  " is 'axial' and the block has an mrope_section; transformers takes none");
      s.rope_type = "default";
    }
    if (s.rope_type == "mrope") {
      TORCH_CHECK(!s.sections.empty(), origin_, ": ", from_block("rope_type"),
                  " is 'mrope' but the block has no 'mrope_section'");
      s.rope_type = "default";
    }
    s.unit = unit_named(s.rope_type);
  }

  // Step: the resolved rope_type, with where it came from; refused where the model type's class
  // raises on it (generated rope_types_rejected: Phi-3's validate_rope takes default and longrope
  // only).
  void record_rope_type(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    const auto& block = s.block;
    const std::string& type_key = s.type_key;
    set("rope_type", s.rope_type,
        s.axial ? where(from_block("rope_type")) +
                      " 'axial': a vision tower's 2D rotary, default frequencies per axis"
        : s.yarn_renamed ? where(from_block(type_key)) + " (legacy 'yarn' or 'su': longrope, as " +
                               std::string(arch.source) + ")"
        : s.ntk_alpha ? where(from_block(type_key)) +
                            " 'dynamic' with a non-zero alpha: ntk_alpha, as model type '" +
                            out.model_type + "' reads it (" + std::string(arch.source) + ")"
        : has(block, "rope_type")
            ? where(from_block("rope_type"))
            : (has(block, "type") ? where(from_block("type")) : "transformers default"));
    TORCH_CHECK(!generated_rule_names(out.model_type, "rope_types_rejected", s.rope_type), origin_,
                ": refused: model type '", out.model_type, "' does not take rope_type '",
                s.rope_type, "' (", from_block(type_key), "): transformers ",
                std::string(kHfArchitecturesTransformers),
                "'s config or rotary class raises on it, so there is no table to match");
  }

  // head_dim = key_size / heads_key, recorded with the keys it came from.
  int64_t head_per_head(const std::string& size_key, const std::string& heads_key,
                        const std::string& rule) {
    const auto& c = model();
    TORCH_CHECK(has(c, size_key) && has(c, heads_key), origin_,
                ": cannot tell the head size: expected '", size_key, "' and '", heads_key, "' (",
                rule, ")");
    const int64_t hidden = integer_at(c, size_key), heads = integer_at(c, heads_key);
    TORCH_CHECK(heads > 0, origin_, ": '", prefix_, heads_key, "' must be positive, got ", heads);
    std::ostringstream text;
    text << "derived: " << prefix_ << size_key << " / " << heads_key << " = " << hidden << " / "
         << heads;
    set("head_dim", hidden / heads, text.str());
    return hidden / heads;
  }
  // head_dim = one key of the file, recorded with the model type's rule.
  int64_t head_from_key(const std::string& key, const std::string& rule) {
    const auto& c = model();
    TORCH_CHECK(has(c, key), origin_, ": cannot tell the head size: expected '", key, "' (", rule,
                ")");
    const int64_t head_dim = integer_at(c, key);
    set("head_dim", head_dim, where(key) + " (" + rule + ")");
    return head_dim;
  }
  // The trackers' memory attention: memory_attention_hidden_size / (downsample_rate x heads).
  int64_t head_from_memory_attention(const std::string& rule) {
    const auto& c = model();
    const char* keys[] = {"memory_attention_hidden_size", "memory_attention_downsample_rate",
                          "memory_attention_num_attention_heads"};
    for (const char* key : keys)
      TORCH_CHECK(has(c, key), origin_, ": cannot tell the head size: expected '", key, "' (", rule,
                  ")");
    const int64_t hidden = integer_at(c, keys[0]), rate = integer_at(c, keys[1]),
                  heads = integer_at(c, keys[2]);
    TORCH_CHECK(rate > 0 && heads > 0, origin_, ": '", prefix_, keys[1], "' and '", prefix_,
                keys[2], "' must be positive, got ", rate, " and ", heads);
    set("head_dim", hidden / (rate * heads),
        "derived: " + prefix_ +
            "memory_attention_hidden_size / (downsample_rate x heads) = " + std::to_string(hidden) +
            " / (" + std::to_string(rate) + " x " + std::to_string(heads) + ")");
    return hidden / (rate * heads);
  }

  // Step: the head size r that partial_rotary_factor multiplies. Rules: the row's HfHeadSize
  // (hf_architectures.h), else generic_head_size; then what apply_head_dim_rules left for it
  // (check_head_dim_rules) and HunYuan's ntk_alpha, which reads config.head_dim.
  void resolve_head_size(HfResolution& out, const HfArchitecture& arch, Step& s) {
    const auto& c = model();
    switch (arch.head) {
      case HfHeadSize::kKvChannels:
        s.head_dim = head_from_key("kv_channels", s.rule);
        break;
      case HfHeadSize::kAttentionHeadDim:
        s.head_dim = head_from_key("attention_head_dim", s.rule);
        break;
      case HfHeadSize::kDModelPerHead:
        s.head_dim = head_per_head("d_model", "n_heads", s.rule);
        break;
      case HfHeadSize::kDecoderHeads:
        s.head_dim = head_per_head("hidden_size", "decoder_num_attention_heads", s.rule);
        break;
      case HfHeadSize::kMemoryAttention:
        s.head_dim = head_from_memory_attention(s.rule);
        break;
      case HfHeadSize::kRotaryDim:
        if (has(c, "n_embd")) {
          s.head_dim = head_per_head("n_embd", "n_head", s.rule);
          break;
        }
        [[fallthrough]];
      default:
        generic_head_size(arch, s);
    }
    TORCH_CHECK(s.head_dim > 0, origin_, ": the head size must be positive, got ", s.head_dim);
    TORCH_CHECK(s.rope_type != "ntk_alpha" || has(c, "head_dim"), origin_,
                ": ntk_alpha ('dynamic' with alpha) reads '", prefix_,
                "head_dim', which this config lacks; transformers' ", std::string(arch.source),
                " fails on it (None - 2), so there is no table to match");
    check_head_dim_rules(
        out, c, s.rope_type, s.head_dim, s.took_head_dim,
        s.axial || s.head_from_layers ||
            (layer_type_ == "full_attention" &&
             (has(c, "global_head_dim") || arch.head == HfHeadSize::kGlobalHeadDim)));
  }

  // The generic head-size rule (and Gemma 4's full-attention layers, kGlobalHeadDim):
  // qk_rope_head_dim > per_layer_config's head_dim > global_head_dim (full attention) > head_dim
  // > the tower's embed_dim or hidden_size per head > hidden_size / num_attention_heads.
  void generic_head_size(const HfArchitecture& arch, Step& s) {
    const auto& c = model();
    const bool global = arch.head == HfHeadSize::kGlobalHeadDim;
    if (arch.head == HfHeadSize::kGeneric && has(c, "qk_rope_head_dim")) {
      s.head_dim = integer_at(c, "qk_rope_head_dim");
      set("head_dim", s.head_dim, where("qk_rope_head_dim") + " (the rotary part of each head)");
    } else if (const auto layer = global ? layer_type_override(c, "head_dim") : std::nullopt;
               layer.has_value()) {
      // a saved config: transformers keeps global_head_dim in per_layer_config, keyed by layer
      // index, and the rotary module reads the config of the type's layers
      s.head_dim = layer->second;
      s.head_from_layers = true;
      set("head_dim", s.head_dim,
          options_.origin + ": " + prefix_ + "per_layer_config['" + layer->first +
              "'].head_dim (this layer type's layers; transformers' per_layer_config)");
    } else if (global && has(c, "per_layer_config") && has(c, "head_dim")) {
      // per_layer_config without an override for this type: its layers take head_dim (an unused
      // global_head_dim is ignored, as transformers ignores it then)
      s.head_dim = integer_at(c, "head_dim");
      set("head_dim", s.head_dim,
          where("head_dim") + " (no per_layer_config head_dim for this layer type's layers)");
    } else if (layer_type_ == "full_attention" && has(c, "global_head_dim")) {
      s.head_dim = integer_at(c, "global_head_dim");
      set("head_dim", s.head_dim,
          where("global_head_dim") + " (full-attention layers; transformers' per_layer_config)");
    } else if (layer_type_ == "full_attention" && global) {
      s.head_dim = 512;
      set("head_dim", s.head_dim,
          "transformers default global_head_dim 512 for full-attention layers, absent from the "
          "file (" +
              s.rule + ")");
    } else if (has(c, "head_dim")) {
      s.head_dim = integer_at(c, "head_dim");
      set("head_dim", s.head_dim, where("head_dim"));
      s.took_head_dim = true;
    } else if (s.axial) {  // compute_axial_rope_parameters: embed_dim or hidden_size per head
      const char* heads = has(c, "num_heads") ? "num_heads" : "num_attention_heads";
      s.head_dim = head_per_head(has(c, "embed_dim") ? "embed_dim" : "hidden_size", heads, s.rule);
    } else {
      TORCH_CHECK(has(c, "hidden_size") && has(c, "num_attention_heads"), origin_,
                  ": cannot tell the head size: expected 'head_dim', 'qk_rope_head_dim' or "
                  "'hidden_size' with 'num_attention_heads' (transformers' rule)");
      s.head_dim = head_per_head("hidden_size", "num_attention_heads", s.rule);
    }
  }

  // Step: the pair layout. rope_interleave where the config sets it and the model type's code
  // reads it (the row's reads_rope_interleave; an unknown or unchecked model type is taken at its
  // word), else the model type's modeling code: its row, else the generated pair_layout (the
  // rotation its attention applies, probed), else rotate_half.
  void resolve_layout(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    const auto& c = model();
    std::string layout(arch.layout);
    std::string layout_source =
        arch.model_type.empty() ? std::string("transformers default (rotate_half)") : s.rule;
    if (const auto* own = hf_absent_key_defaults(out.model_type);
        arch.model_type.empty() && own != nullptr && own->contains("pair_layout") &&
        (*own)["pair_layout"].is_string()) {
      layout = (*own)["pair_layout"].get<std::string>();
      layout_source = "transformers: model type '" + out.model_type + "''s attention rotates " +
                      layout +
                      " pairs (tools/gen_hf_architectures.py's layout probe of its own rotation)";
    }
    if (has(c, "rope_interleave")) {
      TORCH_CHECK(c["rope_interleave"].is_boolean(), origin_, ": '", prefix_,
                  "rope_interleave' must be true or false, got ", describe(c["rope_interleave"]));
      const std::string asked = c["rope_interleave"].get<bool>() ? "interleaved" : "half";
      const auto status = hf_model_type_status(out.model_type);
      if (arch.reads_rope_interleave || status == HfModelTypeStatus::kUnknown ||
          status == HfModelTypeStatus::kUnchecked) {
        layout = asked;
        layout_source = where("rope_interleave");
      } else if (asked != layout) {
        out.warnings.push_back(origin_ + ": '" + prefix_ +
                               "rope_interleave' is not read by model type '" + out.model_type +
                               "' (its attention rotates " + layout +
                               " pairs whatever it says); ignored, as transformers ignores it");
      }
    }
    set("layout", layout, layout_source);
  }

  // Whether the file gives rope_theta at the top level (not one filled from the class's
  // defaults; a composite's own text_config defaults are merged into the file's dict before the
  // text class sees it: they count as the file's).
  bool file_gives_theta() const {
    return has(model(), "rope_theta") &&
           (!defaulted_.count("rope_theta") || composite_keys_.count("rope_theta"));
  }

  // A block without rope_theta beside a top-level one, where the class gives such a block its
  // own theta for some layer types (Gemma 3's sliding window keeps 1e4) or reads another key
  // (GPT-NeoX: rotary_emb_base; generated legacy_rope_scaling.rope_theta_from_file): which blocks
  // take the top-level value is the class's own rule, refused here. Most classes fill
  // default_theta into a block without one; some leave it without, and transformers' rope
  // functions fail on it (generated block_theta_missing: Gemma 4, MiMo-V2-Flash, Laguna, Cohere 2
  // MoE).
  void refuse_block_without_theta(const HfResolution& out, const Step& s) const {
    const bool file_theta = file_gives_theta();
    const double class_theta = class_block_theta(layer_type_);
    const bool neox_unread =
        file_theta && defaults_.is_object() && defaults_.contains("legacy_rope_scaling") &&
        !defaults_["legacy_rope_scaling"].value("rope_theta_from_file", true) &&
        defaults_["legacy_rope_scaling"].contains("rope_theta") &&
        defaults_["legacy_rope_scaling"]["rope_theta"].is_number();
    TORCH_CHECK(has(s.block, "rope_theta") || !file_theta ||
                    ((std::isnan(class_theta) || layer_type_.empty()) && !neox_unread),
                origin_, ": refused: '", prefix_, block_name_,
                "' has no rope_theta and the top level has one, and model type '", out.model_type,
                "''s config class decides per block whether the top-level value applies (it "
                "gives some blocks its own); put rope_theta in every block, as transformers 5 "
                "writes it");
    if (!has(s.block, "rope_theta") && !file_theta && defaults_.is_object() &&
        defaults_.contains("block_theta_missing") && defaults_["block_theta_missing"].is_array())
      for (const auto& t : defaults_["block_theta_missing"])
        TORCH_CHECK(!t.is_string() || (t != "*" && t.get<std::string>() != layer_type_), origin_,
                    ": refused: ", prefix_, block_name_,
                    " has no rope_theta, none is given at the top level, and model type '",
                    out.model_type, "''s config class fills none (transformers ",
                    std::string(kHfArchitecturesTransformers),
                    " fails on it: KeyError 'rope_theta'); give rope_theta");
  }

  // Step: theta. The block's rope_theta > the class's own for a block without one (generated
  // block_rope_theta: Gemma 3's full attention 1e6, its sliding window 1e4) > the top level's >
  // GPT-NeoX's rotary_emb_base (the row's reads_neox_keys) > the base a class that reads no
  // rope_theta hard-codes (generated unread_keys: GPT-J, CodeGen) > transformers' default_theta.
  void resolve_theta(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    const auto& c = model();
    const bool neox = arch.reads_neox_keys;
    refuse_block_without_theta(out, s);
    const double class_theta = class_block_theta(layer_type_);
    if (has(s.block, "rope_theta")) {
      set("rope_theta", number_at(s.block, "rope_theta", from_block("rope_theta")),
          where(from_block("rope_theta")));
    } else if (!std::isnan(class_theta) && !file_gives_theta() &&
               !(neox && has(c, "rotary_emb_base"))) {
      set("rope_theta", class_theta,
          "transformers default of model type '" + out.model_type + "' for " + block_name_ +
              " without rope_theta (its config class's value)");
    } else if (has(c, "rope_theta")) {
      set("rope_theta", number_at(c, "rope_theta"), where("rope_theta"));
    } else if (neox && has(c, "rotary_emb_base")) {
      set("rope_theta", number_at(c, "rotary_emb_base"), where("rotary_emb_base") + " (GPT-NeoX)");
    } else if (unread("rope_theta") && unread("rope_parameters.rope_theta")) {
      // the fixtures check 10000 against the default config's table, which no rope_theta
      // changes (reads_probe)
      set("rope_theta", 10000.0,
          "model type '" + out.model_type +
              "''s rotary class reads no rope_theta: its own base, 10000 (its table whatever the "
              "file says; tools/gen_hf_architectures.py's reads probe)");
    } else {
      set("rope_theta", 10000.0, "transformers default (RotaryEmbeddingConfigMixin.default_theta)");
      out.warnings.push_back(origin_ +
                             ": no rope_theta: using 10000, transformers' default_theta for "
                             "configs without one");
    }
  }

  // Step: the partial rotary factor. The block's > the top level's > GPT-NeoX's rotary_pct (the
  // row's reads_neox_keys) > rotary_dim / head_dim (the row's kRotaryDim: GPT-J, CodeGen; its
  // rotary_dim_sets_partial: MiniMax-M2) > 1. Then the row's partial_from_layer_heads (dots3),
  // and the whole head where the model type's rope ignores the factor (generated
  // kDefaultRopeIgnoresPartialModelTypes: Llama's default rope and its copies; HunYuan's
  // ntk_alpha reads config.head_dim).
  void resolve_partial(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    const auto& c = model();
    if (has(s.block, "partial_rotary_factor")) {
      set("partial_rotary_factor",
          number_at(s.block, "partial_rotary_factor", from_block("partial_rotary_factor")),
          where(from_block("partial_rotary_factor")));
    } else if (has(c, "partial_rotary_factor")) {
      set("partial_rotary_factor", number_at(c, "partial_rotary_factor"),
          where("partial_rotary_factor"));
    } else if (arch.reads_neox_keys && has(c, "rotary_pct")) {
      set("partial_rotary_factor", number_at(c, "rotary_pct"), where("rotary_pct") + " (GPT-NeoX)");
    } else if ((arch.head == HfHeadSize::kRotaryDim || arch.rotary_dim_sets_partial) &&
               has(c, "rotary_dim")) {
      const int64_t rotary = integer_at(c, "rotary_dim");
      set("partial_rotary_factor", static_cast<double>(rotary) / static_cast<double>(s.head_dim),
          "derived: " + prefix_ + "rotary_dim / head_dim (" + s.rule + ")");
    } else {
      set("partial_rotary_factor", 1.0, "transformers default");
    }
    if (arch.partial_from_layer_heads) partial_from_layer_heads(out, c, s.head_dim);
    const bool whole_head =
        !s.axial &&
        ((s.rope_type == "default" && hf_default_rope_ignores_partial(out.model_type)) ||
         s.rope_type == "ntk_alpha");
    if (whole_head && resolved_["partial_rotary_factor"].get<double>() != 1.0) {
      out.warnings.push_back(
          origin_ + ": 'partial_rotary_factor' " + resolved_["partial_rotary_factor"].dump() +
          " (" + sources_["partial_rotary_factor"].get<std::string>() + ") is not read by the " +
          s.rope_type + " rope of model type '" + out.model_type +
          "', which rotates the whole head; ignored, as "
          "transformers ignores it");
      set("partial_rotary_factor", 1.0,
          "model type '" + out.model_type + "': its " + s.rope_type +
              " rope takes the whole head (tools/gen_hf_architectures.py's partial probe)");
    }
  }

  // Step: the context length. max_position_embeddings, or the key the model type's class reads
  // as it (generated max_position_rules.max_position_alias: DBRX's max_seq_len, GPT-J's
  // n_positions); both given must agree.
  void resolve_max_position(const HfResolution& out, Step& s) {
    const auto& c = model();
    if (const auto* d = hf_absent_key_defaults(out.model_type);
        d != nullptr && d->contains("max_position_rules"))
      s.max_rules = &(*d)["max_position_rules"];
    s.alias = s.max_rules != nullptr && s.max_rules->contains("max_position_alias")
                  ? (*s.max_rules)["max_position_alias"].get<std::string>()
                  : std::string();
    s.file_max = has(c, "max_position_embeddings") && !defaulted_.count("max_position_embeddings");
    s.by_alias = !s.alias.empty() && has(c, s.alias);
    TORCH_CHECK(!s.by_alias || !s.file_max ||
                    integer_at(c, s.alias) == integer_at(c, "max_position_embeddings"),
                origin_, ": refused: '", prefix_, s.alias, "' ", integer_at(c, s.alias), " and '",
                prefix_, "max_position_embeddings' ", integer_at(c, "max_position_embeddings"),
                " disagree, and model type '", out.model_type, "''s config class reads '", s.alias,
                "' as max_position_embeddings; give one of them");
    s.has_max = has(c, "max_position_embeddings") || s.by_alias;
    if (s.by_alias)
      set("max_position_embeddings", integer_at(c, s.alias),
          where(s.alias) + " (model type '" + out.model_type +
              "''s config class reads it as max_position_embeddings)");
    else if (s.has_max)
      set("max_position_embeddings", integer_at(c, "max_position_embeddings"),
          where("max_position_embeddings"));
  }

  // Step, for the scaling units that read the original context (their dependencies: yarn,
  // llama3, longrope): the top level's original_max_position_embeddings (not per layer type)
  // > the block's > the class's own fill (generated max_position_rules.alias_original /
  // unset_original) > max_position_embeddings (standardize_rope_params). Refused where the
  // class validates the block before reading the top level (generated top_original_unread:
  // Cohere 2 MoE) or leaves the block without it (generated original_not_filled: Gemma 4,
  // MiMo-V2-Flash, Zaya, ...): transformers fails there (KeyError).
  void resolve_original_context(const HfResolution& out, const Step& s) {
    const auto& c = model();
    const auto& block = s.block;
    const std::string& rope_type = s.rope_type;
    const std::string version(kHfArchitecturesTransformers);
    TORCH_CHECK(has(block, "original_max_position_embeddings") ||
                    !generated_rule_names(out.model_type, "top_original_unread", rope_type),
                origin_, ": refused: rope_type '", rope_type,
                "' without 'original_max_position_embeddings' in ", block_name_, ": model type '",
                out.model_type,
                "''s config class validates the block before it reads the top-level one "
                "(transformers ",
                version, " fails on it: KeyError); give it in the block");
    const std::string max_key = s.by_alias ? s.alias : std::string("max_position_embeddings");
    const char* fill_rule = s.by_alias ? "alias_original" : "unset_original";
    if (has(c, "original_max_position_embeddings") && layer_type_.empty()) {
      set("original_max_position_embeddings", integer_at(c, "original_max_position_embeddings"),
          where("original_max_position_embeddings") +
              " (top level; transformers prefers it over the block's, as Phi-3 needs)");
    } else if (has(block, "original_max_position_embeddings")) {
      set("original_max_position_embeddings",
          integer_at(block, "original_max_position_embeddings",
                     from_block("original_max_position_embeddings")),
          where(from_block("original_max_position_embeddings")));
    } else if (layer_type_.empty() && s.max_rules != nullptr && s.max_rules->contains(fill_rule) &&
               ((*s.max_rules)[fill_rule].is_null() || s.by_alias || s.file_max)) {
      // the class fills the block's original before it sets the file's context length (or not
      // at all: transformers then fails on the block, KeyError)
      const auto& filled = (*s.max_rules)[fill_rule];
      TORCH_CHECK(
          filled.is_number_integer(), origin_, ": refused: rope_type '", rope_type,
          "' without 'original_max_position_embeddings', which model type '", out.model_type,
          "''s config class does not fill from ", max_key, " (transformers ", version,
          " fails on it: KeyError); give original_max_position_embeddings in ", block_name_);
      set("original_max_position_embeddings", filled.get<int64_t>(),
          "transformers: model type '" + out.model_type +
              "''s config class fills it with its default before it sets the file's " + max_key);
    } else {
      TORCH_CHECK(!generated_rule_names(out.model_type, "original_not_filled", rope_type), origin_,
                  ": refused: rope_type '", rope_type,
                  "' without 'original_max_position_embeddings' in ", block_name_, ": model type '",
                  out.model_type,
                  "''s config class does not fill it from max_position_embeddings "
                  "(transformers ",
                  version, " fails on it: KeyError); give it in the block");
      TORCH_CHECK(s.has_max, origin_, ": rope_type '", rope_type,
                  "' needs 'original_max_position_embeddings' (in ", block_name_,
                  " or at the top level) or 'max_position_embeddings', which transformers "
                  "takes in its place; neither is given");
      set("original_max_position_embeddings", resolved_["max_position_embeddings"],
          "max_position_embeddings (transformers' standardize_rope_params when the block has "
          "none)");
    }
  }

  // Step: the block's numbers its scaling unit takes (rope_scaling_takes; others are unread, a
  // warning, as transformers warns), the keys the class requires (generated required_block_keys:
  // KeyError without them), and a factor the block leaves out where the unit derives it from the
  // context lengths (its dependency on max_position_embeddings unless 'factor': yarn, longrope).
  void resolve_block_numbers(HfResolution& out, const Step& s) {
    const auto& block = s.block;
    const std::string& rope_type = s.rope_type;
    RopeScaling scaling = RopeScaling::kDefault;
    try {
      scaling = rope_scaling_from_string(rope_type);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, origin_, ": ", from_block("rope_type"), ": ", e.what_without_backtrace());
    }
    for (const char* key : {"factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                            "mscale_all_dim", "low_freq_factor", "high_freq_factor", "alpha"}) {
      if (!has(block, key)) continue;
      if (!rope_scaling_takes(scaling, key)) {  // transformers: a warning, the key unread
        // HunYuan's block says 'dynamic': transformers validates it as that (factor taken)
        if (s.ntk_alpha && rope_scaling_takes(RopeScaling::kDynamic, key)) continue;
        out.warnings.push_back(options_.origin + ": '" + from_block(key) +
                               "' is not a parameter of rope_type '" + rope_type +
                               "'; ignored, as transformers ignores it with a warning");
        continue;
      }
      set(key, number_at(block, key, from_block(key)), where(from_block(key)));
    }
    if (const auto* own = hf_absent_key_defaults(out.model_type);
        own != nullptr && own->contains("required_block_keys") &&
        (*own)["required_block_keys"].contains(rope_type))
      for (const auto& key : (*own)["required_block_keys"][rope_type]) {
        const auto k = key.get<std::string>();
        TORCH_CHECK(has(block, k), origin_, ": refused: rope_type '", rope_type, "' without '", k,
                    "' in ", block_name_, ": model type '", out.model_type,
                    "''s config class requires it (transformers ",
                    std::string(kHfArchitecturesTransformers),
                    " fails on it: KeyError); give it in the block");
      }
    if (!has(block, "factor") && s.unit != nullptr &&
        depends_on(*s.unit, "max_position_embeddings", true)) {
      TORCH_CHECK(s.has_max, origin_, ": rope_type '", rope_type,
                  "' without 'factor' takes max_position_embeddings / "
                  "original_max_position_embeddings, and max_position_embeddings is not given");
      const double f = resolved_["max_position_embeddings"].get<double>() /
                       resolved_["original_max_position_embeddings"].get<double>();
      set("factor", f, "derived: max_position_embeddings / original_max_position_embeddings");
    }
  }

  // Step: the block's yarn truncate (transformers reads it from config.rope_parameters itself:
  // a per-layer-type block's own is unread), longrope's short/long factor lists, and PhiMoE's
  // length mscale (the row's longrope_mscale_by_length).
  void resolve_block_lists(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    const auto& block = s.block;
    if (has(block, "truncate") && !layer_type_.empty())
      out.warnings.push_back(
          origin_ + ": '" + prefix_ + block_name_ +
          ".truncate' is not read by transformers' yarn (it reads the key "
          "beside the per-layer-type blocks); ignored, as transformers ignores it");
    if (has(block, "truncate") && layer_type_.empty()) {
      TORCH_CHECK(block["truncate"].is_boolean(), origin_, ": '", where(from_block("truncate")),
                  "' must be true or false, got ", describe(block["truncate"]));
      set("truncate", block["truncate"].get<bool>(), where(from_block("truncate")));
    }
    for (const char* key : {"short_factor", "long_factor"}) {
      if (has(block, key)) {
        TORCH_CHECK(block[key].is_array(), origin_, ": '", from_block(key),
                    "' must be a list of numbers, got ", describe(block[key]));
        set(key, block[key], where(from_block(key)));
      }
    }
    if (arch.longrope_mscale_by_length && s.rope_type != "default") apply_length_mscale(block);
  }

  // Step: the M-RoPE sections (resolve_sections) and their layout: the class's own where it was
  // probed (generated mrope_layout; a contrary mrope_interleaved is unread, a warning), else the
  // block's mrope_interleaved.
  void record_sections(HfResolution& out, const Step& s) {
    if (s.sections.empty()) return;
    const auto& block = s.block;
    set("mrope_section", s.sections,
        s.sections_defaulted ? "transformers: model type '" + out.model_type +
                                   "''s rotary class takes these when the block gives none"
                             : where(from_block("mrope_section")));
    const bool interleaved_given =
        has(block, "mrope_interleaved") && block["mrope_interleaved"].is_boolean();
    if (s.mrope != nullptr) {
      const std::string layout = (*s.mrope)["mrope_layout"].get<std::string>();
      if (interleaved_given && block["mrope_interleaved"].get<bool>() != (layout == "interleaved"))
        out.warnings.push_back(origin_ + ": '" + from_block("mrope_interleaved") + "' " +
                               block["mrope_interleaved"].dump() + " is not read: model type '" +
                               out.model_type + "''s rotary class lays the sections out " + layout +
                               " in its code; ignored, as transformers ignores it");
      set("section_layout", layout,
          "transformers: model type '" + out.model_type + "''s rotary class (its code)");
    } else if (interleaved_given && block["mrope_interleaved"].get<bool>()) {
      set("section_layout", "interleaved", where(from_block("mrope_interleaved")));
    }
  }

  // Step: a warning for each block key transformers does not read (kBlockKeys; PhiMoE's
  // short_mscale / long_mscale are apply_length_mscale's).
  void warn_unread_block_keys(HfResolution& out, const HfArchitecture& arch, const Step& s) {
    for (const auto& item : s.block.items()) {
      if (kBlockKeys.count(item.key())) continue;
      if (arch.longrope_mscale_by_length &&
          (item.key() == "short_mscale" || item.key() == "long_mscale"))
        continue;
      out.warnings.push_back(origin_ + ": '" + from_block(item.key()) +
                             "' is not a RoPE parameter transformers reads; ignored (transformers "
                             "ignores it with a warning too)");
    }
  }

  // Step: DeepSeek's softmax scale (yarn_apply_mscale): outside RoPE, reported for the attention.
  void resolve_softmax_scale(HfResolution& out, const Step& s) {
    const auto& block = s.block;
    if (s.rope_type == "default" || !has(block, "mscale_all_dim") || !has(block, "factor")) return;
    const double m_all = number_at(block, "mscale_all_dim", from_block("mscale_all_dim"));
    const double f = number_at(block, "factor", from_block("factor"));
    if (m_all == 0) return;
    const double m = f <= 1 ? 1.0 : 0.1 * m_all * std::log(f) + 1.0;
    out.softmax_scale_multiplier = m * m;
  }

  // The resolved config, which must build (the encoder's own checks: even rotary dim, list sizes).
  HfResolution finish(HfResolution& out) {
    nlohmann::ordered_json config{{"type", "rope"}};
    for (const auto& item : resolved_.items()) config[item.key()] = item.value();
    out.config = config;
    out.sources = sources_;
    out.layer_type = layer_type_;
    try {
      build_encoder(out);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, origin_, ": ", e.what_without_backtrace());
    }
    return out;
  }
  // A vision tower's rotary (rope_type 'axial'): the model type's HfAxial unit gives the number
  // of axes, how many pairs each takes, how the sections sit over the pairs, which coordinate
  // each reads, and whether one ladder is dealt to them or each restarts its own.
  void resolve_axial(HfResolution& out, const HfArchitecture& arch, int64_t head_dim) {
    const HfAxialUnit& unit = hf_axial_unit(arch.axial);
    const std::string rule = "model type '" + out.model_type + "' (" + std::string(arch.source) +
                             "): " + std::string(unit.source);
    if (unit.whole_head && resolved_["partial_rotary_factor"].get<double>() != 1.0) {
      out.warnings.push_back(origin_ + ": 'partial_rotary_factor' " +
                             resolved_["partial_rotary_factor"].dump() +
                             " is not read by the vision rotary of " + rule +
                             ", which sizes it from the head; ignored, as transformers ignores it");
      set("partial_rotary_factor", 1.0, rule);
    }
    const double partial = resolved_["partial_rotary_factor"].get<double>();
    const auto rotary = static_cast<int64_t>(static_cast<double>(head_dim) * partial);
    std::vector<int64_t> sections;
    if (unit.axes == 2) {
      TORCH_CHECK(rotary % 4 == 0, origin_,
                  ": rope_type 'axial' splits the rotary part in two "
                  "axes of whole pairs; its size must be a multiple of 4, got ",
                  rotary);
      sections.assign(2, rotary / 4);
    } else {  // (t, h, w) runs of (Dh / A) / 2 pairs; the head's remaining dims pass through
      const int64_t pairs = (head_dim / unit.axes) / 2;
      TORCH_CHECK(pairs > 0, origin_, ": ", rule, " gives each of its ", unit.axes,
                  " axes (head_dim / ", unit.axes, ") / 2 pairs; head_dim ", head_dim,
                  " leaves none");
      const double factor =
          static_cast<double>(2 * unit.axes * pairs) / static_cast<double>(head_dim);
      TORCH_CHECK(
          static_cast<int64_t>(static_cast<double>(head_dim) * factor) == 2 * unit.axes * pairs,
          origin_, ": the rotary width ", 2 * unit.axes * pairs, " of head_dim ", head_dim,
          " is not int(head_dim * factor) for a double factor");
      set("partial_rotary_factor", factor,
          "derived: " + std::to_string(unit.axes) + " axes x " + std::to_string(pairs) +
              " pairs of head_dim " + std::to_string(head_dim) + " (" + rule + ")");
      sections.assign(unit.axes, pairs);
    }
    set("mrope_section", sections,
        "derived: " + std::to_string(unit.axes) + " axes of " + std::to_string(sections[0]) +
            " pairs (" + rule + ")");
    if (unit.section_layout != "contiguous")
      set("section_layout", std::string(unit.section_layout), rule);
    if (!unit.section_axes.empty()) set("section_axes", unit.section_axes, rule);
    if (unit.position_scale != 1.0) {
      set("position_scale", unit.position_scale, rule);
      // DINOv3's exponents are arange(0, 1, 4 / Dh) (a float64 step, each value rounded once to
      // float32), posenc's per-axis ladder's (2i) / (Dh / 2) in float32: the same numbers where
      // 4 / Dh is a power of two (every released head size), checked here for any other
      const auto step = at::arange(0.0, 1.0, 4.0 / static_cast<double>(head_dim),
                                   at::TensorOptions().dtype(at::kFloat));
      const auto ladder =
          at::arange(0, head_dim / 2, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
          (head_dim / 2);
      TORCH_CHECK(options_.angle_dtype != "float32" ||
                      (step.sizes() == ladder.sizes() && at::equal(step, ladder)),
                  origin_, ": refused: head_dim ", head_dim, " gives ", rule,
                  " float32 exponents arange(0, 1, 4 / head_dim) that are not posenc's (2i) / "
                  "(head_dim / 2) to the bit; use angle_dtype float64");
    }
    if (unit.dealt)
      set("frequency_order", "dealt", rule);
    else
      set("per_axis_frequencies", true,
          "derived: 'axial' restarts the ladder on each axis (" + std::string(unit.source) + ")");
  }

  const nlohmann::json& model() const {
    if (patched_.is_object()) return patched_;
    return text_ ? *text_ : *root_;
  }

  // A composite builds its text model, and the text rotary, from text_config (kTextConfigModelTypes
  // in hf_model_types.inc): RoPE keys at the top level beside a text_config are not the text
  // model's. Without a text_config (transformers 4's flat layout) Qwen2-VL's config class builds
  // text_config from the top-level keys (kFlatTextCarriedModelTypes), resolved by the text model
  // type's rules and defaults; LLaVA's ignores them and takes its text config class's defaults, a
  // table posenc does not build from the file: refused. Composites refused by their row keep it.
  void composite_text_config(HfResolution& out) {
    if (!has(*root_, "model_type") || !(*root_)["model_type"].is_string()) return;
    const std::string root_type = (*root_)["model_type"].get<std::string>();
    const std::string_view text_type = hf_text_config_model_type(root_type);
    if (text_type.empty() || !find_hf_architecture(root_type)->refusal.empty()) return;
    if (has(*root_, "text_config") && (*root_)["text_config"].is_object()) {
      if (text_ == nullptr) {
        out.warnings.push_back(
            origin_ + ": model type '" + root_type +
            "' builds its text model from text_config; the RoPE keys at the top level are not "
            "its (transformers ignores them), so text_config is resolved");
        text_ = &(*root_)["text_config"];
        prefix_ = "text_config.";
      }
      return;
    }
    TORCH_CHECK(hf_flat_text_carried(root_type), origin_, " (model type '", root_type,
                "'): refused: no 'text_config', and transformers ",
                std::string(kHfArchitecturesTransformers),
                " builds this model type's text model from 'text_config' only: it ignores text "
                "keys at the top level and takes its text config class's defaults, which are not "
                "this file's; give the text model's keys under 'text_config'");
    flat_text_type_ = std::string(text_type);
    out.warnings.push_back(origin_ + ": model type '" + root_type +
                           "' without text_config: its config class builds the text model (" +
                           flat_text_type_ + ") from the top-level keys, and so does posenc");
  }

  // Whether the model type's rotary class never reads `key` of a config.json (generated
  // unread_keys, tools/gen_hf_architectures.py's reads_probe: GPT-J's and CodeGen's tables
  // hard-code their base; ESM's reads only the top-level rope_theta).
  bool unread(const std::string& key) const {
    const auto* own = hf_absent_key_defaults(model_type_);
    if (own == nullptr || !own->contains("unread_keys")) return false;
    for (const auto& k : (*own)["unread_keys"])
      if (k.is_string() && k.get<std::string>() == key) return true;
    return false;
  }

  // A modeling file that builds its rotary only for one value of a key (generated rotary_gate:
  // ESM's position_embedding_type 'rotary', its default 'absolute'; Granite MoE Hybrid's 'rope',
  // default None): any other value, or the class's default for a file without the key, has no
  // RoPE at all.
  void check_rotary_gate(const HfResolution& out) const {
    const auto* own = hf_absent_key_defaults(out.model_type);
    if (own == nullptr || !own->contains("rotary_gate") || !(*own)["rotary_gate"].is_object())
      return;
    const auto& gate = (*own)["rotary_gate"];
    const std::string key = gate.value("key", std::string());
    const auto& c = model();
    const nlohmann::json value = c.is_object() && c.contains(key) ? c[key] : gate["absent"];
    TORCH_CHECK(value == gate["rotary"], origin_, ": refused: '", prefix_, key, "' is ",
                value.dump(), c.is_object() && c.contains(key) ? "" : " (the class's default)",
                ", and model type '", out.model_type,
                "''s modeling file builds its rotary only for ", gate["rotary"].dump(),
                ": this model has no RoPE, so there is no table to resolve");
  }

  // Spellings the model type's config or rotary class refuses (generated values_rejected: its
  // strict dataclass fields, its rope functions' pow, its ROPE_INIT_FUNCTIONS without legacy
  // names), refused here too rather than read leniently into a table transformers never builds.
  void refuse_rejected_values(const HfResolution& out) const {
    const auto* own = hf_absent_key_defaults(out.model_type);
    if (own == nullptr || !own->contains("values_rejected")) return;
    const auto& c = model();
    auto rejected = [&](const char* name) {
      for (const auto& k : (*own)["values_rejected"])
        if (k.is_string() && k.get<std::string>() == name) return true;
      return false;
    };
    auto refuse = [&](const std::string& key, const nlohmann::json& v, const char* why) {
      TORCH_CHECK(false, origin_, ": refused: '", prefix_, key, "' is ", describe(v),
                  ", which model type '", out.model_type, "''s config or rotary class refuses (",
                  why, "; transformers ", std::string(kHfArchitecturesTransformers),
                  " cannot build this model)");
    };
    if (has(c, "rope_theta") && c["rope_theta"].is_string() && rejected("rope_theta_string"))
      refuse("rope_theta", c["rope_theta"], "a number is expected");
    if (has(c, "rope_theta") && c["rope_theta"].is_number_integer() &&
        rejected("rope_theta_integer"))
      refuse("rope_theta", c["rope_theta"],
             "its typed field takes only a float; write it as 10000.0");
    for (const char* b : {"rope_parameters", "rope_scaling"}) {
      if (!has(c, b) || !c[b].is_object()) continue;
      const bool nested =
          std::all_of(c[b].begin(), c[b].end(),
                      [](const nlohmann::json& v) { return v.is_object() || v.is_null(); }) &&
          !c[b].empty();
      std::vector<std::pair<std::string, const nlohmann::json*>> blocks;
      if (nested) {
        for (const auto& item : c[b].items())
          if (item.value().is_object())
            blocks.emplace_back(std::string(b) + "." + item.key(), &item.value());
      } else {
        blocks.emplace_back(b, &c[b]);
      }
      for (const auto& [name, block] : blocks) {
        if (block->contains("rope_theta") && (*block)["rope_theta"].is_string() &&
            rejected("block_rope_theta_string"))
          refuse(name + ".rope_theta", (*block)["rope_theta"], "a number is expected");
        for (const char* type_key : {"rope_type", "type"}) {
          if (!block->contains(type_key) || !(*block)[type_key].is_string()) continue;
          const std::string type = (*block)[type_key].get<std::string>();
          if ((type == "su" && rejected("rope_type_su")) ||
              (type == "mrope" && rejected("rope_type_mrope")))
            refuse(name + "." + type_key, (*block)[type_key],
                   "a legacy name its ROPE_INIT_FUNCTIONS does not know: KeyError");
        }
      }
    }
    for (const char* key : {"head_dim", "max_position_embeddings"}) {
      const std::string probe = std::string(key) + "_float";
      if (has(c, key) && c[key].is_number_float() && rejected(probe.c_str()))
        refuse(key, c[key], "its typed field takes only an integer");
    }
  }

  // Keys of the file the model type's rotary class never reads (unread()) do not change posenc's
  // table either: left out, each with a warning, as transformers leaves them unread. A rope_scaling
  // the config class never reads stays refused (legacy_rope_scaling's reads_scaling: Cohere 2 MoE).
  void ignore_unread_keys(HfResolution& out) {
    const auto& c = model();
    if (!c.is_object()) return;
    // a config class that takes rope blocks (legacy_rope_scaling probed: ESM's) validates them by
    // its own rules (a llama3 block without rope_theta fails to load, KeyError) even where its
    // rotary class never reads them; posenc does not mirror those rules: refused. A class that
    // takes no block at all (GPT-J, CodeGen) loads any: ignored below.
    const auto* own = hf_absent_key_defaults(out.model_type);
    const bool class_takes_blocks = own != nullptr && own->contains("legacy_rope_scaling");
    for (const char* b : {"rope_parameters", "rope_scaling"}) {
      const bool plain_theta_block = std::string(b) == "rope_parameters" && has(c, b) &&
                                     c[b].is_object() && !unread("rope_parameters.rope_theta") &&
                                     c[b].size() == 1 && c[b].contains("rope_theta");
      TORCH_CHECK(!(has(c, b) && unread(b) && class_takes_blocks && !plain_theta_block), origin_,
                  ": refused: model type '", out.model_type, "''s rotary class never reads '",
                  prefix_, b,
                  "' (its table is the same without it), while its config class "
                  "validates the block by rules posenc does not mirror; leave it out");
    }
    nlohmann::json patched = c;
    bool changed = false;
    auto drop = [&](nlohmann::json& node, const std::string& key, const std::string& shown) {
      if (!node.is_object() || !node.contains(key)) return;
      node.erase(key);
      changed = true;
      out.warnings.push_back(origin_ + ": '" + prefix_ + shown + "' is not read by model type '" +
                             out.model_type +
                             "''s rotary class (its table is the same whatever it says); "
                             "ignored, as transformers ignores it");
    };
    if (unread("partial_rotary_factor"))
      drop(patched, "partial_rotary_factor", "partial_rotary_factor");
    if (patched.contains("rope_parameters") && patched["rope_parameters"].is_object()) {
      auto& params = patched["rope_parameters"];
      if (unread("rope_parameters")) {
        // the block's theta may still be read (a class reading config.rope_theta from it)
        const bool keep_theta = !unread("rope_parameters.rope_theta") &&
                                params.contains("rope_theta") && !params["rope_theta"].is_null();
        nlohmann::json kept = nlohmann::json::object();
        if (keep_theta) kept["rope_theta"] = params["rope_theta"];
        if (kept.empty()) {
          drop(patched, "rope_parameters", "rope_parameters");
        } else if (params != kept) {
          params = kept;
          changed = true;
          out.warnings.push_back(origin_ + ": '" + prefix_ +
                                 "rope_parameters' other than its rope_theta is not read by "
                                 "model type '" +
                                 out.model_type +
                                 "''s rotary class; ignored, as transformers ignores it");
        }
      } else if (unread("rope_parameters.rope_theta")) {
        drop(params, "rope_theta", "rope_parameters.rope_theta");
      }
    }
    const bool scaling_refused = own != nullptr && own->contains("legacy_rope_scaling") &&
                                 !(*own)["legacy_rope_scaling"].value("reads_scaling", true);
    if (unread("rope_scaling") && !scaling_refused) drop(patched, "rope_scaling", "rope_scaling");
    // (probed on a file without a block: beside one, the class's conversion may take it into the
    // block, which the rules below decide)
    if (unread("rope_theta") && !has(patched, "rope_parameters") && !has(patched, "rope_scaling"))
      drop(patched, "rope_theta", "rope_theta");
    if (changed) patched_ = std::move(patched);
  }

  // A top-level partial_rotary_factor (transformers 4's place for it) that the model type's config
  // class does not carry into rope_parameters, where its rotary class reads the factor, is unread
  // by transformers, whose rotary class then takes its own default for a block without one (GPT-
  // NeoX: rotary_pct 0.25; MiMo-V2-Flash: 0.334): refused, naming where the factor must go.
  void refuse_unread_partial(const HfResolution& out) const {
    const auto& c = model();
    if (!has(c, "partial_rotary_factor") || !hf_top_level_partial_unread(out.model_type)) return;
    for (const char* b : {"rope_parameters", "rope_scaling"})
      if (has(c, b) && c[b].is_object() && c[b].contains("partial_rotary_factor")) return;
    TORCH_CHECK(false, origin_, ": '", prefix_,
                "partial_rotary_factor' at the top level is not carried into rope_parameters by "
                "the config class of model type '",
                out.model_type,
                "', so transformers does not read it and its rotary class takes its own default; "
                "give the factor inside 'rope_parameters' (as transformers 5 writes it)");
  }

  // Keys posenc reads that the file leaves out take the model type's config-class default
  // (hf_defaults.inc, generated from transformers): Qwen3 without head_dim is 128, not
  // hidden_size / num_attention_heads; Qwen2-VL's text model without rope_theta is 1e6.
  // PhiMoE (the row's longrope_mscale_by_length; models/phimoe/modeling_phimoe.py): its rotary
  // forward recomputes the frequencies without a sequence length, so short_factor applies at
  // every length, and scales cos/sin by the block's short_mscale, or long_mscale past
  // original_max_position_embeddings, in place of the longrope attention factor; its
  // validate_rope requires both numbers. posenc applies one scaling: equal values (the released
  // Phi-3.5-MoE: 1.2431...) resolve, different ones are refused.
  void apply_length_mscale(const nlohmann::json& block) {
    auto from_block = [&](const std::string& key) { return block_name_ + "." + key; };
    double value[2] = {0, 0};
    const char* keys[2] = {"short_mscale", "long_mscale"};
    for (int i = 0; i < 2; ++i) {
      TORCH_CHECK(has(block, keys[i]) && block[keys[i]].is_number(), origin_, ": refused: '",
                  from_block(keys[i]), "' must be a number for a scaled rope of model type '",
                  model_type_, "' (its config class's validate_rope requires it; transformers ",
                  std::string(kHfArchitecturesTransformers), ": TypeError), got ",
                  has(block, keys[i]) ? describe(block[keys[i]]) : std::string("none"));
      value[i] = block[keys[i]].get<double>();
      TORCH_CHECK(std::isfinite(value[i]), origin_, ": '", from_block(keys[i]),
                  "' must be finite, got ", value[i]);
    }
    TORCH_CHECK(value[0] == value[1], origin_, ": refused: '", from_block("short_mscale"), "' ",
                value[0], " and '", from_block("long_mscale"), "' ", value[1],
                " differ: model type '", model_type_,
                "''s rotary forward picks one by the sequence length, and posenc applies one "
                "attention scaling");
    set("attention_factor", value[0],
        where(from_block("short_mscale")) +
            " (= long_mscale; PhiMoE's forward scales cos/sin by it)");
    if (resolved_.contains("short_factor"))
      set("long_factor", resolved_["short_factor"],
          "derived: PhiMoE's forward takes short_factor at every length (rope_init_fn without "
          "seq_len)");
  }

  void fill_absent_defaults(HfResolution& out, const HfArchitecture& arch) {
    const std::string& type = out.model_type;
    nlohmann::json merged = nlohmann::json::object();
    if (const auto* own = hf_absent_key_defaults(type)) merged = *own;
    // a composite merges its own defaults into the text_config dict (Voxtral: rope_theta 1e8)
    if (text_ != nullptr && has(*root_, "model_type") && (*root_)["model_type"].is_string())
      if (const auto* composite =
              hf_absent_key_defaults((*root_)["model_type"].get<std::string>() + "/text_config"))
        for (const auto& item : composite->items()) {
          merged[item.key()] = item.value();
          composite_keys_.insert(item.key());
        }
    // transformers reads `rope_scaling or rope_parameters`: an empty rope_scaling is absent
    if (has(model(), "rope_scaling") && model()["rope_scaling"].is_object() &&
        model()["rope_scaling"].empty()) {
      nlohmann::json without = model();
      without.erase("rope_scaling");
      patched_ = std::move(without);
    }
    if (merged.empty()) return;
    defaults_ = merged;
    const nlohmann::json* defaults = &defaults_;
    const auto& c = model();
    nlohmann::json patched = c;
    const bool block_theta = [&] {
      for (const char* b : {"rope_parameters", "rope_scaling"})
        if (has(c, b) && c[b].is_object() && c[b].contains("rope_theta")) return true;
      return false;
    }();
    // A file with neither rope_parameters nor rope_scaling gets the class's own block(s) (Apertus:
    // llama3; GPT-OSS: yarn; Gemma 3: one per layer type); a top-level rope_theta reaches only
    // the blocks that take it (setdefault under the class's own theta elsewhere). Gemma 3's flat
    // rope_local_base_freq is synthesized by scaling_block instead.
    // (Rows refusing a flat file, whose classes read flat keys of their own such as ModernBERT's
    // global_rope_theta, keep their refusal when the file has any such key.)
    const bool rope_keys = std::any_of(c.items().begin(), c.items().end(), [](const auto& item) {
      const std::string& k = item.key();
      return k.find("rope") != std::string::npos || k.find("rotary") != std::string::npos ||
             k.find("theta") != std::string::npos;
    });
    if (defaults->contains("rope_parameters") && (arch.flat_refusal.empty() || !rope_keys) &&
        !has(c, "rope_parameters") && !has(c, "rope_scaling") && !has(c, "rope_local_base_freq")) {
      nlohmann::json params = (*defaults)["rope_parameters"];
      auto fill = [&](nlohmann::json& b) {
        if (!b.is_object()) return;
        if (b.value("rope_theta_from_file", false) && has(c, "rope_theta"))
          b["rope_theta"] = c["rope_theta"];
        // a top-level partial_rotary_factor reaches the block (classes that leave it out were
        // refused by refuse_unread_partial); GPT-NeoX's class sets its block from its own keys
        if (has(c, "partial_rotary_factor"))
          b["partial_rotary_factor"] = c["partial_rotary_factor"];
        if (arch.reads_neox_keys && !b.value("rope_theta_from_file", false) &&
            has(c, "rotary_emb_base"))
          b["rope_theta"] = c["rotary_emb_base"];
        if (arch.reads_neox_keys && has(c, "rotary_pct"))
          b["partial_rotary_factor"] = c["rotary_pct"];
        b.erase("rope_theta_from_file");
      };
      const bool nested = std::all_of(params.begin(), params.end(), [](const nlohmann::json& v) {
        return v.is_object() || v.is_null();
      });
      if (nested)
        for (auto& item : params.items()) fill(item.value());
      else
        fill(params);
      patched["rope_parameters"] = params;
      defaulted_.insert("rope_parameters");
    }
    // transformers 4's top-level rope_scaling, where the class departs from the standard
    // conversion (legacy_rope_scaling, generated): Cohere 2 MoE never reads it; GPT-NeoX takes
    // rotary_emb_base (or its default), not rope_theta; Moonshine Streaming's partial default
    // belonged to the default block the file's replaces.
    bool legacy_partial_set = false;
    // the factor the class gives a block that replaced its default one (null: none, the whole
    // head); the class's plain partial default is then not filled in
    auto take_replaced_partial = [&](const nlohmann::json& v) {
      legacy_partial_set = true;
      if (!v.is_number()) return;
      patched["partial_rotary_factor"] = v;
      defaulted_.insert("partial_rotary_factor");
    };
    if (defaults->contains("legacy_rope_scaling") && has(c, "rope_scaling"))
      TORCH_CHECK((*defaults)["legacy_rope_scaling"].value("reads_scaling", true), origin_,
                  ": refused: model type '", type, "''s config class never reads '", prefix_,
                  "rope_scaling' (transformers builds its RoPE without it); give only "
                  "'rope_parameters', as transformers 5 writes it");
    if (defaults->contains("legacy_rope_scaling") && has(c, "rope_scaling") &&
        !has(c, "rope_parameters")) {
      const auto& legacy = (*defaults)["legacy_rope_scaling"];
      if (!legacy.value("rope_theta_from_file", true) && legacy.contains("rope_theta") &&
          legacy["rope_theta"].is_number() && !has(c, "rotary_emb_base")) {
        if (has(c, "rope_theta") && c["rope_theta"] != legacy["rope_theta"])
          out.warnings.push_back(origin_ + ": '" + prefix_ +
                                 "rope_theta' beside 'rope_scaling' is " +
                                 "not read by model type '" + type + "''s config class; ignored, " +
                                 "as transformers ignores it");
        patched["rope_theta"] = legacy["rope_theta"];
        defaulted_.insert("rope_theta");
      }
      // without a top-level rope_theta the class's own attribute, not its default block's
      if (!has(c, "rope_theta") && legacy.contains("absent_rope_theta") &&
          legacy["absent_rope_theta"].is_number() && !has(c, "rotary_emb_base") &&
          !c["rope_scaling"].contains("rope_theta")) {
        patched["rope_theta"] = legacy["absent_rope_theta"];
        defaulted_.insert("rope_theta");
      }
    }
    // transformers reads `rope_scaling or rope_parameters`: a rope_scaling replaces the class's
    // default block, and the factor it carried, beside a rope_parameters too (Mistral 4)
    if (defaults->contains("legacy_rope_scaling") && has(c, "rope_scaling") &&
        c["rope_scaling"].is_object() &&
        (*defaults)["legacy_rope_scaling"].contains("partial_rotary_factor") &&
        !has(c, "partial_rotary_factor") && !c["rope_scaling"].contains("partial_rotary_factor")) {
      take_replaced_partial((*defaults)["legacy_rope_scaling"]["partial_rotary_factor"]);
    }
    // the file's own flat rope_parameters block without a factor replaces the class's default
    // block, and with it the factor that block carried (Moonshine Streaming: the whole head)
    if (defaults->contains("legacy_rope_scaling") &&
        (*defaults)["legacy_rope_scaling"].contains("block_partial_rotary_factor") &&
        !has(c, "rope_scaling") && has(c, "rope_parameters") && c["rope_parameters"].is_object() &&
        (c["rope_parameters"].contains("rope_type") || c["rope_parameters"].contains("type") ||
         c["rope_parameters"].contains("rope_theta")) &&
        !c["rope_parameters"].contains("partial_rotary_factor") &&
        !has(c, "partial_rotary_factor")) {
      take_replaced_partial((*defaults)["legacy_rope_scaling"]["block_partial_rotary_factor"]);
    }
    for (const auto& item : defaults->items()) {
      const std::string& key = item.key();
      if (key == "rope_parameters" || key == "legacy_rope_scaling" || key == "head_dim_rules" ||
          key == "rope_theta_raises" || key == "null_rope_scaling_unsets" ||
          key == "original_not_filled" || key == "top_original_unread" ||
          key == "required_block_keys" || key == "mrope_default_section" || key == "mrope_layout" ||
          key == "max_position_rules" || key == "block_theta_missing" ||
          key == "rope_types_rejected" || key == "unread_keys" || key == "rotary_gate" ||
          key == "values_rejected" || key == "pair_layout")
        continue;
      if (key == "partial_rotary_factor" && legacy_partial_set) continue;
      if (has(c, key)) continue;
      // a composite merges its defaults under the file's keys ({**defaults, **file}): a null in
      // the file replaces the composite's value, and the text class sees None (Voxtral's head_dim)
      if (composite_keys_.count(key) && c.contains(key) && c[key].is_null()) continue;
      if (key == "rope_theta" &&
          (block_theta || (arch.reads_neox_keys && has(c, "rotary_emb_base"))))
        continue;
      if (key == "partial_rotary_factor" &&
          ((arch.reads_neox_keys && has(c, "rotary_pct")) || has(c, "rotary_dim") ||
           (!has(c, "rope_scaling") && has(c, "rope_parameters") &&
            c["rope_parameters"].is_object() &&
            c["rope_parameters"].contains("partial_rotary_factor")) ||
           (has(c, "rope_scaling") && c["rope_scaling"].is_object() &&
            c["rope_scaling"].contains("partial_rotary_factor"))))
        continue;
      patched[key] = item.value();
      defaulted_.insert(key);
    }
    if (!defaulted_.empty()) patched_ = std::move(patched);
  }

  // head_dim as the model type's config class takes it (hf_defaults.inc's generated
  // "head_dim_rules", tools/gen_hf_architectures.py's head_dim_rules):
  // - the class sets head_dim itself (DeepSeek-V2: qk_rope_head_dim): the file's value is unread;
  // - an alias (JetMoE's head_dim is kv_channels): the file's value is that key's;
  // - "head_dim": null: a validation error (Qwen3's typed field: refused), hidden_size /
  //   num_attention_heads (ERNIE 4.5), or None, for which transformers' default, linear and
  //   llama3 ropes take hidden / heads and the others fail (None * float): head_none_;
  // - a file without head_dim whose class leaves None (Mixtral): the same as null.
  // A head_dim the class keeps where posenc's rule reads another key (DeepSeek-V3 declares no
  // head_dim: the file's is set last and the rotary class reads it, while the attention rotates
  // qk_rope_head_dim) is checked against that key once the head size is known (head_dim_kept_).
  void apply_head_dim_rules(HfResolution& out) {
    const auto* own = hf_absent_key_defaults(out.model_type);
    if (own == nullptr) return;
    const auto& c = model();
    const nlohmann::json& file = text_ ? *text_ : *root_;  // before any default was filled
    if (own->value("rope_theta_raises", false))
      TORCH_CHECK(
          !has(file, "rope_theta") || has(file, "rope_parameters") || has(file, "rope_scaling"),
          origin_, ": refused: a top-level '", prefix_,
          "rope_theta' without rope_parameters: model type '", out.model_type,
          "''s config class zips it with layer_types (a list of thetas) and fails on "
          "this one (transformers ",
          std::string(kHfArchitecturesTransformers),
          ": TypeError); give per-layer-type 'rope_parameters'");
    // "rope_scaling": null (Llama 2's files carry it) is assigned over the blocks by some classes
    // (DiffusionGemma, EmbeddingGemma 2, Zaya): rope_parameters None, their rotary class fails
    if (own->value("null_rope_scaling_unsets", false))
      TORCH_CHECK(
          !(file.is_object() && file.contains("rope_scaling") && file["rope_scaling"].is_null()),
          origin_, ": refused: '", prefix_, "rope_scaling': null: model type '", out.model_type,
          "''s config class takes it over rope_parameters, which become None, and its "
          "rotary class fails (transformers ",
          std::string(kHfArchitecturesTransformers), ": TypeError); leave the key out");
    if (!own->contains("head_dim_rules")) return;
    const auto& rules = (*own)["head_dim_rules"];
    const bool given = file.is_object() && file.contains("head_dim");
    const bool null = given && file["head_dim"].is_null();
    nlohmann::json patched = c;
    bool changed = false;
    if (given && !null) {
      TORCH_CHECK(!rules.value("head_dim_raises", false), origin_, ": refused: model type '",
                  out.model_type, "''s config class fails on a '", prefix_,
                  "head_dim' key (transformers ", std::string(kHfArchitecturesTransformers),
                  " cannot load this file); leave it out");
      if (rules.value("head_dim_overridden", false)) {
        out.warnings.push_back(origin_ + ": '" + prefix_ + "head_dim' " + c["head_dim"].dump() +
                               " is not read: model type '" + out.model_type +
                               "''s config class sets head_dim itself; ignored, as transformers "
                               "ignores it");
        patched.erase("head_dim");
        if (const auto* d = hf_absent_key_defaults(out.model_type); d && d->contains("head_dim")) {
          patched["head_dim"] = (*d)["head_dim"];
          defaulted_.insert("head_dim");
        }
        changed = true;
      } else if (rules.contains("head_dim_alias_of") && rules["head_dim_alias_of"].is_string()) {
        const std::string key = rules["head_dim_alias_of"].get<std::string>();
        if (has(c, key) && c[key] != c["head_dim"])
          out.warnings.push_back(origin_ + ": '" + prefix_ + "head_dim' " + c["head_dim"].dump() +
                                 " is model type '" + out.model_type + "''s alias of '" + key +
                                 "' and replaces its " + c[key].dump() +
                                 ", as transformers sets it last");
        patched[key] = c["head_dim"];
        changed = true;
      } else {
        head_dim_kept_ = true;
      }
    }
    if (null) {
      const std::string outcome = rules.value("null_head_dim", "");
      TORCH_CHECK(outcome != "raises", origin_, ": '", prefix_,
                  "head_dim' is null, and model type '", out.model_type,
                  "''s config class takes only an integer there (transformers ",
                  std::string(kHfArchitecturesTransformers),
                  " refuses the file); give the head size or leave the key out");
      if (outcome == "derived") {
        TORCH_CHECK(has(c, "hidden_size") && has(c, "num_attention_heads") &&
                        integer_at(c, "num_attention_heads") > 0,
                    origin_, ": '", prefix_, "head_dim' is null: model type '", out.model_type,
                    "' then takes hidden_size / num_attention_heads, which this config lacks");
        patched["head_dim"] = integer_at(c, "hidden_size") / integer_at(c, "num_attention_heads");
        head_null_derived_ = true;
        changed = true;
      } else if (outcome == "none") {
        head_none_ = true;
      }
    }
    if (!given && rules.value("absent_head_dim_none", false)) head_none_ = true;
    if (head_none_ && defaulted_.count("head_dim")) {
      patched.erase("head_dim");
      defaulted_.erase("head_dim");
      changed = true;
    }
    if (changed) patched_ = std::move(patched);
  }

  // dots3's config class sets each block's partial_rotary_factor to its layer type's
  // qk_rope_head_dim / head_dim: from per_layer_config's entry for the first layer of that type,
  // else the top level (its convert_rope_params_to_dict); a block's own factor is unread.
  void partial_from_layer_heads(HfResolution& out, const nlohmann::json& c, int64_t head_dim) {
    nlohmann::json entry = nlohmann::json::object();
    const bool per_layer = has(c, "per_layer_config") && c["per_layer_config"].is_object();
    if (!layer_type_.empty() && per_layer && has(c, "layer_types") && c["layer_types"].is_array()) {
      const auto& types = c["layer_types"];
      for (size_t i = 0; i < types.size(); ++i) {
        if (!types[i].is_string() || types[i].get<std::string>() != layer_type_) continue;
        for (const auto& item : c["per_layer_config"].items()) {
          const std::string& k = item.key();
          if (!k.empty() && k.size() < 10 &&
              std::all_of(k.begin(), k.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
              std::stoul(k) == i && item.value().is_object())
            entry = item.value();
        }
        break;
      }
    }
    TORCH_CHECK(per_layer || layer_type_ != "sliding_attention", origin_, ": refused: model type '",
                out.model_type,
                "' without 'per_layer_config': its config class builds the sliding layers' head "
                "sizes from swa_* keys and defaults posenc does not mirror; give per_layer_config, "
                "as transformers 5 writes it");
    TORCH_CHECK(!has(entry, "head_dim") || integer_at(entry, "head_dim") == head_dim, origin_,
                ": refused: per_layer_config gives ", layer_type_, " layers head_dim ",
                has(entry, "head_dim") ? integer_at(entry, "head_dim") : 0,
                " where the top level says ", head_dim,
                "; posenc resolves one head size per model");
    const bool own = has(entry, "qk_rope_head_dim");
    TORCH_CHECK(own || has(c, "qk_rope_head_dim"), origin_, ": model type '", out.model_type,
                "' takes each layer type's partial_rotary_factor as qk_rope_head_dim / head_dim, "
                "and this config has no qk_rope_head_dim");
    const int64_t rope =
        own ? integer_at(entry, "qk_rope_head_dim") : integer_at(c, "qk_rope_head_dim");
    const double factor = static_cast<double>(rope) / static_cast<double>(head_dim);
    if (resolved_.contains("partial_rotary_factor") &&
        resolved_["partial_rotary_factor"].get<double>() != factor &&
        sources_["partial_rotary_factor"].get<std::string>() != "transformers default")
      out.warnings.push_back(
          origin_ + ": 'partial_rotary_factor' " + resolved_["partial_rotary_factor"].dump() +
          " (" + sources_["partial_rotary_factor"].get<std::string>() +
          ") is not read: model type '" + out.model_type +
          "''s config class sets it to qk_rope_head_dim / head_dim = " + std::to_string(rope) +
          " / " + std::to_string(head_dim));
    set("partial_rotary_factor", factor,
        "derived: " + prefix_ + (own ? "per_layer_config." : "") + "qk_rope_head_dim / head_dim (" +
            std::to_string(rope) + " / " + std::to_string(head_dim) + "; model type '" +
            out.model_type + "''s config class recomputes every block's factor)");
  }

  // What apply_head_dim_rules left for the head size: a None head_dim (transformers' rope then
  // takes hidden / heads, or fails), a kept head_dim beside the key posenc's rule read.
  void check_head_dim_rules(const HfResolution& out, const nlohmann::json& c,
                            const std::string& rope_type, int64_t head_dim, bool took_head_dim,
                            bool other_head) const {
    const std::string source = sources_.contains("head_dim") && sources_["head_dim"].is_string()
                                   ? sources_["head_dim"].get<std::string>()
                                   : std::string("posenc's rule");
    if (head_none_) {
      TORCH_CHECK(rope_type == "default" || rope_type == "linear" || rope_type == "llama3" ||
                      rope_type == "proportional",
                  origin_, ": refused: model type '", out.model_type,
                  "''s config class leaves head_dim None for this file (", prefix_, "head_dim ",
                  (text_ ? *text_ : *root_).contains("head_dim") ? "null" : "absent",
                  "), and transformers' ", rope_type,
                  " rope multiplies it (TypeError: its own model fails); give head_dim");
      TORCH_CHECK(has(c, "hidden_size") && has(c, "num_attention_heads") &&
                      integer_at(c, "num_attention_heads") > 0,
                  origin_, ": model type '", out.model_type,
                  "''s head_dim is None for this file, so transformers' rope takes hidden_size / "
                  "num_attention_heads, which this config lacks");
      const int64_t fallback = integer_at(c, "hidden_size") / integer_at(c, "num_attention_heads");
      TORCH_CHECK(other_head || fallback == head_dim, origin_, ": refused: model type '",
                  out.model_type,
                  "''s head_dim is None for this file, so transformers' rotary table takes "
                  "hidden_size / num_attention_heads = ",
                  fallback, " while its attention rotates ", head_dim, " (", source,
                  "): its own model fails; give head_dim");
    }
    if (head_dim_kept_ && !took_head_dim && !other_head && has(c, "head_dim") &&
        integer_at(c, "head_dim") != head_dim)
      TORCH_CHECK(false, origin_, ": refused: '", prefix_, "head_dim' ", integer_at(c, "head_dim"),
                  " is kept by model type '", out.model_type,
                  "''s config class for its rotary table, while its attention rotates ", head_dim,
                  " (", source,
                  "): transformers' own model fails on this file; leave head_dim out or make it ",
                  head_dim);
  }

  // The model type's row; refusals and model types posenc has not checked are said here. From
  // here on every message names the model type.
  const HfArchitecture& architecture(HfResolution& out) {
    const std::string& type = out.model_type;
    const std::string version(kHfArchitecturesTransformers);
    if (!type.empty()) origin_ += " (model type '" + type + "')";
    const auto status = hf_model_type_status(type);
    TORCH_CHECK(status != HfModelTypeStatus::kNoRotary, origin_, ": transformers ", version,
                " has no rotary embedding for model type '", type,
                "' (its modeling file defines no rotary class: its positions are learned, "
                "sinusoidal, relative or absent), so there is no RoPE table to resolve");
    const HfArchitecture* row = find_hf_architecture(type);
    TORCH_CHECK(row->refusal.empty(), origin_, ": refused: ", std::string(row->refusal), " (",
                std::string(row->source), ")");
    if (type.empty()) {
      out.warnings.push_back(origin_ +
                             ": no model_type: resolved by the generic rule (head_dim or "
                             "hidden_size / num_attention_heads, rotate_half pairs)");
    } else if (status != HfModelTypeStatus::kRotary) {
      out.warnings.push_back(
          origin_ + ": model type '" + type +
          "' is not one posenc has checked against transformers " + version +
          (status == HfModelTypeStatus::kUnknown ? " (not a model type of that version)"
                                                 : " (no modeling file of its own)") +
          "; resolved by the generic rule (head_dim or hidden_size / num_attention_heads, "
          "rotate_half pairs): check the table against the model's own code");
    }
    return *row;
  }
  static bool has(const nlohmann::json& o, const std::string& key) {
    return o.is_object() && o.contains(key) && !o.at(key).is_null();
  }
  // transformers' per-layer overrides (per_layer_config: {"<layer index>": {key: value}}) of key
  // for this layer type's layers: (the first such layer's entry, the value), or none when none of
  // them overrides it. The layers of one type must agree (transformers refuses a type whose layers
  // differ: the rotary module reads one config per type), and layer_types must say which layers
  // are of the type (transformers derives a default pattern when it is absent; posenc does not
  // guess it).
  std::optional<std::pair<std::string, int64_t>> layer_type_override(const nlohmann::json& c,
                                                                     const std::string& key) const {
    if (!has(c, "per_layer_config")) return std::nullopt;
    const auto& overrides = c["per_layer_config"];
    TORCH_CHECK(overrides.is_object(), origin_, ": '", prefix_,
                "per_layer_config' must be an object keyed by layer index, got ",
                describe(overrides));
    if (overrides.empty()) return std::nullopt;
    TORCH_CHECK(has(c, "layer_types") && c["layer_types"].is_array(), origin_, ": '", prefix_,
                "per_layer_config' is keyed by layer index but '", prefix_,
                "layer_types' is absent: transformers derives a default pattern there, which "
                "posenc does not guess; give layer_types");
    std::map<int64_t, std::string> index_of;  // layer index -> its entry's key ("05", "5")
    for (const auto& [index, entry] : overrides.items()) {
      int64_t parsed = -1;
      try {
        size_t used = 0;
        parsed = std::stoll(index, &used);
        if (used != index.size()) parsed = -1;
      } catch (const std::exception&) {
        parsed = -1;
      }
      TORCH_CHECK(parsed >= 0, origin_, ": '", prefix_,
                  "per_layer_config' keys must be layer indices, got '", index, "'");
      TORCH_CHECK(!index_of.count(parsed), origin_, ": '", prefix_,
                  "per_layer_config' names layer ", parsed, " twice ('", index_of[parsed],
                  "' and '", index,
                  "'): which one transformers takes depends on the file's key order");
      index_of[parsed] = index;
    }
    // the layer types transformers uses: the last layer is made full attention (Gemma 4's config
    // class forces it, with a warning)
    std::vector<std::string> types;
    for (const auto& t : c["layer_types"])
      types.push_back(t.is_string() ? t.get<std::string>() : "");
    TORCH_CHECK(index_of.rbegin()->first < static_cast<int64_t>(types.size()), origin_, ": '",
                prefix_, "per_layer_config' names layer ", index_of.rbegin()->first, " but '",
                prefix_, "layer_types' has ", types.size(), " layers (transformers refuses it)");
    if (!types.empty()) types.back() = "full_attention";
    // the base value an override equal to it does not change (transformers drops such overrides)
    const std::optional<int64_t> base =
        has(c, key) ? std::optional<int64_t>(integer_at(c, key)) : std::nullopt;
    std::optional<std::pair<std::string, int64_t>> first;
    int64_t first_layer = -1;
    for (size_t i = 0; i < types.size(); ++i) {
      if (types[i] != layer_type_) continue;
      const auto at = index_of.find(static_cast<int64_t>(i));
      std::optional<std::pair<std::string, int64_t>> value;
      if (at != index_of.end()) {
        const auto& entry = overrides[at->second];
        for (const auto& [name, ignored] : entry.items()) {  // what would change the table
          (void)ignored;
          const bool rotary = name != key && (name.find("rope") != std::string::npos ||
                                              name.find("rotary") != std::string::npos ||
                                              name.find("theta") != std::string::npos ||
                                              name.find("partial") != std::string::npos ||
                                              name.find("position") != std::string::npos ||
                                              name.find("head_dim") != std::string::npos);
          TORCH_CHECK(!rotary, origin_, ": '", prefix_, "per_layer_config['", at->second, "'].",
                      name,
                      "' sets a rotary parameter per layer, which posenc does not read (only "
                      "head_dim); refused rather than a table without it");
        }
        if (entry.contains(key)) {
          const auto name = "per_layer_config['" + at->second + "']." + key;
          TORCH_CHECK(!entry[key].is_null(), origin_, ": '", prefix_, name,
                      "' must be an integer, got null");
          const int64_t v = integer_at(entry, key, name);
          if (!base || v != *base) value = std::make_pair(at->second, v);
        }
      }
      if (first_layer < 0) {
        first_layer = static_cast<int64_t>(i);
        first = value;
      } else {
        const auto shown = [](const auto& v) {
          return v ? std::to_string(v->second) : std::string("the base value");
        };
        TORCH_CHECK(
            value.has_value() == first.has_value() && (!value || value->second == first->second),
            origin_, ": '", prefix_, "per_layer_config' gives the '", layer_type_,
            "' layers different ", key, "s (layer ", first_layer, ": ", shown(first), ", layer ", i,
            ": ", shown(value),
            "); transformers refuses a layer type whose layers are not homogeneous");
      }
    }
    return first;
  }
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
                                   const std::string& name) const {
    TORCH_CHECK(o[key].is_array(), origin_, ": '", prefix_, name,
                "' must be a list of integers, got ", describe(o[key]));
    std::vector<int64_t> out;
    for (size_t i = 0; i < o[key].size(); ++i) {
      const auto& v = o[key][i];
      TORCH_CHECK(v.is_number_integer() ||
                      (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
                  origin_, ": '", prefix_, name, "'[", i, "] must be an integer, got ",
                  describe(v));
      out.push_back(static_cast<int64_t>(v.get<double>()));
    }
    return out;
  }
  template <typename T>
  void set(const std::string& key, const T& value, const std::string& source) {
    resolved_[key] = value;
    sources_[key] = source;
  }

  // A flat RoPE layout (no block per layer type) for a model type whose config class builds the
  // per-layer-type blocks from flat keys by rules of its own (hf_architectures.cpp): refused where
  // posenc does not mirror them, or where the flat block scales and the class scales some layer
  // types only.
  void check_flat_layout(const HfArchitecture& arch, const nlohmann::json& flat,
                         const std::string& name) const {
    TORCH_CHECK(arch.flat_refusal.empty(), origin_,
                ": refused: without per-layer-type 'rope_parameters' ",
                std::string(arch.flat_refusal), ", which posenc does not mirror (",
                std::string(arch.source),
                "); give 'rope_parameters' per layer type, as transformers 5 writes it");
    if (arch.flat_scaling_refusal.empty()) return;
    const std::string type = string_or(flat, "rope_type", string_or(flat, "type", "default"));
    TORCH_CHECK(type == "default", origin_, ": refused: '", prefix_, name,
                "' is flat with rope_type '", type, "', and ",
                std::string(arch.flat_scaling_refusal), " (", std::string(arch.source),
                "); give 'rope_parameters' per layer type, as transformers 5 writes it");
  }

  // The scaling block: rope_parameters (v5) or rope_scaling (legacy), flat or per layer type.
  nlohmann::json scaling_block(HfResolution& out, const HfArchitecture& arch) {
    const auto& c = model();
    const bool v5 = has(c, "rope_parameters"), legacy = has(c, "rope_scaling");
    // Gemma 3 ships flat keys that transformers turns into one RoPE per layer type
    // (models/gemma3/configuration_gemma3.py): full_attention takes rope_theta and any
    // rope_scaling, sliding_attention takes rope_local_base_freq without scaling.
    // Other config classes ignore the key (kLocalBaseFreqModelTypes, generated); a model type
    // this transformers does not ship is taken at its word.
    const auto status = hf_model_type_status(out.model_type);
    const bool reads_local_base = hf_reads_local_base_freq(out.model_type) ||
                                  status == HfModelTypeStatus::kUnknown ||
                                  status == HfModelTypeStatus::kUnchecked;
    if (has(c, "rope_local_base_freq") && !reads_local_base)
      out.warnings.push_back(origin_ + ": '" + prefix_ +
                             "rope_local_base_freq' is not read by model type '" + out.model_type +
                             "''s config class (only Gemma 3's kin give it to sliding-window "
                             "layers); ignored, as transformers ignores it");
    // Gemma 3's kin without the key take their class's own local base (its sliding-window
    // block theta) for a flat rope_scaling, as their config class does.
    const double class_sliding_theta = class_block_theta("sliding_attention");
    const bool class_local_base = !has(c, "rope_local_base_freq") &&
                                  hf_reads_local_base_freq(out.model_type) && legacy && !v5 &&
                                  !std::isnan(class_sliding_theta);
    if ((has(c, "rope_local_base_freq") || class_local_base) && reads_local_base &&
        !(v5 && c["rope_parameters"].contains("sliding_attention"))) {
      nlohmann::json full =
          legacy ? c["rope_scaling"] : (v5 ? c["rope_parameters"] : nlohmann::json::object());
      TORCH_CHECK(full.is_object(), origin_, ": '", prefix_,
                  legacy ? "rope_scaling" : "rope_parameters", "' must be an object, got ",
                  describe(full));
      check_flat_layout(arch, full, legacy ? "rope_scaling" : "rope_parameters");
      const double full_default = class_block_theta("full_attention");
      if (!full.contains("rope_theta"))
        full["rope_theta"] = has(c, "rope_theta")        ? c["rope_theta"]
                             : !std::isnan(full_default) ? nlohmann::json(full_default)
                                                         : nlohmann::json(1000000.0);
      const nlohmann::json local =
          class_local_base ? nlohmann::json(class_sliding_theta) : c["rope_local_base_freq"];
      synthesized_ = {{"full_attention", full},
                      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", local}}}};
      block_name_ =
          "rope_parameters (from rope_theta, rope_local_base_freq as transformers' "
          "Gemma3TextConfig)";
      return pick_layer_type(synthesized_, {"full_attention", "sliding_attention"});
    }
    if (!v5 && !legacy) {
      block_name_ = "rope_parameters";
      check_flat_layout(arch, nlohmann::json::object(), block_name_);
      TORCH_CHECK(options_.layer_type.empty(), origin_, ": --layer-type '", options_.layer_type,
                  "' was given but the config has no rope_parameters per layer type (nor does "
                  "model type '",
                  out.model_type, "''s config class build any)");
      return nlohmann::json::object();
    }
    if (v5 && legacy)
      out.warnings.push_back(origin_ + ": both rope_parameters and rope_scaling are given; " +
                             "transformers reads rope_scaling first, and so does posenc");
    block_name_ = legacy ? "rope_scaling" : "rope_parameters";
    const auto& block = c[block_name_];
    TORCH_CHECK(block.is_object(), origin_, ": '", prefix_, block_name_,
                "' must be an object, got ", describe(block));
    // Nested per layer type: keys named in layer_types, or every value an object/null.
    std::vector<std::string> nested;
    std::set<std::string> layer_types;
    if (has(c, "layer_types") && c["layer_types"].is_array())
      for (const auto& t : c["layer_types"])
        if (t.is_string()) layer_types.insert(t.get<std::string>());
    bool all_objects = !block.empty();
    for (const auto& item : block.items()) {
      if (layer_types.count(item.key())) nested.push_back(item.key());
      if (!item.value().is_object() && !item.value().is_null()) all_objects = false;
    }
    if (nested.empty() && all_objects)
      for (const auto& item : block.items()) nested.push_back(item.key());
    if (nested.empty()) {
      check_flat_layout(arch, block, block_name_);
      TORCH_CHECK(options_.layer_type.empty(), origin_, ": --layer-type '", options_.layer_type,
                  "' was given but ", prefix_, block_name_, " is not nested per layer type");
      return block;
    }
    return pick_layer_type(block, nested);
  }

  nlohmann::json pick_layer_type(const nlohmann::json& block,
                                 const std::vector<std::string>& nested) {
    std::string chosen = options_.layer_type;
    std::ostringstream names;
    for (size_t i = 0; i < nested.size(); ++i) names << (i ? ", " : "") << nested[i];
    // one RoPE for every layer type (a class's default blocks for a file without scaling: OLMo 3)
    const bool identical = std::all_of(nested.begin(), nested.end(), [&](const std::string& t) {
      return block[t] == block[nested.front()];
    });
    if (chosen.empty() && identical && block[nested.front()].is_object())
      return block[nested.front()];
    if (chosen.empty()) {
      TORCH_CHECK(nested.size() == 1, origin_, ": ", prefix_, block_name_,
                  " holds one RoPE per layer type (", names.str(),
                  "); choose one with --layer-type (or 'layer_type' in the hf config)");
      chosen = nested.front();
    }
    TORCH_CHECK(block.contains(chosen), origin_, ": layer type '", chosen, "' is not in ", prefix_,
                block_name_, "; it has: ", names.str());
    TORCH_CHECK(block[chosen].is_object(), origin_, ": ", prefix_, block_name_, ".", chosen,
                " has no RoPE (null: a layer without positions)");
    layer_type_ = chosen;
    block_name_ = block_name_ + "." + chosen;
    return block[chosen];
  }

  HfConfigOptions options_;
  std::string origin_;
  const nlohmann::json* root_ = nullptr;
  const nlohmann::json* text_ = nullptr;
  std::string flat_text_type_;  ///< the text model type a flat composite's top level is read as
  std::set<std::string> composite_keys_;  ///< keys filled from "<composite>/text_config"
  nlohmann::json defaults_;  ///< the model type's config-class defaults (hf_defaults.inc)

  // The rope_theta the class gives a block of the file without one, for the resolved layer type
  // (hf_defaults.inc's block_rope_theta, probed per class); NaN when not known.
  // `layer`: a layer type, or "" for a flat block.
  double class_block_theta(const std::string& layer) const {
    if (!defaults_.is_object() || !defaults_.contains("block_rope_theta")) return NAN;
    const auto& t = defaults_["block_rope_theta"];
    if (t.is_number()) return layer.empty() ? t.get<double>() : NAN;
    if (!t.is_object() || layer.empty() || !t.contains(layer) || !t[layer].is_number()) return NAN;
    return t[layer].get<double>();
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

}  // namespace

HfResolution from_hf_config(const nlohmann::json& config, const HfConfigOptions& options) {
  TORCH_CHECK(options.angle_dtype == "float64" || options.angle_dtype == "float32",
              "hf config: unknown angle_dtype '", options.angle_dtype,
              "'; expected one of: float64, float32");
  auto resolution = Resolver(config, options).run();
  // transformers loads no layer type of a file whose other block it fails on (its config class
  // validates every block, its rotary class builds every layer type's table), and a sibling
  // posenc refuses may be one transformers would fail on in words posenc does not say: any
  // refused sibling block refuses this one too (none of the committed files has a refused and a
  // resolved layer type side by side)
  if (!resolution.layer_type.empty() && config.is_object()) {
    std::vector<const nlohmann::json*> nodes{&config};
    if (config.contains("text_config") && config["text_config"].is_object())
      nodes.push_back(&config["text_config"]);
    for (const auto* node : nodes)
      for (const char* key : {"rope_parameters", "rope_scaling"}) {
        if (!node->contains(key) || !(*node)[key].is_object()) continue;
        for (const auto& item : (*node)[key].items()) {
          if (item.key() == resolution.layer_type || !item.value().is_object()) continue;
          HfConfigOptions sibling = options;
          sibling.layer_type = item.key();
          try {
            Resolver(config, sibling).run();
          } catch (const c10::Error& e) {
            const std::string why = e.what_without_backtrace();
            // (a block that is not a layer type's: not this check's question)
            if (why.find("is not in") != std::string::npos) continue;
            TORCH_CHECK(false, why, " (layer type '", item.key(),
                        "' of the same file: transformers loads the file's layer types together, "
                        "so '",
                        resolution.layer_type, "' is refused too)");
          }
        }
      }
  }
  return resolution;
}

HfResolution load_hf_config(const std::string& path, HfConfigOptions options) {
  options.origin = path;
  return from_hf_config(load_config(path), options);
}

PositionalEncoding build_encoder(const HfResolution& resolution, const ModelContext& context) {
  return build_encoder(nlohmann::json::parse(resolution.config.dump()), context);
}

nlohmann::ordered_json to_json(const HfResolution& r) {
  nlohmann::ordered_json out;
  out["model_type"] = r.model_type;
  if (!r.layer_type.empty()) out["layer_type"] = r.layer_type;
  out["config"] = r.config;
  out["sources"] = r.sources;
  out["ignored_keys"] = r.ignored_keys;
  out["warnings"] = r.warnings;
  out["softmax_scale_multiplier"] = r.softmax_scale_multiplier;
  return out;
}

}  // namespace posenc
