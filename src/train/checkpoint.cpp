// weights.pt and checkpoint.pt in torch.save's format; the layout and checksum are described in
// posenc/train/checkpoint.h. Python's torch.optim.AdamW.state_dict() layout is mirrored so that
// `torch.load(path, weights_only=True)` gives a state_dict a Python AdamW can load.
#include "posenc/train/checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "posenc/io/durable_file.h"
#include "posenc/io/input_file.h"
#include "posenc/train/safetensors.h"

namespace posenc::train {

namespace {

constexpr const char* kFormat = "posenc-checkpoint-1";

// FNV-1a, 64 bit, over a canonical walk of a value (kind tag, sizes, bytes), so that the same
// content read back from the file gives the same sum.
class Checksum {
 public:
  void bytes(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      hash_ ^= p[i];
      hash_ *= 1099511628211ULL;
    }
  }
  template <typename T>
  void pod(const T& value) {
    bytes(&value, sizeof(value));
  }
  void value(const c10::IValue& v) {
    if (v.isNone()) {
      pod('N');
    } else if (v.isBool()) {
      pod('B');
      pod(static_cast<unsigned char>(v.toBool()));
    } else if (v.isInt()) {
      pod('I');
      pod(v.toInt());
    } else if (v.isDouble()) {
      pod('D');
      pod(v.toDouble());
    } else if (v.isString()) {
      pod('S');
      const auto& s = v.toStringRef();
      pod(s.size());
      bytes(s.data(), s.size());
    } else if (v.isTensor()) {
      auto t = v.toTensor().contiguous().cpu();
      pod('T');
      pod(static_cast<int>(t.scalar_type()));
      pod(t.dim());
      for (auto s : t.sizes()) pod(s);
      bytes(t.data_ptr(), t.numel() * t.element_size());
    } else if (v.isTuple() || v.isList()) {
      pod('L');
      const auto items = v.isTuple() ? v.toTupleRef().elements().vec() : v.toListRef().vec();
      pod(items.size());
      for (const auto& item : items) value(item);
    } else if (v.isGenericDict()) {
      pod('M');
      const auto dict = v.toGenericDict();
      pod(dict.size());
      for (const auto& item : dict) {
        value(item.key());
        value(item.value());
      }
    } else {
      TORCH_CHECK(false, "checkpoint: cannot checksum a value of type ", v.tagKind());
    }
  }
  uint64_t hash() const { return hash_; }
  std::string text() const {
    char out[32];
    std::snprintf(out, sizeof(out), "fnv1a64:%016llx", static_cast<unsigned long long>(hash_));
    return out;
  }

 private:
  uint64_t hash_ = 14695981039346656037ULL;
};

c10::impl::GenericDict string_dict() {
  return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get());
}

// A tensor as files hold it: in host memory, whatever device the run computed on, so a
// checkpoint or weights.pt written on a GPU loads anywhere (torch.load without map_location).
at::Tensor host(const at::Tensor& t) { return t.detach().cpu(); }

// The model's parameters and buffers by name: its own tensors (detached views: loading copies
// into them), or with `for_file` their host copies (for writing).
c10::impl::GenericDict state_dict(torch::nn::Module& model, bool for_file = false) {
  auto out = string_dict();
  auto as = [for_file](const at::Tensor& t) { return for_file ? host(t) : t.detach(); };
  for (const auto& item : model.named_parameters()) out.insert(item.key(), as(item.value()));
  for (const auto& item : model.named_buffers()) out.insert(item.key(), as(item.value()));
  return out;
}

