// Patch-grid tables as dispatcher operators (what timm's layers compute;
// python/posenc/timm_layers.py gives them timm's signatures):
//
// posenc::resample_grid_table(table, old_size, new_size, num_prefix_tokens, mode, antialias,
//                             align_corners) -> Tensor
//   table [prefix + H*W, D] -> [prefix + H'*W', D]: the prefix rows (CLS, registers) unchanged,
//   the grid rows laid out as an image [1, D, H, W] and interpolated to [H', W'] (bicubic or
//   bilinear, antialias, align_corners), or AST's per-axis cut/stretch ("ast"). timm's
//   resample_abs_pos_embed (layers/pos_embed.py); posenc/encoders/learned_grid.h states the rule.
//
// posenc::axial_sincos_table(coords, dim, temperature, layout) -> Tensor
//   coords [..., N, A] -> [..., N, dim] float64 with F = dim / (2A) frequencies per axis,
//   omega_i = temperature^(-i/F): "timm" [sin(a_0 w) .. sin(a_A-1 w), cos(a_0 w) .. cos(a_A-1 w)]
//   (timm build_sincos2d_pos_embed), "mae" per axis [sin, cos], axes in reverse order (MAE's
//   get_2d_sincos_pos_embed); posenc/functional/sinusoidal.h.
//
// posenc::patch_grid_bands(num_bands, in_pixels, max_res, temperature, linear_bands) -> Tensor
//   [F] float32 axial frequency bands: pi * linspace(1, max_res / 2, F) (or its log spacing) in
//   pixels, else temperature^(-i/F) (timm's pixel_freq_bands / freq_bands).
//
// posenc::patch_grid_rope(feat_shape, bands, grid_type, ref_feat_shape, grid_offset,
//                         grid_indexing, normalize_coords, layout) -> (cos, sin)
//   Axial RoPE tables [N, 2 A F] for a grid feat_shape (N = prod, A axes) with F bands per axis:
//   pair (a, f) rotates by c_a * bands[f], c_a the grid coordinates of posenc/functional/
//   patch_grid.h (index, pixel or centered; EVA's reference shape; "xy" swaps the first two
//   channels), axis-major, laid out interleaved (t0 t0 t1 t1 ..: timm's default) or half
//   (cat(t, t): rotate_half). float32 bands: timm's float32 products (its tables to the bit);
//   float64 bands: exact angles, float32 tables. timm's build_rotary_pos_embed returns (sin, cos).
//
// The first three are compositions of ATen ops (CompositeImplicitAutograd): autograd, fake
// tensors and torch.compile come from the ops they are made of. patch_grid_rope is registered per
// dispatch key (its grid is built from data), its tables have no gradient, and its fake kernel
// is in python/posenc/_meta.py.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "posenc/encoders/learned_grid.h"
#include "posenc/functional/patch_grid.h"
#include "posenc/functional/rope.h"
#include "posenc/functional/sinusoidal.h"
#include "registration.h"

