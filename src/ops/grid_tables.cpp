// Patch-grid tables as dispatcher operators (what timm's layers compute; python/posenc/timm.py
// gives them timm's signatures):
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
// Both are compositions of ATen ops (CompositeImplicitAutograd): autograd, fake tensors and
// torch.compile come from the ops they are made of.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "posenc/encoders/learned_grid.h"
#include "posenc/functional/sinusoidal.h"

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

}  // namespace

TORCH_LIBRARY_FRAGMENT(posenc, m) {
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

}  // namespace posenc::ops
