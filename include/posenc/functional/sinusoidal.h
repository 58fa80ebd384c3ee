// Sinusoidal position tables (Vaswani et al. 2017, "Attention Is All You Need", sec. 3.5):
//   omega_i = base^(-2i/D),  i = 0 .. D/2-1
//   interleaved (Vaswani, Informer, VideoMAE):  PE[p, 2i] = sin(p omega_i), PE[p, 2i+1] = cos(p
//   omega_i) concat      (MAE get_1d_sincos_pos_embed):  PE[p, i]  = sin(p omega_i), PE[p, D/2+i] =
//   cos(p omega_i)
// Positions may be fractional (timestamps); angles are computed in float64.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace posenc {

enum class SinusoidalLayout { kInterleaved, kConcat };
std::string to_string(SinusoidalLayout layout);
SinusoidalLayout sinusoidal_layout_from_string(const std::string& name);

/// positions: [...] (any float dtype) -> table [..., dim] float64. dim must be even.
at::Tensor sinusoidal_table(const at::Tensor& positions, int64_t dim, double base,
                            SinusoidalLayout layout);

/// Multi-axis sin-cos (2D patch grids, 3D video) from per-axis pieces; F = D / (2A) frequencies
/// per axis, omega_i = temperature^(-i/F):
///   kTimm  [sin(a_0 w), .., sin(a_{A-1} w), cos(a_0 w), .., cos(a_{A-1} w)]
///          (timm build_sincos2d_pos_embed: sin(h), sin(w), cos(h), cos(w))
///   kMae   per axis [sin(a w), cos(a w)], axes in reverse order (MAE get_2d_sincos_pos_embed
///          builds its grid with meshgrid(grid_w, grid_h): the width coordinate comes first)
enum class AxialSincosLayout { kTimm, kMae };
std::string to_string(AxialSincosLayout layout);
AxialSincosLayout axial_sincos_layout_from_string(const std::string& name);

/// coords [..., N, A] -> table [..., N, dim] float64; dim must be divisible by 2A.
at::Tensor axial_sincos_table(const at::Tensor& coords, int64_t dim, double temperature,
                              AxialSincosLayout layout);

}  // namespace posenc