namespace posenc::ops {

namespace {

std::pair<int64_t, int64_t> grid_size(c10::IntArrayRef size, const char* name) {
  TORCH_CHECK(size.size() == 2, "posenc.resample_grid_table: ", name,
              " must be [height, width], got ", size);
  TORCH_CHECK(size[0] > 0 && size[1] > 0, "posenc.resample_grid_table: ", name,
              " must be positive, got ", size);
  return {size[0], size[1]};
}

at::Tensor resample_grid_table_op(const at::Tensor& table, c10::IntArrayRef old_size,
                                  c10::IntArrayRef new_size, int64_t num_prefix_tokens,
                                  c10::string_view mode, bool antialias, bool align_corners) {
  TORCH_CHECK(at::isFloatingType(table.scalar_type()),
              "posenc.resample_grid_table: table must be floating point, got ",
              table.scalar_type());
  TORCH_CHECK(num_prefix_tokens >= 0,
              "posenc.resample_grid_table: num_prefix_tokens must be >= 0, got ",
              num_prefix_tokens);
  const auto [old_h, old_w] = grid_size(old_size, "old_size");
  const auto [new_h, new_w] = grid_size(new_size, "new_size");
  return resample_grid_table(
      table, old_h, old_w, new_h, new_w, num_prefix_tokens,
      GridResample().mode(std::string(mode)).antialias(antialias).align_corners(align_corners));
}

at::Tensor axial_sincos_table_op(const at::Tensor& coords, int64_t dim, double temperature,
                                 c10::string_view layout) {
  TORCH_CHECK(at::isFloatingType(coords.scalar_type()) || at::isIntegralType(coords.scalar_type(),
                                                                             /*includeBool=*/false),
              "posenc.axial_sincos_table: coords must be numbers, got ", coords.scalar_type());
  return axial_sincos_table(coords, dim, temperature,
                            axial_sincos_layout_from_string(std::string(layout)));
}

at::Tensor patch_grid_bands_op(int64_t num_bands, bool in_pixels, double max_res,
                               double temperature, bool linear_bands) {
  return patch_grid_bands(num_bands, in_pixels, max_res, temperature, linear_bands);
}

std::tuple<at::Tensor, at::Tensor> patch_grid_rope_op(
    c10::IntArrayRef feat_shape, const at::Tensor& bands, c10::string_view grid_type,
    at::OptionalIntArrayRef ref_feat_shape, double grid_offset, c10::string_view grid_indexing,
    c10::string_view normalize_coords, c10::string_view layout) {
  TORCH_CHECK(bands.dim() == 1 && bands.numel() >= 1,
              "posenc.patch_grid_rope: bands must be [F] with F >= 1, got shape ", bands.sizes());
  TORCH_CHECK(bands.scalar_type() == at::kFloat || bands.scalar_type() == at::kDouble,
              "posenc.patch_grid_rope: bands must be float32 (timm's arithmetic) or float64 "
              "(exact angles), got ",
              bands.scalar_type());
  const std::string indexing(grid_indexing);
  TORCH_CHECK(indexing == "ij" || indexing == "xy",
              "posenc.patch_grid_rope: grid_indexing must be 'ij' or 'xy', got '", indexing, "'");
  PatchGridOptions options;
  options.coords(grid_coords_from_string(std::string(grid_type)))
      .offset(grid_offset)
      .xy(indexing == "xy")
      .normalize(grid_normalize_from_string(std::string(normalize_coords)));
  if (ref_feat_shape.has_value())
    options.reference_shape(std::vector<int64_t>(ref_feat_shape->begin(), ref_feat_shape->end()));
  const std::vector<int64_t> shape(feat_shape.begin(), feat_shape.end());
  const auto axes = static_cast<int64_t>(shape.size());
  const auto grid = patch_grid(shape, options).view({-1, axes}).to(bands.device());  // [N, A]
  const std::vector<int64_t> sections(shape.size(), bands.size(0));  // axis-major pairs
  auto [cos, sin] =
      rope_cos_sin_sections(grid, bands.repeat({axes}), sections, RopeSectionLayout::kContiguous);
  const RopeLayout pairs = rope_layout_from_string(std::string(layout));
  return {rope_expand(cos, pairs).contiguous(), rope_expand(sin, pairs).contiguous()};
}

// The tables are data: bands that ask for a gradient are one line, never a silent None.
std::tuple<at::Tensor, at::Tensor> patch_grid_rope_autograd(
    c10::IntArrayRef feat_shape, const at::Tensor& bands, c10::string_view grid_type,
    at::OptionalIntArrayRef ref_feat_shape, double grid_offset, c10::string_view grid_indexing,
    c10::string_view normalize_coords, c10::string_view layout) {
  TORCH_CHECK(!(at::GradMode::is_enabled() && bands.requires_grad()),
              "posenc.patch_grid_rope: the tables have no gradient with respect to the bands "
              "(learned frequencies: compute the angles with torch ops)");
  at::AutoDispatchBelowADInplaceOrView guard;  // on to the CPU/CUDA kernel, or the fake one
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("posenc::patch_grid_rope", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(
              c10::IntArrayRef, const at::Tensor&, c10::string_view, at::OptionalIntArrayRef,
              double, c10::string_view, c10::string_view, c10::string_view)>();
  return op.call(feat_shape, bands, grid_type, ref_feat_shape, grid_offset, grid_indexing,
                 normalize_coords, layout);
}

}  // namespace

POSENC_LIBRARY_FRAGMENT(m) {
  m.def(
      "patch_grid_bands(int num_bands, bool in_pixels=True, float max_res=224., "
      "float temperature=10000., bool linear_bands=False) -> Tensor");
  m.impl("patch_grid_bands", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(patch_grid_bands_op));
  m.def(
      "patch_grid_rope(int[] feat_shape, Tensor bands, str grid_type=\"index\", "
      "int[]? ref_feat_shape=None, float grid_offset=0., str grid_indexing=\"ij\", "
      "str normalize_coords=\"separate\", str layout=\"interleaved\") -> (Tensor, Tensor)");

  m.def(
      "resample_grid_table(Tensor table, int[2] old_size, int[2] new_size, "
      "int num_prefix_tokens=0, str mode=\"bicubic\", bool antialias=True, "
      "bool align_corners=False) -> Tensor");
  m.impl("resample_grid_table", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(resample_grid_table_op));
  m.def(
      "axial_sincos_table(Tensor coords, int dim, float temperature=10000.0, "
      "str layout=\"timm\") -> Tensor");
  m.impl("axial_sincos_table", c10::DispatchKey::CompositeImplicitAutograd,
         TORCH_FN(axial_sincos_table_op));
}

// patch_grid_rope builds its grid from data (a fake tensor has none): per key, with a fake kernel
// in python/posenc/_meta.py.
POSENC_LIBRARY_IMPL(CPU, m) { m.impl("patch_grid_rope", TORCH_FN(patch_grid_rope_op)); }
POSENC_LIBRARY_IMPL(CUDA, m) { m.impl("patch_grid_rope", TORCH_FN(patch_grid_rope_op)); }
POSENC_LIBRARY_IMPL(Autograd, m) { m.impl("patch_grid_rope", TORCH_FN(patch_grid_rope_autograd)); }

}  // namespace posenc::ops
