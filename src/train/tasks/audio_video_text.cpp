// audio_video_text (experiment 8): one stream of three modalities. A moving Fashion-MNIST clip
// turns once ("a sneaker moves left, then up"); a voice says one direction word at some moment of
// it; a caption names the item and both directions. The question: does the spoken word name the
// motion at the moment it is spoken, and does the caption describe the clip? Binary, 50%
// positives; the negatives are of two kinds:
//   timing   the word names the direction of the OTHER phase (caption true): only the time of the
//            word against the time of the turn tells it from a positive, so audio time has to be
//            matched with video time
//   caption  the word is right but the caption swaps the two directions ("up, then left"): the
//            order of the caption against the order of the frames
// Agreement alone is an XOR (word = first direction XOR spoken after the turn): no single cue
// correlates with the label, and a small model sits at chance (a probe: 256 steps at 0.693).
// Two auxiliary 4-way heads, weighted by aux_weight, give the stream what it must compute anyway:
//   direction  the direction of motion at the moment the word is spoken (video time against
//              audio time: the alignment itself; chance 25%, the caption's two directions 50%)
//   word       the spoken word (audio alone)
// Loss = BCE(agreement) + aux_weight (CE(direction) + CE(word)); the model's 9 logits are
// [agreement, direction x 4, word x 4]. Evaluation reports all three accuracies, the
// agreement accuracy per kind, and direction_accuracy_timing: the direction head on the timing
// negatives alone. On 75% of the examples (positives, caption negatives) the spoken word IS the
// direction while it is spoken, so "repeat the word" scores 75% on direction_accuracy without any
// time (NoPE does); on timing negatives it scores 0, and only the word's time against the turn's
// gives the answer.
// Data:
//   video  T frames at `fps` (8 at 2.5 fps = 3.2 s), turn at frame k in [min_phase_frames,
//          T - 1 - min_phase_frames]; phase 1 spans [0, k / fps) s, phase 2 [k / fps, T / fps) s;
//          tubelets of 1 frame x patch x patch
//   when   the turn frame k uniform in [min_phase_frames, T - 1 - min_phase_frames], the phase
//          50/50, then the word kMarginSeconds + gap before the turn (ending there) or after it,
//          gap uniform in [0, min(kMaxGapSeconds, the room left)]: the turn frame alone says
//          nothing about the phase (NoPE sees it in the lengths of the path's two legs, without
//          any order). The onset alone says a little (an early word is more often before the turn)
//          and every model with positions on the audio sees it; beyond that, only comparing the
//          word's time with the turn's time helps. A first version drew the turn after the onset
//          and phase, which made the turn frame predict the phase (92-100%): NoPE reached 62% on
//          it while the rotary runs sat at chance
//   audio  espeak-ng's words (scripts/setup.sh: 72 voices x "right", "left", "down", "up" under
//          ${data}/spoken_directions/<voice>/<word>.wav), resampled to 8 kHz, trimmed to the
//          samples above kTrimLevel of the peak, placed at its onset, silence elsewhere; log-mel
//          (n_fft 256, hop 80 = 10 ms, n_mels bands in [20, 3800] Hz, Slaney, ln with a 1e-8 floor)
//          normalized by the training set's mean and std; audio_token_frames (4) frames = 40 ms per
//          audio token, as Qwen2.5-Omni's audio encoder emits them (80 tokens for 3.2 s). Voices
//          split by name: a voice is a test voice when FNV-1a(name) mod 1000 < 1000 test_fraction
//   text   the caption's bytes, caption_length slots, padding masked
// Stream (task.layout; posenc/core/stream.h, the Qwen2.5-Omni rule, spatial merge 1, 25
// positions per second, 2 s chunks):
//   aligned     TMRoPE: <|vision_bos|> <|audio_bos|> video + its audio interleaved in 2 s chunks,
//               video frame f at t = f / fps * 25 and audio token j at t = j (both 40 ms units, one
//               clock) <|audio_eos|> <|vision_eos|>, then the caption
//   sequential  the video, then the audio as its own segment (its t continues after the video's:
//               no shared clock), then the caption
// task.positions: mrope (the layout's (t, h, w)) or sequence (one index per token in the layout's
// order: 1D RoPE over the flattened stream).
//
// Keys (task): data_dir (Fashion-MNIST), words_dir (${data}/spoken_directions), train_clips
//   (4096), eval_clips (1024), frames (8), fps (2.5), canvas (32), item_size (14), min_speed (1.5),
//   max_speed (2.0), min_phase_frames (2), train_frames ([frames]: training clips of these
//   lengths, an equal share each), patch (8), n_mels (32), audio_token_frames (4),
//   caption_length (40), test_fraction (0.25), timing_negatives (0.25), caption_negatives (0.25),
//   aux_weight (1.0; 0: agreement only), layout (aligned | sequential), positions (mrope |
//   sequence), eval_frames ([frames]: the generalization rows, clips of other lengths), eval_batch
//   (256)
// Keys (model): transformer keys + head_hidden (0: a linear head; > 0: Linear -> GELU -> Linear)
// Generalization: the same test at other clip lengths (eval_frames, at the same fps): the stream
// gets longer or shorter, so in the sequential layout the audio starts at another position than in
// training, while the aligned layout keeps every audio token on its video frame's clock.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "audio/audio_file.h"
#include "audio/log_mel.h"
#include "common.h"
#include "posenc/core/stream.h"
#include "posenc/nn/stream_classifier.h"
#include "tasks.h"
#include "video/moving_fashion.h"
#include "video/video.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kSampleRate = 8000;  // the audio track's rate
constexpr double kTrimLevel = 0.05;    // a word's samples: from the first to the last above 5% peak
constexpr double kMarginSeconds = 0.05;  // a word keeps this far from its phase's ends
constexpr double kMaxGapSeconds = 0.6;   // the word lies at most this much further from the turn
constexpr int64_t kMaxVoices = 10000;    // voice folders words_dir may hold
constexpr int64_t kMaxClips = 1000000;   // clips a set may ask for
constexpr int64_t kMaxFrames = 1000;     // frames a clip may have
enum Kind : int64_t { kPositive = 0, kTiming = 1, kCaption = 2 };
constexpr int64_t kOutputs = 9;  // agreement, direction at the word x 4, spoken word x 4
const char* const kKindNames[3] = {"positive", "timing", "caption"};

