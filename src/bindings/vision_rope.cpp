// Vision RoPE tables whose angles are not a grid times fixed bands, as dispatcher operators
// (timm 1.0.x layers/pos_embed_sincos.py; python/posenc/timm_layers.py gives them timm's modules):
//
// posenc::patch_grid_coords(feat_shape, grid_type, ref_feat_shape, grid_offset, grid_indexing,
//                           normalize_coords) -> Tensor
//   The patch grid's coordinates [prod(feat_shape), A] float32 on the CPU, row-major over
//   feat_shape: posenc/functional/patch_grid.h (index, pixel or centered; EVA's reference shape;
//   "xy" swaps the first two channels), timm's _build_grid(...).flatten(0, -2) to the bit. The
//   coordinates a caller augments (timm's shift / jitter / rescale_coords) before the tables.
//
// posenc::dinov3_periods(dim, temperature, min_period, max_period) -> Tensor
//   DINOv3's periods [dim / 4] float32 on the CPU (timm's RotaryEmbeddingDinoV3._compute_periods):
//   min_period (max_period / min_period)^linspace(0, 1, dim / 4) when both are given, else
//   temperature^(2 i / (dim / 2)), i < dim / 4; float32 op for op as timm.
//
// posenc::rope_periods_cos_sin(coords, periods, layout) -> (cos, sin)
//   DINOv3's RoPE (Simeoni et al. 2025; timm's RotaryEmbeddingDinoV3, facebookresearch/dinov3
//   RopePositionEmbedding): coords [N, A], periods [F] ->
//     angle[n, a F + f] = (2 pi c[n, a]) / periods[f]
//   in the periods' dtype (float32 or float64), op for op as timm's _get_pos_embed_from_coords
//   (the scalar product first, then the division: not a product with 2 pi / period, which rounds
//   differently); cos, sin [N, 2 A F] laid out "half" (cat(t, t): DINOv3's rotate_half) or
//   "interleaved" (t0 t0 t1 t1 ..), in the periods' dtype.
//
// posenc::rope_mixed_cos_sin(coords, freqs, layout) -> (cos, sin)
//   RoPE-Mixed (Heo et al. 2024, "Rotary Position Embedding for Vision Transformer"; timm's
//   RotaryEmbeddingMixed / get_mixed_freqs, naver-ai/rope-vit): coords [N, 2] (x, y), learned
//   freqs [2, ..., F] (row 0 multiplies x, row 1 y; timm's [2, depth, heads, head_dim / 2]) ->
//     angle[..., n, f] = c[n, 0] freqs[0, ..., f] + c[n, 1] freqs[1, ..., f]
//   float32 (two rounded products, then their sum: timm's arithmetic); cos, sin [..., N, 2F]
//   float32, "interleaved" (timm's) or "half".
//
// All four are compositions of ATen ops (CompositeImplicitAutograd), as grid_tables.cpp's
// patch_grid_bands: autograd, fake tensors and torch.compile come from the ops they are made of.
// rope_mixed_cos_sin's frequencies are trainable parameters, so its gradients must reach them:
// they do, through ATen's own derivatives of the same ops timm runs (the same gradients).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "../kernels/dispatch/operator_checks.h"
#include "posenc/functional/patch_grid.h"
#include "posenc/functional/rope.h"
#include "registration.h"

