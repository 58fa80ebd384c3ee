// Patchify, image files, resize and augmentation; see images.h.
#include "images.h"

#include <torch/torch.h>

#include <cmath>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

namespace posenc::vision {

Patches patchify(const at::Tensor& images, int64_t patch) {
  TORCH_CHECK(images.dim() == 4, "patchify: images must be [B, C, H, W], got ", images.sizes());
  TORCH_CHECK(patch > 0, "patchify: patch size must be positive, got ", patch);
  const int64_t b = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  TORCH_CHECK(h % patch == 0 && w % patch == 0, "patchify: image size ", h, "x", w,
              " is not divisible by the patch size ", patch, " (resize or crop to a multiple)");
  const int64_t gh = h / patch, gw = w / patch;
  // [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p] -> [B, gh * gw, C * p * p]
  auto tokens = images.reshape({b, c, gh, patch, gw, patch})
                    .permute({0, 2, 4, 1, 3, 5})
                    .reshape({b, gh * gw, c * patch * patch});
  return {tokens, Positions::grid(gh, gw)};
}

at::Tensor load_image(const std::string& path) {
  cv::Mat image = cv::imread(path, cv::IMREAD_UNCHANGED);
  TORCH_CHECK(!image.empty(), "load_image: cannot read '", path,
              "' (missing, unreadable or not an image OpenCV decodes)");
  cv::Mat converted;
  if (image.channels() == 1) {
    converted = image;
  } else if (image.channels() == 4) {
    cv::cvtColor(image, converted, cv::COLOR_BGRA2RGB);
  } else {
    cv::cvtColor(image, converted, cv::COLOR_BGR2RGB);
  }
  cv::Mat as_float;
  const double scale = converted.depth() == CV_16U ? 1.0 / 65535 : 1.0 / 255;
  converted.convertTo(as_float, CV_32F, scale);
  auto hwc = torch::from_blob(as_float.data, {as_float.rows, as_float.cols, as_float.channels()},
                              torch::kFloat32);
  // a copy out of the cv::Mat, always: with C = 1 the permute is already contiguous, and
  // .contiguous() would return a view of memory the Mat frees on return
  return hwc.permute({2, 0, 1}).clone(at::MemoryFormat::Contiguous);
}

at::Tensor resize_images(const at::Tensor& images, int64_t height, int64_t width) {
  TORCH_CHECK(images.dim() == 4, "resize_images: images must be [B, C, H, W], got ",
              images.sizes());
  TORCH_CHECK(height > 0 && width > 0, "resize_images: size must be positive, got ", height, "x",
              width);
  namespace F = torch::nn::functional;
  const bool shrink = height < images.size(2) || width < images.size(3);
  return F::interpolate(images.to(torch::kFloat32), F::InterpolateFuncOptions()
                                                        .size(std::vector<int64_t>{height, width})
                                                        .mode(torch::kBilinear)
                                                        .align_corners(false)
                                                        .antialias(shrink));
}

at::Tensor random_crop(const at::Tensor& images, int64_t padding) {
  TORCH_CHECK(images.dim() == 4, "random_crop: images must be [B, C, H, W], got ", images.sizes());
  TORCH_CHECK(padding >= 0, "random_crop: padding must be >= 0, got ", padding);
  if (padding == 0) return images;
  const int64_t h = images.size(2), w = images.size(3);
  auto padded = torch::constant_pad_nd(images, {padding, padding, padding, padding}, 0);
  auto offsets = torch::randint(0, 2 * padding + 1, {images.size(0), 2}, torch::kLong);
  std::vector<at::Tensor> crops;
  for (int64_t i = 0; i < images.size(0); ++i) {
    const int64_t dy = offsets[i][0].item<int64_t>(), dx = offsets[i][1].item<int64_t>();
    crops.push_back(padded[i].narrow(1, dy, h).narrow(2, dx, w));
  }
  return torch::stack(crops);
}

at::Tensor random_horizontal_flip(const at::Tensor& images) {
  TORCH_CHECK(images.dim() == 4, "random_horizontal_flip: images must be [B, C, H, W], got ",
              images.sizes());
  auto flip = torch::rand({images.size(0)}) < 0.5;
  return torch::where(flip.view({-1, 1, 1, 1}), images.flip({3}), images);
}

at::Tensor random_erasing(const at::Tensor& images, double probability, double value) {
  TORCH_CHECK(images.dim() == 4, "random_erasing: images must be [B, C, H, W], got ",
              images.sizes());
  TORCH_CHECK(probability >= 0 && probability <= 1,
              "random_erasing: probability must be in [0, 1], got ", probability);
  if (probability == 0) return images;
  const int64_t b = images.size(0), h = images.size(2), w = images.size(3);
  // All random numbers in two draws: [B] (erase or not) and [B, attempts, 4] uniforms.
  auto erase = (torch::rand({b}, torch::kDouble) < probability).contiguous();
  auto u = torch::rand({b, kEraseAttempts, 4}, torch::kDouble).contiguous();
  auto e = erase.accessor<bool, 1>();
  auto a = u.accessor<double, 3>();
  auto out = images.clone();
  const double log_min = std::log(kEraseMinAspect), log_max = std::log(kEraseMaxAspect);
  for (int64_t i = 0; i < b; ++i) {
    if (!e[i]) continue;
    for (int64_t k = 0; k < kEraseAttempts; ++k) {
      const double area = static_cast<double>(h * w) *
                          (kEraseMinArea + (kEraseMaxArea - kEraseMinArea) * a[i][k][0]);
      const double aspect = std::exp(log_min + (log_max - log_min) * a[i][k][1]);
      const int64_t eh = std::lround(std::sqrt(area * aspect));
      const int64_t ew = std::lround(std::sqrt(area / aspect));
      if (eh < 1 || ew < 1 || eh >= h || ew >= w) continue;
      const int64_t top = std::min(h - eh, static_cast<int64_t>(a[i][k][2] * (h - eh + 1)));
      const int64_t left = std::min(w - ew, static_cast<int64_t>(a[i][k][3] * (w - ew + 1)));
      out[i].narrow(1, top, eh).narrow(2, left, ew).fill_(value);
      break;
    }
  }
  return out;
}

}  // namespace posenc::vision
