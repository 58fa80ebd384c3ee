// image_classification: a ViT (Dosovitskiy et al. 2021) on Fashion-MNIST (Xiao et al. 2017).
//   image [28, 28] uint8 -> /255 -> (resize by `scale`) -> zero border `pad` px (scaled too)
//   -> normalize (mean 0.2860, std 0.3530, the training set's) -> p x p patches with grid positions
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
// Keys (task): data_dir, train_limit, eval_limit, pad (2), patch (4), crop_padding (2),
//              flip (true), erase_probability (0), label_smoothing (0), eval_scales ([1.0]),
//              eval_batch (500), eval_flip (false)
// Keys (model): transformer keys + pooling (mean | cls)
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <sstream>

#include "common.h"
#include "tasks.h"
#include "vision/idx.h"
#include "vision/images.h"

namespace posenc::train {
namespace {

constexpr double kMean = 0.2860, kStd = 0.3530;

class ImageClassification : public Task {
 public:
  explicit ImageClassification(const nlohmann::json& config) {
    ConfigReader task(config.at("task"), "task");
    task.allow("type");
    const std::string dir = task.string("data_dir", "/usr/share/datasets/fashion-mnist");
    const int64_t train_limit = task.integer("train_limit", 0);
    const int64_t eval_limit = task.integer("eval_limit", 0);
    pad_ = task.integer("pad", 2);
    patch_ = task.integer("patch", 4);
    crop_padding_ = task.integer("crop_padding", 2);
    flip_ = task.boolean("flip", true);
    erase_probability_ = task.number("erase_probability", 0.0);
    label_smoothing_ = task.number("label_smoothing", 0.0);
    eval_batch_ = task.integer("eval_batch", 500);
    eval_flip_ = task.boolean("eval_flip", false);
    if (task.has("eval_scales")) scales_ = task.numbers("eval_scales");
    task.finish();
    TORCH_CHECK(pad_ >= 0 && patch_ > 0 && crop_padding_ >= 0 && eval_batch_ > 0,
                "task: pad, crop_padding must be >= 0 and patch, eval_batch > 0");
    TORCH_CHECK(erase_probability_ >= 0 && erase_probability_ <= 1,
                "task: erase_probability must be in [0, 1], got ", erase_probability_);
    TORCH_CHECK(label_smoothing_ >= 0 && label_smoothing_ < 1,
                "task: label_smoothing must be in [0, 1), got ", label_smoothing_);
    TORCH_CHECK(train_limit >= 0 && eval_limit >= 0,
                "task: train_limit and eval_limit must be >= 0 (0: all), got ", train_limit,
                " and ", eval_limit);
    // Checked before training, not after it: each scale must give a patch grid.
    for (double scale : scales_) {
      TORCH_CHECK(scale >= 0.25 && scale <= 8, "task: eval_scales must be in [0.25, 8], got ",
                  scale);
      TORCH_CHECK(side_at(scale) % patch_ == 0, "task: eval scale ", scale, " gives ",
                  side_at(scale), " px, not a multiple of patch = ", patch_);
    }
    train_ = vision::load_fashion_mnist(true, dir);
    test_ = vision::load_fashion_mnist(false, dir);
    if (train_limit > 0)
      train_ = {train_.images.narrow(0, 0, std::min(train_limit, train_.images.size(0))),
                train_.labels.narrow(0, 0, std::min(train_limit, train_.labels.size(0)))};
    if (eval_limit > 0)
      test_ = {test_.images.narrow(0, 0, std::min(eval_limit, test_.images.size(0))),
               test_.labels.narrow(0, 0, std::min(eval_limit, test_.labels.size(0)))};

    ConfigReader model(config.at("model"), "model");
    auto t = transformer_options(model);
    const auto pooling = pooling_from_string(model.string("pooling", "mean"));
    model.finish();
    const int64_t side = 28 + 2 * pad_;
    TORCH_CHECK(side % patch_ == 0, "task: the padded image side 28 + 2 * pad = ", side,
                " is not a multiple of patch = ", patch_);
    model_ = TokenClassifier(TokenClassifierOptions(patch_ * patch_, 10, t).pooling(pooling),
                             encoder_from(config, "encoder", t));
  }

  std::shared_ptr<torch::nn::Module> model() override { return model_.ptr(); }
  int64_t train_size() const override { return train_.images.size(0); }
  std::string metric_name() const override { return "accuracy"; }

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
    return std::lround(28 * scale) + 2 * std::lround(static_cast<double>(pad_) * scale);
  }

  // uint8 [B, 28, 28] -> normalized float [B, 1, S, S].
  at::Tensor prepare(const at::Tensor& raw, double scale, bool augment) const {
    auto x = raw.to(torch::kFloat).div_(255.0).unsqueeze(1);
    if (scale != 1.0) {
      const int64_t size = std::lround(28 * scale);
      x = vision::resize_images(x, size, size);
    }
    const int64_t pad = std::lround(static_cast<double>(pad_) * scale);
    if (pad > 0) x = torch::constant_pad_nd(x, {pad, pad, pad, pad}, 0.0);
    if (augment && crop_padding_ > 0) x = vision::random_crop(x, crop_padding_);
    if (augment && flip_) x = vision::random_horizontal_flip(x);
    x = (x - kMean) / kStd;
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

  vision::FashionMnist train_, test_;
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
