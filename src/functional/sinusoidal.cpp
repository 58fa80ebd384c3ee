// Sinusoidal tables; formula and layouts in include/posenc/functional/sinusoidal.h.
#include "posenc/functional/sinusoidal.h"

#include <torch/torch.h>

namespace posenc {

std::string to_string(SinusoidalLayout layout) {
  switch (layout) {
    case SinusoidalLayout::kInterleaved:
      return "interleaved";
    case SinusoidalLayout::kConcat:
      return "concat";
  }
  return "unknown";
}

SinusoidalLayout sinusoidal_layout_from_string(const std::string& name) {
  if (name == "interleaved") return SinusoidalLayout::kInterleaved;
  if (name == "concat") return SinusoidalLayout::kConcat;
  TORCH_CHECK(false, "sinusoidal: unknown layout '", name,
              "'; expected one of: interleaved, concat");
}

at::Tensor sinusoidal_table(const at::Tensor& positions, int64_t dim, double base,
                            SinusoidalLayout layout) {
  TORCH_CHECK(dim > 0 && dim % 2 == 0, "sinusoidal: dim must be positive and even, got ", dim);
  TORCH_CHECK(base > 0 && std::isfinite(base), "sinusoidal: base must be positive, got ", base);
  // omega: [D/2]
  const auto doubles = positions.options().dtype(torch::kFloat64);  // where the positions are
  auto omega = torch::pow(base, -torch::arange(0, dim, 2, doubles) / static_cast<double>(dim));
  auto angles = positions.to(torch::kFloat64).unsqueeze(-1) * omega;  // [..., D/2]
  auto s = angles.sin();
  auto c = angles.cos();
  if (layout == SinusoidalLayout::kConcat) return torch::cat({s, c}, -1);
  return torch::stack({s, c}, -1).flatten(-2);  // [..., D/2, 2] -> [..., D]: sin, cos, sin, ...
}

std::string to_string(AxialSincosLayout layout) {
  return layout == AxialSincosLayout::kTimm ? "timm" : "mae";
}

AxialSincosLayout axial_sincos_layout_from_string(const std::string& name) {
  if (name == "timm") return AxialSincosLayout::kTimm;
  if (name == "mae") return AxialSincosLayout::kMae;
  TORCH_CHECK(false, "axial_sincos: unknown layout '", name, "'; expected one of: timm, mae");
}

at::Tensor axial_sincos_table(const at::Tensor& coords, int64_t dim, double temperature,
                              AxialSincosLayout layout) {
  TORCH_CHECK(coords.dim() >= 2, "axial_sincos: coords must be [..., N, A], got ", coords.sizes());
  const int64_t axes = coords.size(-1);
  TORCH_CHECK(dim > 0 && dim % (2 * axes) == 0,
              "axial_sincos: dim must be divisible by 2 * axes = ", 2 * axes, ", got ", dim);
  TORCH_CHECK(temperature > 0, "axial_sincos: temperature must be positive, got ", temperature);
  const int64_t f = dim / (2 * axes);
  auto omega = torch::pow(temperature, -torch::arange(f, coords.options().dtype(torch::kFloat64)) /
                                           static_cast<double>(f));
  auto angles = coords.to(torch::kFloat64).unsqueeze(-1) * omega;  // [..., N, A, F]
  if (layout == AxialSincosLayout::kTimm)
    return torch::cat({angles.sin().flatten(-2), angles.cos().flatten(-2)}, -1);
  std::vector<at::Tensor> blocks;
  for (int64_t a = axes - 1; a >= 0; --a) {
    auto axis = angles.select(-2, a);
    blocks.push_back(axis.sin());
    blocks.push_back(axis.cos());
  }
  return torch::cat(blocks, -1);
}

}  // namespace posenc
