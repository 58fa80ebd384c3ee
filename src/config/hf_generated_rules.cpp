// The generated rules table (posenc/config/hf_generated_rules.h): the rows of
// hf_generated_rules.inc (tools/gen_hf_architectures.py, from transformers' own config and rotary
// classes), looked up by model type, and each row back in the generator's JSON shape
// (tests/fixtures/hf_architectures/generated_rules.json), which tests/test_hf_architectures.cpp
// compares with the compiled rows: a field the renderer or to_json drops fails there.
#include "posenc/config/hf_generated_rules.h"

#include <map>
#include <string>

namespace posenc {

namespace {

// JSON of an optional HfOrNone: null for None.
template <typename T>
nlohmann::json or_none(const HfOrNone<T>& v) {
  return v.value ? nlohmann::json(*v.value) : nlohmann::json(nullptr);
}

nlohmann::json strings(const std::vector<std::string_view>& names) {
  nlohmann::json out = nlohmann::json::array();
  for (auto n : names) out.push_back(std::string(n));
  return out;
}

// The rope types of the set, in ROPE_INIT_FUNCTIONS' order of the header's fields.
nlohmann::json rope_types(const HfRopeTypes& set) {
  nlohmann::json out = nlohmann::json::array();
  for (const char* t : {"linear", "dynamic", "yarn", "longrope", "llama3"})
    if (set.names(t)) out.push_back(t);
  return out;
}

// head_dim's rules in the generator's JSON shape (only what departs from the defaults).
nlohmann::json head_dim_rules_json(const HfHeadDimRules& h) {
  nlohmann::json j = nlohmann::json::object();
  switch (h.null_head_dim) {
    case HfNullHeadDim::kNotProbed:
      break;
    case HfNullHeadDim::kNone:
      j["null_head_dim"] = "none";
      break;
    case HfNullHeadDim::kRaises:
      j["null_head_dim"] = "raises";
      break;
    case HfNullHeadDim::kDerived:
      j["null_head_dim"] = "derived";
      break;
  }
  if (h.head_dim_overridden) j["head_dim_overridden"] = true;
  if (h.head_dim_raises) j["head_dim_raises"] = true;
  if (!h.head_dim_alias_of.empty()) j["head_dim_alias_of"] = std::string(h.head_dim_alias_of);
  if (h.absent_head_dim_none) j["absent_head_dim_none"] = true;
  return j;
}

// The names of the spellings the set refuses, in the header's field order.
nlohmann::json values_rejected_json(const HfRejectedValues& v) {
  nlohmann::json rejected = nlohmann::json::array();
  for (const auto& [name, set] :
       {std::pair<const char*, bool>{"rope_theta_string", v.rope_theta_string},
        {"rope_theta_integer", v.rope_theta_integer},
        {"block_rope_theta_string", v.block_rope_theta_string},
        {"head_dim_float", v.head_dim_float},
        {"max_position_embeddings_float", v.max_position_embeddings_float},
        {"rope_type_su", v.rope_type_su},
        {"rope_type_mrope", v.rope_type_mrope}})
    if (set) rejected.push_back(name);
  return rejected;
}

}  // namespace

std::string_view hf_head_size_name(HfHeadSize head) {
  switch (head) {
    case HfHeadSize::kGeneric:
      return "qk_rope_head_dim";
    case HfHeadSize::kHeadDim:
      return "head_dim";
    case HfHeadSize::kGlobalHeadDim:
      return "global_head_dim";
    case HfHeadSize::kKvChannels:
      return "kv_channels";
    case HfHeadSize::kAttentionHeadDim:
      return "attention_head_dim";
    case HfHeadSize::kDModelPerHead:
      return "d_model / n_heads";
    case HfHeadSize::kDecoderHeads:
      return "hidden_size / decoder_num_attention_heads";
    case HfHeadSize::kRotaryDim:
      return "rotary_dim";
    case HfHeadSize::kMemoryAttention:
      return "memory_attention";
  }
  return "?";
}

bool HfRopeTypes::names(std::string_view rope_type) const {
  return (rope_type == "linear" && linear) || (rope_type == "dynamic" && dynamic) ||
         (rope_type == "yarn" && yarn) || (rope_type == "longrope" && longrope) ||
         (rope_type == "llama3" && llama3);
}

const std::vector<std::string_view>& HfRequiredBlockKeys::of(std::string_view rope_type) const {
  static const std::vector<std::string_view> kNone;
  if (rope_type == "linear") return linear;
  if (rope_type == "dynamic") return dynamic;
  if (rope_type == "yarn") return yarn;
  if (rope_type == "longrope") return longrope;
  if (rope_type == "llama3") return llama3;
  return kNone;
}

const std::vector<HfGeneratedRules>& hf_generated_rule_rows() {
  static const std::vector<HfGeneratedRules> kRows = {
#include "hf_generated_rules.inc"
  };
  return kRows;
}

const HfGeneratedRules* hf_generated_rules(std::string_view model_type) {
  static const auto kByType = [] {
    std::map<std::string_view, const HfGeneratedRules*> out;
    for (const auto& row : hf_generated_rule_rows()) out.emplace(row.model_type, &row);
    return out;
  }();
  const auto it = kByType.find(model_type);
  return it == kByType.end() ? nullptr : it->second;
}

nlohmann::json hf_default_block_json(const HfDefaultBlock& b) {
  if (b.no_rope) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  if (!b.rope_type.empty()) out["rope_type"] = std::string(b.rope_type);
  auto put = [&](const char* key, const auto& v) {
    if (v) out[key] = *v;
  };
  put("rope_theta", b.rope_theta);
  put("partial_rotary_factor", b.partial_rotary_factor);
  put("factor", b.factor);
  put("original_max_position_embeddings", b.original_max_position_embeddings);
  put("max_position_embeddings", b.max_position_embeddings);
  put("attention_factor", b.attention_factor);
  put("beta_fast", b.beta_fast);
  put("beta_slow", b.beta_slow);
  put("mscale", b.mscale);
  put("mscale_all_dim", b.mscale_all_dim);
  put("truncate", b.truncate);
  put("low_freq_factor", b.low_freq_factor);
  put("high_freq_factor", b.high_freq_factor);
  put("llama_4_scaling_beta", b.llama_4_scaling_beta);
  if (!b.mrope_section.empty()) out["mrope_section"] = b.mrope_section;
  return out;
}

nlohmann::json to_json(const HfClassDefaults& d) {
  nlohmann::json out = nlohmann::json::object();
  auto put = [&](const char* key, const auto& v) {
    if (v) out[key] = *v;
  };
  put("rope_theta", d.rope_theta);
  put("partial_rotary_factor", d.partial_rotary_factor);
  put("head_dim", d.head_dim);
  put("global_head_dim", d.global_head_dim);
  put("max_position_embeddings", d.max_position_embeddings);
  put("rope_interleave", d.rope_interleave);
  if (d.rope_parameters.empty()) return out;
  auto block = [](const HfDefaultBlock& b) {
    nlohmann::json j = hf_default_block_json(b);
    if (b.rope_theta_from_file) j["rope_theta_from_file"] = true;
    return j;
  };
  if (d.rope_parameters.size() == 1 && d.rope_parameters[0].layer_type.empty()) {
    out["rope_parameters"] = block(d.rope_parameters[0]);
  } else {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& b : d.rope_parameters) params[std::string(b.layer_type)] = block(b);
    out["rope_parameters"] = params;
  }
  return out;
}

