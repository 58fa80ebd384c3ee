// Video tasks on moving Fashion-MNIST clips (modalities/video/moving_fashion.h): an item moves
// in one of 4 (or 8) directions; only the order of frames tells "left" from "right".
//
// video_classification: (with task.videos or task.labels: the user's clips, video_clips.cpp)
//   the direction of motion from tubelets (ViViT tubelet embedding) with
//   positions on the axes `position_axes` (default t, h, w). With tubelet_frames = 1 no token
//   holds two frames, so an encoding without the t axis leaves the model blind to frame order:
//   it can tell the axis of motion (horizontal or vertical) but not its sign.
// text_video_matching: which of `candidates` captions describes a clip. Each (clip, caption) pair
//   is one stream [video tubelets | caption bytes] scored by a TextVideoMatcher; the loss is the
//   cross-entropy over the candidates. hard_negatives: the wrong captions name the same item
//   moving in other directions (so matching needs frame order); else they are other clips'
//   captions. stream_positions: mrope (Qwen2-VL layout via build_stream: the video grid, then
//   the text resuming at max + 1, the same index on every axis) or sequence (one 1D index over
//   the flattened stream). text_encoder / video_encoder: optional additive encoders applied to
//   each segment before the join (the per-modality baseline; then use encoder: nope).
//
// Keys (task): data_dir, train_clips, eval_clips, frames, canvas, item_size, num_directions,
//   min_speed, max_speed, tubelet_frames (1), patch (8), eval_batch (256);
//   classification: position_axes ([t, h, w]);
//   matching: candidates (4), hard_negatives (true), caption_length (32),
//   stream_positions (mrope), text_encoder, video_encoder
#include <torch/torch.h>

#include "common.h"
#include "posenc/core/stream.h"
#include "tasks.h"
#include "video/moving_fashion.h"
#include "video/video.h"

namespace posenc::train {
namespace {

struct ClipSet {
  at::Tensor tokens;  ///< [N, Ntok, Td]
  at::Tensor direction;
  std::vector<std::string> captions;
};

struct VideoData {
  ClipSet train, eval;
  Positions positions;  ///< tubelet positions (t, h, w)
  int64_t token_dim = 0, num_directions = 4, grid_t = 0, grid_h = 0, grid_w = 0;
  int64_t eval_batch = 256;
};

// Named limits of the generated clips, checked before anything is allocated.
constexpr int64_t kMaxVideoClips = 1000000;            // train_clips, eval_clips
constexpr int64_t kMaxVideoFrames = 1000;              // frames per clip
constexpr int64_t kMaxCanvas = 4096;                   // canvas side in pixels
constexpr int64_t kMaxVideoBytes = int64_t{16} << 30;  // all clips' float pixels: 16 GiB

// Reads the keys shared by both video tasks and generates the clips.
VideoData load_video_data(ConfigReader& task, uint64_t seed) {
  const auto dir = task.string("data_dir", "/usr/share/datasets/fashion-mnist");
  const int64_t train_clips = task.integer("train_clips", 4096);
  const int64_t eval_clips = task.integer("eval_clips", 1024);
  video::MovingOptions o;
  o.num_frames = task.integer("frames", o.num_frames);
  o.canvas = task.integer("canvas", o.canvas);
  o.item_size = task.integer("item_size", o.item_size);
  o.num_directions = task.integer("num_directions", o.num_directions);
  o.min_speed = task.number("min_speed", o.min_speed);
  o.max_speed = task.number("max_speed", o.max_speed);
  const int64_t t = task.integer("tubelet_frames", 1);
  const int64_t p = task.integer("patch", 8);
  TORCH_CHECK(train_clips >= 1 && train_clips <= kMaxVideoClips && eval_clips >= 1 &&
                  eval_clips <= kMaxVideoClips,
              "task: train_clips and eval_clips must be in [1, kMaxVideoClips = ", kMaxVideoClips,
              "], got ", train_clips, " and ", eval_clips);
  TORCH_CHECK(o.num_frames >= 1 && o.num_frames <= kMaxVideoFrames,
              "task: frames must be in [1, kMaxVideoFrames = ", kMaxVideoFrames, "], got ",
              o.num_frames);
  TORCH_CHECK(o.canvas >= 1 && o.canvas <= kMaxCanvas,
              "task: canvas must be in [1, kMaxCanvas = ", kMaxCanvas, "] pixels, got ", o.canvas);
  // (each factor is bounded above, so the product fits in double exactly enough to compare)
  const double bytes = static_cast<double>(train_clips + eval_clips) *
                       static_cast<double>(o.num_frames) * static_cast<double>(o.canvas) *
                       static_cast<double>(o.canvas) * 4.0;
  TORCH_CHECK(bytes <= static_cast<double>(kMaxVideoBytes), "task: ", train_clips + eval_clips,
              " clips of ", o.num_frames, " frames of ", o.canvas, "x", o.canvas, " pixels take ",
              bytes / (1 << 30),
              " GiB, over the video limit kMaxVideoBytes = ", kMaxVideoBytes >> 30, " GiB");
  VideoData data;
  data.eval_batch = task.integer("eval_batch", 256);
  data.num_directions = o.num_directions;
  auto make = [&](bool train, int64_t count, uint64_t stream) {
    o.seed = seed * 1000 + stream;
    auto clips = video::generate_moving_clips(vision::load_fashion_mnist(train, dir), count, o);
    auto tubelets = video::tubeletize(clips.frames, t, p);
    data.positions = tubelets.positions;
    return ClipSet{tubelets.tokens, clips.direction, clips.captions};
  };
  data.train = make(true, train_clips, 1);
  data.eval = make(false, eval_clips, 2);
  data.token_dim = data.train.tokens.size(2);
  data.grid_t = o.num_frames / t;
  data.grid_h = o.canvas / p;
  data.grid_w = o.canvas / p;
  return data;
}

class VideoClassification : public Task {
 public:
  VideoClassification(const nlohmann::json& config, uint64_t seed) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    std::vector<std::string> axes = {"t", "h", "w"};
    if (task.has("position_axes")) axes = task.strings("position_axes");
    data_ = load_video_data(task, seed);
    task.finish();
    positions_ = select_axes(data_.positions, axes);
    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const auto pooling = pooling_from_string(model.string("pooling", "mean"));
    model.finish();
    model_ = TokenClassifier(
        TokenClassifierOptions(data_.token_dim, data_.num_directions, t).pooling(pooling),
        encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return data_.train.tokens.size(0); }
  std::string metric_name() const override { return "accuracy"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    auto logits = model_(on_device(data_.train.tokens.index_select(0, indices)), positions_);
    auto labels = on_device(data_.train.direction.index_select(0, indices));
    *metric = accuracy(logits.detach(), labels);
    return torch::cross_entropy_loss(logits, labels);
  }

