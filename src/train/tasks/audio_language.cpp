// audio_language: spoken-language identification on Asterisk's prompts (experiment 7): which of
// en, es, fr, it, ru is this recording? AST-style patches over log-mel spectrograms (Gong et al.
// 2021) into the token classifier.
//   clip (8 kHz WAV) -> the first `seconds` of it, silence after a shorter clip -> log-mel
//   (n_fft 256 = 32 ms, hop 80 = 10 ms, n_mels bands in [20, 3800] Hz, Slaney, ln with a 1e-8
//   floor) -> normalized by the training set's mean and std -> patch x patch squares every
//   `stride` bands and frames -> tokens with positions (freq row, time) where time is the
//   patch's start in seconds (time_unit seconds) or its column (index: for learned tables)
// Files with a header and no samples are skipped with a warning naming them (Debian's
// asterisk-core-sounds-ru-wav 1.6.1 ships one: is.wav). Split by prompt name: a prompt (its path
// inside the language folder, e.g. digits/7.wav) is in the test set when FNV-1a(name) mod 1000 <
// 1000 test_fraction, the same for every language, so the same sentence in another voice never sits
// on the other side of the split. Generalization: the test clips as recorded, and each with a
// random 0..shift_seconds of leading silence (seeded per clip): the content moves in time while the
// positions stay. An encoding that is relative in time should hold; an absolute one may not (the
// training clips always start at 0 unless train_shift_seconds > 0: then every training clip of a
// step is moved by a random 0..train_shift_seconds, drawn per clip from the step's seeded
// generator, in whole 10 ms frames on the log-mel (silence frames in front, the end cut off, as the
// shifted test does), so a model sees content at every time; what then remains of the shifted
// test's drop is content cut off at the end, not position).
//
// Keys (task): data_dir (${data}/asterisk), languages ([en, es, fr, it, ru]),
//              test_fraction (0.2), seconds (3.0), n_mels (64), patch (16), stride (10),
//              time_unit (seconds | index), shift_seconds (1.0), train_shift_seconds (0),
//              eval_batch (256), train_limit (0: all)
// Keys (model): transformer keys + pooling (mean | cls)
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "audio/audio_file.h"
#include "audio/audio_positions.h"
#include "audio/log_mel.h"
#include "common.h"
#include "tasks.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSampleRate = 8000;      // the prompts' rate (checked per file)
constexpr uint64_t kShiftSeed = 20211006;  // the shifted test: one draw per clip
constexpr int64_t kMaxClips = 100000;      // files one language folder may hold
constexpr double kMaxSeconds = 60.0;       // the longest clip length a config may ask for

struct Clips {
  at::Tensor mel;     // [N, T, M] float32, normalized
  at::Tensor labels;  // [N] int64
};

class AudioLanguage : public Task {
 public:
  explicit AudioLanguage(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const std::string dir = resolve_data_path(task.string("data_dir", "${data}/asterisk"));
    languages_ = {"en", "es", "fr", "it", "ru"};
    if (task.has("languages")) languages_ = task.strings("languages");
    test_fraction_ = task.number("test_fraction", 0.2);
    seconds_ = task.number("seconds", 3.0);
    mel_.n_mels = task.integer("n_mels", 64);
    patch_.patch = task.integer("patch", 16);
    patch_.stride = task.integer("stride", 10);
    unit_ = audio::time_unit_from_string(task.string("time_unit", "seconds"));
    shift_seconds_ = task.number("shift_seconds", 1.0);
    train_shift_seconds_ = task.number("train_shift_seconds", 0.0);
    eval_batch_ = task.integer("eval_batch", 256);
    const int64_t train_limit = task.integer("train_limit", 0);
    task.finish();
    TORCH_CHECK(languages_.size() >= 2, "task: languages needs at least 2 entries, got ",
                languages_.size());
    TORCH_CHECK(test_fraction_ > 0 && test_fraction_ < 1,
                "task: test_fraction must be in (0, 1), got ", test_fraction_);
    TORCH_CHECK(seconds_ > 0 && seconds_ <= kMaxSeconds, "task: seconds must be in (0, ",
                kMaxSeconds, "], got ", seconds_);
    TORCH_CHECK(shift_seconds_ >= 0 && shift_seconds_ <= seconds_,
                "task: shift_seconds must be in [0, seconds = ", seconds_, "], got ",
                shift_seconds_);
    TORCH_CHECK(train_shift_seconds_ >= 0 && train_shift_seconds_ <= seconds_,
                "task: train_shift_seconds must be in [0, seconds = ", seconds_, "], got ",
                train_shift_seconds_);
    TORCH_CHECK(eval_batch_ > 0 && train_limit >= 0,
                "task: eval_batch must be > 0 and train_limit >= 0");
    mel_ = speech_log_mel(mel_.n_mels);
    samples_ = std::llround(seconds_ * kSampleRate);
    frames_ = mel_.frames(samples_);
    grid_ = audio::ast_patch_grid(mel_.n_mels, frames_, patch_);
    load(dir, train_limit);

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const auto pooling = pooling_from_string(model.string("pooling", "mean"));
    model.finish();
    model_ = TokenClassifier(TokenClassifierOptions(patch_.patch * patch_.patch,
                                                    static_cast<int64_t>(languages_.size()), t)
                                 .pooling(pooling),
                             encoder_from(config, "encoder", t));
    positions_ = audio::ast_positions(grid_, patch_, mel_.frame_seconds(), unit_);
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return train_.labels.size(0); }
  std::string metric_name() const override { return "accuracy"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    auto mel = train_.mel.index_select(0, indices);  // [b, T, M]
    if (train_shift_seconds_ > 0) mel = shift_in_time(mel);
    auto tokens = on_device(audio::ast_patches(mel, patch_));
    auto labels = on_device(train_.labels.index_select(0, indices));
    auto logits = model_(tokens, positions_);
    *metric = accuracy(logits.detach(), labels);
    return torch::cross_entropy_loss(logits, labels);
  }