// torch.optim.AdamW.state_dict(): state keyed by the parameter's index over all groups.
c10::impl::GenericDict optimizer_state(torch::optim::AdamW& optimizer) {
  auto state = c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get());
  auto groups = c10::impl::GenericList(c10::AnyType::get());
  int64_t index = 0;
  for (auto& group : optimizer.param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // AnyType, not IntType: a typed int list pickles as torch.jit._pickle.build_intlist, which
    // torch.load(weights_only=True) refuses.
    auto params = c10::impl::GenericList(c10::AnyType::get());
    for (const auto& p : group.params()) {
      auto found = optimizer.state().find(p.unsafeGetTensorImpl());
      if (found != optimizer.state().end()) {
        const auto& s = static_cast<const torch::optim::AdamWParamState&>(*found->second);
        auto entry = string_dict();
        entry.insert("step", torch::tensor(static_cast<float>(s.step())));  // float32, as Python
        entry.insert("exp_avg", host(s.exp_avg()));
        entry.insert("exp_avg_sq", host(s.exp_avg_sq()));
        if (o.amsgrad()) entry.insert("max_exp_avg_sq", host(s.max_exp_avg_sq()));
        state.insert(index, entry);
      }
      params.push_back(index++);
    }
    auto g = string_dict();
    g.insert("lr", o.lr());
    g.insert("betas", c10::ivalue::Tuple::create(std::get<0>(o.betas()), std::get<1>(o.betas())));
    g.insert("eps", o.eps());
    g.insert("weight_decay", o.weight_decay());
    g.insert("amsgrad", o.amsgrad());
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
    g.insert("decoupled_weight_decay", true);
    g.insert("params", params);
    groups.push_back(g);
  }
  auto out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

c10::IValue entry(const c10::impl::GenericDict& dict, const std::string& key,
                  const std::string& origin) {
  auto found = dict.find(key);
  TORCH_CHECK(found != dict.end(), origin, ": no '", key, "' entry (not a posenc checkpoint?)");
  return found->value();
}

// The run config as resume compares it: parsed (so JSON and YAML spellings agree), integral
// floats as integers (threads: 1.0 == 1), without the keys that do not change what is computed
// (train.threads, train.log_every, the ranks' settings, train.device: a run may resume on another
// device, with that device's rounding); dumped with sorted keys.
nlohmann::json normalized(const nlohmann::json& v) {
  if (v.is_object()) {
    auto out = nlohmann::json::object();
    for (const auto& item : v.items()) out[item.key()] = normalized(item.value());
    return out;
  }
  if (v.is_array()) {
    auto out = nlohmann::json::array();
    for (const auto& item : v) out.push_back(normalized(item));
    return out;
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::floor(d) == d && std::abs(d) < 9.0e15)
      return static_cast<int64_t>(d);
  }
  return v;
}

std::string comparable_config(const std::string& text) {
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return text;
  }
  if (config.is_object() && config.contains("train") && config["train"].is_object()) {
    // how a run is executed, not what it computes: a resume may change them
    for (const char* key : {"threads", "log_every", "rank_timeout_s", "gradient_sync", "bucket_mb",
                            "find_unused_parameters", "device"})
      config["train"].erase(key);
  }
  return normalized(config).dump();
}

// The first setting (dotted path) whose value differs between two comparable configs, as
// "key: A in the checkpoint, B now"; empty when they are equal.
std::string first_difference(const nlohmann::json& saved, const nlohmann::json& now,
                             const std::string& where) {
  const auto name = where.empty() ? std::string("the config") : where;
  if (saved.is_object() && now.is_object()) {
    std::set<std::string> keys;
    for (const auto& item : saved.items()) keys.insert(item.key());
    for (const auto& item : now.items()) keys.insert(item.key());
    for (const auto& key : keys) {
      const auto path = where.empty() ? key : where + "." + key;
      if (!saved.contains(key) || !now.contains(key)) {
        return path + ": " + (saved.contains(key) ? saved[key].dump() : "absent") +
               " in the checkpoint, " + (now.contains(key) ? now[key].dump() : "absent") + " now";
      }
      auto inner = first_difference(saved[key], now[key], path);
      if (!inner.empty()) return inner;
    }
    return "";
  }
  if (saved == now) return "";
  return name + ": " + saved.dump() + " in the checkpoint, " + now.dump() + " now";
}

