// The HF resolver's run(): config.json -> the resolution as a pipeline of named steps, each a
// function of the file, the model type's row (hf_architectures.h) and the resolution so far (the
// Step and the values resolved), naming the rules it reads (generated ones from the typed table of
// hf_generated_rules.h and hf_model_types.inc, the scaling units' facts from rope_scaling.h). The
// order is the order transformers' config and rotary classes decide in. The file's preparation (the
// class's defaults for absent keys, unread keys, head_dim's rules, the scaling block) is
// hf_config.cpp's.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "hf_resolver.h"
#include "posenc/config/registry.h"
#include "posenc/functional/rope.h"

namespace posenc::hf_resolve {

// config.json -> the resolution, as a pipeline of named steps. Each step reads the file
// (model()), the model type's row (arch) and what the earlier steps resolved (the Step and
// resolved_), and names the rules it follows; the order is the order transformers' config and
// rotary classes decide in, so the first refusal is the one transformers would meet first.
HfResolution Resolver::run() {
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

// The scaling unit transformers' ROPE_INIT_FUNCTIONS names rope_type (its own name; a legacy
// alias such as 'su' is not one, as transformers 5 does not read it as one).
const RopeScalingUnit* Resolver::unit_named(const std::string& rope_type) {
  for (const auto& unit : rope_scaling_units())
    if (unit.name == rope_type) return &unit;
  return nullptr;
}

// Step: which model type's rules apply. A composite's text_config without its own model_type
// is built by the composite's default text config class (LLaVA's: Llama), whose rules then
// apply; so are the top-level text keys of a composite whose config class builds text_config
// from them (generated kTextConfigModelTypes, kFlatTextCarriedModelTypes).
void Resolver::resolve_model_type(HfResolution& out) {
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
void Resolver::resolve_rope_type(HfResolution& out, const HfArchitecture& arch, Step& s) {
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
void Resolver::resolve_sections(HfResolution& out, const HfArchitecture& arch, Step& s) {
  const auto& block = s.block;
  s.mrope_layout = rules().mrope_layout;
  if (has(block, "mrope_section")) {
    s.sections = integers_at(block, "mrope_section", from_block("mrope_section"));
  } else if (!s.mrope_layout.empty() && s.rope_type != "axial") {
    s.sections = rules().mrope_default_section;
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
void Resolver::record_rope_type(HfResolution& out, const HfArchitecture& arch, const Step& s) {
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
  TORCH_CHECK(!rules().rope_types_rejected.names(s.rope_type), origin_, ": refused: model type '",
              out.model_type, "' does not take rope_type '", s.rope_type, "' (",
              from_block(type_key), "): transformers ", std::string(kHfArchitecturesTransformers),
              "'s config or rotary class raises on it, so there is no table to match");
}

// head_dim = key_size / heads_key, recorded with the keys it came from.
int64_t Resolver::head_per_head(const std::string& size_key, const std::string& heads_key,
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
int64_t Resolver::head_from_key(const std::string& key, const std::string& rule) {
  const auto& c = model();
  TORCH_CHECK(has(c, key), origin_, ": cannot tell the head size: expected '", key, "' (", rule,
              ")");
  const int64_t head_dim = integer_at(c, key);
  set("head_dim", head_dim, where(key) + " (" + rule + ")");
  return head_dim;
}

// The trackers' memory attention: memory_attention_hidden_size / (downsample_rate x heads).
int64_t Resolver::head_from_memory_attention(const std::string& rule) {
  const auto& c = model();
  const char* keys[] = {"memory_attention_hidden_size", "memory_attention_downsample_rate",
                        "memory_attention_num_attention_heads"};
  for (const char* key : keys)
    TORCH_CHECK(has(c, key), origin_, ": cannot tell the head size: expected '", key, "' (", rule,
                ")");
  const int64_t hidden = integer_at(c, keys[0]), rate = integer_at(c, keys[1]),
                heads = integer_at(c, keys[2]);
  TORCH_CHECK(rate > 0 && heads > 0, origin_, ": '", prefix_, keys[1], "' and '", prefix_, keys[2],
              "' must be positive, got ", rate, " and ", heads);
  set("head_dim", hidden / (rate * heads),
      "derived: " + prefix_ +
          "memory_attention_hidden_size / (downsample_rate x heads) = " + std::to_string(hidden) +
          " / (" + std::to_string(rate) + " x " + std::to_string(heads) + ")");
  return hidden / (rate * heads);
}

// Where the head size comes from: the row's HfHeadSize (written where the generator's probe
// cannot see it: Gemma 4's per-layer global_head_dim, ...), else the generated head_size (the keys
// that size the model type's rotary tables), else the generic rule.
HfHeadSize Resolver::head_size(const HfArchitecture& arch) const {
  if (arch.head != HfHeadSize::kGeneric) return arch.head;
  return rules().head_size.value_or(HfHeadSize::kGeneric);
}

// Step: the head size r that partial_rotary_factor multiplies. Rules: head_size (the row's, else
// the generated one), else generic_head_size; then what apply_head_dim_rules left for it
// (check_head_dim_rules) and HunYuan's ntk_alpha, which reads config.head_dim.
void Resolver::resolve_head_size(HfResolution& out, const HfArchitecture& arch, Step& s) {
  const auto& c = model();
  const HfHeadSize head = head_size(arch);
  s.head_rule = arch.head != HfHeadSize::kGeneric || !rules().head_size
                    ? s.rule
                    : "model type '" + out.model_type + "' (its rotary tables are sized by " +
                          std::string(hf_head_size_name(head)) +
                          ": tools/gen_hf_architectures.py's head-size probe)";
  const std::string& rule = s.head_rule;
  switch (head) {
    case HfHeadSize::kKvChannels:
      s.head_dim = head_from_key("kv_channels", rule);
      break;
    case HfHeadSize::kAttentionHeadDim:
      s.head_dim = head_from_key("attention_head_dim", rule);
      break;
    case HfHeadSize::kDModelPerHead:
      s.head_dim = head_per_head("d_model", "n_heads", rule);
      break;
    case HfHeadSize::kDecoderHeads:
      s.head_dim = head_per_head("hidden_size", "decoder_num_attention_heads", rule);
      break;
    case HfHeadSize::kMemoryAttention:
      s.head_dim = head_from_memory_attention(rule);
      break;
    case HfHeadSize::kRotaryDim:
      if (has(c, "n_embd")) {
        s.head_dim = head_per_head("n_embd", "n_head", rule);
        break;
      }
      [[fallthrough]];
    default:
      generic_head_size(head, s, rule);
  }
  TORCH_CHECK(s.head_dim > 0, origin_, ": the head size must be positive, got ", s.head_dim);
  TORCH_CHECK(s.rope_type != "ntk_alpha" || has(c, "head_dim"), origin_,
              ": ntk_alpha ('dynamic' with alpha) reads '", prefix_,
              "head_dim', which this config lacks; transformers' ", std::string(arch.source),
              " fails on it (None - 2), so there is no table to match");
  check_head_dim_rules(out, c, s.rope_type, s.head_dim, s.took_head_dim,
                       s.axial || s.head_from_layers ||
                           (layer_type_ == "full_attention" &&
                            (has(c, "global_head_dim") || head == HfHeadSize::kGlobalHeadDim)));
}

// Mistral 4's config class derives an absent head_dim as qk_nope_head_dim + qk_rope_head_dim and
// an absent partial_rotary_factor as qk_rope_head_dim / head_dim; posenc fills absent keys with
// the class's default values, which equal the derivation only at the default parts (64 + 64):
// other parts without the keys are refused, naming the value the class would take.
void Resolver::check_qk_parts(const nlohmann::json& c, int64_t head_dim) const {
  if (!has(c, "qk_nope_head_dim") || !has(c, "qk_rope_head_dim")) return;
  const int64_t nope = integer_at(c, "qk_nope_head_dim"), rope = integer_at(c, "qk_rope_head_dim");
  TORCH_CHECK(!defaulted_.count("head_dim") || head_dim == nope + rope, origin_, ": refused: '",
              prefix_, "head_dim' is absent, and the config class then takes ",
              "qk_nope_head_dim + qk_rope_head_dim = ", nope + rope, ", a rule posenc does not ",
              "mirror (its default is ", head_dim, "); give head_dim");
  const double partial = resolved_["partial_rotary_factor"].get<double>();
  const bool partial_absent = defaulted_.count(from_block("partial_rotary_factor")) ||
                              defaulted_.count("partial_rotary_factor");
  TORCH_CHECK(
      !partial_absent || partial == static_cast<double>(rope) / static_cast<double>(head_dim),
      origin_, ": refused: 'partial_rotary_factor' is absent, and the config class then ",
      "takes qk_rope_head_dim / head_dim = ", rope, " / ", head_dim,
      ", a rule posenc does not mirror (its default is ", partial, "); give partial_rotary_factor");
}

// The generic head-size rule (and Gemma 4's full-attention layers, kGlobalHeadDim):
// qk_rope_head_dim (kGeneric only) > per_layer_config's head_dim > global_head_dim (full
// attention) > head_dim > the tower's embed_dim or hidden_size per head > hidden_size /
// num_attention_heads.
void Resolver::generic_head_size(HfHeadSize head, Step& s, const std::string& rule) {
  const auto& c = model();
  const bool global = head == HfHeadSize::kGlobalHeadDim;
  if (head == HfHeadSize::kGeneric && has(c, "qk_rope_head_dim")) {
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
            rule + ")");
  } else if (has(c, "head_dim")) {
    s.head_dim = integer_at(c, "head_dim");
    set("head_dim", s.head_dim, where("head_dim"));
    s.took_head_dim = true;
  } else if (s.axial) {  // compute_axial_rope_parameters: embed_dim or hidden_size per head
    const char* heads = has(c, "num_heads") ? "num_heads" : "num_attention_heads";
    s.head_dim = head_per_head(has(c, "embed_dim") ? "embed_dim" : "hidden_size", heads, rule);
  } else {
    TORCH_CHECK(has(c, "hidden_size") && has(c, "num_attention_heads"), origin_,
                ": cannot tell the head size: expected 'head_dim', ",
                head == HfHeadSize::kGeneric ? "'qk_rope_head_dim' " : "",
                "or 'hidden_size' with 'num_attention_heads' (",
                head == HfHeadSize::kGeneric ? "transformers' rule" : rule, ")");
    s.head_dim = head_per_head("hidden_size", "num_attention_heads", rule);
  }
}

// Step: the pair layout. rope_interleave where the config sets it and the model type's code
// reads it (the row's reads_rope_interleave; an unknown or unchecked model type is taken at its
// word), else the model type's modeling code: the generated pair_layout (the rotation its
// attention applies, probed), else its row's layout (written where the generator could not run
// the rotation: GPT-J's rotate_every_two, the trackers' rotate_pairwise, ...), else rotate_half.
void Resolver::resolve_layout(HfResolution& out, const HfArchitecture& arch, const Step& s) {
  const auto& c = model();
  std::string layout = "half";
  std::string layout_source = "transformers default (rotate_half)";
  if (!rules().pair_layout.empty()) {
    layout = std::string(rules().pair_layout);
    layout_source = "transformers: model type '" + out.model_type + "''s attention rotates " +
                    layout +
                    " pairs (tools/gen_hf_architectures.py's layout probe of its own rotation)";
  } else if (!arch.layout.empty()) {
    layout = std::string(arch.layout);
    layout_source = s.rule;
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
bool Resolver::file_gives_theta() const {
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
void Resolver::refuse_block_without_theta(const HfResolution& out, const Step& s) const {
  const bool file_theta = file_gives_theta();
  const double class_theta = class_block_theta(layer_type_);
  const auto& legacy = rules().legacy_rope_scaling;
  const bool neox_unread = file_theta && legacy && !legacy->rope_theta_from_file &&
                           legacy->rope_theta && legacy->rope_theta->value;
  TORCH_CHECK(has(s.block, "rope_theta") || !file_theta ||
                  ((std::isnan(class_theta) || layer_type_.empty()) && !neox_unread),
              origin_, ": refused: '", prefix_, block_name_,
              "' has no rope_theta and the top level has one, and model type '", out.model_type,
              "''s config class decides per block whether the top-level value applies (it "
              "gives some blocks its own); put rope_theta in every block, as transformers 5 "
              "writes it");
  if (!has(s.block, "rope_theta") && !file_theta)
    for (const std::string_view t : rules().block_theta_missing)
      TORCH_CHECK(t != "*" && t != layer_type_, origin_, ": refused: ", prefix_, block_name_,
                  " has no rope_theta, none is given at the top level, and model type '",
                  out.model_type, "''s config class fills none (transformers ",
                  std::string(kHfArchitecturesTransformers),
                  " fails on it: KeyError 'rope_theta'); give rope_theta");
}

// Step: theta. The block's rope_theta > the class's own for a block without one (generated
// block_rope_theta: Gemma 3's full attention 1e6, its sliding window 1e4) > the top level's >
// GPT-NeoX's rotary_emb_base (the row's reads_neox_keys) > the base a class that reads no
// rope_theta hard-codes (generated unread_keys: GPT-J, CodeGen) > transformers' default_theta.
void Resolver::resolve_theta(HfResolution& out, const HfArchitecture& arch, const Step& s) {
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
// row's reads_neox_keys) > rotary_dim / head_dim (head size kRotaryDim, generated: GPT-J,
// CodeGen; MiniMax-M2's config class turns a legacy rotary_dim into the factor) > 1. Then the row's
// partial_from_layer_heads (dots3), and the whole head where the model type's rope ignores the
// factor (generated kDefaultRopeIgnoresPartialModelTypes: Llama's default rope and its copies;
// HunYuan's ntk_alpha reads config.head_dim).
void Resolver::resolve_partial(HfResolution& out, const HfArchitecture& arch, const Step& s) {
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
  } else if (head_size(arch) == HfHeadSize::kRotaryDim && has(c, "rotary_dim")) {
    const int64_t rotary = integer_at(c, "rotary_dim");
    set("partial_rotary_factor", static_cast<double>(rotary) / static_cast<double>(s.head_dim),
        "derived: " + prefix_ + "rotary_dim / head_dim (" + s.head_rule + ")");
  } else {
    set("partial_rotary_factor", 1.0, "transformers default");
  }
  if (arch.partial_from_layer_heads) partial_from_layer_heads(out, c, s.head_dim);
  if (arch.head_from_qk_parts) check_qk_parts(c, s.head_dim);
  const bool whole_head =
      !s.axial && ((s.rope_type == "default" && hf_default_rope_ignores_partial(out.model_type)) ||
                   s.rope_type == "ntk_alpha");
  if (whole_head && resolved_["partial_rotary_factor"].get<double>() != 1.0) {
    out.warnings.push_back(
        origin_ + ": 'partial_rotary_factor' " + resolved_["partial_rotary_factor"].dump() + " (" +
        sources_["partial_rotary_factor"].get<std::string>() + ") is not read by the " +
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
void Resolver::resolve_max_position(const HfResolution& out, Step& s) {
  const auto& c = model();
  if (rules().max_position_rules) s.max_rules = &*rules().max_position_rules;
  s.alias = s.max_rules != nullptr ? std::string(s.max_rules->max_position_alias) : std::string();
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
void Resolver::resolve_original_context(const HfResolution& out, const Step& s) {
  const auto& c = model();
  const auto& block = s.block;
  const std::string& rope_type = s.rope_type;
  const std::string version(kHfArchitecturesTransformers);
  TORCH_CHECK(has(block, "original_max_position_embeddings") ||
                  !rules().top_original_unread.names(rope_type),
              origin_, ": refused: rope_type '", rope_type,
              "' without 'original_max_position_embeddings' in ", block_name_, ": model type '",
              out.model_type,
              "''s config class validates the block before it reads the top-level one "
              "(transformers ",
              version, " fails on it: KeyError); give it in the block");
  const std::string max_key = s.by_alias ? s.alias : std::string("max_position_embeddings");
  // the class's fill for a block without one (generated alias_original / unset_original)
  const std::optional<HfOrNone<int64_t>> fill = s.max_rules == nullptr ? std::nullopt
                                                : s.by_alias           ? s.max_rules->alias_original
                                                             : s.max_rules->unset_original;
  if (has(c, "original_max_position_embeddings") && layer_type_.empty()) {
    set("original_max_position_embeddings", integer_at(c, "original_max_position_embeddings"),
        where("original_max_position_embeddings") +
            " (top level; transformers prefers it over the block's, as Phi-3 needs)");
  } else if (has(block, "original_max_position_embeddings")) {
    set("original_max_position_embeddings",
        integer_at(block, "original_max_position_embeddings",
                   from_block("original_max_position_embeddings")),
        where(from_block("original_max_position_embeddings")));
  } else if (layer_type_.empty() && fill && (!fill->value || s.by_alias || s.file_max)) {
    // the class fills the block's original before it sets the file's context length (or not
    // at all: transformers then fails on the block, KeyError)
    TORCH_CHECK(fill->value.has_value(), origin_, ": refused: rope_type '", rope_type,
                "' without 'original_max_position_embeddings', which model type '", out.model_type,
                "''s config class does not fill from ", max_key, " (transformers ", version,
                " fails on it: KeyError); give original_max_position_embeddings in ", block_name_);
    set("original_max_position_embeddings", *fill->value,
        "transformers: model type '" + out.model_type +
            "''s config class fills it with its default before it sets the file's " + max_key);
  } else {
    TORCH_CHECK(!rules().original_not_filled.names(rope_type), origin_, ": refused: rope_type '",
                rope_type, "' without 'original_max_position_embeddings' in ", block_name_,
                ": model type '", out.model_type,
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
void Resolver::resolve_block_numbers(HfResolution& out, const Step& s) {
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
  for (const std::string_view key : rules().required_block_keys.of(rope_type)) {
    const std::string k(key);
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
void Resolver::resolve_block_lists(HfResolution& out, const HfArchitecture& arch, const Step& s) {
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
void Resolver::record_sections(HfResolution& out, const Step& s) {
  if (s.sections.empty()) return;
  const auto& block = s.block;
  set("mrope_section", s.sections,
      s.sections_defaulted ? "transformers: model type '" + out.model_type +
                                 "''s rotary class takes these when the block gives none"
                           : where(from_block("mrope_section")));
  const bool interleaved_given =
      has(block, "mrope_interleaved") && block["mrope_interleaved"].is_boolean();
  if (!s.mrope_layout.empty()) {
    const std::string layout(s.mrope_layout);
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
  const bool interleaved = s.mrope_layout.empty()
                               ? interleaved_given && block["mrope_interleaved"].get<bool>()
                               : std::string(s.mrope_layout) == "interleaved";
  if (interleaved && s.sections.size() == 3) {
    // transformers' interleave (Qwen3-VL's apply_interleaved_mrope, Qwen3.5's
    // recomposition_frequencies) takes clamped slices: h at pairs 1, 4, ... below 3 s_h, w at
    // 2, 5, ... below 3 s_w, t the rest. posenc deals the sections round-robin: the same pairs
    // for [24, 20, 20] or [11, 11, 10], other ones for [4, 1, 3] (a silent difference).
    const auto& sec = s.sections;
    const int64_t total = sec[0] + sec[1] + sec[2];
    std::vector<int64_t> sliced(static_cast<size_t>(std::max<int64_t>(total, 0)), 0);
    for (int64_t a = 1; a <= 2; ++a)
      for (int64_t j = a; j < std::min(3 * sec[a], total); j += 3) sliced[j] = a;
    const auto dealt = rope_section_axes(sec, RopeSectionLayout::kInterleaved);
    TORCH_CHECK(
        std::equal(sliced.begin(), sliced.end(), dealt.data_ptr<int64_t>()), origin_,
        ": interleaved mrope_section ", c10::IntArrayRef(sec),
        " gives some pairs another position axis in transformers' clamped slices (h at 1, 4, ... "
        "below 3 s_h, w at 2, 5, ... below 3 s_w) than in posenc's round-robin interleave; "
        "refused");
  }
}

// Step: a warning for each block key transformers does not read (kBlockKeys; PhiMoE's
// short_mscale / long_mscale are apply_length_mscale's).
void Resolver::warn_unread_block_keys(HfResolution& out, const HfArchitecture& arch,
                                      const Step& s) {
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
void Resolver::resolve_softmax_scale(HfResolution& out, const Step& s) {
  const auto& block = s.block;
  if (s.rope_type == "default" || !has(block, "mscale_all_dim") || !has(block, "factor")) return;
  const double m_all = number_at(block, "mscale_all_dim", from_block("mscale_all_dim"));
  const double f = number_at(block, "factor", from_block("factor"));
  if (m_all == 0) return;
  const double m = f <= 1 ? 1.0 : 0.1 * m_all * std::log(f) + 1.0;
  out.softmax_scale_multiplier = m * m;
}

// The resolved config, which must build (the encoder's own checks: even rotary dim, list sizes).
HfResolution Resolver::finish(HfResolution& out) {
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
void Resolver::resolve_axial(HfResolution& out, const HfArchitecture& arch, int64_t head_dim) {
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

}  // namespace posenc::hf_resolve