nlohmann::json to_json(const HfGeneratedRules& r) {
  nlohmann::json out{{"model_type", std::string(r.model_type)}};
  if (const auto d = to_json(r.defaults); !d.empty()) out["defaults"] = d;
  if (const auto d = to_json(r.text_config_defaults); !d.empty()) out["text_config_defaults"] = d;
  if (r.block_rope_theta.size() == 1 && r.block_rope_theta[0].layer_type.empty()) {
    out["block_rope_theta"] = r.block_rope_theta[0].rope_theta;
  } else if (!r.block_rope_theta.empty()) {
    for (const auto& t : r.block_rope_theta)
      out["block_rope_theta"][std::string(t.layer_type)] = t.rope_theta;
  }
  if (!r.block_theta_missing.empty()) out["block_theta_missing"] = strings(r.block_theta_missing);
  if (r.head_dim_rules) out["head_dim_rules"] = head_dim_rules_json(*r.head_dim_rules);
  if (r.head_size) out["head_size"] = std::string(hf_head_size_name(*r.head_size));
  if (const auto& l = r.legacy_rope_scaling) {
    nlohmann::json j = nlohmann::json::object();
    if (!l->reads_scaling) j["reads_scaling"] = false;
    if (!l->rope_theta_from_file) j["rope_theta_from_file"] = false;
    if (l->rope_theta) j["rope_theta"] = or_none(*l->rope_theta);
    if (l->absent_rope_theta) j["absent_rope_theta"] = *l->absent_rope_theta;
    if (l->partial_rotary_factor) j["partial_rotary_factor"] = or_none(*l->partial_rotary_factor);
    if (l->block_partial_rotary_factor)
      j["block_partial_rotary_factor"] = or_none(*l->block_partial_rotary_factor);
    out["legacy_rope_scaling"] = j;
  }
  if (const auto& m = r.max_position_rules) {
    nlohmann::json j = nlohmann::json::object();
    if (!m->max_position_alias.empty())
      j["max_position_alias"] = std::string(m->max_position_alias);
    if (m->alias_original) j["alias_original"] = or_none(*m->alias_original);
    if (m->unset_original) j["unset_original"] = or_none(*m->unset_original);
    out["max_position_rules"] = j;
  }
  if (!r.mrope_default_section.empty()) out["mrope_default_section"] = r.mrope_default_section;
  if (!r.mrope_layout.empty()) out["mrope_layout"] = std::string(r.mrope_layout);
  if (r.null_rope_scaling_unsets) out["null_rope_scaling_unsets"] = true;
  if (const auto t = rope_types(r.original_not_filled); !t.empty()) out["original_not_filled"] = t;
  if (!r.pair_layout.empty()) out["pair_layout"] = std::string(r.pair_layout);
  {
    nlohmann::json j = nlohmann::json::object();
    for (const char* t : {"linear", "dynamic", "yarn", "longrope", "llama3"})
      if (!r.required_block_keys.of(t).empty()) j[t] = strings(r.required_block_keys.of(t));
    if (!j.empty()) out["required_block_keys"] = j;
  }
  if (r.rope_theta_raises) out["rope_theta_raises"] = true;
  if (const auto t = rope_types(r.rope_types_rejected); !t.empty()) out["rope_types_rejected"] = t;
  if (!r.rotary_gate.key.empty())
    out["rotary_gate"] = {
        {"key", std::string(r.rotary_gate.key)},
        {"rotary", std::string(r.rotary_gate.rotary)},
        {"absent", r.rotary_gate.absent ? nlohmann::json(std::string(*r.rotary_gate.absent))
                                        : nlohmann::json(nullptr)}};
  if (const auto t = rope_types(r.top_original_unread); !t.empty()) out["top_original_unread"] = t;
  if (!r.unread_keys.empty()) out["unread_keys"] = strings(r.unread_keys);
  if (const auto v = values_rejected_json(r.values_rejected); !v.empty())
    out["values_rejected"] = v;
  return out;
}

}  // namespace posenc