// " (key: A in the checkpoint, B now)", or empty where a config is not JSON.
std::string config_difference(const std::string& saved, const std::string& now) {
  try {
    const auto difference = first_difference(nlohmann::json::parse(comparable_config(saved)),
                                             nlohmann::json::parse(comparable_config(now)), "");
    return difference.empty() ? "" : " (" + difference + ")";
  } catch (const nlohmann::json::exception&) {
    return "";
  }
}

std::string read_file(const std::string& path) {
  return read_regular_file(path, "weights or checkpoint file", kMaxCheckpointBytes,
                           "the checkpoint size limit");
}

}  // namespace

std::string torch_save_bytes(const c10::IValue& value) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler(
      [&pickle](const char* bytes, size_t size) {
        pickle.insert(pickle.end(), bytes, bytes + size);
      },
      nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  std::string container;
  caffe2::serialize::PyTorchStreamWriter writer([&container](const void* bytes, size_t size) {
    container.append(static_cast<const char*>(bytes), size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(),
                                     writer);
  writer.writeEndOfFile();
  return container;
}

namespace {

// CRC-32 (IEEE 802.3, zip's): the reflected polynomial 0xEDB88320, one table byte at a time.
uint32_t crc32_of(const char* data, size_t size) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i)
    c = table[(c ^ static_cast<uint8_t>(data[i])) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

// Little-endian fields of the zip format (APPNOTE.TXT 4.3), bounds-checked.
struct ZipView {
  const std::string& bytes;
  const std::string& origin;
  uint64_t at(size_t offset, int width) const {
    TORCH_CHECK(offset + width <= bytes.size(), "'", origin,
                "' is not a readable torch.save file (corrupt or truncated): a zip field at byte ",
                offset, " lies past its end (", bytes.size(), " bytes)");
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[offset + i]);
    return v;
  }
};

// Every stored (uncompressed: torch.save's) record's data against the CRC-32 of its central
// directory entry. Files that are not zip archives are left to the reader's own error.
void verify_zip_crcs(const std::string& bytes, const std::string& origin) {
  const ZipView z{bytes, origin};
  if (bytes.size() < 22) return;
  size_t eocd = std::string::npos;  // end of central directory: at most 64 KiB of comment
  const size_t lowest = bytes.size() > 22 + 65535 ? bytes.size() - 22 - 65535 : 0;
  for (size_t i = bytes.size() - 22 + 1; i-- > lowest;)
    if (z.at(i, 4) == 0x06054b50) {
      eocd = i;
      break;
    }
  if (eocd == std::string::npos) return;
  uint64_t entries = z.at(eocd + 10, 2), directory = z.at(eocd + 16, 4);
  if ((entries == 0xFFFF || directory == 0xFFFFFFFF) && eocd >= 20 &&
      z.at(eocd - 20, 4) == 0x07064b50) {  // ZIP64 end of central directory locator
    const uint64_t record = z.at(eocd - 20 + 8, 8);
    TORCH_CHECK(z.at(record, 4) == 0x06064b50, "'", origin,
                "' is corrupt: its ZIP64 directory record is not where the locator says");
    entries = z.at(record + 32, 8);
    directory = z.at(record + 48, 8);
  }
  size_t p = directory;
  for (uint64_t e = 0; e < entries; ++e) {
    TORCH_CHECK(z.at(p, 4) == 0x02014b50, "'", origin, "' is corrupt: zip directory entry ", e,
                " has a bad signature");
    const uint64_t method = z.at(p + 10, 2), crc = z.at(p + 16, 4);
    uint64_t size = z.at(p + 20, 4), local = z.at(p + 42, 4);
    const uint64_t name_len = z.at(p + 28, 2), extra_len = z.at(p + 30, 2),
                   comment_len = z.at(p + 32, 2);
    const std::string name = bytes.substr(p + 46, name_len);
    for (size_t x = p + 46 + name_len; x + 4 <= p + 46 + name_len + extra_len;) {
      const uint64_t id = z.at(x, 2), len = z.at(x + 2, 2);
      if (id == 0x0001) {  // ZIP64 extra: the 32-bit fields that are 0xFFFFFFFF, in order
        size_t f = x + 4;
        if (z.at(p + 24, 4) == 0xFFFFFFFF) f += 8;  // uncompressed size
        if (size == 0xFFFFFFFF) size = z.at(f, 8), f += 8;
        if (local == 0xFFFFFFFF) local = z.at(f, 8);
      }
      x += 4 + len;
    }
    TORCH_CHECK(z.at(local, 4) == 0x04034b50, "'", origin, "' is corrupt: record '", name,
                "' has no local header where the directory says");
    const size_t data = local + 30 + z.at(local + 26, 2) + z.at(local + 28, 2);
    TORCH_CHECK(data + size <= bytes.size(), "'", origin, "' is truncated: record '", name,
                "' ends at byte ", data + size, " of ", bytes.size());
    if (method == 0) {
      const uint32_t computed = crc32_of(bytes.data() + data, size);
      TORCH_CHECK(computed == crc, "'", origin, "' is corrupt: record '", name,
                  "' fails its CRC-32 check (stored ", crc, ", computed ", computed,
                  "): the file changed after it was written");
    }
    p += 46 + name_len + extra_len + comment_len;
  }
}

}  // namespace

std::string run_config_for_comparison(const std::string& config_text) {
  return comparable_config(config_text);
}

c10::IValue torch_load_bytes(const std::string& bytes, const std::string& origin) {
  TORCH_CHECK(!bytes.empty(), "'", origin, "' is empty");
  verify_zip_crcs(bytes, origin);
  try {
    return torch::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    if (auto cut = why.find('\n'); cut != std::string::npos) why = why.substr(0, cut);
    TORCH_CHECK(false, "'", origin,
                "' is not a readable torch.save file (corrupt or truncated): ", why);
  }
}

int64_t weights_checksum(torch::nn::Module& model) {
  Checksum sum;
  sum.value(state_dict(model));
  return static_cast<int64_t>(sum.hash());
}

std::string safetensors_path(const std::string& path) {
  const bool pt = path.size() > 3 && path.substr(path.size() - 3) == ".pt";
  return (pt ? path.substr(0, path.size() - 3) : path) + ".safetensors";
}

void save_weights(const std::string& path, torch::nn::Module& model) {
  const auto dict = state_dict(model, /*for_file=*/true);
  write_file_atomically(path, torch_save_bytes(dict));
  NamedTensors tensors;
  for (const auto& item : dict)
    tensors.emplace_back(item.key().toStringRef(), item.value().toTensor());
  write_safetensors(safetensors_path(path), tensors, {{"format", "pt"}});
}

std::string previous_checkpoint_path(const std::string& path) {
  const std::string stem = path.size() > 3 && path.substr(path.size() - 3) == ".pt"
                               ? path.substr(0, path.size() - 3)
                               : path;
  return stem + ".prev.pt";
}

void save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::AdamW& optimizer, const CheckpointState& state) {
  auto dict = string_dict();
  dict.insert("format", std::string(kFormat));
  dict.insert("model", state_dict(model, /*for_file=*/true));
  dict.insert("optimizer", optimizer_state(optimizer));
  dict.insert("step", state.step);
  dict.insert("elapsed", state.elapsed);
  dict.insert("log_window",
              state.log_window.defined() ? state.log_window : torch::zeros({4}, torch::kFloat64));
  dict.insert("config", state.config);
  if (!state.ema.empty()) {
    auto ema = string_dict();
    for (const auto& [name, tensor] : state.ema) ema.insert(name, host(tensor));
    dict.insert("ema", ema);
  }
  Checksum sum;
  sum.value(dict);
  dict.insert("checksum", sum.text());
  write_file_atomically(path, torch_save_bytes(dict), previous_checkpoint_path(path));
}

