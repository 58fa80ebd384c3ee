// Patch-grid coordinates and axial frequency bands for vision RoPE, in timm's conventions
// (timm/layers/pos_embed_sincos.py: _build_grid, pixel_freq_bands, freq_bands; used by
// RotaryEmbedding / RotaryEmbeddingCat in EVA-02, ViT-RoPE, DINOv3-style towers).
//
// A grid of shape (s_0, .., s_{A-1}) gets, per axis a, the coordinates c_a[j]:
//   kIndex     j + offset                                   (float32 of the int64 index)
//   kPixel     linspace(-1, 1, s_a)[j]
//   kCentered  2 (j + 0.5 + offset) / d_a - 1, d_a = s_a (separate), max_b s_b or min_b s_b
// A reference (pretraining) shape r rescales c_a -> c_a / s_a * r_a (EVA's fine-tune rule; before
// the centered map to [-1, 1]). The grid is [*shape, A]; kXy swaps the first two coordinate
// channels (meshgrid's "xy"), the spatial layout stays shape's. All in float32, op for op as timm
// computes it, so tables built on it equal timm's to the bit.
//
// Bands (F per axis):
//   in pixels  pi * linspace(1, max_res / 2, F)            (linear)
//              pi * 2^linspace(0, log2(max_res) - 1, F)    (log)
//   else       1 / temperature^(i / F), i = 0 .. F-1       (the ViT/RoPE ladder)
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <string>
#include <vector>

namespace posenc {

/// How a patch grid's coordinates are spaced (timm's grid_type).
enum class GridCoords { kIndex, kPixel, kCentered };
std::string to_string(GridCoords coords);
GridCoords grid_coords_from_string(const std::string& name);

/// The denominator of centered coordinates (timm's normalize_coords).
enum class GridNormalize { kSeparate, kMax, kMin };
GridNormalize grid_normalize_from_string(const std::string& name);

struct PatchGridOptions {
  TORCH_ARG(GridCoords, coords) = GridCoords::kIndex;
  /// Pretraining shape to rescale to (EVA); empty: none.
  TORCH_ARG(std::vector<int64_t>, reference_shape) = {};
  /// Added to index and centered coordinates.
  TORCH_ARG(double, offset) = 0.0;
  /// Swap the first two coordinate channels (meshgrid indexing "xy" instead of "ij").
  TORCH_ARG(bool, xy) = false;
  TORCH_ARG(GridNormalize, normalize) = GridNormalize::kSeparate;
};

/// shape (s_0, .., s_{A-1}) -> coordinates [*shape, A] float32.
at::Tensor patch_grid(const std::vector<int64_t>& shape, const PatchGridOptions& options);

/// F frequency bands [F] float32 (see the file's head).
at::Tensor patch_grid_bands(int64_t num_bands, bool in_pixels, double max_res, double temperature,
                            bool linear_bands);

}  // namespace posenc
