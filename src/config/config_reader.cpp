// ConfigReader: typed, checked reads of config keys, and the config limits every door checks;
// see posenc/config/config_reader.h.
#include "posenc/config/config_reader.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <sstream>

namespace posenc {

namespace {
std::string describe(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return std::string(value.type_name()) + " " + text;
}
}  // namespace

// Depth first with an explicit stack: a value is counted (and its depth checked) when it is
// pushed, so the stack never holds more than kMaxConfigNodes entries and a tree nested 100000
// deep is refused at level 65 without recursion.
void check_config_limits(const nlohmann::json& config, const std::string& origin) {
  struct Entry {
    const nlohmann::json* value;
    int depth;
  };
  std::vector<Entry> stack{{&config, 0}};
  int64_t values = 1, bytes = 0;
  auto push = [&](const nlohmann::json& child, int depth, size_t key_bytes) {
    TORCH_CHECK(depth <= kMaxConfigDepth, origin, ": nested deeper than ", kMaxConfigDepth,
                " levels (the config depth limit)");
    TORCH_CHECK(++values <= kMaxConfigNodes, origin, ": more than ", kMaxConfigNodes,
                " values (the config size limit)");
    bytes += static_cast<int64_t>(key_bytes);
    stack.push_back({&child, depth});
  };
  while (!stack.empty()) {
    const auto [value, depth] = stack.back();
    stack.pop_back();
    if (value->is_string()) {
      bytes += static_cast<int64_t>(value->get_ref<const std::string&>().size());
    } else if (value->is_object()) {
      for (auto it = value->begin(); it != value->end(); ++it)
        push(it.value(), depth + 1, it.key().size());
    } else if (value->is_array()) {
      for (const auto& item : *value) push(item, depth + 1, 0);
    }
    TORCH_CHECK(bytes <= kMaxConfigBytes, origin, ": more than ", kMaxConfigBytes,
                " bytes in its keys and strings (the config size limit)");
  }
}

ConfigReader::ConfigReader(const nlohmann::json& object, std::string where)
    : object_(object), where_(std::move(where)) {
  TORCH_CHECK(object_.is_object(), where_, ": expected an object, got ", describe(object_));
}

bool ConfigReader::has(const std::string& key) const {
  return object_.contains(key) && !object_.at(key).is_null();
}

void ConfigReader::allow(const std::string& key) { known_.insert(key); }

const nlohmann::json* ConfigReader::find(const std::string& key) {
  known_.insert(key);
  if (!object_.contains(key) || object_.at(key).is_null()) return nullptr;
  return &object_.at(key);
}

std::optional<double> ConfigReader::optional_number(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  TORCH_CHECK(v->is_number(), where_, ": key '", key, "' must be a number, got ", describe(*v));
  const double x = v->get<double>();
  TORCH_CHECK(std::isfinite(x), where_, ": key '", key, "' must be finite, got ", x);
  return x;
}

double ConfigReader::number(const std::string& key, double fallback) {
  return optional_number(key).value_or(fallback);
}

std::optional<int64_t> ConfigReader::optional_integer(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  const bool integral = v->is_number_integer() ||
                        (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>());
  TORCH_CHECK(integral, where_, ": key '", key, "' must be an integer, got ", describe(*v));
  if (v->is_number_unsigned())
    TORCH_CHECK(v->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), where_, ": key '", key,
                "' is ", v->get<uint64_t>(), ", over the largest integer ", INT64_MAX);
  if (v->is_number_float())  // 1e300 is "integral" but no int64 holds it
    TORCH_CHECK(std::abs(v->get<double>()) < 9.2e18, where_, ": key '", key, "' is ",
                v->get<double>(), ", outside the 64-bit integer range");
  return v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
}

int64_t ConfigReader::integer(const std::string& key, int64_t fallback) {
  return optional_integer(key).value_or(fallback);
}

bool ConfigReader::boolean(const std::string& key, bool fallback) {
  const auto* v = find(key);
  if (!v) return fallback;
  TORCH_CHECK(v->is_boolean(), where_, ": key '", key, "' must be true or false, got ",
              describe(*v));
  return v->get<bool>();
}

std::optional<std::string> ConfigReader::optional_string(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  TORCH_CHECK(v->is_string(), where_, ": key '", key, "' must be a string, got ", describe(*v));
  return v->get<std::string>();
}

std::string ConfigReader::string(const std::string& key, const std::string& fallback) {
  return optional_string(key).value_or(fallback);
}

std::vector<double> ConfigReader::numbers(const std::string& key) {
  const auto* v = find(key);
  if (!v) return {};
  TORCH_CHECK(v->is_array(), where_, ": key '", key, "' must be a list of numbers, got ",
              describe(*v));
  std::vector<double> out;
  for (size_t i = 0; i < v->size(); ++i) {
    TORCH_CHECK((*v)[i].is_number(), where_, ": key '", key, "'[", i, "] must be a number, got ",
                describe((*v)[i]));
    const double x = (*v)[i].get<double>();
    TORCH_CHECK(std::isfinite(x), where_, ": key '", key, "'[", i, "] must be finite, got ", x);
    out.push_back(x);
  }
  return out;
}

std::vector<int64_t> ConfigReader::integers(const std::string& key) {
  std::vector<int64_t> out;
  for (double v : numbers(key)) {
    TORCH_CHECK(std::floor(v) == v && std::abs(v) < 9.2e18, where_, ": key '", key,
                "' must hold integers, got ", v);
    out.push_back(static_cast<int64_t>(v));
  }
  return out;
}

std::vector<std::string> ConfigReader::strings(const std::string& key) {
  const auto* v = find(key);
  if (!v) return {};
  TORCH_CHECK(v->is_array(), where_, ": key '", key, "' must be a list of strings, got ",
              describe(*v));
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    TORCH_CHECK((*v)[i].is_string(), where_, ": key '", key, "'[", i, "] must be a string, got ",
                describe((*v)[i]));
    out.push_back((*v)[i].get<std::string>());
  }
  return out;
}

std::optional<nlohmann::json> ConfigReader::object(const std::string& key) {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  TORCH_CHECK(v->is_object(), where_, ": key '", key, "' must be an object, got ", describe(*v));
  return *v;
}

std::vector<std::string> ConfigReader::unread() const {
  std::vector<std::string> out;
  for (const auto& item : object_.items())
    if (!known_.count(item.key())) out.push_back(item.key());
  return out;
}

void ConfigReader::finish() const {
  for (const auto& item : object_.items()) {
    if (known_.count(item.key())) continue;
    std::ostringstream known;
    bool first = true;
    for (const auto& k : known_) {
      known << (first ? "" : ", ") << k;
      first = false;
    }
    TORCH_CHECK(false, where_, ": unknown key '", item.key(), "'; known keys: ", known.str());
  }
}

}  // namespace posenc
