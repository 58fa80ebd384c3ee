// ConfigReader — typed, checked access to one JSON object of a config. Every key read is
// recorded; finish() rejects the keys nobody read, naming each and listing the known ones, so a
// typo ("rope_thetta") is an error rather than a silently ignored setting.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace posenc {

/// The config limits, one set for every door a config comes through: the tool's --config,
/// parse_config / load_config (text), build_encoder (a JSON tree built in memory), Python's
/// posenc.build_encoder and torch.classes.posenc.Encoder. Each is named with its number when a
/// config passes it. Size: bytes of text (or of the keys and strings of a tree, YAML aliases
/// expanded); depth: nesting levels; values: after YAML aliases are expanded ("billion laughs").
inline constexpr int64_t kMaxConfigBytes = 4 << 20;
inline constexpr int kMaxConfigDepth = 64;
inline constexpr int64_t kMaxConfigNodes = 1000000;

/// Checks a config tree against the limits above without recursing (a tree built in memory may
/// be nested deeper than any stack): depth, values, and the bytes of its keys and strings. Errors
/// name `origin` and the limit with its number.
void check_config_limits(const nlohmann::json& config, const std::string& origin);

class ConfigReader {
 public:
  /// where: names the object in errors ("rope config", "rope config.rope_scaling").
  ConfigReader(const nlohmann::json& object, std::string where);

  bool has(const std::string& key) const;
  /// Declares a key as known without reading it (e.g. "type").
  void allow(const std::string& key);
  double number(const std::string& key, double fallback);
  std::optional<double> optional_number(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback);
  std::optional<int64_t> optional_integer(const std::string& key);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);
  std::optional<std::string> optional_string(const std::string& key);
  std::vector<double> numbers(const std::string& key);
  std::vector<int64_t> integers(const std::string& key);
  std::vector<std::string> strings(const std::string& key);
  /// A nested object (or nullopt when absent); the key counts as read.
  std::optional<nlohmann::json> object(const std::string& key);
  /// Throws if a key was neither read nor allowed.
  void finish() const;
  /// The keys neither read nor allowed so far (for blocks where extra keys only warn).
  std::vector<std::string> unread() const;
  /// The object being read.
  const nlohmann::json& json() const { return object_; }
  const std::string& where() const { return where_; }

 private:
  const nlohmann::json* find(const std::string& key);
  const nlohmann::json& object_;
  std::string where_;
  std::set<std::string> known_;
};

}  // namespace posenc