  Metrics evaluate() override {
    const int64_t n = data_.eval.tokens.size(0);
    double loss = 0, correct = 0;
    for (int64_t begin = 0, batch = 0; begin < n; begin += data_.eval_batch, ++batch) {
      if (!ranks_.mine(batch)) continue;
      const int64_t size = std::min(data_.eval_batch, n - begin);
      auto logits = model_(on_device(data_.eval.tokens.narrow(0, begin, size)), positions_);
      auto labels = on_device(data_.eval.direction.narrow(0, begin, size));
      loss += torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum).item<double>();
      correct += logits.argmax(-1).eq(labels).sum().item<double>();
    }
    const auto sums = ranks_.total({loss, correct});
    loss = sums[0];
    correct = sums[1];
    return {{"loss", loss / static_cast<double>(n)},
            {"accuracy", correct / static_cast<double>(n)}};
  }

 private:
  VideoData data_;
  Positions positions_;
  TokenClassifier model_{nullptr};
};

class TextVideoMatching : public Task {
 public:
  TextVideoMatching(const nlohmann::json& config, uint64_t seed) : seed_(seed) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    candidates_ = task.integer("candidates", 4);
    hard_negatives_ = task.boolean("hard_negatives", true);
    caption_length_ = task.integer("caption_length", 32);
    const auto stream = task.string("stream_positions", "mrope");
    auto text_encoder = task.object("text_encoder");
    auto video_encoder = task.object("video_encoder");
    data_ = load_video_data(task, seed);
    task.finish();
    TORCH_CHECK(stream == "mrope" || stream == "sequence",
                "task: stream_positions must be 'mrope' or 'sequence', got '", stream, "'");
    TORCH_CHECK(candidates_ >= 2, "task: candidates must be >= 2, got ", candidates_);
    TORCH_CHECK(!hard_negatives_ || candidates_ <= data_.num_directions, "task: ", candidates_,
                " candidates with hard negatives need as many directions, there are ",
                data_.num_directions);
    const int64_t nv = data_.positions.size();
    if (stream == "mrope") {
      stream_positions_ = build_stream({Segment::video(data_.grid_t, data_.grid_h, data_.grid_w),
                                        Segment::text(caption_length_)})
                              .positions;
    } else {
      stream_positions_ = Positions::sequence(nv + caption_length_);
    }
    text_positions_ = Positions::sequence(caption_length_);

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    model.finish();
    auto per_modality = [&](const std::optional<nlohmann::json>& section) {
      if (!section) return PositionalEncoding(nullptr);
      return encoder_from(nlohmann::json{{"e", *section}}, "e", t);
    };
    model_ = TextVideoMatcher(TextVideoMatcherOptions(data_.token_dim, t),
                              encoder_from(config, "encoder", t), per_modality(text_encoder),
                              per_modality(video_encoder));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return data_.train.tokens.size(0); }
  std::string metric_name() const override { return "accuracy"; }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    // Negatives drawn from torch's generator, which the trainer seeds per step.
    auto [scores, labels] = score(data_.train, indices, [](int64_t n) {
      return torch::randint(n, {1}, torch::kLong).item<int64_t>();
    });
    *metric = accuracy(scores.detach(), labels);
    return torch::cross_entropy_loss(scores, labels);
  }

  Metrics evaluate() override {
    auto rng = data_rng(seed_, 77);  // the same candidates at every evaluation
    auto draw = [&rng](int64_t n) { return std::uniform_int_distribution<int64_t>(0, n - 1)(rng); };
    const int64_t n = data_.eval.tokens.size(0);
    const int64_t batch = std::max<int64_t>(1, data_.eval_batch / candidates_);
    double loss = 0, correct = 0;
    for (int64_t begin = 0, number = 0; begin < n; begin += batch, ++number) {
      if (!ranks_.mine(number)) {  // another rank's batch: draw its candidates all the same
        for (int64_t i = begin; i < std::min(n, begin + batch); ++i)
          candidates_of(data_.eval, i, draw);
        continue;
      }
      auto indices = torch::arange(begin, std::min(n, begin + batch), torch::kLong);
      auto [scores, labels] = score(data_.eval, indices, draw);
      loss += torch::cross_entropy_loss(scores, labels, {}, at::Reduction::Sum).item<double>();
      correct += scores.argmax(-1).eq(labels).sum().item<double>();
    }
    const auto sums = ranks_.total({loss, correct});
    loss = sums[0];
    correct = sums[1];
    return {{"loss", loss / static_cast<double>(n)},
            {"accuracy", correct / static_cast<double>(n)}};
  }

 private:
  // The candidate captions of clip i: the true one at a random slot, then the negatives.
  std::pair<std::vector<std::string>, int64_t> candidates_of(
      const ClipSet& set, int64_t i, const std::function<int64_t(int64_t)>& draw) const {
    const auto& truth = set.captions[static_cast<size_t>(i)];
    std::vector<std::string> options;
    if (hard_negatives_) {
      const auto stem = truth.substr(0, truth.rfind(' ') + 1);  // "a sneaker moves "
      std::vector<std::string> others;
      for (const auto& name : video::MovingClips::direction_names(data_.num_directions)) {
        if (stem + name != truth) others.push_back(stem + name);
      }
      for (int64_t k = 1; k < candidates_; ++k) {
        const auto pick = draw(static_cast<int64_t>(others.size()));
        options.push_back(others[static_cast<size_t>(pick)]);
        others.erase(others.begin() + pick);
      }
    } else {
      while (static_cast<int64_t>(options.size()) < candidates_ - 1) {
        const auto& other =
            set.captions[static_cast<size_t>(draw(static_cast<int64_t>(set.captions.size())))];
        if (other != truth && std::find(options.begin(), options.end(), other) == options.end()) {
          options.push_back(other);
        }
      }
    }
    const int64_t slot = draw(candidates_);
    options.insert(options.begin() + slot, truth);
    return {options, slot};
  }

  // -> scores [b, K], labels [b] (the true caption's slot).
  std::pair<at::Tensor, at::Tensor> score(const ClipSet& set, const at::Tensor& indices,
                                          const std::function<int64_t(int64_t)>& draw) {
    const int64_t b = indices.size(0), k = candidates_;
    auto text = torch::zeros({b * k, caption_length_}, torch::kLong);
    auto padding = torch::zeros({b * k, caption_length_}, torch::kBool);
    std::vector<int64_t> labels;
    auto* ids = indices.data_ptr<int64_t>();
    auto bytes = text.accessor<int64_t, 2>();
    auto real = padding.accessor<bool, 2>();
    for (int64_t n = 0; n < b; ++n) {
      auto [options, slot] = candidates_of(set, ids[n], draw);
      labels.push_back(slot);
      for (int64_t c = 0; c < k; ++c) {
        const auto& caption = options[static_cast<size_t>(c)];
        const int64_t length = std::min<int64_t>(caption_length_, caption.size());
        for (int64_t j = 0; j < length; ++j) {
          bytes[n * k + c][j] = static_cast<int64_t>(static_cast<unsigned char>(caption[j]));
          real[n * k + c][j] = true;
        }
      }
    }
    MatchInput input;
    input.video = on_device(set.tokens.index_select(0, indices)).repeat_interleave(k, 0);
    input.video_positions = data_.positions;
    input.text = on_device(text);
    input.text_padding = on_device(padding);
    input.text_positions = text_positions_;
    input.stream_positions = stream_positions_;
    return {model_(input).view({b, k}), on_device(torch::tensor(labels, torch::kLong))};
  }

  uint64_t seed_;
  int64_t candidates_, caption_length_;
  bool hard_negatives_;
  VideoData data_;
  Positions stream_positions_, text_positions_;
  TextVideoMatcher model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_video_classification(const nlohmann::json& config) {
  // the user's clips (video_clips.cpp) when the task names them
  const auto& task = config.at("task");
  if (task.is_object() && (task.contains("videos") || task.contains("labels")))
    return make_video_clip_classification(config);
  return std::make_unique<VideoClassification>(config, config.value("seed", uint64_t{0}));
}

std::unique_ptr<Task> make_text_video_matching(const nlohmann::json& config) {
  return std::make_unique<TextVideoMatching>(config, config.value("seed", uint64_t{0}));
}

}  // namespace posenc::train
