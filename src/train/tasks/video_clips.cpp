// video_classification on the user's clips (task.videos / task.labels; video/video_folder.h): a
// ViViT-style classifier (tubelet embedding, Arnab et al. 2021) over clips sampled at a stated
// rate, with volume positions whose time axis is in seconds.
//   clip -> `frames` samples at `fps` per second (the frame on screen at start + j / fps; a clip
//   that ends sooner repeats its last frame) -> resized to image_size x image_size, C = channels
//   -> uint8 cache, decoded once before the first step by decode_threads threads (frames C S^2
//   bytes a clip, bounded by cache_mb) -> /255 -> (x - mean) / std per channel -> tubelets of
//   tubelet_frames x patch x patch (video::tubeletize: [B, N, t p p C]) with positions
//   (t, h, w): t = time_scale * the seconds of the tubelet's first frame since the clip's first
//   sample, from the frames' real timestamps (CAP_PROP_POS_MSEC: a variable-rate clip keeps its
//   times), h, w = the patch's row and column. Clips whose times differ (another source frame
//   rate) get per-clip positions [B, N, 3] in their batch; when a batch's clips share their times
//   the positions are one [N, 3] for all.
// Labels: the training CSV's distinct labels, sorted; held out: val_labels (a CSV of the same
// format; each label one of the training file's), else a seeded val_fraction of each class
// (split_seed; the rule of image_classification's folder split: round(fraction n_c) of class c,
// at least one left for training, drawn by a Mersenne twister, path order kept).
// No training augmentation: a mirrored or reversed clip can change what it shows (the direction
// of a motion).
// Decoding waits for the first use of the data (train_size, a step, evaluate): `posenc eval
// --video` builds the task for its class names and classifies its clips without decoding the
// training clips.
//
// Keys (task): videos (the clip folder: CSV paths are relative to it; default the CSV's folder),
//   labels (default videos/labels.csv), val_labels, val_fraction (0.1), split_seed (0), frames
//   (8), fps (8), image_size (112), channels (3), mean, std (ImageNet's for RGB, 0.5 for gray),
//   tubelet_frames (1), patch (16), time_scale (1: positions per second), position_axes
//   ([t, h, w]), bad_videos (stop | skip), cache_mb (4096), decode_threads (0: every core),
//   eval_batch (64)
// Keys (model): transformer keys + pooling (mean | cls)
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <random>

#include "common.h"
#include "tasks.h"
#include "video/video.h"
#include "video/video_folder.h"