struct Examples {
  at::Tensor video;                // [N, Nv, Dv]
  at::Tensor audio;                // [N, Na, Da], normalized log-mel
  at::Tensor text;                 // [N, L] int64
  at::Tensor padding;              // [N, L] bool, true where real
  at::Tensor label;                // [N] float 0/1
  at::Tensor kind;                 // [N] int64 Kind
  at::Tensor direction;            // [N] int64: the direction of motion while the word is spoken
  at::Tensor word;                 // [N] int64: the spoken word (a direction index)
  std::vector<SegmentKind> kinds;  // the stream's tokens (the same for every example of a set)
  Positions positions;             // one per stream token
};

class AudioVideoText : public Task {
 public:
  explicit AudioVideoText(const nlohmann::json& config) {
    const uint64_t seed = config.value("seed", uint64_t{0});
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const auto data_dir = task.string("data_dir", "/usr/share/datasets/fashion-mnist");
    const auto words_dir = resolve_data_path(task.string("words_dir", "${data}/spoken_directions"));
    const int64_t train_clips = task.integer("train_clips", 4096);
    const int64_t eval_clips = task.integer("eval_clips", 1024);
    video::MovingOptions o;
    o.num_frames = task.integer("frames", 8);
    fps_ = task.number("fps", 2.5);
    o.canvas = task.integer("canvas", o.canvas);
    o.item_size = task.integer("item_size", o.item_size);
    o.min_speed = task.number("min_speed", 1.5);
    o.max_speed = task.number("max_speed", 2.0);
    o.min_phase_frames = task.integer("min_phase_frames", 2);
    o.turn = true;
    patch_ = task.integer("patch", 8);
    mel_.n_mels = task.integer("n_mels", 32);
    token_frames_ = task.integer("audio_token_frames", 4);
    caption_length_ = task.integer("caption_length", 40);
    const double test_fraction = task.number("test_fraction", 0.25);
    timing_ = task.number("timing_negatives", 0.25);
    caption_ = task.number("caption_negatives", 0.25);
    aux_weight_ = task.number("aux_weight", 1.0);
    layout_ = task.string("layout", "aligned");
    positions_ = task.string("positions", "mrope");
    std::vector<int64_t> eval_frames, train_frames;
    if (task.has("eval_frames")) eval_frames = task.integers("eval_frames");
    if (task.has("train_frames")) train_frames = task.integers("train_frames");
    eval_batch_ = task.integer("eval_batch", 256);
    task.finish();
    TORCH_CHECK(layout_ == "aligned" || layout_ == "sequential",
                "task: layout must be 'aligned' or 'sequential', got '", layout_, "'");
    TORCH_CHECK(positions_ == "mrope" || positions_ == "sequence",
                "task: positions must be 'mrope' or 'sequence', got '", positions_, "'");
    TORCH_CHECK(
        train_clips > 0 && train_clips <= kMaxClips && eval_clips > 0 && eval_clips <= kMaxClips,
        "task: train_clips and eval_clips must be in [1, kMaxClips = ", kMaxClips, "], got ",
        train_clips, " and ", eval_clips);
    TORCH_CHECK(fps_ > 0 && fps_ <= 60, "task: fps must be in (0, 60], got ", fps_);
    TORCH_CHECK(patch_ > 0 && o.canvas % patch_ == 0, "task: patch must divide canvas = ", o.canvas,
                ", got ", patch_);
    TORCH_CHECK(token_frames_ >= 1 && caption_length_ >= 1 && eval_batch_ >= 1,
                "task: audio_token_frames, caption_length and eval_batch must be >= 1, got ",
                token_frames_, ", ", caption_length_, ", ", eval_batch_);
    TORCH_CHECK(test_fraction > 0 && test_fraction < 1,
                "task: test_fraction must be in (0, 1), got ", test_fraction);
    TORCH_CHECK(aux_weight_ >= 0 && std::isfinite(aux_weight_),
                "task: aux_weight must be finite and >= 0, got ", aux_weight_);
    TORCH_CHECK(timing_ >= 0 && caption_ >= 0 && timing_ + caption_ < 1,
                "task: timing_negatives and caption_negatives must be >= 0 and sum below 1, got ",
                timing_, " and ", caption_);
    mel_ = speech_log_mel(mel_.n_mels);
    if (eval_frames.empty()) eval_frames = {o.num_frames};
    if (train_frames.empty()) train_frames = {o.num_frames};
    TORCH_CHECK(static_cast<int64_t>(train_frames.size()) <= train_clips, "task: train_frames has ",
                train_frames.size(), " lengths for ", train_clips, " training clips");
    for (const auto& [key, list] :
         {std::pair{"eval_frames", &eval_frames}, std::pair{"train_frames", &train_frames}}) {
      for (const int64_t f : *list) {
        TORCH_CHECK(f >= 2 * o.min_phase_frames + 1 && f <= kMaxFrames, "task: ", key, " entry ", f,
                    " must be in [2 min_phase_frames + 1 = ", 2 * o.min_phase_frames + 1,
                    ", kMaxFrames = ", kMaxFrames, "]");
      }
    }
    TORCH_CHECK(o.num_frames <= kMaxFrames, "task: frames must be <= kMaxFrames = ", kMaxFrames,
                ", got ", o.num_frames);

    load_words(words_dir, test_fraction);
    auto fashion_train = vision::load_fashion_mnist(true, data_dir);
    fashion_test_ = vision::load_fashion_mnist(false, data_dir);
    moving_ = o;
    moving_.seed = seed * 1000 + 1;
    // an equal share of the training clips at each length (the first lengths take the remainder)
    const int64_t lengths = static_cast<int64_t>(train_frames.size());
    for (int64_t i = 0; i < lengths; ++i) {
      auto o_i = moving_;
      o_i.num_frames = train_frames[static_cast<size_t>(i)];
      o_i.seed = moving_.seed + 7919 * static_cast<uint64_t>(i);
      const int64_t count = train_clips / lengths + (i < train_clips % lengths ? 1 : 0);
      train_offsets_.push_back(train_size_);
      train_sets_.push_back(make_examples(fashion_train, count, o_i, train_words_, o_i.seed + 10));
      train_size_ += count;
    }
    // log-mel normalized by the training set's statistics (every length together)
    std::vector<at::Tensor> all;
    for (const auto& set : train_sets_) all.push_back(set.audio.flatten());
    auto audio = torch::cat(all);
    mean_ = audio.mean().item<double>();
    std_ = audio.std().item<double>();
    for (auto& set : train_sets_) set.audio = (set.audio - mean_) / std_;
    eval_seed_ = seed;
    eval_clips_ = eval_clips;
    eval_ = make_eval(o.num_frames);
    eval_frames_ = eval_frames;

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const int64_t head_hidden = model.integer("head_hidden", 0);
    model.finish();
    model_ = StreamClassifier(StreamClassifierOptions(train_sets_[0].video.size(2),
                                                      train_sets_[0].audio.size(2), kOutputs, t)
                                  .head_hidden(head_hidden),
                              encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return train_size_; }
  std::string metric_name() const override { return "accuracy"; }

  // A batch may hold clips of several lengths: one forward per length, the losses weighted by
  // their share of the batch (the mean over the whole batch).
  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    const double b = static_cast<double>(indices.size(0));
    at::Tensor loss;
    double correct = 0;
    for (size_t s = 0; s < train_sets_.size(); ++s) {
      const auto& set = train_sets_[s];
      const int64_t begin = train_offsets_[s], end = begin + set.label.size(0);
      auto local = indices.masked_select(indices.ge(begin).logical_and(indices.lt(end))) - begin;
      if (local.numel() == 0) continue;
      auto logits = forward(set, local);  // [b_s, 9]
      auto pick = [&](const at::Tensor& t) { return on_device(t.index_select(0, local)); };
      auto labels = pick(set.label);
      auto agree = logits.select(1, 0);
      correct += agree.detach().gt(0).eq(labels.gt(0.5)).sum().item<double>();
      auto part = torch::binary_cross_entropy_with_logits(agree, labels);
      if (aux_weight_ > 0) {
        part = part + aux_weight_ *
                          (torch::cross_entropy_loss(logits.narrow(1, 1, 4), pick(set.direction)) +
                           torch::cross_entropy_loss(logits.narrow(1, 5, 4), pick(set.word)));
      }
      part = part * (static_cast<double>(local.numel()) / b);
      loss = loss.defined() ? loss + part : part;
    }
    *metric = correct / b;
    return loss;
  }

