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
  auto omega =
      torch::pow(base, -torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(dim));
  auto angles = positions.to(torch::kFloat64).unsqueeze(-1) * omega;  // [..., D/2]
  auto s = angles.sin();
  auto c = angles.cos();
  if (layout == SinusoidalLayout::kConcat) return torch::cat({s, c}, -1);
  return torch::stack({s, c}, -1).flatten(-2);  // [..., D/2, 2] -> [..., D]: sin, cos, sin, ...
}

}  // namespace posenc
