// Shared task pieces; see common.h.
#include "common.h"

#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

#include "posenc/io/input_digest.h"
#include "text/gutenberg.h"

namespace posenc::train {

at::Tensor Task::classify_files(const std::vector<std::string>& /*files*/) {
  TORCH_CHECK(false,
              "eval --image / --video: this task does not classify files (image_classification "
              "does images, video_classification with task.videos or task.labels does clips)");
}

double metric_value(const Metrics& metrics, const std::string& name) {
  for (const auto& [key, value] : metrics) {
    if (key == name) return value;
  }
  TORCH_CHECK(false, "no metric '", name, "'");
}

TransformerOptions transformer_options(ConfigReader& r) {
  TransformerOptions o(r.integer("dim", 128), r.integer("num_heads", 4),
                       r.integer("num_layers", 4));
  o.mlp_ratio(r.number("mlp_ratio", o.mlp_ratio()));
  o.dropout(r.number("dropout", o.dropout()));
  o.fused(r.boolean("fused", o.fused()));
  o.temperature(attention_temperature_from_string(r.string("attention_temperature", "none")));
  o.logn_length(r.integer("logn_length", 0));
  o.attention_scale(r.number("attention_scale", 0.0));
  o.norm_eps(r.number("norm_eps", o.norm_eps()));
  TORCH_CHECK(o.norm_eps() > 0 && o.norm_eps() <= 0.1, r.where(),
              ": norm_eps must be in (0, 0.1], got ", o.norm_eps());
  TORCH_CHECK(std::isfinite(o.attention_scale()) && o.attention_scale() >= 0, r.where(),
              ": attention_scale must be >= 0 (0: 1/sqrt(head_dim)), got ", o.attention_scale());
  TORCH_CHECK(o.dim() > 0 && o.num_heads() > 0 && o.dim() % o.num_heads() == 0, r.where(),
              ": dim (", o.dim(), ") must be a positive multiple of num_heads (", o.num_heads(),
              ")");
  TORCH_CHECK(o.num_layers() >= 1 && o.mlp_ratio() > 0 && o.dropout() >= 0 && o.dropout() < 1,
              r.where(), ": num_layers must be >= 1, mlp_ratio > 0 and dropout in [0, 1), got ",
              o.num_layers(), ", ", o.mlp_ratio(), ", ", o.dropout());
  TORCH_CHECK(o.num_layers() <= kMaxLayers && o.mlp_ratio() <= kMaxMlpRatio, r.where(),
              ": num_layers must be <= kMaxLayers = ", kMaxLayers,
              " and mlp_ratio <= kMaxMlpRatio = ", kMaxMlpRatio, ", got ", o.num_layers(), " and ",
              o.mlp_ratio());
  // Model size limit, checked before anything is allocated: parameters of the blocks
  // (attention 4 D^2, MLP 2 r D^2) times 16 bytes (weights, gradients, two AdamW moments) must
  // fit in the memory the machine has.
  const double d = static_cast<double>(o.dim());
  const double parameters = static_cast<double>(o.num_layers()) * (4 + 2 * o.mlp_ratio()) * d * d;
  const double bytes = parameters * 16;
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  TORCH_CHECK(bytes <= memory, r.where(), ": dim ", o.dim(), ", num_layers ", o.num_layers(),
              ", mlp_ratio ", o.mlp_ratio(), " is ~", parameters / 1e6, "M parameters, ~",
              bytes / 1e9, " GB to train (16 bytes each), over this machine's ", memory / 1e9,
              " GB (the model size limit)");
  return o;
}

PositionalEncoding encoder_from(const nlohmann::json& config, const std::string& key,
                                const TransformerOptions& model) {
  if (!config.contains(key) || config.at(key).is_null()) return as_encoding(Nope());
  ModelContext context;
  context.dim = model.dim();
  context.num_heads = model.num_heads();
  return build_encoder(config.at(key), context);
}

Positions select_axes(const Positions& positions, const std::vector<std::string>& axes) {
  if (axes.empty() || axes == positions.axes()) return positions;
  std::vector<at::Tensor> columns;
  for (const auto& axis : axes) columns.push_back(positions.axis(axis));
  return Positions(torch::stack(columns, -1), axes);
}

BookSource book_source(ConfigReader& task) {
  BookSource source;
  source.files = {"${data}/gutenberg/moby-dick.txt", "${data}/gutenberg/sherlock-holmes.txt",
                  "${data}/gutenberg/tom-sawyer.txt"};
  if (task.has("files")) source.files = task.strings("files");
  source.eval_fraction = task.number("eval_fraction", 0.1);
  TORCH_CHECK(source.eval_fraction > 0 && source.eval_fraction < 1,
              "task: eval_fraction must be in (0, 1), got ", source.eval_fraction);
  return source;
}

BookBytes load_books(const BookSource& source) {
  std::vector<at::Tensor> train_parts, held_parts;
  text::ByteTokenizer tokenizer;
  for (const auto& file : source.files) {
    const auto text = text::strip_gutenberg(text::read_text(resolve_data_path(file)));
    // the ranks of a run compare what they train on: the text after the line-ending and
    // Gutenberg-header normalization (a copy with CRLF line ends is the same book)
    note_input(text.data(), text.size());
    auto tokens = tokenizer.encode(text);
    const int64_t held =
        static_cast<int64_t>(static_cast<double>(tokens.size(0)) * source.eval_fraction);
    train_parts.push_back(tokens.narrow(0, 0, tokens.size(0) - held));
    held_parts.push_back(tokens.narrow(0, tokens.size(0) - held, held));
  }
  return {torch::cat(train_parts), torch::cat(held_parts)};
}

at::Tensor mean_probability_log(const std::vector<at::Tensor>& logits) {
  TORCH_CHECK(!logits.empty(), "mean_probability_log: no views");
  std::vector<at::Tensor> views;
  for (const auto& l : logits) views.push_back(l.log_softmax(-1));
  return torch::stack(views).logsumexp(0).sub_(std::log(static_cast<double>(views.size())));
}

double accuracy(const at::Tensor& logits, const at::Tensor& labels) {
  return logits.argmax(-1).eq(labels).to(torch::kDouble).mean().item<double>();
}

std::string resolve_data_path(const std::string& path) {
  const std::string token = "${data}";
  auto at = path.find(token);
  if (at == std::string::npos) return path;
  std::string data;
  if (const char* env = std::getenv("POSENC_DATA_DIR")) data = env;
#ifdef POSENC_DATA_DIR
  if (data.empty()) data = POSENC_DATA_DIR;
#endif
  TORCH_CHECK(!data.empty(), "'", path,
              "' names ${data}, but no data folder is known: run scripts/setup.sh or set "
              "POSENC_DATA_DIR");
  return path.substr(0, at) + data + path.substr(at + token.size());
}

std::mt19937_64 data_rng(uint64_t seed, uint64_t stream) {
  std::seed_seq sequence{seed, stream, uint64_t{0x9e3779b97f4a7c15ULL}};
  return std::mt19937_64(sequence);
}

bool held_out_by_name(const std::string& name, double fraction) {
  uint64_t h = 14695981039346656037ULL;  // FNV-1a, 64 bit
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  return static_cast<double>(h % 1000) < 1000.0 * fraction;
}

audio::LogMelOptions speech_log_mel(int64_t n_mels) {
  audio::LogMelOptions mel;
  mel.sample_rate = 8000;
  mel.n_fft = 256;
  mel.hop_length = 80;
  mel.n_mels = n_mels;
  mel.f_min = 20.0;
  mel.f_max = 3800.0;
  mel.log_floor = 1e-8;
  mel.validate();
  return mel;
}

std::vector<double> per_channel(ConfigReader& task, const nlohmann::json& section,
                                const std::string& key, int64_t channels,
                                std::vector<double> fallback) {
  if (!task.has(key)) return fallback;
  auto values =
      section.at(key).is_number() ? std::vector<double>{task.number(key, 0.0)} : task.numbers(key);
  if (values.size() == 1) values.assign(static_cast<size_t>(channels), values[0]);
  TORCH_CHECK(static_cast<int64_t>(values.size()) == channels, "task: ", key, " needs ", channels,
              " values (one per channel) or one, got ", values.size());
  return values;
}

}  // namespace posenc::train