namespace posenc::train {
namespace {

namespace fs = std::filesystem;

struct ClipCache {
  at::Tensor frames;  ///< [N, F, C, S, S] uint8
  at::Tensor times;   ///< [N, F] float64 seconds
  at::Tensor labels;  ///< [N] int64
};

class VideoClipClassification : public Task {
 public:
  explicit VideoClipClassification(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const auto videos = task.optional_string("videos");
    auto labels = task.optional_string("labels");
    const auto val_labels = task.optional_string("val_labels");
    val_fraction_ = task.number("val_fraction", 0.1);
    split_seed_ = task.integer("split_seed", 0);
    options_.frames = task.integer("frames", 8);
    options_.fps = task.number("fps", 8.0);
    options_.size = task.integer("image_size", 112);
    options_.channels = task.integer("channels", 3);
    options_.bad = video::bad_videos_from_string(task.string("bad_videos", "stop"));
    const int64_t cache_mb = task.integer("cache_mb", 4096);
    options_.threads = task.integer("decode_threads", 0);
    tubelet_frames_ = task.integer("tubelet_frames", 1);
    patch_ = task.integer("patch", 16);
    time_scale_ = task.number("time_scale", 1.0);
    eval_batch_ = task.integer("eval_batch", 64);
    axes_ = task.has("position_axes") ? task.strings("position_axes")
                                      : std::vector<std::string>{"t", "h", "w"};
    TORCH_CHECK(options_.channels == 1 || options_.channels == 3,
                "task: channels must be 1 (gray) or 3 (RGB), got ", options_.channels);
    const bool rgb = options_.channels == 3;
    mean_ = per_channel(task, config.at("task"), "mean", options_.channels,
                        rgb ? std::vector<double>{0.485, 0.456, 0.406} : std::vector<double>{0.5});
    std_ = per_channel(task, config.at("task"), "std", options_.channels,
                       rgb ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>{0.5});
    task.finish();
    for (double v : std_) TORCH_CHECK(v > 0, "task: std must be positive, got ", v);
    TORCH_CHECK(cache_mb > 0 && cache_mb <= (int64_t{1} << 24),
                "task: cache_mb must be in [1, 2^24], got ", cache_mb);
    options_.max_cache_bytes = cache_mb << 20;
    TORCH_CHECK(options_.threads >= 0 && options_.threads <= 1024,
                "task: decode_threads must be in [0, 1024] (0: every core), got ",
                options_.threads);
    TORCH_CHECK(options_.frames >= 1 && options_.frames <= 1000,
                "task: frames must be in [1, 1000], got ", options_.frames);
    TORCH_CHECK(std::isfinite(options_.fps) && options_.fps > 0 && options_.fps <= 1000,
                "task: fps must be in (0, 1000] samples per second, got ", options_.fps);
    TORCH_CHECK(options_.size >= 1 && options_.size <= 4096,
                "task: image_size must be in [1, 4096], got ", options_.size);
    TORCH_CHECK(tubelet_frames_ >= 1 && options_.frames % tubelet_frames_ == 0,
                "task: frames = ", options_.frames,
                " must be a multiple of tubelet_frames >= 1, got ", tubelet_frames_);
    TORCH_CHECK(patch_ >= 1 && options_.size % patch_ == 0, "task: image_size = ", options_.size,
                " must be a multiple of patch >= 1, got ", patch_);
    TORCH_CHECK(std::isfinite(time_scale_) && time_scale_ > 0 && time_scale_ <= 1e6,
                "task: time_scale must be in (0, 1e6] positions per second, got ", time_scale_);
    TORCH_CHECK(val_fraction_ > 0 && val_fraction_ < 1,
                "task: val_fraction must be in (0, 1), got ", val_fraction_);
    TORCH_CHECK(eval_batch_ >= 1, "task: eval_batch must be >= 1, got ", eval_batch_);
    TORCH_CHECK(videos || labels,
                "task: video_classification on your clips needs task.videos "
                "(a folder with labels.csv) or task.labels (a CSV)");
    clip_folder_ = videos ? resolve_data_path(*videos) : std::string();
    labels_path_ =
        labels ? resolve_data_path(*labels) : (fs::path(clip_folder_) / "labels.csv").string();
    if (val_labels) val_labels_path_ = resolve_data_path(*val_labels);
    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const auto pooling = pooling_from_string(model.string("pooling", "mean"));
    model.finish();
    // the rows (cheap: the CSV and a stat per clip); the clips are decoded at first use
    train_rows_ = video::read_video_labels(labels_path_, clip_folder_, options_.bad);
    classes_ = train_rows_.classes;
    TORCH_CHECK(classes_.size() >= 2, "labels: '", labels_path_, "' has ", classes_.size(),
                " class", classes_.size() == 1 ? " ('" + classes_[0] + "')" : std::string("es"),
                "; a classifier needs at least 2");
    const int64_t grid = options_.size / patch_;
    base_positions_ = Positions::volume(options_.frames / tubelet_frames_, grid, grid);
    select_axes(base_positions_, axes_);  // an unknown axis is an error now, not at the first step
    model_ = TokenClassifier(
        TokenClassifierOptions(tubelet_frames_ * patch_ * patch_ * options_.channels,
                               static_cast<int64_t>(classes_.size()), t)
            .pooling(pooling),
        encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return data().train.frames.size(0); }
  std::string metric_name() const override { return "accuracy"; }
  std::vector<std::string> class_names() const override { return classes_; }

  at::Tensor classify_files(const std::vector<std::string>& files) override {
    std::vector<at::Tensor> frames, times;
    for (const auto& file : files) {
      auto clip = video::sample_clip(file, 0.0, std::numeric_limits<double>::infinity(), options_);
      if (clip.padded > 0)
        std::cerr << "video: '" << file << "' ends before " << options_.frames << " samples at "
                  << options_.fps << " per second: its last frame repeated " << clip.padded
                  << " time(s)\n";
      frames.push_back(clip.frames);
      times.push_back(clip.times);
    }
    auto [tokens, positions] = prepare(torch::stack(frames), torch::stack(times));
    return model_(tokens, positions);
  }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    const auto& set = data().train;
    at::Tensor tokens, labels;
    Positions positions;
    {
      RECORD_USER_SCOPE("posenc::data");  // a category of `posenc train --profile`
      std::tie(tokens, positions) =
          prepare(set.frames.index_select(0, indices), set.times.index_select(0, indices));
      labels = on_device(set.labels.index_select(0, indices));
    }
    auto logits = model_(tokens, positions);
    *metric = accuracy(logits.detach(), labels);
    return torch::cross_entropy_loss(logits, labels);
  }

  Metrics evaluate() override {
    const auto& set = data().held_out;
    const int64_t n = set.frames.size(0);
    double loss = 0, correct = 0;
    for (int64_t begin = 0, batch = 0; begin < n; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      const int64_t size = std::min(eval_batch_, n - begin);
      auto [tokens, positions] =
          prepare(set.frames.narrow(0, begin, size), set.times.narrow(0, begin, size));
      auto logits = model_(tokens, positions);
      auto labels = on_device(set.labels.narrow(0, begin, size));
      loss += torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Sum).item<double>();
      correct += logits.argmax(-1).eq(labels).sum().item<double>();
    }
    const auto sums = ranks_.total({loss, correct});
    return {{"loss", sums[0] / static_cast<double>(n)},
            {"accuracy", sums[1] / static_cast<double>(n)}};
  }