void load_parameters(const std::string& path, torch::nn::Module& model) {
  TORCH_CHECK(std::filesystem::is_regular_file(path), "init: '", path,
              "' is not a file (expected a run's weights.pt, weights.safetensors or "
              "checkpoint.pt)");
  c10::impl::GenericDict dict = string_dict();
  const bool safetensors = path.size() > 12 && path.substr(path.size() - 12) == ".safetensors";
  if (safetensors) {
    for (auto& [name, tensor] : read_safetensors(path)) dict.insert(name, tensor);
  } else {
    const auto loaded = torch_load_bytes(read_file(path), path);
    TORCH_CHECK(loaded.isGenericDict(), "init: '", path, "' holds a ", loaded.tagKind(),
                ", expected a {name: tensor} dict (weights.pt)");
    dict = loaded.toGenericDict();
  }
  if (dict.contains("format") && dict.contains("model")) {  // a checkpoint: its model tensors
    // with a weight average, "model" is the raw training weights: not what the run evaluated
    TORCH_CHECK(!dict.contains("ema") || dict.at("ema").toGenericDict().empty(), "init: '", path,
                "' is the checkpoint of a run with a weight average (train.ema_decay): its "
                "\"model\" is the raw training weights, not the average the run evaluated and "
                "wrote; read the run's weights.pt (or weights.safetensors), or continue the run "
                "with --resume");
    dict = dict.at("model").toGenericDict();
  }
  std::map<std::string, at::Tensor> params, buffers;
  for (const auto& item : model.named_parameters()) params[item.key()] = item.value();
  for (const auto& item : model.named_buffers()) buffers[item.key()] = item.value();
  for (const auto& item : dict) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), "init: '", path,
                "' holds a non-tensor entry; expected a {name: tensor} dict (weights.pt)");
    const auto& name = item.key().toStringRef();
    TORCH_CHECK(params.count(name) || buffers.count(name), "init: '", path, "' holds '", name,
                "', which is not a tensor of this model (a different model config?)");
  }
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : params) {
    auto found = dict.find(name);
    TORCH_CHECK(found != dict.end(), "init: '", path, "' has no tensor '", name,
                "', a parameter of this model (shape ", target.sizes(), ")");
    const auto source = found->value().toTensor();
    TORCH_CHECK(source.sizes() == target.sizes(), "init: '", path, "': '", name, "' has shape ",
                source.sizes(), " in the file but ", target.sizes(), " in the model");
    TORCH_CHECK(source.scalar_type() == target.scalar_type(), "init: '", path, "': '", name,
                "' is ", source.scalar_type(), " in the file but ", target.scalar_type(),
                " in the model");
    target.copy_(source);
  }
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& model,
                                torch::optim::AdamW& optimizer,
                                const std::string& expected_config) {
  const auto loaded = torch_load_bytes(read_file(path), path);
  TORCH_CHECK(loaded.isGenericDict(), "'", path, "' is not a posenc checkpoint (a ",
              loaded.tagKind(), ", expected a dict)");
  auto dict = loaded.toGenericDict();
  const auto format = entry(dict, "format", path);
  TORCH_CHECK(format.isString() && format.toStringRef() == kFormat, "'", path, "' has format ",
              format.isString() ? format.toStringRef() : format.tagKind(), ", expected ", kFormat,
              " (written by another posenc version?)");
  const auto stored = entry(dict, "checksum", path);
  auto content = dict.copy();
  (void)content.erase("checksum");
  Checksum sum;
  sum.value(content);
  TORCH_CHECK(stored.isString() && stored.toStringRef() == sum.text(), "'", path,
              "' is corrupt: its checksum is ", stored.isString() ? stored.toStringRef() : "absent",
              " but its content sums to ", sum.text(), "; the previous checkpoint is '",
              previous_checkpoint_path(path), "' (copy it over '", path,
              "' to resume from there), or start afresh without --resume");
  CheckpointState state;
  state.config = entry(dict, "config", path).toStringRef();
  TORCH_CHECK(comparable_config(state.config) == comparable_config(expected_config), "resume: '",
              path, "' was written by a different config",
              config_difference(state.config, expected_config),
              "; start afresh (without --resume) or use another output folder");
  // model: every tensor by name, shapes checked
  const auto weights = entry(dict, "model", path).toGenericDict();
  auto own = state_dict(model);
  TORCH_CHECK(weights.size() == own.size(), "'", path, "' holds ", weights.size(),
              " model tensors but the model has ", own.size());
  torch::NoGradGuard no_grad;
  for (const auto& item : own) {
    const auto& name = item.key().toStringRef();
    auto found = weights.find(name);
    TORCH_CHECK(found != weights.end(), "'", path, "' has no tensor '", name, "'");
    auto target = item.value().toTensor();
    const auto source = found->value().toTensor();
    TORCH_CHECK(source.sizes() == target.sizes(), "'", path, "': tensor '", name, "' has shape ",
                source.sizes(), " but the model's is ", target.sizes());
    target.copy_(source);
  }
  // optimizer: Python's layout back into LibTorch's per-parameter states
  const auto saved = entry(dict, "optimizer", path).toGenericDict();
  const auto saved_state = entry(saved, "state", path).toGenericDict();
  const auto saved_groups = entry(saved, "param_groups", path).toList();
  TORCH_CHECK(saved_groups.size() == optimizer.param_groups().size(), "'", path, "' has ",
              saved_groups.size(), " optimizer groups, expected ", optimizer.param_groups().size());
  int64_t index = 0;
  for (size_t g = 0; g < saved_groups.size(); ++g) {
    auto& group = optimizer.param_groups()[g];
    const auto params = entry(saved_groups.get(g).toGenericDict(), "params", path).toList();
    TORCH_CHECK(params.size() == group.params().size(), "'", path, "': optimizer group ", g,
                " has ", params.size(), " parameters, expected ", group.params().size());
    for (auto& p : group.params()) {
      auto found = saved_state.find(index++);
      if (found == saved_state.end()) continue;
      const auto s = found->value().toGenericDict();
      auto restored = std::make_unique<torch::optim::AdamWParamState>();
      restored->step(static_cast<int64_t>(entry(s, "step", path).toTensor().item<double>()));
      auto exp_avg = entry(s, "exp_avg", path).toTensor();
      auto exp_avg_sq = entry(s, "exp_avg_sq", path).toTensor();
      TORCH_CHECK(exp_avg.sizes() == p.sizes() && exp_avg_sq.sizes() == p.sizes(), "'", path,
                  "': optimizer state ", index - 1, " has shape ", exp_avg.sizes(),
                  " but its parameter's is ", p.sizes());
      // copies on the parameter's device (the file's tensors are in host memory)
      auto beside = [&p](const at::Tensor& t) { return t.to(p.device(), false, /*copy=*/true); };
      restored->exp_avg(beside(exp_avg));
      restored->exp_avg_sq(beside(exp_avg_sq));
      if (s.contains("max_exp_avg_sq"))
        restored->max_exp_avg_sq(beside(entry(s, "max_exp_avg_sq", path).toTensor()));
      optimizer.state()[p.unsafeGetTensorImpl()] = std::move(restored);
    }
  }
  state.step = entry(dict, "step", path).toInt();
  state.elapsed = entry(dict, "elapsed", path).toDouble();
  state.log_window = entry(dict, "log_window", path).toTensor();
  if (dict.contains("ema"))
    for (const auto& item : entry(dict, "ema", path).toGenericDict())
      state.ema[item.key().toStringRef()] = item.value().toTensor();
  return state;
}

}  // namespace posenc::train