  Metrics evaluate() override { return evaluate_on(test_); }

  std::vector<GeneralizationRow> generalization() override {
    std::ostringstream shifted;
    shifted << "0-" << shift_seconds_ << " s of leading silence";
    return {{"as recorded", 0.0, evaluate_on(test_)},
            {shifted.str(), shift_seconds_, evaluate_on(shifted_)}};
  }

 private:
  // Reads every WAV of every language, splits by prompt name, computes the normalized log-mels.
  void load(const std::string& dir, int64_t train_limit) {
    std::vector<at::Tensor> train_wave, test_wave, shifted_wave;
    std::vector<int64_t> train_labels, test_labels;
    std::vector<std::string> empty;
    auto shift_generator = at::detail::createCPUGenerator(kShiftSeed);
    for (size_t label = 0; label < languages_.size(); ++label) {
      const fs::path root = fs::path(dir) / languages_[label];
      TORCH_CHECK(fs::is_directory(root), "task: no folder '", root.string(), "' for language '",
                  languages_[label], "' (scripts/setup.sh unpacks the Asterisk prompts into ", dir,
                  ")");
      std::vector<std::string> names;
      for (const auto& entry : fs::recursive_directory_iterator(root))
        if (entry.is_regular_file() && entry.path().extension() == ".wav")
          names.push_back(fs::relative(entry.path(), root).string());
      TORCH_CHECK(!names.empty(), "task: '", root.string(), "' holds no .wav files");
      TORCH_CHECK(static_cast<int64_t>(names.size()) <= kMaxClips, "task: '", root.string(),
                  "' holds ", names.size(), " files, more than kMaxClips = ", kMaxClips);
      std::sort(names.begin(), names.end());  // a fixed order, whatever the file system's
      for (const auto& name : names) {
        const auto path = (root / name).string();
        audio::AudioReadOptions options;
        options.target_rate = kSampleRate;
        options.resample = false;
        options.allow_empty = true;
        auto samples = audio::read_audio(path, options).samples;
        if (samples.size(0) == 0) {  // a header without samples: said once, below
          empty.push_back(languages_[label] + "/" + name);
          continue;
        }
        auto wave = fit(samples);  // [samples_]
        const bool test = held_out_by_name(name, test_fraction_);
        if (test) {
          test_wave.push_back(wave);
          test_labels.push_back(static_cast<int64_t>(label));
          const double shift = shift_seconds_ * torch::rand({1}, shift_generator).item<double>();
          auto silence = torch::zeros({std::llround(shift * kSampleRate)});
          shifted_wave.push_back(fit(torch::cat({silence, wave})));
        } else {
          train_wave.push_back(wave);
          train_labels.push_back(static_cast<int64_t>(label));
        }
      }
    }
    if (!empty.empty()) {
      std::string list;
      for (const auto& e : empty) list += (list.empty() ? "" : ", ") + e;
      TORCH_WARN("audio_language: skipped ", empty.size(), " file(s) with no samples: ", list);
    }
    TORCH_CHECK(!train_wave.empty() && !test_wave.empty(), "task: the split left ",
                train_wave.size(), " training and ", test_wave.size(),
                " test clips; change test_fraction");
    auto train_mel = audio::log_mel_spectrogram(torch::stack(train_wave), mel_);  // [N, T, M]
    auto labels = torch::tensor(train_labels, torch::kLong);
    if (train_limit > 0 && train_limit < train_mel.size(0)) {
      auto keep = torch::randperm(train_mel.size(0), at::detail::createCPUGenerator(1))
                      .narrow(0, 0, train_limit);
      train_mel = train_mel.index_select(0, keep);
      labels = labels.index_select(0, keep);
    }
    mean_ = train_mel.mean().item<double>();
    std_ = train_mel.std().item<double>();
    silence_ = (std::log(mel_.log_floor) - mean_) / std_;  // a silent frame, normalized
    train_ = {(train_mel - mean_) / std_, labels};
    auto test_labels_t = torch::tensor(test_labels, torch::kLong);
    test_ = {(audio::log_mel_spectrogram(torch::stack(test_wave), mel_) - mean_) / std_,
             test_labels_t};
    shifted_ = {(audio::log_mel_spectrogram(torch::stack(shifted_wave), mel_) - mean_) / std_,
                test_labels_t};
  }