namespace posenc::ops {

namespace {

at::Tensor patch_grid_coords_op(c10::IntArrayRef feat_shape, c10::string_view grid_type,
                                at::OptionalIntArrayRef ref_feat_shape, double grid_offset,
                                c10::string_view grid_indexing, c10::string_view normalize_coords) {
  TORCH_CHECK(!feat_shape.empty(),
              "posenc.patch_grid_coords: feat_shape must name at least one "
              "axis, got []");
  for (const int64_t s : feat_shape)
    TORCH_CHECK(s >= 1, "posenc.patch_grid_coords: feat_shape sizes must be >= 1, got ",
                feat_shape);
  const std::string indexing(grid_indexing);
  TORCH_CHECK(indexing == "ij" || indexing == "xy",
              "posenc.patch_grid_coords: grid_indexing must be 'ij' or 'xy', got '", indexing, "'");
  PatchGridOptions options;
  options.coords(grid_coords_from_string(std::string(grid_type)))
      .offset(grid_offset)
      .xy(indexing == "xy")
      .normalize(grid_normalize_from_string(std::string(normalize_coords)));
  if (ref_feat_shape.has_value()) {
    TORCH_CHECK(ref_feat_shape->size() == feat_shape.size(),
                "posenc.patch_grid_coords: "
                "ref_feat_shape must have one size per axis (",
                feat_shape.size(), "), got ", *ref_feat_shape);
    options.reference_shape(std::vector<int64_t>(ref_feat_shape->begin(), ref_feat_shape->end()));
  }
  const std::vector<int64_t> shape(feat_shape.begin(), feat_shape.end());
  return patch_grid(shape, options).view({-1, static_cast<int64_t>(shape.size())});  // [N, A]
}

at::Tensor dinov3_periods_op(int64_t dim, std::optional<double> temperature,
                             std::optional<double> min_period, std::optional<double> max_period) {
  TORCH_CHECK(dim >= 4, "posenc.dinov3_periods: dim must be >= 4 (dim / 4 periods), got ", dim);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const int64_t count = dim / 4;
  if (min_period.has_value() && max_period.has_value()) {
    TORCH_CHECK(std::isfinite(*min_period) && std::isfinite(*max_period) && *min_period > 0 &&
                    *max_period > 0,
                "posenc.dinov3_periods: min_period and max_period must be finite and > 0, got ",
                *min_period, " and ", *max_period);
    const auto exponents = at::linspace(0, 1, count, f32);
    return *min_period * at::pow(*max_period / *min_period, exponents);
  }
  TORCH_CHECK(temperature.has_value(),
              "posenc.dinov3_periods: give min_period and max_period, or temperature");
  TORCH_CHECK(std::isfinite(*temperature) && *temperature > 0,
              "posenc.dinov3_periods: temperature must be finite and > 0, got ", *temperature);
  const auto exponents = 2.0 * at::arange(count, f32) / (dim / 2);
  return at::pow(*temperature, exponents);
}

// angles [..., F] -> (cos, sin) [..., 2F] in the layout's order (timm's _rope_layout).
std::tuple<at::Tensor, at::Tensor> laid_out(const at::Tensor& angles, c10::string_view layout) {
  const RopeLayout pairs = rope_layout_from_string(std::string(layout));
  return {rope_expand(angles.cos(), pairs), rope_expand(angles.sin(), pairs)};
}

std::tuple<at::Tensor, at::Tensor> rope_periods_cos_sin_op(const at::Tensor& coords,
                                                           const at::Tensor& periods,
                                                           c10::string_view layout) {
  const char* op = "posenc.rope_periods_cos_sin";
  check_same_device(op, {{"coords", coords}, {"periods", periods}});
  TORCH_CHECK(coords.dim() == 2 && coords.sym_size(1) >= 1,
              "posenc.rope_periods_cos_sin: coords must be [N, A] with A >= 1, got shape ",
              coords.sym_sizes());
  TORCH_CHECK(at::isFloatingType(coords.scalar_type()) ||
                  at::isIntegralType(coords.scalar_type(), /*includeBool=*/false),
              "posenc.rope_periods_cos_sin: coords must be real numbers, got ",
              coords.scalar_type());
  TORCH_CHECK(periods.dim() == 1 && periods.sym_size(0) >= 1,
              "posenc.rope_periods_cos_sin: periods must be [F] with F >= 1, got shape ",
              periods.sym_sizes());
  TORCH_CHECK(periods.scalar_type() == at::kFloat || periods.scalar_type() == at::kDouble,
              "posenc.rope_periods_cos_sin: periods must be float32 (timm's arithmetic) or "
              "float64, got ",
              periods.scalar_type());
  // timm: coords[:, :, None].to(periods' dtype); 2 * math.pi * coords / periods[None, None, :]
  const auto c = coords.unsqueeze(-1).to(periods.scalar_type());             // [N, A, 1]
  const auto angles = (2 * M_PI * c / periods.view({1, 1, -1})).flatten(1);  // [N, A F]
  return laid_out(angles, layout);
}

std::tuple<at::Tensor, at::Tensor> rope_mixed_cos_sin_op(const at::Tensor& coords,
                                                         const at::Tensor& freqs,
                                                         c10::string_view layout) {
  const char* op = "posenc.rope_mixed_cos_sin";
  check_same_device(op, {{"coords", coords}, {"freqs", freqs}});
  TORCH_CHECK(coords.dim() == 2 && coords.sym_size(1) == 2,
              "posenc.rope_mixed_cos_sin: coords must be [N, 2] (x, y), got shape ",
              coords.sym_sizes());
  TORCH_CHECK(coords.scalar_type() == at::kFloat,
              "posenc.rope_mixed_cos_sin: coords must be float32 (timm's arithmetic), got ",
              coords.scalar_type());
  TORCH_CHECK(freqs.dim() >= 2 && freqs.sym_size(0) == 2 && freqs.sym_size(-1) >= 1,
              "posenc.rope_mixed_cos_sin: freqs must be [2, ..., F] (x and y rows), got shape ",
              freqs.sym_sizes());
  TORCH_CHECK(freqs.scalar_type() == at::kFloat,
              "posenc.rope_mixed_cos_sin: freqs must be float32 (timm casts them with .float() "
              "first), got ",
              freqs.scalar_type());
  // timm's get_mixed_freqs: t_x.unsqueeze(-1) * freqs[0].unsqueeze(-2), the same for y, summed
  const auto x = coords.select(1, 0).contiguous().unsqueeze(-1);  // [N, 1]
  const auto y = coords.select(1, 1).contiguous().unsqueeze(-1);
  const auto angles = x * freqs[0].unsqueeze(-2) + y * freqs[1].unsqueeze(-2);  // [..., N, F]
  return laid_out(angles, layout);
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "dinov3_periods(int dim, float? temperature=100., float? min_period=None, "
      "float? max_period=None) -> Tensor");
  m.impl("dinov3_periods", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(dinov3_periods_op));
  m.def(
      "patch_grid_coords(int[] feat_shape, str grid_type=\"index\", int[]? ref_feat_shape=None, "
      "float grid_offset=0., str grid_indexing=\"ij\", str normalize_coords=\"separate\") -> "
      "Tensor");
  m.impl("patch_grid_coords", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(patch_grid_coords_op));
  m.def(
      "rope_periods_cos_sin(Tensor coords, Tensor periods, str layout=\"half\") -> "
      "(Tensor, Tensor)");
  m.impl("rope_periods_cos_sin", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(rope_periods_cos_sin_op));
  m.def(
      "rope_mixed_cos_sin(Tensor coords, Tensor freqs, str layout=\"interleaved\") -> "
      "(Tensor, Tensor)");
  m.impl("rope_mixed_cos_sin", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(rope_mixed_cos_sin_op));
}

}  // namespace posenc::ops
