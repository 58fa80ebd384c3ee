// config.json -> posenc RoPE config, the rules of posenc/config/hf_config.h. Every value the
// result holds is recorded with its source, so `posenc inspect --hf-config` shows where each
// number came from; nothing falls back to a posenc default without a warning. This file: the
// public entry points and the rules that prepare the file before the steps run (the model type's
// row, its class's defaults for absent keys, keys its classes never read, head_dim's rules, the
// scaling block chosen); the steps themselves (Resolver::run) are hf_resolve_steps.cpp's, the
// Resolver's state hf_resolver.h's.
#include "posenc/config/hf_config.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "hf_resolver.h"
#include "posenc/config/hf_architectures.h"
#include "posenc/config/registry.h"
#include "posenc/functional/rope.h"

namespace posenc {

namespace hf_resolve {

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

// A composite builds its text model, and the text rotary, from text_config (kTextConfigModelTypes
// in hf_model_types.inc): RoPE keys at the top level beside a text_config are not the text
// model's. Without a text_config (transformers 4's flat layout) Qwen2-VL's config class builds
// text_config from the top-level keys (kFlatTextCarriedModelTypes), resolved by the text model
// type's rules and defaults; LLaVA's ignores them and takes its text config class's defaults, a
// table posenc does not build from the file: refused. Composites refused by their row keep it.
void Resolver::composite_text_config(HfResolution& out) {
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

// A modeling file that builds its rotary only for one value of a key (generated rotary_gate:
// ESM's position_embedding_type 'rotary', its default 'absolute'; Granite MoE Hybrid's 'rope',
// default None): any other value, or the class's default for a file without the key, has no
// RoPE at all.
void Resolver::check_rotary_gate(const HfResolution& out) const {
  const HfRotaryGate& gate = rules().rotary_gate;
  if (gate.key.empty()) return;
  const std::string key(gate.key);
  const nlohmann::json rotary = std::string(gate.rotary);
  const auto& c = model();
  const bool given = c.is_object() && c.contains(key);
  const nlohmann::json value = given         ? c[key]
                               : gate.absent ? nlohmann::json(std::string(*gate.absent))
                                             : nlohmann::json(nullptr);
  TORCH_CHECK(value == rotary, origin_, ": refused: '", prefix_, key, "' is ", value.dump(),
              given ? "" : " (the class's default)", ", and model type '", out.model_type,
              "''s modeling file builds its rotary only for ", rotary.dump(),
              ": this model has no RoPE, so there is no table to resolve");
}

// Spellings the model type's config or rotary class refuses (generated values_rejected: its
// strict dataclass fields, its rope functions' pow, its ROPE_INIT_FUNCTIONS without legacy
// names), refused here too rather than read leniently into a table transformers never builds.
void Resolver::refuse_rejected_values(const HfResolution& out) const {
  const HfRejectedValues& rejected = rules().values_rejected;
  const auto& c = model();
  auto refuse = [&](const std::string& key, const nlohmann::json& v, const char* why) {
    TORCH_CHECK(false, origin_, ": refused: '", prefix_, key, "' is ", describe(v),
                ", which model type '", out.model_type, "''s config or rotary class refuses (", why,
                "; transformers ", std::string(kHfArchitecturesTransformers),
                " cannot build this model)");
  };
  if (has(c, "rope_theta") && c["rope_theta"].is_string() && rejected.rope_theta_string)
    refuse("rope_theta", c["rope_theta"], "a number is expected");
  if (has(c, "rope_theta") && c["rope_theta"].is_number_integer() && rejected.rope_theta_integer)
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
          rejected.block_rope_theta_string)
        refuse(name + ".rope_theta", (*block)["rope_theta"], "a number is expected");
      for (const char* type_key : {"rope_type", "type"}) {
        if (!block->contains(type_key) || !(*block)[type_key].is_string()) continue;
        const std::string type = (*block)[type_key].get<std::string>();
        if ((type == "su" && rejected.rope_type_su) ||
            (type == "mrope" && rejected.rope_type_mrope))
          refuse(name + "." + type_key, (*block)[type_key],
                 "a legacy name its ROPE_INIT_FUNCTIONS does not know: KeyError");
      }
    }
  }
  for (const auto& [key, float_rejected] :
       {std::pair<const char*, bool>{"head_dim", rejected.head_dim_float},
        {"max_position_embeddings", rejected.max_position_embeddings_float}})
    if (has(c, key) && c[key].is_number_float() && float_rejected)
      refuse(key, c[key], "its typed field takes only an integer");
}

