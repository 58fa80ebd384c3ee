// Pieces every task shares: the model section of a run config, the encoder, axis selection,
// batched evaluation. Internal to the trainer.
#pragma once

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "audio/log_mel.h"
#include "posenc/config/config_reader.h"
#include "posenc/config/registry.h"
#include "posenc/nn/models.h"
#include "posenc/train/task.h"

namespace posenc::train {

/// The context limit: task.context, task.eval_contexts and a forecast's context + horizon, in
/// tokens, checked before any data is prepared (2^20).
inline constexpr int64_t kMaxContextTokens = int64_t{1} << 20;
inline constexpr int64_t kMaxLayers = 1024;   // transformer blocks of a model
inline constexpr double kMaxMlpRatio = 64.0;  // MLP width / model width

/// The `model` section: dim, num_heads, num_layers, mlp_ratio, dropout, fused, norm_eps,
/// attention_temperature, logn_length, attention_scale (+ pooling, read
/// by the caller if it wants it: call before finish()).
TransformerOptions transformer_options(ConfigReader& model);
/// The `encoder` section of the config, built for the model's sizes (NoPE when absent).
PositionalEncoding encoder_from(const nlohmann::json& config, const std::string& key,
                                const TransformerOptions& model);
/// The same coordinates restricted to the named axes, in the order given.
Positions select_axes(const Positions& positions, const std::vector<std::string>& axes);
/// Where a text task's books come from: task keys `files` (the three Gutenberg books under
/// `${data}/gutenberg/`) and `eval_fraction` (0.1, checked to be in (0, 1)).
struct BookSource {
  std::vector<std::string> files;
  double eval_fraction = 0.1;
};
BookSource book_source(ConfigReader& task);
/// The books as bytes, headers and footers stripped; the last eval_fraction of each held out.
struct BookBytes {
  at::Tensor train, held_out;  ///< [bytes] int64 each, the books concatenated
};
BookBytes load_books(const BookSource& source);
/// Test-time averaging of several views' predictions: log of the mean of their class
/// probabilities, log((softmax(l_1) + ... + softmax(l_V)) / V) = logsumexp_v log_softmax(l_v) -
/// log V, for logits [V][B, K] -> [B, K] (numerically stable for tiny probabilities).
at::Tensor mean_probability_log(const std::vector<at::Tensor>& logits);
/// Accuracy of logits [B, K] against labels [B].
double accuracy(const at::Tensor& logits, const at::Tensor& labels);
/// A config file's directory-relative path resolved, with `${data}` replaced by the data folder
/// that scripts/setup.sh fills (POSENC_DATA_DIR at build time, or the env var POSENC_DATA_DIR).
std::string resolve_data_path(const std::string& path);
/// A split by name that does not depend on file order or language: `name` (a prompt's path, a
/// voice) is held out when FNV-1a(name) mod 1000 < 1000 fraction.
bool held_out_by_name(const std::string& name, double fraction);
/// Log-mel options for 8 kHz telephone speech (the audio tasks): n_fft 256 (32 ms), hop 80
/// (10 ms), n_mels bands in [20, 3800] Hz, Slaney, ln with a 1e-8 floor; validated.
audio::LogMelOptions speech_log_mel(int64_t n_mels);
/// Seeded generator for data that must not depend on the training step (held-out windows).
std::mt19937_64 data_rng(uint64_t seed, uint64_t stream);

/// A per-channel key of `section` (mean, std): one number for every channel, or one per channel;
/// `fallback` when absent.
std::vector<double> per_channel(ConfigReader& task, const nlohmann::json& section,
                                const std::string& key, int64_t channels,
                                std::vector<double> fallback);

}  // namespace posenc::train
