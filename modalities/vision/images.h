// Images into tokens + Positions (ViT, Dosovitskiy et al. 2021): a [B, C, H, W] batch is cut
// into p x p patches, row-major, each flattened to C*p*p values, with grid positions (h, w).
// Image files come through OpenCV (any format it reads), RGB, values in [0, 1].
// Training augmentation: random crop with zero padding, random horizontal flip.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "posenc/core/positions.h"

namespace posenc::vision {

struct Patches {
  at::Tensor tokens;    ///< [B, N, C * p * p], N = (H / p) * (W / p)
  Positions positions;  ///< Positions::grid(H / p, W / p)
};

/// images [B, C, H, W] float; H and W must be multiples of `patch`.
Patches patchify(const at::Tensor& images, int64_t patch);
/// An image file -> [C, H, W] float32 in [0, 1], RGB (or 1 channel for grayscale files).
at::Tensor load_image(const std::string& path);
/// Bilinear resize of [B, C, H, W] (antialiased when shrinking).
at::Tensor resize_images(const at::Tensor& images, int64_t height, int64_t width);
/// Random crop back to H x W after zero padding of `padding` pixels on each side.
at::Tensor random_crop(const at::Tensor& images, int64_t padding);
/// Flips each image left-right with probability 1/2.
at::Tensor random_horizontal_flip(const at::Tensor& images);
/// Random erasing (Zhong et al. 2020; timm's RandomErasing, mode "const"): with `probability`,
/// each image gets one rectangle set to `value` (all channels), its area a uniform fraction of
/// [kEraseMinArea, kEraseMaxArea] of the image and its aspect ratio log-uniform in
/// [kEraseMinAspect, kEraseMaxAspect]; up to kEraseAttempts draws for a rectangle that fits.
inline constexpr double kEraseMinArea = 0.02, kEraseMaxArea = 1.0 / 3.0;
inline constexpr double kEraseMinAspect = 0.3, kEraseMaxAspect = 1.0 / 0.3;
inline constexpr int64_t kEraseAttempts = 10;
at::Tensor random_erasing(const at::Tensor& images, double probability, double value = 0.0);

}  // namespace posenc::vision
