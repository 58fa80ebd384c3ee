// safetensors writing and checked reading; the format and the checks are in
// posenc/train/safetensors.h.
#include "posenc/train/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "posenc/io/durable_file.h"
#include "posenc/io/input_file.h"

namespace posenc::train {

namespace {

constexpr const char* kChecksumKey = "posenc_fnv1a64";

struct DtypeName {
  at::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {{at::kDouble, "F64"},    {at::kFloat, "F32"}, {at::kHalf, "F16"},
                                 {at::kBFloat16, "BF16"}, {at::kLong, "I64"},  {at::kInt, "I32"},
                                 {at::kShort, "I16"},     {at::kChar, "I8"},   {at::kByte, "U8"},
                                 {at::kBool, "BOOL"}};

const char* dtype_name(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (d.type == type) return d.name;
  TORCH_CHECK(false, "safetensors: dtype ", type, " is not one posenc writes");
}

std::string fnv1a64(const char* data, size_t size) {
  uint64_t hash = 14695981039346656037ULL;
  for (size_t i = 0; i < size; ++i) {
    hash ^= static_cast<unsigned char>(data[i]);
    hash *= 1099511628211ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::string data_of(const NamedTensors& tensors, nlohmann::ordered_json& header) {
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    TORCH_CHECK(name != "__metadata__" && !name.empty(), "safetensors: bad tensor name '", name,
                "'");
    TORCH_CHECK(!header.contains(name), "safetensors: the tensor '", name, "' is given twice");
    auto host = tensor.detach().cpu().contiguous();
    const size_t bytes = static_cast<size_t>(host.numel()) * host.element_size();
    header[name] = {{"dtype", dtype_name(host.scalar_type())},
                    {"shape", host.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(host.data_ptr()), bytes);  // little-endian hosts only
  }
  return data;
}

}  // namespace

std::string safetensors_bytes(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors: little-endian hosts");
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  const auto data = data_of(tensors, header);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  return out + text + data;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json scratch = nlohmann::ordered_json::object();
  auto with_sum = metadata;
  const auto data = data_of(tensors, scratch);
  with_sum[kChecksumKey] = fnv1a64(data.data(), data.size());
  write_file_atomically(path, safetensors_bytes(tensors, with_sum));
}

NamedTensors parse_safetensors(const std::string& bytes, const std::string& path,
                               std::map<std::string, std::string>* metadata) {
  const std::string where = "safetensors: '" + path + "'";
  TORCH_CHECK(bytes.size() >= 8, where, " is truncated: ", bytes.size(),
              " bytes, less than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  TORCH_CHECK(n <= static_cast<uint64_t>(kMaxSafetensorsHeaderBytes), where, " announces a ", n,
              "-byte header, over kMaxSafetensorsHeaderBytes = ", kMaxSafetensorsHeaderBytes,
              " (not a safetensors file?)");
  TORCH_CHECK(8 + n <= bytes.size(), where, " is truncated: its header needs ", n,
              " bytes, the file has ", bytes.size() - 8, " after the length");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  } catch (const nlohmann::json::exception&) {
    TORCH_CHECK(false, where, " has a header that is not valid JSON (corrupt)");
  }
  TORCH_CHECK(header.is_object(), where, "'s header is a ", header.type_name(),
              ", expected an object");
  const size_t data_begin = 8 + n, data_size = bytes.size() - data_begin;
  std::map<std::string, std::string> meta;
  struct Entry {
    std::string name;
    at::ScalarType type;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      TORCH_CHECK(value.is_object(), where, ": __metadata__ must be an object of strings");
      for (const auto& [k, v] : value.items()) {
        TORCH_CHECK(v.is_string(), where, ": __metadata__['", k, "'] is not a string");
        meta[k] = v.get<std::string>();
      }
      continue;
    }
    TORCH_CHECK(value.is_object() && value.contains("dtype") && value.contains("shape") &&
                    value.contains("data_offsets"),
                where, ": the entry '", name, "' needs dtype, shape and data_offsets");
    const auto& dtype = value.at("dtype");
    const auto& shape = value.at("shape");
    const auto& offsets = value.at("data_offsets");
    Entry e{name, at::kFloat, {}, 0, 0};
    bool known = false;
    for (const auto& d : kDtypes)
      if (dtype.is_string() && dtype.get<std::string>() == d.name) {
        e.type = d.type;
        known = true;
      }
    TORCH_CHECK(known, where, ": '", name, "' has dtype ", dtype.dump(),
                ", not one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL");
    TORCH_CHECK(shape.is_array() && shape.size() <= 16, where, ": '", name, "' has a bad shape ",
                shape.dump());
    uint64_t numel = 1;
    for (const auto& s : shape) {
      TORCH_CHECK(s.is_number_unsigned() || (s.is_number_integer() && s.get<int64_t>() >= 0), where,
                  ": '", name, "' has a bad shape ", shape.dump());
      const auto size = s.get<uint64_t>();
      TORCH_CHECK(size <= (uint64_t{1} << 40) && (size == 0 || numel <= (uint64_t{1} << 40) / size),
                  where, ": '", name, "' has a shape too large: ", shape.dump());
      numel *= size;
      e.shape.push_back(static_cast<int64_t>(size));
    }
    TORCH_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
                    offsets[1].is_number_unsigned(),
                where, ": '", name, "' has bad data_offsets ", offsets.dump());
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    TORCH_CHECK(e.begin <= e.end && e.end <= data_size, where, ": '", name, "' has data_offsets [",
                e.begin, ", ", e.end, "] outside the ", data_size,
                "-byte data section (truncated or corrupt)");
    const uint64_t expected = numel * c10::elementSize(e.type);
    TORCH_CHECK(e.end - e.begin == expected, where, ": '", name, "' is ", dtype.get<std::string>(),
                " ", shape.dump(), " (", expected, " bytes) but its data_offsets span ",
                e.end - e.begin);
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  uint64_t covered = 0;
  for (const auto& e : entries) {
    TORCH_CHECK(e.begin == covered, where, ": the data of '", e.name, "' starts at byte ", e.begin,
                ", expected ", covered, " (a gap or an overlap)");
    covered = e.end;
  }
  TORCH_CHECK(covered == data_size, where, " has ", data_size, " bytes of data, its tensors cover ",
              covered, " (bytes after the last tensor)");
  if (meta.count(kChecksumKey)) {
    const auto sum = fnv1a64(bytes.data() + data_begin, data_size);
    TORCH_CHECK(sum == meta.at(kChecksumKey), where, ": the data's checksum is ", sum,
                ", the header says ", meta.at(kChecksumKey), " (the file is corrupt)");
  }
  NamedTensors out;
  for (const auto& e : entries) {
    auto t = torch::empty(e.shape, torch::TensorOptions().dtype(e.type));
    if (e.end > e.begin)
      std::memcpy(t.data_ptr(), bytes.data() + data_begin + e.begin, e.end - e.begin);
    out.emplace_back(e.name, t);
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

NamedTensors read_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata) {
  const auto bytes = read_regular_file(path, "safetensors file", kMaxSafetensorsFileBytes,
                                       "kMaxSafetensorsFileBytes");
  return parse_safetensors(bytes, path, metadata);
}

}  // namespace posenc::train