 private:
  struct Data {
    ClipCache train, held_out;
  };

  // The decoded clips, decoded at the first call.
  const Data& data() const {
    if (!data_) data_ = decode();
    return *data_;
  }

  Data decode() const {
    auto train = video::decode_video_labels(train_rows_, labels_path_, options_);
    ClipCache all{train.frames, train.times, train.labels};
    Data data;
    if (!val_labels_path_.empty()) {
      auto held = video::load_video_folder(val_labels_path_, clip_folder_, options_, classes_);
      data.train = all;
      data.held_out = {held.frames, held.times, held.labels};
      return data;
    }
    // a seeded split of each class (image_classification's rule for folders)
    std::mt19937_64 rng(static_cast<uint64_t>(split_seed_));
    const auto* label = all.labels.data_ptr<int64_t>();
    const int64_t n = all.labels.numel();
    std::vector<bool> held(static_cast<size_t>(n), false);
    for (int64_t c = 0; c < static_cast<int64_t>(classes_.size()); ++c) {
      std::vector<int64_t> members;
      for (int64_t i = 0; i < n; ++i)
        if (label[i] == c) members.push_back(i);
      std::shuffle(members.begin(), members.end(), rng);
      const auto count = static_cast<int64_t>(members.size());
      const int64_t take =
          std::min<int64_t>(count - 1, std::llround(val_fraction_ * static_cast<double>(count)));
      for (int64_t k = 0; k < take; ++k) held[static_cast<size_t>(members[k])] = true;
    }
    std::vector<int64_t> train_index, held_index;
    for (int64_t i = 0; i < n; ++i)
      (held[static_cast<size_t>(i)] ? held_index : train_index).push_back(i);
    TORCH_CHECK(!held_index.empty(), "task: val_fraction ", val_fraction_, " holds out no clip of ",
                n, " (raise it, or give val_labels)");
    auto pick = [&](const std::vector<int64_t>& index) {
      auto i = torch::tensor(index, torch::kLong);
      return ClipCache{all.frames.index_select(0, i), all.times.index_select(0, i),
                       all.labels.index_select(0, i)};
    };
    data.train = pick(train_index);
    data.held_out = pick(held_index);
    return data;
  }

  // uint8 frames [B, F, C, S, S] + times [B, F] -> tokens [B, N, t p p C] on the model's device,
  // positions on the configured axes (shared [N, A] when every clip has the same times).
  std::pair<at::Tensor, Positions> prepare(const at::Tensor& raw, const at::Tensor& times) const {
    auto x = raw.to(torch::kFloat).div_(255.0);
    auto mean = torch::tensor(mean_, torch::kDouble).to(torch::kFloat).view({1, 1, -1, 1, 1});
    auto std = torch::tensor(std_, torch::kDouble).to(torch::kFloat).view({1, 1, -1, 1, 1});
    x = (x - mean) / std;
    auto tubelets = video::tubeletize(x, tubelet_frames_, patch_);
    // the time of each tubelet's first frame, scaled: [B, gt]
    auto seconds = times
                       .index({torch::indexing::Slice(),
                               torch::indexing::Slice(torch::indexing::None, torch::indexing::None,
                                                      tubelet_frames_)})
                       .mul(time_scale_);
    const auto& volume = base_positions_.coords();  // [N, 3], t = the tubelet's frame block
    const auto block = volume.select(1, 0).to(torch::kLong);  // [N]
    Positions positions;
    if (seconds.size(0) == 1 || torch::equal(seconds, seconds[0].expand_as(seconds))) {
      auto coords = volume.clone();
      coords.select(1, 0).copy_(seconds[0].index_select(0, block));
      positions = Positions(coords, base_positions_.axes());
    } else {
      auto coords = volume.unsqueeze(0).repeat({seconds.size(0), 1, 1});  // [B, N, 3]
      coords.select(2, 0).copy_(seconds.index_select(1, block));
      positions = Positions(coords, base_positions_.axes());
    }
    return {on_device(tubelets.tokens), select_axes(positions, axes_)};
  }

  video::VideoFolderOptions options_;
  std::string clip_folder_, labels_path_, val_labels_path_;
  video::VideoLabels train_rows_;
  std::vector<std::string> classes_;
  double val_fraction_ = 0.1, time_scale_ = 1.0;
  int64_t split_seed_ = 0, tubelet_frames_ = 1, patch_ = 16, eval_batch_ = 64;
  std::vector<std::string> axes_;
  std::vector<double> mean_, std_;
  Positions base_positions_;
  mutable std::optional<Data> data_;
  TokenClassifier model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_video_clip_classification(const nlohmann::json& config) {
  return std::make_unique<VideoClipClassification>(config);
}

}  // namespace posenc::train