  Metrics evaluate() override { return evaluate_on(eval_); }

  std::vector<GeneralizationRow> generalization() override {
    std::vector<GeneralizationRow> rows;
    for (const int64_t f : eval_frames_) {
      std::ostringstream setting;
      setting << f << " frames (" << static_cast<double>(f) / fps_ << " s)";
      rows.push_back({setting.str(), static_cast<double>(f),
                      f == moving_.num_frames ? evaluate_on(eval_) : evaluate_on(make_eval(f))});
    }
    return rows;
  }

 private:
  // The test set at `frames` frames: its own clips (seeded by the length), the test voices,
  // normalized with the training statistics.
  Examples make_eval(int64_t frames) {
    auto o = moving_;
    o.num_frames = frames;
    o.seed = eval_seed_ * 1000 + 2 +
             (frames == moving_.num_frames ? 0 : 7919 * static_cast<uint64_t>(frames));
    auto set = make_examples(fashion_test_, eval_clips_, o, test_words_, o.seed + 10);
    set.audio = (set.audio - mean_) / std_;
    return set;
  }

  Metrics evaluate_on(const Examples& set) {
    const int64_t n = set.label.size(0);
    // loss, correct, then (correct, count) per kind, then direction and word correct, then the
    // direction head on timing negatives: (correct, count)
    std::vector<double> sums(2 + 2 * 3 + 2 + 2, 0.0);
    for (int64_t begin = 0, batch = 0; begin < n; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      auto indices = torch::arange(begin, std::min(n, begin + eval_batch_), torch::kLong);
      auto logits = forward(set, indices);
      auto pick = [&](const at::Tensor& t) { return on_device(t.index_select(0, indices)); };
      auto labels = pick(set.label);
      auto agree = logits.select(1, 0);
      sums[0] += torch::binary_cross_entropy_with_logits(agree, labels, {}, {}, at::Reduction::Sum)
                     .item<double>();
      auto right = agree.gt(0).eq(labels.gt(0.5));
      auto seen = logits.narrow(1, 1, 4).argmax(1), heard = logits.narrow(1, 5, 4).argmax(1);
      const auto direction = pick(set.direction), kind = pick(set.kind);
      sums[8] += seen.eq(direction).sum().item<double>();
      sums[9] += heard.eq(pick(set.word)).sum().item<double>();
      // on timing negatives the word names the other phase: "say the word" is wrong there
      auto timing = kind.eq(kTiming);
      sums[10] += seen.eq(direction).logical_and(timing).sum().item<double>();
      sums[11] += timing.sum().item<double>();
      sums[1] += right.sum().item<double>();
      for (int64_t k = 0; k < 3; ++k) {
        auto of_kind = kind.eq(k);
        sums[static_cast<size_t>(2 + 2 * k)] += right.logical_and(of_kind).sum().item<double>();
        sums[static_cast<size_t>(3 + 2 * k)] += of_kind.sum().item<double>();
      }
    }
    sums = ranks_.total(sums);
    Metrics metrics{{"loss", sums[0] / static_cast<double>(n)},
                    {"accuracy", sums[1] / static_cast<double>(n)}};
    for (int64_t k = 0; k < 3; ++k) {
      const double count = sums[static_cast<size_t>(3 + 2 * k)];
      metrics.emplace_back(std::string("accuracy_") + kKindNames[k],
                           count > 0 ? sums[static_cast<size_t>(2 + 2 * k)] / count : NAN);
    }
    metrics.emplace_back("direction_accuracy", sums[8] / static_cast<double>(n));
    metrics.emplace_back("word_accuracy", sums[9] / static_cast<double>(n));
    metrics.emplace_back("direction_accuracy_timing", sums[11] > 0 ? sums[10] / sums[11] : NAN);
    return metrics;
  }

