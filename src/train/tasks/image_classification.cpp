// image_classification: a ViT (Dosovitskiy et al. 2021) on Fashion-MNIST (Xiao et al. 2017) or on
// a folder of the user's images (torchvision's ImageFolder layout, vision/image_folder.h).
//   image uint8 [C, S, S] -> /255 -> (resize by `scale`) -> zero border `pad` px (scaled too)
//   -> normalize per channel (mean, std) -> p x p patches with grid positions
// Fashion-MNIST: S = 28, C = 1, mean 0.2860, std 0.3530 (the training set's). A folder: every
// image decoded once before training, in parallel, into a uint8 cache (C S^2 bytes an image,
// bounded by cache_mb), resized to S = image_size; C = channels (3: RGB, gray replicated, alpha
// dropped; 1: luma); mean and std default to ImageNet's (0.485 0.456 0.406 / 0.229 0.224 0.225)
// for RGB, 0.5 / 0.5 for gray. Held out: the val_images folder (the same class subfolders), else
// a seeded val_fraction of each class (split_seed). A step reads the cache as it reads IDX's
// tensor, so a folder trains at the speed of the step (docs/performance.md).
// Training augmentation: random crop after zero padding, random horizontal flip, random erasing
// (a rectangle set to 0 = the mean pixel after normalization; Zhong et al. 2020).
// Loss: cross-entropy, with label smoothing eps (Szegedy et al. 2016): targets (1 - eps) on the
// label + eps / K on every class; evaluation reports the plain cross-entropy.
// Test-time flip averaging (eval_flip): the class probabilities of an image and of its mirror
// image are averaged, p = (softmax(f(x)) + softmax(f(flip(x)))) / 2, and the reported loss is
// -log p[label] (the usual flip test-time augmentation; a model trained with flips is invariant
// to the mirror in distribution, so the two views are two samples of the same prediction).
// Generalization: accuracy at the eval_scales (e.g. 1.5: 28 -> 42 px + 3 px border = 48, a
// 12 x 12 grid instead of 8 x 8): a learned table is resampled to the new grid (bicubic, as timm),
// a 2D relative table is resized, sin-cos and RoPE are evaluated at the new positions.
//
// Keys (task): data_dir, train_limit, eval_limit, pad (2; 0 with images), patch (4),
//              crop_padding (2), flip (true), erase_probability (0), label_smoothing (0),
//              eval_scales ([1.0]), eval_batch (500), eval_flip (false);
//              a folder: images, val_images, val_fraction (0.1), split_seed (0), image_size
//              (224), channels (3), mean, std, bad_images (stop | skip), cache_mb (4096),
//              decode_threads (0: every core)
// Keys (model): transformer keys + pooling (mean | cls)
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <sstream>
#include <tuple>

#include "common.h"
#include "tasks.h"
#include "vision/idx.h"
#include "vision/image_folder.h"
#include "vision/images.h"

