// The encoder registry: builds any encoder from a config (JSON or YAML).
//
//   {"type": "rope", "rope_theta": 500000, "rope_scaling": {"rope_type": "llama3", ...}}
//
// `type` selects the encoder (an unknown type fails listing the known ones); every other key is
// an option of that encoder (an unknown key fails naming it). Model-given sizes (dim, num_heads,
// head_dim) may be set in the config or come from the ModelContext; if both, they must agree.
// The keys of each encoder are listed in the README's encoder table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/config/config_reader.h"  // the config limits (kMaxConfigBytes, ...)
#include "posenc/core/encoder.h"

namespace posenc {

struct ModelContext {
  int64_t dim = 0;        ///< model width D (0: unknown)
  int64_t num_heads = 0;  ///< heads H (0: unknown; rotary then takes Dh = D)
  int64_t head_dim = 0;   ///< Dh (0: dim / num_heads)
};

/// Builds the encoder a config describes; the config limits (config_reader.h) hold first.
PositionalEncoding build_encoder(const nlohmann::json& config, const ModelContext& context);
/// The registered type names, sorted.
std::vector<std::string> encoder_types();

/// The model size limit: an encoder's dim or head_dim (the largest shipped heads are 512 wide).
inline constexpr int64_t kMaxModelSize = 65536;

/// Parses config text: JSON, or YAML (one document, converted to the same JSON tree). Duplicate
/// keys, several YAML documents and text over the limits are errors naming `origin`.
nlohmann::json parse_config(const std::string& text, const std::string& origin = "config");
/// Reads a config file (.json, .yaml, .yml); errors name the file.
nlohmann::json load_config(const std::string& path);
/// A literal config or a path: text starting with '{' is parsed, anything else is read as a file.
nlohmann::json config_from_argument(const std::string& argument);

}  // namespace posenc
