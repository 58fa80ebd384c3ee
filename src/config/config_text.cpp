// Config text -> the JSON tree every builder reads (posenc/config/registry.h: parse_config,
// load_config, config_from_argument), hardened: the config size, depth and node limits
// (posenc/config/config_reader.h, shared with trees built in memory), valid
// UTF-8, no NUL, no duplicate key, one YAML document, yaml-cpp 0.7's stray-comma blow-up refused
// before parsing, Python's NaN/Infinity literals and transformers' {"__float__": ...} read, and
// files read only when they are regular files (posenc/io/input_file.h).
#include <c10/util/Exception.h>
#include <yaml-cpp/yaml.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include "posenc/config/registry.h"
#include "posenc/io/input_file.h"

namespace posenc {

namespace {

// YAML -> the JSON tree, with the limits below checked as it goes (aliases are expanded, so a
// few hundred bytes of nested aliases, "billion laughs", would otherwise grow without bound).
class YamlToJson {
 public:
  explicit YamlToJson(const std::string& origin) : origin_(origin) {}
  nlohmann::json convert(const YAML::Node& node, int depth = 0) {
    TORCH_CHECK(depth <= kMaxConfigDepth, origin_, ": nested deeper than ", kMaxConfigDepth,
                " levels (the config depth limit)");
    TORCH_CHECK(++nodes_ <= kMaxConfigNodes, origin_, ": more than ", kMaxConfigNodes,
                " values once aliases are expanded (the config size limit)");
    switch (node.Type()) {
      case YAML::NodeType::Null:
      case YAML::NodeType::Undefined:
        return nullptr;
      case YAML::NodeType::Sequence: {
        auto out = nlohmann::json::array();
        for (const auto& item : node) out.push_back(convert(item, depth + 1));
        return out;
      }
      case YAML::NodeType::Map: {
        auto out = nlohmann::json::object();
        for (const auto& item : node) {
          TORCH_CHECK(item.first.IsScalar(), origin_, ": line ", item.first.Mark().line + 1,
                      ": a key must be a plain value");
          const auto key = item.first.as<std::string>();
          count_bytes(key.size());
          TORCH_CHECK(!out.contains(key), origin_, ": line ", item.first.Mark().line + 1, ": key '",
                      key, "' appears twice in one mapping");
          out[key] = convert(item.second, depth + 1);
        }
        return out;
      }
      case YAML::NodeType::Scalar:
        count_bytes(node.Scalar().size());
        return scalar(node);
    }
    return nullptr;
  }

 private:
  // An alias of a long string repeats it: its bytes count each time it is expanded.
  void count_bytes(size_t size) {
    bytes_ += static_cast<int64_t>(size);
    TORCH_CHECK(bytes_ <= kMaxConfigBytes, origin_, ": more than ", kMaxConfigBytes,
                " bytes in its keys and strings once aliases are expanded (the config size limit)");
  }

  nlohmann::json scalar(const YAML::Node& node) {
    const std::string& s = node.Scalar();
    if (node.Tag() == "!") return s;  // quoted: a string
    if (s == "true" || s == "True") return true;
    if (s == "false" || s == "False") return false;
    if (s == "null" || s == "~") return nullptr;
    try {
      size_t used = 0;
      const long long i = std::stoll(s, &used);
      if (used == s.size()) return i;
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, origin_, ": line ", node.Mark().line + 1, ": the integer ", s,
                  " does not fit in 64 bits");
    } catch (const std::exception&) {
    }
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return d;
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, origin_, ": line ", node.Mark().line + 1, ": the number ", s,
                  " is out of the range of a double");
    } catch (const std::exception&) {
    }
    return s;
  }

  const std::string& origin_;
  int64_t nodes_ = 0;
  int64_t bytes_ = 0;
};