  // Each clip [b, T, M] delayed by a random whole number of frames in [0, train_shift_seconds]
  // (torch's generator, seeded per step by the trainer): silence in front, the end cut off.
  at::Tensor shift_in_time(const at::Tensor& mel) const {
    const int64_t b = mel.size(0), frames = mel.size(1);
    const int64_t most = std::min<int64_t>(
        frames, static_cast<int64_t>(std::floor(train_shift_seconds_ / mel_.frame_seconds())));
    auto shift = torch::randint(0, most + 1, {b, 1}, torch::kLong);          // [b, 1] frames
    auto source = torch::arange(frames, torch::kLong).unsqueeze(0) - shift;  // [b, T]
    auto inside = source.ge(0).unsqueeze(-1);                                // [b, T, 1]
    auto moved = mel.gather(1, source.clamp_min(0).unsqueeze(-1).expand({b, frames, mel.size(2)}));
    return torch::where(inside, moved, torch::full({}, silence_, mel.options()));
  }

  // The first samples_ samples; silence after a shorter clip.
  at::Tensor fit(const at::Tensor& wave) const {
    if (wave.size(0) >= samples_) return wave.narrow(0, 0, samples_).contiguous();
    return torch::constant_pad_nd(wave, {0, samples_ - wave.size(0)}, 0.0);
  }

  Metrics evaluate_on(const Clips& clips) {
    const int64_t n = clips.labels.size(0);
    double loss = 0, correct = 0;
    for (int64_t begin = 0, batch = 0; begin < n; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      const int64_t size = std::min(eval_batch_, n - begin);
      auto tokens = on_device(audio::ast_patches(clips.mel.narrow(0, begin, size), patch_));
      auto labels = on_device(clips.labels.narrow(0, begin, size));
      auto logits = model_(tokens, positions_);
      loss += torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum).item<double>();
      correct += logits.argmax(-1).eq(labels).sum().item<double>();
    }
    const auto sums = ranks_.total({loss, correct});
    return {{"loss", sums[0] / static_cast<double>(n)},
            {"accuracy", sums[1] / static_cast<double>(n)}};
  }

  std::vector<std::string> languages_;
  double test_fraction_ = 0.2, seconds_ = 3.0, shift_seconds_ = 1.0, mean_ = 0, std_ = 1;
  double train_shift_seconds_ = 0, silence_ = 0;
  int64_t eval_batch_ = 256, samples_ = 0, frames_ = 0;
  audio::LogMelOptions mel_;
  audio::AstPatchOptions patch_;
  audio::TimeUnit unit_ = audio::TimeUnit::kSeconds;
  audio::PatchGridSize grid_;
  Positions positions_;
  Clips train_, test_, shifted_;
  TokenClassifier model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_audio_language(const nlohmann::json& config) {
  return std::make_unique<AudioLanguage>(config);
}

}  // namespace posenc::train
