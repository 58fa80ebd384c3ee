// Patch-grid coordinates and bands; the math and its source are in posenc/functional/patch_grid.h.
#include "posenc/functional/patch_grid.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace posenc {

std::string to_string(GridCoords coords) {
  switch (coords) {
    case GridCoords::kIndex:
      return "index";
    case GridCoords::kPixel:
      return "pixel";
    case GridCoords::kCentered:
      return "centered";
  }
  return "?";
}

GridCoords grid_coords_from_string(const std::string& name) {
  if (name == "index") return GridCoords::kIndex;
  if (name == "pixel") return GridCoords::kPixel;
  if (name == "centered") return GridCoords::kCentered;
  TORCH_CHECK(false, "patch grid: unknown grid_type '", name,
              "'; expected one of: index, pixel, centered");
}

GridNormalize grid_normalize_from_string(const std::string& name) {
  if (name == "separate") return GridNormalize::kSeparate;
  if (name == "max") return GridNormalize::kMax;
  if (name == "min") return GridNormalize::kMin;
  TORCH_CHECK(false, "patch grid: unknown normalize_coords '", name,
              "'; expected one of: separate, max, min");
}

at::Tensor patch_grid(const std::vector<int64_t>& shape, const PatchGridOptions& options) {
  TORCH_CHECK(!shape.empty(), "patch grid: the shape needs at least one axis, got none");
  for (const int64_t s : shape)
    TORCH_CHECK(s >= 1, "patch grid: every axis needs >= 1 patch, got shape ",
                c10::IntArrayRef(shape));
  const auto& reference = options.reference_shape();
  TORCH_CHECK(reference.empty() || reference.size() == shape.size(),
              "patch grid: the reference shape ", c10::IntArrayRef(reference),
              " must have one size per axis of ", c10::IntArrayRef(shape));
  for (const int64_t r : reference)
    TORCH_CHECK(r >= 1, "patch grid: reference sizes must be >= 1, got ",
                c10::IntArrayRef(reference));
  TORCH_CHECK(std::isfinite(options.offset()), "patch grid: offset must be finite, got ",
              options.offset());
  TORCH_CHECK(!options.xy() || shape.size() >= 2,
              "patch grid: 'xy' indexing swaps two axes; the shape has ", shape.size());
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  double largest = 0, smallest = 0;
  if (options.coords() == GridCoords::kCentered) {
    largest = static_cast<double>(*std::max_element(shape.begin(), shape.end()));
    smallest = static_cast<double>(*std::min_element(shape.begin(), shape.end()));
  }
  std::vector<at::Tensor> axes;
  for (size_t a = 0; a < shape.size(); ++a) {
    const int64_t s = shape[a];
    at::Tensor t;
    switch (options.coords()) {
      case GridCoords::kPixel:
        t = at::linspace(-1.0, 1.0, s, f32);
        break;
      case GridCoords::kCentered: {
        const double d = options.normalize() == GridNormalize::kMax   ? largest
                         : options.normalize() == GridNormalize::kMin ? smallest
                                                                      : static_cast<double>(s);
        t = (at::arange(0.5, static_cast<double>(s), 1.0, f32) + options.offset()) / d;
        break;
      }
      case GridCoords::kIndex:
        t = at::arange(s, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) + options.offset();
        break;
    }
    if (!reference.empty())  // EVA: x / s * r, as two float32 ops
      t = t / static_cast<double>(s) * static_cast<double>(reference[a]);
    axes.push_back(t);
  }
  auto grid = at::stack(at::meshgrid(axes, "ij"), -1);  // [*shape, A]
  if (options.coords() == GridCoords::kCentered) grid = 2.0 * grid - 1.0;
  if (options.xy()) {  // meshgrid "xy": channel 0 is the second axis' coordinate
    std::vector<int64_t> order(shape.size());
    for (size_t a = 0; a < order.size(); ++a) order[a] = static_cast<int64_t>(a);
    std::swap(order[0], order[1]);
    grid = grid.index_select(-1, at::tensor(order, at::kLong));
  }
  return grid.contiguous();
}

at::Tensor patch_grid_bands(int64_t num_bands, bool in_pixels, double max_res, double temperature,
                            bool linear_bands) {
  TORCH_CHECK(num_bands >= 1, "patch grid bands: num_bands must be >= 1, got ", num_bands);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  if (in_pixels) {
    TORCH_CHECK(std::isfinite(max_res) && max_res > 0,
                "patch grid bands: max_res must be finite and > 0, got ", max_res);
    at::Tensor bands =
        linear_bands ? at::linspace(1.0, max_res / 2, num_bands, f32)
                     : at::pow(2.0, at::linspace(0.0, std::log2(max_res) - 1, num_bands, f32));
    return bands * M_PI;
  }
  TORCH_CHECK(std::isfinite(temperature) && temperature > 0,
              "patch grid bands: temperature must be finite and > 0, got ", temperature);
  const auto exponent =
      at::arange(0, num_bands, 1, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
      static_cast<double>(num_bands);
  return at::reciprocal(at::pow(temperature, exponent));
}

}  // namespace posenc