// Deepest run of '[' / '{' outside quotes: yaml-cpp parses flow collections recursively, so a
// 100000-deep "[[[[...]]]]" would overflow the stack before any check could run.
int flow_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote) {
      if (c == '\\' && quote == '"')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#' && (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\n')) {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

// Offset of the first byte that breaks UTF-8 (npos when the text is valid): the JSON library
// refuses to print such strings, so they must not get into a config tree.
size_t invalid_utf8_at(const std::string& text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t code = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return i;
    }
    if (i + extra >= text.size()) return i;  // cut short
    for (size_t k = 1; k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(text[i + k]);
      if ((b & 0xC0) != 0x80) return i;
      code = (code << 6) | (b & 0x3F);
    }
    static const uint32_t smallest[4] = {0, 0x80, 0x800, 0x10000};
    if (code < smallest[extra] || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += extra + 1;
  }
  return std::string::npos;
}

// yaml-cpp 0.7 (Debian 12) allocates without bound when a ',' outside any flow collection starts
// a token: at the start of the document or of a line, after a quoted scalar ("a", b), or after a
// tag or anchor (found by tests/fuzz; it took 24 GB before the OOM killer). Such a ',' is no
// valid YAML; inside a plain scalar ("a, b") it is text and fine.
bool yaml_stray_comma(const std::string& text) {
  int depth = 0;
  char quote = 0;
  bool token_start = true;  // no plain-scalar character since the line began or a quote closed
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote) {
      if (quote == '"' && c == '\\') {
        ++i;
      } else if (c == quote) {
        if (quote == '\'' && i + 1 < text.size() && text[i + 1] == '\'') {
          ++i;
        } else {
          quote = 0;
          token_start = true;
        }
      }
      continue;
    }
    if (c == '\n') {
      token_start = true;
    } else if (c == ' ' || c == '\t' || c == '\r') {
    } else if (c == '#' &&
               (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
      while (i + 1 < text.size() && text[i + 1] != '\n') ++i;
    } else if ((c == '"' || c == '\'') && token_start) {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
      token_start = true;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',') {
      if (depth == 0 && token_start) return true;
      token_start = depth > 0;
    } else if ((c == '!' || c == '&' || c == '*') && token_start) {  // tag, anchor, alias word
      while (i + 1 < text.size() && text[i + 1] != ' ' && text[i + 1] != '\n') ++i;
    } else if (c == '-' && token_start && i + 1 < text.size() && text[i + 1] == ' ') {
    } else if (c == ':' && i + 1 < text.size() && (text[i + 1] == ' ' || text[i + 1] == '\n')) {
      token_start = true;
    } else {
      token_start = false;
    }
  }
  return false;
}