namespace posenc::train {
namespace {

constexpr double kMean = 0.2860, kStd = 0.3530;  // Fashion-MNIST's training set

struct LabeledImages {
  at::Tensor images;  ///< [N, C, S, S] uint8
  at::Tensor labels;  ///< [N] int64
  LabeledImages first(int64_t limit) const {
    if (limit <= 0 || limit >= images.size(0)) return *this;
    return {images.narrow(0, 0, limit), labels.narrow(0, 0, limit)};
  }
};

// A seeded held-out split of each class: round(fraction n_c) of class c's images (at least one
// stays for training), drawn by a Mersenne twister from `seed`; both parts keep path order.
std::pair<LabeledImages, LabeledImages> split_by_class(const LabeledImages& all, int64_t classes,
                                                       double fraction, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto labels = all.labels.contiguous();
  const auto* label = labels.data_ptr<int64_t>();
  std::vector<bool> held(static_cast<size_t>(labels.numel()), false);
  for (int64_t c = 0; c < classes; ++c) {
    std::vector<int64_t> members;
    for (int64_t i = 0; i < labels.numel(); ++i)
      if (label[i] == c) members.push_back(i);
    std::shuffle(members.begin(), members.end(), rng);
    const auto count = static_cast<int64_t>(members.size());
    const int64_t take =
        std::min<int64_t>(count - 1, std::llround(fraction * static_cast<double>(count)));
    for (int64_t k = 0; k < take; ++k) held[static_cast<size_t>(members[k])] = true;
  }
  std::vector<int64_t> train_index, held_index;
  for (int64_t i = 0; i < labels.numel(); ++i)
    (held[static_cast<size_t>(i)] ? held_index : train_index).push_back(i);
  TORCH_CHECK(!held_index.empty(), "task: val_fraction ", fraction, " holds out no image of ",
              labels.numel(), " (raise it, or give val_images)");
  auto pick = [&](const std::vector<int64_t>& index) {
    auto i = torch::tensor(index, torch::kLong);
    return LabeledImages{all.images.index_select(0, i), all.labels.index_select(0, i)};
  };
  return {pick(train_index), pick(held_index)};
}

class ImageClassification : public Task {
 public:
  explicit ImageClassification(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const auto folder = task.optional_string("images");
    const std::string dir = task.string("data_dir", "/usr/share/datasets/fashion-mnist");
    const int64_t train_limit = task.integer("train_limit", 0);
    const int64_t eval_limit = task.integer("eval_limit", 0);
    pad_ = task.integer("pad", folder ? 0 : 2);
    patch_ = task.integer("patch", 4);
    crop_padding_ = task.integer("crop_padding", 2);
    flip_ = task.boolean("flip", true);
    erase_probability_ = task.number("erase_probability", 0.0);
    label_smoothing_ = task.number("label_smoothing", 0.0);
    eval_batch_ = task.integer("eval_batch", 500);
    eval_flip_ = task.boolean("eval_flip", false);
    if (task.has("eval_scales")) scales_ = task.numbers("eval_scales");
    vision::ImageFolderOptions from_folder;
    std::optional<std::string> val_folder;
    double val_fraction = 0.1;
    int64_t split_seed = 0;
    if (folder) {
      from_folder.size = task.integer("image_size", 224);
      from_folder.channels = task.integer("channels", 3);
      from_folder.bad = vision::bad_images_from_string(task.string("bad_images", "stop"));
      const int64_t cache_mb = task.integer("cache_mb", 4096);
      TORCH_CHECK(cache_mb > 0 && cache_mb <= (int64_t{1} << 24),
                  "task: cache_mb must be in [1, 2^24], got ", cache_mb);
      from_folder.max_cache_bytes = cache_mb << 20;
      from_folder.threads = task.integer("decode_threads", 0);
      TORCH_CHECK(from_folder.threads >= 0 && from_folder.threads <= 1024,
                  "task: decode_threads must be in [0, 1024] (0: every core), got ",
                  from_folder.threads);
      TORCH_CHECK(from_folder.channels == 1 || from_folder.channels == 3,
                  "task: channels must be 1 (gray) or 3 (RGB), got ", from_folder.channels);
      TORCH_CHECK(from_folder.size >= 1 && from_folder.size <= 4096,
                  "task: image_size must be in [1, 4096], got ", from_folder.size);
      val_folder = task.optional_string("val_images");
      val_fraction = task.number("val_fraction", 0.1);
      split_seed = task.integer("split_seed", 0);
      TORCH_CHECK(val_fraction > 0 && val_fraction < 1,
                  "task: val_fraction must be in (0, 1), got ", val_fraction);
      side_ = from_folder.size;
      channels_ = from_folder.channels;
    }
    const bool rgb = channels_ == 3;
    mean_ = per_channel(
        task, config.at("task"), "mean", channels_,
        folder ? (rgb ? std::vector<double>{0.485, 0.456, 0.406} : std::vector<double>{0.5})
               : std::vector<double>{kMean});
    std::vector<double> std_default =
        folder ? (rgb ? std::vector<double>{0.229, 0.224, 0.225} : std::vector<double>{0.5})
               : std::vector<double>{kStd};
    std_ = per_channel(task, config.at("task"), "std", channels_, std_default);
    for (double v : std_) TORCH_CHECK(v > 0, "task: std must be positive, got ", v);
    task.finish();
    TORCH_CHECK(pad_ >= 0 && patch_ > 0 && crop_padding_ >= 0 && eval_batch_ > 0,
                "task: pad, crop_padding must be >= 0 and patch, eval_batch > 0");
    // borders within the image size limit (image_size's 4096): side + 2 pad cannot overflow
    TORCH_CHECK(pad_ <= 4096, "task: pad must be in [0, 4096] pixels, got ", pad_);
    TORCH_CHECK(crop_padding_ <= 4096, "task: crop_padding must be in [0, 4096] pixels, got ",
                crop_padding_);
    TORCH_CHECK(erase_probability_ >= 0 && erase_probability_ <= 1,
                "task: erase_probability must be in [0, 1], got ", erase_probability_);
    TORCH_CHECK(label_smoothing_ >= 0 && label_smoothing_ < 1,
                "task: label_smoothing must be in [0, 1), got ", label_smoothing_);
    TORCH_CHECK(train_limit >= 0 && eval_limit >= 0,
                "task: train_limit and eval_limit must be >= 0 (0: all), got ", train_limit,
                " and ", eval_limit);
    const int64_t side = side_ + 2 * pad_;
    TORCH_CHECK(side % patch_ == 0, "task: the padded image side ", side_, " + 2 * pad = ", side,
                " is not a multiple of patch = ", patch_);
    // Checked before training, not after it: each scale must give a patch grid.
    for (double scale : scales_) {
      TORCH_CHECK(scale >= 0.25 && scale <= 8, "task: eval_scales must be in [0.25, 8], got ",
                  scale);
      TORCH_CHECK(side_at(scale) % patch_ == 0, "task: eval scale ", scale, " gives ",
                  side_at(scale), " px, not a multiple of patch = ", patch_);
    }
    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const auto pooling = pooling_from_string(model.string("pooling", "mean"));
    model.finish();
    if (folder) {
      const auto root = resolve_data_path(*folder);
      auto train_folder = vision::load_image_folder(root, from_folder);
      classes_ = train_folder.classes;
      LabeledImages all{train_folder.images, train_folder.labels};
      if (val_folder) {
        auto held =
            vision::load_image_folder(resolve_data_path(*val_folder), from_folder, classes_);
        train_ = all;
        test_ = {held.images, held.labels};
      } else {
        std::tie(train_, test_) = split_by_class(all, static_cast<int64_t>(classes_.size()),
                                                 val_fraction, static_cast<uint64_t>(split_seed));
      }
    } else {
      auto train = vision::load_fashion_mnist(true, dir);
      auto test = vision::load_fashion_mnist(false, dir);
      train_ = {train.images.unsqueeze(1), train.labels};
      test_ = {test.images.unsqueeze(1), test.labels};
      const auto& names = vision::FashionMnist::class_names();
      classes_.assign(names.begin(), names.end());
    }
    train_ = train_.first(train_limit);
    test_ = test_.first(eval_limit);
    model_ = TokenClassifier(TokenClassifierOptions(channels_ * patch_ * patch_,
                                                    static_cast<int64_t>(classes_.size()), t)
                                 .pooling(pooling),
                             encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return train_.images.size(0); }
  std::string metric_name() const override { return "accuracy"; }
  std::vector<std::string> class_names() const override { return classes_; }

  at::Tensor classify_files(const std::vector<std::string>& files) override {
    std::vector<at::Tensor> raw;
    for (const auto& file : files) raw.push_back(vision::decode_image_file(file, channels_, side_));
    auto images = on_device(prepare(torch::stack(raw), 1.0, false));
    auto patches = vision::patchify(images, patch_);
    return model_(patches.tokens, patches.positions);
  }

  nlohmann::json image_input() const override {
    return {{"channels", channels_}, {"image_size", side_}, {"pad", pad_},
            {"patch", patch_},       {"mean", mean_},       {"std", std_}};
  }

  at::Tensor train_loss(const at::Tensor& indices, double* metric) override {
    vision::Patches patches;
    at::Tensor labels;
    {
      RECORD_USER_SCOPE("posenc::data");  // a category of `posenc train --profile`
      auto images = prepare(train_.images.index_select(0, indices), 1.0, true);
      labels = on_device(train_.labels.index_select(0, indices));
      patches = vision::patchify(on_device(images), patch_);
    }
    auto logits = model_(patches.tokens, patches.positions);
    *metric = accuracy(logits.detach(), labels);
    return torch::cross_entropy_loss(logits, labels, {}, at::Reduction::Mean, -100,
                                     label_smoothing_);
  }

  Metrics evaluate() override { return evaluate_at(1.0); }

  std::vector<GeneralizationRow> generalization() override {
    std::vector<GeneralizationRow> rows;
    for (double scale : scales_) {
      const int64_t grid = side_at(scale) / patch_;
      auto restore = fit_encoder_to_grid(grid);
      auto metrics = evaluate_at(scale);
      restore();
      std::ostringstream name;
      name << "scale " << scale << "x (" << side_at(scale) << " px, " << grid << "x" << grid
           << " patches)";
      rows.push_back({name.str(), scale, metrics});
    }
    return rows;
  }

 private:
  int64_t side_at(double scale) const {
    return std::lround(static_cast<double>(side_) * scale) +
           2 * std::lround(static_cast<double>(pad_) * scale);
  }

  // uint8 [B, C, S, S] -> normalized float [B, C, S', S'] (S' = side_at(scale)).
  at::Tensor prepare(const at::Tensor& raw, double scale, bool augment) const {
    auto x = raw.to(torch::kFloat).div_(255.0);
    if (scale != 1.0) {
      const int64_t size = std::lround(static_cast<double>(side_) * scale);
      x = vision::resize_images(x, size, size);
    }
    const int64_t pad = std::lround(static_cast<double>(pad_) * scale);
    if (pad > 0) x = torch::constant_pad_nd(x, {pad, pad, pad, pad}, 0.0);
    if (augment && crop_padding_ > 0) x = vision::random_crop(x, crop_padding_);
    if (augment && flip_) x = vision::random_horizontal_flip(x);
    if (channels_ == 1) {
      x = (x - mean_[0]) / std_[0];
    } else {
      auto mean = torch::tensor(mean_, torch::kDouble).to(torch::kFloat).view({1, -1, 1, 1});
      auto std = torch::tensor(std_, torch::kDouble).to(torch::kFloat).view({1, -1, 1, 1});
      x = (x - mean) / std;
    }
    if (augment && erase_probability_ > 0) x = vision::random_erasing(x, erase_probability_, 0.0);
    return x;
  }

  Metrics evaluate_at(double scale) {
    const int64_t n = test_.images.size(0);
    double loss = 0, correct = 0;
    for (int64_t begin = 0, batch = 0; begin < n; begin += eval_batch_, ++batch) {
      if (!ranks_.mine(batch)) continue;
      const int64_t size = std::min(eval_batch_, n - begin);
      auto images = on_device(prepare(test_.images.narrow(0, begin, size), scale, false));
      auto labels = on_device(test_.labels.narrow(0, begin, size));
      auto patches = vision::patchify(images, patch_);
      auto logits = model_(patches.tokens, patches.positions);  // [size, classes]
      at::Tensor log_p;                                         // [size, classes]
      if (eval_flip_) {
        auto mirrored = vision::patchify(images.flip({-1}), patch_);
        log_p = mean_probability_log({logits, model_(mirrored.tokens, mirrored.positions)});
      } else {
        log_p = logits.log_softmax(-1);
      }
      loss += torch::nll_loss(log_p, labels, {}, at::Reduction::Sum).item<double>();
      correct += log_p.argmax(-1).eq(labels).sum().item<double>();
    }
    const auto sums = ranks_.total({loss, correct});
    loss = sums[0];
    correct = sums[1];
    return {{"loss", loss / static_cast<double>(n)},
            {"accuracy", correct / static_cast<double>(n)}};
  }

  // Grid-bound tables (learned grid, Swin's relative table) fitted to a grid x grid patch grid,
  // through the interface; returns how to undo it.
  std::function<void()> fit_encoder_to_grid(int64_t grid) {
    return model_->transformer->encoder->adapt({grid, grid});
  }

  LabeledImages train_, test_;
  std::vector<std::string> classes_;
  int64_t side_ = 28, channels_ = 1;
  std::vector<double> mean_, std_;
  int64_t pad_, patch_, crop_padding_, eval_batch_;
  bool flip_, eval_flip_ = false;
  double erase_probability_ = 0, label_smoothing_ = 0;
  std::vector<double> scales_{1.0};
  TokenClassifier model_{nullptr};
};

}  // namespace

std::unique_ptr<Task> make_image_classification(const nlohmann::json& config) {
  return std::make_unique<ImageClassification>(config);
}

}  // namespace posenc::train