  struct Word {
    at::Tensor samples;  // [S] float32 at kSampleRate, trimmed
    int64_t direction;   // index into direction_names(4)
  };
  struct Voice {
    std::vector<Word> words;  // the four words, in direction order
    double longest = 0;       // seconds of the longest
  };

  // Reads every voice folder of words_dir, splits the voices by name.
  void load_words(const std::string& dir, double test_fraction) {
    TORCH_CHECK(fs::is_directory(dir), "task: no folder '", dir,
                "' of spoken words (scripts/setup.sh synthesizes them with espeak-ng)");
    std::vector<std::string> voices;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.is_directory()) voices.push_back(entry.path().filename().string());
    std::sort(voices.begin(), voices.end());
    TORCH_CHECK(!voices.empty() && static_cast<int64_t>(voices.size()) <= kMaxVoices, "task: '",
                dir, "' holds ", voices.size(),
                " voice folders, expected 1 to kMaxVoices = ", kMaxVoices);
    const auto& names = video::MovingClips::direction_names(4);
    for (const auto& name : voices) {
      Voice voice;
      for (int64_t d = 0; d < 4; ++d) {
        const auto path =
            (fs::path(dir) / name / (names[static_cast<size_t>(d)] + ".wav")).string();
        audio::AudioReadOptions options;
        options.target_rate = kSampleRate;
        auto samples = audio::read_audio(path, options).samples;  // errors name the file
        auto loud = samples.abs().ge(kTrimLevel * samples.abs().max().item<double>()).nonzero();
        TORCH_CHECK(loud.size(0) > 0 && samples.abs().max().item<double>() > 0, "task: '", path,
                    "' is silent");
        const int64_t first = loud[0][0].item<int64_t>(), last = loud[-1][0].item<int64_t>();
        voice.words.push_back({samples.narrow(0, first, last - first + 1).contiguous(), d});
        voice.longest =
            std::max(voice.longest, static_cast<double>(last - first + 1) / kSampleRate);
      }
      const bool test = held_out_by_name(name, test_fraction);
      (test ? test_words_ : train_words_).push_back(std::move(voice));
    }
    TORCH_CHECK(!train_words_.empty() && !test_words_.empty(), "task: the voice split left ",
                train_words_.size(), " training and ", test_words_.size(),
                " test voices; change test_fraction");
  }

  Examples make_examples(const vision::FashionMnist& source, int64_t count,
                         const video::MovingOptions& o, const std::vector<Voice>& voices,
                         uint64_t seed) {
    const int64_t clip_samples =
        std::llround(static_cast<double>(o.num_frames) / fps_ * kSampleRate);
    const int64_t audio_tokens = mel_.frames(clip_samples) / token_frames_;
    TORCH_CHECK(audio_tokens >= 1, "task: a clip of ", clip_samples,
                " samples gives no audio token");
    auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
    auto uniform = [&] { return torch::rand({1}, generator, torch::kFloat64).item<double>(); };
    auto pick = [&](int64_t n) {
      return torch::randint(0, n, {1}, generator, torch::kLong).item<int64_t>();
    };
    // 1. when: a voice, the turn frame, the phase, the gap between the word and the turn
    const int64_t k_lo = o.min_phase_frames, k_hi = o.num_frames - 1 - o.min_phase_frames;
    const double clip_seconds = static_cast<double>(clip_samples) / kSampleRate;
    std::vector<int64_t> voice_of(static_cast<size_t>(count)), phase_of(voice_of.size());
    std::vector<double> onset_of(voice_of.size());
    auto moving = o;
    moving.turn_frames.assign(voice_of.size(), 0);
    for (size_t n = 0; n < voice_of.size(); ++n) {
      voice_of[n] = pick(static_cast<int64_t>(voices.size()));
      const double longest = voices[static_cast<size_t>(voice_of[n])].longest;
      const int64_t k = k_lo + pick(k_hi - k_lo + 1);
      const double turn = static_cast<double>(k) / fps_;
      phase_of[n] = pick(2);
      // room for the gap: phase 0 ends the word kMarginSeconds + gap before the turn and starts
      // it kMarginSeconds after 0 at the earliest; phase 1 mirrors it after the turn
      const double room = phase_of[n] == 0 ? turn - 2 * kMarginSeconds - longest
                                           : clip_seconds - turn - 2 * kMarginSeconds - longest;
      TORCH_CHECK(room >= 0, "task: clips of ", o.num_frames, " frames at ", fps_,
                  " fps leave no room for a word of ", longest, " s ",
                  phase_of[n] == 0 ? "before" : "after", " a turn at frame ", k,
                  " with margins of ", kMarginSeconds, " s; use more frames or a lower fps");
      const double gap = uniform() * std::min(kMaxGapSeconds, room);
      onset_of[n] =
          phase_of[n] == 0 ? turn - kMarginSeconds - gap - longest : turn + kMarginSeconds + gap;
      moving.turn_frames[n] = k;
    }
    // 2. the clips with those turns; 3. what is said, and the caption
    auto clips = video::generate_moving_clips(source, count, moving);
    Examples ex;
    ex.video = video::tubeletize(clips.frames, 1, patch_).tokens;  // [N, T * g * g, p * p]
    const auto& names = video::MovingClips::direction_names(4);
    auto tracks = torch::zeros({count, clip_samples}, torch::kFloat32);
    ex.text = torch::zeros({count, caption_length_}, torch::kLong);
    ex.padding = torch::zeros({count, caption_length_}, torch::kBool);
    ex.label = torch::zeros({count}, torch::kFloat32);
    ex.kind = torch::zeros({count}, torch::kLong);
    ex.direction = torch::zeros({count}, torch::kLong);
    ex.word = torch::zeros({count}, torch::kLong);
    auto bytes = ex.text.accessor<int64_t, 2>();
    auto real = ex.padding.accessor<bool, 2>();
    for (int64_t n = 0; n < count; ++n) {
      const auto i = static_cast<size_t>(n);
      const int64_t d1 = clips.direction[n].item<int64_t>();
      const int64_t d2 = clips.direction2[n].item<int64_t>();
      const double r = uniform();
      const Kind kind = r < timing_ ? kTiming : r < timing_ + caption_ ? kCaption : kPositive;
      const int64_t phase = phase_of[i];
      const int64_t spoken_phase_direction = phase == 0 ? d1 : d2;
      const int64_t word = kind == kTiming ? (phase == 0 ? d2 : d1) : spoken_phase_direction;
      const auto& wave =
          voices[static_cast<size_t>(voice_of[i])].words[static_cast<size_t>(word)].samples;
      const int64_t at =
          std::min<int64_t>(std::llround(onset_of[i] * kSampleRate), clip_samples - wave.size(0));
      tracks[n].narrow(0, at, wave.size(0)).copy_(wave);
      // the caption: true, or its two directions swapped
      auto caption = clips.captions[static_cast<size_t>(n)];
      if (kind == kCaption) {
        caption = caption.substr(0, caption.find(" moves ") + 7) + names[static_cast<size_t>(d2)] +
                  ", then " + names[static_cast<size_t>(d1)];
      }
      TORCH_CHECK(static_cast<int64_t>(caption.size()) <= caption_length_, "task: the caption '",
                  caption, "' has ", caption.size(),
                  " bytes, more than caption_length = ", caption_length_);
      for (size_t j = 0; j < caption.size(); ++j) {
        bytes[n][static_cast<int64_t>(j)] = static_cast<unsigned char>(caption[j]);
        real[n][static_cast<int64_t>(j)] = true;
      }
      ex.label[n] = kind == kPositive ? 1.0f : 0.0f;
      ex.kind[n] = static_cast<int64_t>(kind);
      ex.direction[n] = spoken_phase_direction;
      ex.word[n] = word;
    }
    // log-mel in slices (the STFT of thousands of clips at once is large), 40 ms per token
    std::vector<at::Tensor> mels;
    constexpr int64_t kSlice = 512;
    for (int64_t begin = 0; begin < count; begin += kSlice) {
      auto mel =
          audio::log_mel_spectrogram(tracks.narrow(0, begin, std::min(kSlice, count - begin)),
                                     mel_);  // [b, frames, M]
      mels.push_back(mel.narrow(1, 0, audio_tokens * token_frames_)
                         .reshape({mel.size(0), audio_tokens, token_frames_ * mel_.n_mels}));
    }
    ex.audio = torch::cat(mels, 0);  // [N, Na, frames per token * M]
    // the stream: the Qwen2.5-Omni rule without spatial merging
    auto stream_options = StreamOptions::qwen2_5_omni();
    stream_options.spatial_merge_size = 1;
    const int64_t grid = o.canvas / patch_;
    const double seconds_per_frame = 1.0 / fps_;
    std::vector<Segment> segments;
    if (layout_ == "aligned") {
      segments = {
          Segment::video_with_audio(o.num_frames, grid, grid, seconds_per_frame, audio_tokens),
          Segment::text(caption_length_)};
    } else {
      segments = {Segment::video(o.num_frames, grid, grid, seconds_per_frame),
                  Segment::audio(audio_tokens), Segment::text(caption_length_)};
    }
    auto stream = build_stream(segments, stream_options);
    ex.kinds = stream.kinds;
    ex.positions = positions_ == "mrope"
                       ? stream.positions
                       : Positions::sequence(static_cast<int64_t>(stream.kinds.size()));
    return ex;
  }

  at::Tensor forward(const Examples& set, const at::Tensor& indices) {
    StreamInput input;
    input.video = on_device(set.video.index_select(0, indices));
    input.audio = on_device(set.audio.index_select(0, indices));
    input.text = on_device(set.text.index_select(0, indices));
    input.text_padding = on_device(set.padding.index_select(0, indices));
    input.kinds = set.kinds;
    input.positions = set.positions;
    return model_(input);  // [b, 9]
  }

  double fps_ = 2.5, timing_ = 0.25, caption_ = 0.25, aux_weight_ = 1.0, mean_ = 0, std_ = 1;
  int64_t patch_ = 8, token_frames_ = 4, caption_length_ = 40, eval_batch_ = 256;
  int64_t eval_clips_ = 0;
  uint64_t eval_seed_ = 0;
  std::string layout_, positions_;
  std::vector<int64_t> eval_frames_;
  video::MovingOptions moving_;
  vision::FashionMnist fashion_test_;
  audio::LogMelOptions mel_;
  std::vector<Voice> train_words_, test_words_;
  std::vector<Examples> train_sets_;    // one per training length
  std::vector<int64_t> train_offsets_;  // each set's first index in [0, train_size_)
  int64_t train_size_ = 0;
  Examples eval_;
  StreamClassifier model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_audio_video_text(const nlohmann::json& config) {
  return std::make_unique<AudioVideoText>(config);
}

}  // namespace posenc::train