// config.json as Python writes it: json.dump writes the non-finite floats as the bare words NaN,
// Infinity and -Infinity, which Python's json.load (and so transformers) reads back; transformers 5
// writes them as {"__float__": "Infinity"} (PreTrainedConfig._encode_special_floats). Both become
// numbers here; a key posenc reads then says it must be finite, naming itself.
// The words are swapped for a marker string before nlohmann parses (the marker is a prefix the text
// does not contain) and the marker strings turned into numbers after.
struct NonFiniteWords {
  std::string marker;
  std::string text;
};
NonFiniteWords mark_non_finite_words(const std::string& text) {
  std::string marker = "posenc:non-finite:";
  for (int k = 0; text.find(marker) != std::string::npos; ++k)
    marker = "posenc:non-finite-" + std::to_string(k) + ":";
  NonFiniteWords out{marker, {}};
  out.text.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out.text += c;
      if (c == '\\' && i + 1 < text.size()) {
        out.text += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (const char* word : {"-Infinity", "Infinity", "NaN"}) {
      const size_t n = std::char_traits<char>::length(word);
      const bool starts_token = i == 0 || std::strchr(" \t\r\n:,[", text[i - 1]) != nullptr;
      const bool ends_token = i + n >= text.size() || std::strchr(" \t\r\n,]}", text[i + n]);
      if (starts_token && ends_token && text.compare(i, n, word) == 0) {
        out.text += "\"" + marker + word + "\"";
        i += n - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out.text += c;
  }
  return out;
}
double non_finite(const std::string& word) {
  if (word == "NaN") return std::numeric_limits<double>::quiet_NaN();
  return word == "-Infinity" ? -std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::infinity();
}
void restore_non_finite(nlohmann::json& value, const std::string& marker) {
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (!marker.empty() && s.rfind(marker, 0) == 0) value = non_finite(s.substr(marker.size()));
  } else if (value.is_object()) {
    if (value.size() == 1 && value.contains("__float__") && value["__float__"].is_string()) {
      const auto tag = value["__float__"].get<std::string>();
      if (tag == "NaN" || tag == "Infinity" || tag == "-Infinity") {
        value = non_finite(tag);
        return;
      }
    }
    for (auto& item : value.items()) restore_non_finite(item.value(), marker);
  } else if (value.is_array()) {
    for (auto& item : value) restore_non_finite(item, marker);
  }
}

nlohmann::json parse_json(const std::string& raw, const std::string& origin) {
  const auto marked = mark_non_finite_words(raw);
  const std::string& text = marked.text;
  // Depth and duplicate keys checked while parsing (nlohmann keeps the last of two equal keys).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    TORCH_CHECK(depth <= kMaxConfigDepth, origin, ": nested deeper than ", kMaxConfigDepth,
                " levels (the config depth limit)");
    switch (event) {
      case nlohmann::json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case nlohmann::json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case nlohmann::json::parse_event_t::key: {
        const auto key = parsed.get<std::string>();
        TORCH_CHECK(keys.empty() || keys.back().insert(key).second, origin, ": key '", key,
                    "' appears twice in one object");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    auto parsed = nlohmann::json::parse(text, callback);
    restore_non_finite(parsed, marked.marker);
    return parsed;
  } catch (const nlohmann::json::exception& e) {
    std::string why = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 9: ..." -> from "line"
    if (auto at = why.find("line "); at != std::string::npos) why = why.substr(at);
    TORCH_CHECK(false, origin, ": invalid JSON: ", why);
  }
}

}  // namespace

nlohmann::json parse_config(const std::string& text, const std::string& origin) {
  TORCH_CHECK(text.size() <= kMaxConfigBytes, origin, ": ", text.size(),
              " bytes; configs are limited to ", kMaxConfigBytes, " bytes (the config size limit)");
  TORCH_CHECK(text.find('\0') == std::string::npos, origin, ": a NUL byte; a config is text");
  const auto bad = invalid_utf8_at(text);
  TORCH_CHECK(bad == std::string::npos, origin, ": byte ", bad,
              " is not valid UTF-8; a config is UTF-8 text");
  const int depth = flow_depth(text);
  TORCH_CHECK(depth <= kMaxConfigDepth, origin, ": nested ", depth,
              " levels deep; configs are limited to ", kMaxConfigDepth,
              " levels (the config depth limit)");
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (text[first] == '{' || text[first] == '[')) {
    auto parsed = parse_json(text, origin);
    check_config_limits(parsed, origin);  // the values limit (the text's limits held above)
    return parsed;
  }
  TORCH_CHECK(!yaml_stray_comma(text), origin,
              ": invalid YAML: a ',' outside [...] or {...} where a value should start");
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    TORCH_CHECK(false, origin, ": invalid YAML: ", e.what());
  }
  TORCH_CHECK(documents.size() <= 1, origin, ": ", documents.size(),
              " YAML documents ('---'); a config is one document");
  if (documents.empty()) return nullptr;
  try {
    return YamlToJson(origin).convert(documents.front());
  } catch (const YAML::Exception& e) {
    TORCH_CHECK(false, origin, ": invalid YAML: ", e.what());
  }
}

nlohmann::json load_config(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  TORCH_CHECK(!error && std::filesystem::exists(status), "cannot read config file '", path,
              "': no such file");
  TORCH_CHECK(!std::filesystem::is_directory(status), "config file '", path,
              "' is a folder, not a file");
  // a FIFO or a device is refused without blocking; the size limit holds before reading
  return parse_config(
      read_regular_file(path, "config file", kMaxConfigBytes, "the config size limit"), path);
}

nlohmann::json config_from_argument(const std::string& argument) {
  const auto first = argument.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && argument[first] == '{')
    return parse_config(argument, "--config");
  return load_config(argument);
}

}  // namespace posenc