// Keys of the file the model type's rotary class never reads (unread()) do not change posenc's
// table either: left out, each with a warning, as transformers leaves them unread. A rope_scaling
// the config class never reads stays refused (legacy_rope_scaling's reads_scaling: Cohere 2 MoE).
void Resolver::ignore_unread_keys(HfResolution& out) {
  const auto& c = model();
  if (!c.is_object()) return;
  // a config class that takes rope blocks (legacy_rope_scaling probed: ESM's) validates them by
  // its own rules (a llama3 block without rope_theta fails to load, KeyError) even where its
  // rotary class never reads them; posenc does not mirror those rules: refused. A class that
  // takes no block at all (GPT-J, CodeGen) loads any: ignored below.
  const auto& legacy = rules().legacy_rope_scaling;
  const bool class_takes_blocks = legacy.has_value();
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
  const bool scaling_refused = legacy && !legacy->reads_scaling;
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
void Resolver::refuse_unread_partial(const HfResolution& out) const {
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

// PhiMoE (the row's longrope_mscale_by_length; models/phimoe/modeling_phimoe.py): its rotary
// forward recomputes the frequencies without a sequence length, so short_factor applies at
// every length, and scales cos/sin by the block's short_mscale, or long_mscale past
// original_max_position_embeddings, in place of the longrope attention factor; its
// validate_rope requires both numbers. posenc applies one scaling: equal values (the released
// Phi-3.5-MoE: 1.2431...) resolve, different ones are refused.
void Resolver::apply_length_mscale(const nlohmann::json& block) {
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

// Keys posenc reads that the file leaves out take the model type's config-class default
// (hf_generated_rules.inc's defaults, generated from transformers): Qwen3 without head_dim is 128,
// not hidden_size / num_attention_heads; Qwen2-VL's text model without rope_theta is 1e6. Steps:
// the class's default block(s) for a file without any, transformers 4's rope_scaling where
// the class departs from the standard conversion, then the plain absent keys.
void Resolver::fill_absent_defaults(HfResolution& out, const HfArchitecture& arch) {
  class_defaults_ = class_defaults();
  // transformers reads `rope_scaling or rope_parameters`: an empty rope_scaling is absent
  if (has(model(), "rope_scaling") && model()["rope_scaling"].is_object() &&
      model()["rope_scaling"].empty()) {
    nlohmann::json without = model();
    without.erase("rope_scaling");
    patched_ = std::move(without);
  }
  const auto& c = model();
  nlohmann::json patched = c;
  fill_default_blocks(arch, c, patched);
  const bool legacy_partial_set = fill_legacy_scaling(out, c, patched);
  fill_absent_keys(arch, c, patched, legacy_partial_set);
  if (!defaulted_.empty()) patched_ = std::move(patched);
}

// The model type's generated defaults for absent keys; a composite merges its own text_config
// defaults over them (Voxtral: rope_theta 1e8), which then count as the file's (composite_keys_).
HfClassDefaults Resolver::class_defaults() {
  HfClassDefaults merged = rules().defaults;
  if (text_ == nullptr || !has(*root_, "model_type") || !(*root_)["model_type"].is_string())
    return merged;
  const auto* composite = hf_generated_rules((*root_)["model_type"].get<std::string>());
  if (composite == nullptr) return merged;
  const HfClassDefaults& own = composite->text_config_defaults;
  auto take = [](auto& into, const auto& from) {
    if (from) into = from;
  };
  take(merged.rope_theta, own.rope_theta);
  take(merged.partial_rotary_factor, own.partial_rotary_factor);
  take(merged.head_dim, own.head_dim);
  take(merged.global_head_dim, own.global_head_dim);
  take(merged.max_position_embeddings, own.max_position_embeddings);
  take(merged.rope_interleave, own.rope_interleave);
  if (!own.rope_parameters.empty()) merged.rope_parameters = own.rope_parameters;
  const nlohmann::json keys = to_json(own);  // (items() of a temporary would dangle)
  for (const auto& item : keys.items()) composite_keys_.insert(item.key());
  return merged;
}

// A file with neither rope_parameters nor rope_scaling gets the class's own block(s) (generated
// rope_parameters; Apertus: llama3; GPT-OSS: yarn; Gemma 3: one per layer type); a top-level
// rope_theta reaches only the blocks that take it (rope_theta_from_file: setdefault under the
// class's own theta elsewhere). Gemma 3's flat rope_local_base_freq is synthesized by
// scaling_block instead. (Rows refusing a flat file, whose classes read flat keys of their own
// such as ModernBERT's global_rope_theta, keep their refusal when the file has any such key.)
void Resolver::fill_default_blocks(const HfArchitecture& arch, const nlohmann::json& c,
                                   nlohmann::json& patched) {
  const bool rope_keys = std::any_of(c.items().begin(), c.items().end(), [](const auto& item) {
    const std::string& k = item.key();
    return k.find("rope") != std::string::npos || k.find("rotary") != std::string::npos ||
           k.find("theta") != std::string::npos;
  });
  if (class_defaults_.rope_parameters.empty() || (!arch.flat_refusal.empty() && rope_keys) ||
      has(c, "rope_parameters") || has(c, "rope_scaling") || has(c, "rope_local_base_freq"))
    return;
  auto fill = [&](nlohmann::json& b, bool theta_from_file) {
    if (theta_from_file && has(c, "rope_theta")) b["rope_theta"] = c["rope_theta"];
    // a top-level partial_rotary_factor reaches the block (classes that leave it out were
    // refused by refuse_unread_partial); GPT-NeoX's class sets its block from its own keys
    if (has(c, "partial_rotary_factor")) b["partial_rotary_factor"] = c["partial_rotary_factor"];
    if (arch.reads_neox_keys && !theta_from_file && has(c, "rotary_emb_base"))
      b["rope_theta"] = c["rotary_emb_base"];
    if (arch.reads_neox_keys && has(c, "rotary_pct")) b["partial_rotary_factor"] = c["rotary_pct"];
  };
  nlohmann::json params = nlohmann::json::object();
  for (const HfDefaultBlock& block : class_defaults_.rope_parameters) {
    nlohmann::json b = hf_default_block_json(block);
    if (!block.no_rope) fill(b, block.rope_theta_from_file);
    if (block.layer_type.empty())
      params = b;  // a flat block (the only one)
    else
      params[std::string(block.layer_type)] = b;
  }
  patched["rope_parameters"] = params;
  defaulted_.insert("rope_parameters");
}

// transformers 4's top-level rope_scaling, where the class departs from the standard
// conversion (generated legacy_rope_scaling): Cohere 2 MoE never reads it (refused); GPT-NeoX
// takes rotary_emb_base (or its default), not rope_theta; Ministral 3 without a top-level
// rope_theta takes its attribute's (absent_rope_theta), not its default block's; Moonshine
// Streaming's and Mistral 4's partial default belonged to the default block the file's
// replaces. Returns whether such a replaced block's factor was taken (the class's plain partial
// default is then not filled in).
bool Resolver::fill_legacy_scaling(HfResolution& out, const nlohmann::json& c,
                                   nlohmann::json& patched) {
  if (!rules().legacy_rope_scaling) return false;
  const HfLegacyScaling& legacy = *rules().legacy_rope_scaling;
  const std::string& type = out.model_type;
  if (has(c, "rope_scaling"))
    TORCH_CHECK(legacy.reads_scaling, origin_, ": refused: model type '", type,
                "''s config class never reads '", prefix_,
                "rope_scaling' (transformers builds its RoPE without it); give only "
                "'rope_parameters', as transformers 5 writes it");
  if (has(c, "rope_scaling") && !has(c, "rope_parameters")) {
    const std::optional<double> class_theta =
        legacy.rope_theta ? legacy.rope_theta->value : std::nullopt;
    if (!legacy.rope_theta_from_file && class_theta && !has(c, "rotary_emb_base")) {
      if (has(c, "rope_theta") && c["rope_theta"] != nlohmann::json(*class_theta))
        out.warnings.push_back(origin_ + ": '" + prefix_ + "rope_theta' beside 'rope_scaling' is " +
                               "not read by model type '" + type + "''s config class; ignored, " +
                               "as transformers ignores it");
      patched["rope_theta"] = *class_theta;
      defaulted_.insert("rope_theta");
    }
    if (!has(c, "rope_theta") && legacy.absent_rope_theta && !has(c, "rotary_emb_base") &&
        !c["rope_scaling"].contains("rope_theta")) {
      patched["rope_theta"] = *legacy.absent_rope_theta;
      defaulted_.insert("rope_theta");
    }
  }
  // the factor the class gives a block that replaced its default one (null: none, the whole
  // head)
  bool legacy_partial_set = false;
  auto take_replaced_partial = [&](const HfOrNone<double>& v) {
    legacy_partial_set = true;
    if (!v.value) return;
    patched["partial_rotary_factor"] = *v.value;
    defaulted_.insert("partial_rotary_factor");
  };
  // transformers reads `rope_scaling or rope_parameters`: a rope_scaling replaces the class's
  // default block, and the factor it carried, beside a rope_parameters too (Mistral 4)
  if (has(c, "rope_scaling") && c["rope_scaling"].is_object() && legacy.partial_rotary_factor &&
      !has(c, "partial_rotary_factor") && !c["rope_scaling"].contains("partial_rotary_factor"))
    take_replaced_partial(*legacy.partial_rotary_factor);
  // the file's own flat rope_parameters block without a factor replaces the class's default
  // block, and with it the factor that block carried (Moonshine Streaming: the whole head)
  if (legacy.block_partial_rotary_factor && !has(c, "rope_scaling") && has(c, "rope_parameters") &&
      c["rope_parameters"].is_object() &&
      (c["rope_parameters"].contains("rope_type") || c["rope_parameters"].contains("type") ||
       c["rope_parameters"].contains("rope_theta")) &&
      !c["rope_parameters"].contains("partial_rotary_factor") && !has(c, "partial_rotary_factor"))
    take_replaced_partial(*legacy.block_partial_rotary_factor);
  return legacy_partial_set;
}

// The plain absent keys (rope_theta, head_dim, max_position_embeddings, ...): the class's
// default where the file gives none, and no other key that the class reads in its place does
// (a block's rope_theta, GPT-NeoX's rotary_emb_base and rotary_pct, rotary_dim, a block's
// partial_rotary_factor).
void Resolver::fill_absent_keys(const HfArchitecture& arch, const nlohmann::json& c,
                                nlohmann::json& patched, bool legacy_partial_set) {
  const bool block_theta = [&] {
    for (const char* b : {"rope_parameters", "rope_scaling"})
      if (has(c, b) && c[b].is_object() && c[b].contains("rope_theta")) return true;
    return false;
  }();
  auto block_partial = [&](const char* b) {
    return has(c, b) && c[b].is_object() && c[b].contains("partial_rotary_factor");
  };
  nlohmann::json values = to_json(class_defaults_);
  values.erase("rope_parameters");  // (fill_default_blocks')
  for (const auto& item : values.items()) {
    const std::string& key = item.key();
    if (key == "partial_rotary_factor" && legacy_partial_set) continue;
    if (has(c, key)) continue;
    // a composite merges its defaults under the file's keys ({**defaults, **file}): a null in
    // the file replaces the composite's value, and the text class sees None (Voxtral's head_dim)
    if (composite_keys_.count(key) && c.contains(key) && c[key].is_null()) continue;
    if (key == "rope_theta" && (block_theta || (arch.reads_neox_keys && has(c, "rotary_emb_base"))))
      continue;
    if (key == "partial_rotary_factor" &&
        ((arch.reads_neox_keys && has(c, "rotary_pct")) || has(c, "rotary_dim") ||
         (!has(c, "rope_scaling") && block_partial("rope_parameters")) ||
         block_partial("rope_scaling")))
      continue;
    patched[key] = item.value();
    defaulted_.insert(key);
  }
}

// Files the model type's config class fails on before any head size is read (generated
// rope_theta_raises: a top-level rope_theta zipped with layer_types; null_rope_scaling_unsets:
// "rope_scaling": null assigned over the blocks).
void Resolver::refuse_class_failures(const HfResolution& out, const nlohmann::json& file) const {
  if (rules().rope_theta_raises)
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
  if (rules().null_rope_scaling_unsets)
    TORCH_CHECK(
        !(file.is_object() && file.contains("rope_scaling") && file["rope_scaling"].is_null()),
        origin_, ": refused: '", prefix_, "rope_scaling': null: model type '", out.model_type,
        "''s config class takes it over rope_parameters, which become None, and its "
        "rotary class fails (transformers ",
        std::string(kHfArchitecturesTransformers), ": TypeError); leave the key out");
}

// head_dim as the model type's config class takes it (the generated head_dim_rules,
// tools/gen_hf_architectures.py's head_dim_rules):
// - the class sets head_dim itself (DeepSeek-V2: qk_rope_head_dim): the file's value is unread;
// - an alias (JetMoE's head_dim is kv_channels): the file's value is that key's;
// - "head_dim": null: a validation error (Qwen3's typed field: refused), hidden_size /
//   num_attention_heads (ERNIE 4.5), or None, for which transformers' default, linear and
//   llama3 ropes take hidden / heads and the others fail (None * float): head_none_;
// - a file without head_dim whose class leaves None (Mixtral): the same as null.
// A head_dim the class keeps where posenc's rule reads another key (DeepSeek-V3 declares no
// head_dim: the file's is set last and the rotary class reads it, while the attention rotates
// qk_rope_head_dim) is checked against that key once the head size is known (head_dim_kept_).
void Resolver::apply_head_dim_rules(HfResolution& out) {
  const auto& c = model();
  const nlohmann::json& file = text_ ? *text_ : *root_;  // before any default was filled
  refuse_class_failures(out, file);
  if (!rules().head_dim_rules) return;
  const HfHeadDimRules& head_rules = *rules().head_dim_rules;
  const bool given = file.is_object() && file.contains("head_dim");
  const bool null = given && file["head_dim"].is_null();
  nlohmann::json patched = c;
  bool changed = false;
  if (given && !null) {
    TORCH_CHECK(!head_rules.head_dim_raises, origin_, ": refused: model type '", out.model_type,
                "''s config class fails on a '", prefix_, "head_dim' key (transformers ",
                std::string(kHfArchitecturesTransformers), " cannot load this file); leave it out");
    if (head_rules.head_dim_overridden) {
      out.warnings.push_back(origin_ + ": '" + prefix_ + "head_dim' " + c["head_dim"].dump() +
                             " is not read: model type '" + out.model_type +
                             "''s config class sets head_dim itself; ignored, as transformers "
                             "ignores it");
      patched.erase("head_dim");
      if (const auto& head = rules().defaults.head_dim) {
        patched["head_dim"] = *head;
        defaulted_.insert("head_dim");
      }
      changed = true;
    } else if (!head_rules.head_dim_alias_of.empty()) {
      const std::string key(head_rules.head_dim_alias_of);
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
    const HfNullHeadDim outcome = head_rules.null_head_dim;
    TORCH_CHECK(outcome != HfNullHeadDim::kRaises, origin_, ": '", prefix_,
                "head_dim' is null, and model type '", out.model_type,
                "''s config class takes only an integer there (transformers ",
                std::string(kHfArchitecturesTransformers),
                " refuses the file); give the head size or leave the key out");
    if (outcome == HfNullHeadDim::kDerived) {
      TORCH_CHECK(has(c, "hidden_size") && has(c, "num_attention_heads") &&
                      integer_at(c, "num_attention_heads") > 0,
                  origin_, ": '", prefix_, "head_dim' is null: model type '", out.model_type,
                  "' then takes hidden_size / num_attention_heads, which this config lacks");
      patched["head_dim"] = integer_at(c, "hidden_size") / integer_at(c, "num_attention_heads");
      head_null_derived_ = true;
      changed = true;
    } else if (outcome == HfNullHeadDim::kNone) {
      head_none_ = true;
    }
  }
  if (!given && head_rules.absent_head_dim_none) head_none_ = true;
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
void Resolver::partial_from_layer_heads(HfResolution& out, const nlohmann::json& c,
                                        int64_t head_dim) {
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
              " where the top level says ", head_dim, "; posenc resolves one head size per model");
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
        origin_ + ": 'partial_rotary_factor' " + resolved_["partial_rotary_factor"].dump() + " (" +
        sources_["partial_rotary_factor"].get<std::string>() + ") is not read: model type '" +
        out.model_type + "''s config class sets it to qk_rope_head_dim / head_dim = " +
        std::to_string(rope) + " / " + std::to_string(head_dim));
  set("partial_rotary_factor", factor,
      "derived: " + prefix_ + (own ? "per_layer_config." : "") + "qk_rope_head_dim / head_dim (" +
          std::to_string(rope) + " / " + std::to_string(head_dim) + "; model type '" +
          out.model_type + "''s config class recomputes every block's factor)");
}

// What apply_head_dim_rules left for the head size: a None head_dim (transformers' rope then
// takes hidden / heads, or fails), a kept head_dim beside the key posenc's rule read.
void Resolver::check_head_dim_rules(const HfResolution& out, const nlohmann::json& c,
                                    const std::string& rope_type, int64_t head_dim,
                                    bool took_head_dim, bool other_head) const {
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
const HfArchitecture& Resolver::architecture(HfResolution& out) {
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

// per_layer_config's keys as layer indices: index -> the entry's key ("05", "5"); a key that
// is not an index, or a layer named twice, refused.
std::map<int64_t, std::string> Resolver::layer_indices(const nlohmann::json& overrides) const {
  std::map<int64_t, std::string> index_of;
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
    TORCH_CHECK(!index_of.count(parsed), origin_, ": '", prefix_, "per_layer_config' names layer ",
                parsed, " twice ('", index_of[parsed], "' and '", index,
                "'): which one transformers takes depends on the file's key order");
    index_of[parsed] = index;
  }
  return index_of;
}

// transformers' per-layer overrides (per_layer_config: {"<layer index>": {key: value}}) of key
// for this layer type's layers: (the first such layer's entry, the value), or none when none of
// them overrides it. The layers of one type must agree (transformers refuses a type whose layers
// differ: the rotary module reads one config per type), and layer_types must say which layers
// are of the type (transformers derives a default pattern when it is absent; posenc does not
// guess it).
std::optional<std::pair<std::string, int64_t>> Resolver::layer_type_override(
    const nlohmann::json& c, const std::string& key) const {
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
  const std::map<int64_t, std::string> index_of = layer_indices(overrides);
  // the layer types transformers uses: the last layer is made full attention (Gemma 4's config
  // class forces it, with a warning)
  std::vector<std::string> types;
  for (const auto& t : c["layer_types"]) types.push_back(t.is_string() ? t.get<std::string>() : "");
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
        const bool rotary =
            name != key &&
            (name.find("rope") != std::string::npos || name.find("rotary") != std::string::npos ||
             name.find("theta") != std::string::npos || name.find("partial") != std::string::npos ||
             name.find("position") != std::string::npos ||
             name.find("head_dim") != std::string::npos);
        TORCH_CHECK(!rotary, origin_, ": '", prefix_, "per_layer_config['", at->second, "'].", name,
                    "' sets a rotary parameter per layer, which posenc does not read (only "
                    "head_dim); refused rather than a table without it");
      }
      if (entry.contains(key)) {
        const auto name = "per_layer_config['" + at->second + "']." + key;
        TORCH_CHECK(!entry[key].is_null(), origin_, ": '", prefix_, name,
                    "' must be an integer, got null");
        const int64_t v = integer_at(entry, key, name);
        if (base != v) value = std::make_pair(at->second, v);  // (an absent base differs)
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

std::vector<int64_t> Resolver::integers_at(const nlohmann::json& o, const std::string& key,
                                           const std::string& name) const {
  TORCH_CHECK(o[key].is_array(), origin_, ": '", prefix_, name,
              "' must be a list of integers, got ", describe(o[key]));
  std::vector<int64_t> out;
  for (size_t i = 0; i < o[key].size(); ++i) {
    const auto& v = o[key][i];
    TORCH_CHECK(v.is_number_integer() ||
                    (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()),
                origin_, ": '", prefix_, name, "'[", i, "] must be an integer, got ", describe(v));
    out.push_back(static_cast<int64_t>(v.get<double>()));
  }
  return out;
}

// A flat RoPE layout (no block per layer type) for a model type whose config class builds the
// per-layer-type blocks from flat keys by rules of its own (hf_architectures.cpp): refused where
// posenc does not mirror them, or where the flat block scales and the class scales some layer
// types only.
void Resolver::check_flat_layout(const HfArchitecture& arch, const nlohmann::json& flat,
                                 const std::string& name) const {
  TORCH_CHECK(
      arch.flat_refusal.empty(), origin_, ": refused: without per-layer-type 'rope_parameters' ",
      std::string(arch.flat_refusal), ", which posenc does not mirror (", std::string(arch.source),
      "); give 'rope_parameters' per layer type, as transformers 5 writes it");
  if (arch.flat_scaling_refusal.empty()) return;
  const std::string type = string_or(flat, "rope_type", string_or(flat, "type", "default"));
  TORCH_CHECK(type == "default", origin_, ": refused: '", prefix_, name,
              "' is flat with rope_type '", type, "', and ", std::string(arch.flat_scaling_refusal),
              " (", std::string(arch.source),
              "); give 'rope_parameters' per layer type, as transformers 5 writes it");
}

// Gemma 3's flat keys as its config class turns them into one RoPE per layer type
// (models/gemma3/configuration_gemma3.py): full_attention takes rope_theta and any
// rope_scaling, sliding_attention rope_local_base_freq (`class_local`: the class's own sliding
// theta for a file without the key; NaN: the file's) without scaling.
nlohmann::json Resolver::local_base_blocks(const HfArchitecture& arch, double class_local) {
  const auto& c = model();
  const bool v5 = has(c, "rope_parameters"), legacy = has(c, "rope_scaling");
  const bool class_local_base = !std::isnan(class_local);
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
      class_local_base ? nlohmann::json(class_local) : c["rope_local_base_freq"];
  synthesized_ = {{"full_attention", full},
                  {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", local}}}};
  block_name_ =
      "rope_parameters (from rope_theta, rope_local_base_freq as transformers' "
      "Gemma3TextConfig)";
  return pick_layer_type(synthesized_, {"full_attention", "sliding_attention"});
}

// The scaling block: rope_parameters (v5) or rope_scaling (legacy), flat or per layer type.
nlohmann::json Resolver::scaling_block(HfResolution& out, const HfArchitecture& arch) {
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
    return local_base_blocks(arch, class_local_base ? class_sliding_theta : NAN);
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
  TORCH_CHECK(block.is_object(), origin_, ": '", prefix_, block_name_, "' must be an object, got ",
              describe(block));
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

nlohmann::json Resolver::pick_layer_type(const nlohmann::json& block,
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

}  // namespace hf_resolve

using hf_resolve::Resolver;

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
