// Fractional RoPE (LTX-2); the math and its source are in posenc/functional/rope_fractional.h.
// Each line below is one line of diffusers' LTX2AudioVideoRotaryPosEmbed.forward, the same ATen
// op on the same dtype, so the float32 results are its bits.
#include "posenc/functional/rope_fractional.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

at::Tensor rope_fractional_frequencies(double theta, int64_t count, bool double_precision) {
  TORCH_CHECK(theta > 0 && std::isfinite(theta), "rope_fractional: theta must be positive, got ",
              theta);
  TORCH_CHECK(count >= 1, "rope_fractional: needs at least one frequency, got ", count);
  const auto dtype = double_precision ? torch::kFloat64 : torch::kFloat32;
  // pow_indices = torch.pow(theta, torch.linspace(0.0, 1.0, steps=F, dtype=freqs_dtype))
  auto pow_indices = torch::pow(at::Scalar(theta), torch::linspace(0.0, 1.0, count, dtype));
  // freqs = (pow_indices * torch.pi / 2.0).to(dtype=torch.float32)
  return pow_indices.mul(M_PI).div(2.0).to(torch::kFloat32);
}

std::pair<at::Tensor, at::Tensor> rope_fractional_cos_sin(const at::Tensor& coords,
                                                          const std::vector<double>& max_positions,
                                                          const at::Tensor& frequencies,
                                                          int64_t num_heads, int64_t head_dim) {
  const auto axes = static_cast<int64_t>(max_positions.size());
  TORCH_CHECK(axes >= 1, "rope_fractional: max_positions must name at least one axis");
  TORCH_CHECK(coords.dim() >= 2 && coords.size(-1) == axes,
              "rope_fractional: coords must be [..., N, A] with A = ", axes,
              " (one per max_positions entry), got shape ", coords.sizes());
  TORCH_CHECK(num_heads >= 1 && head_dim >= 2 && head_dim % 2 == 0,
              "rope_fractional: needs num_heads >= 1 and an even head_dim >= 2, got num_heads=",
              num_heads, ", head_dim=", head_dim);
  const int64_t dim = num_heads * head_dim, count = dim / (2 * axes);
  TORCH_CHECK(frequencies.dim() == 1 && frequencies.size(0) == count, "rope_fractional: expected ",
              count, " frequencies (dim ", dim, " // (2 * ", axes, " axes)), got shape ",
              frequencies.sizes());
  // grid = stack([coords[:, i] / max_positions[i] for i in range(A)], dim=-1)   (float32)
  auto values = coords.to(torch::kFloat32);
  std::vector<at::Tensor> fractions;
  for (int64_t a = 0; a < axes; ++a) {
    TORCH_CHECK(max_positions[a] > 0 && std::isfinite(max_positions[a]),
                "rope_fractional: max_positions[", a, "] must be positive, got ", max_positions[a]);
    fractions.push_back(values.select(-1, a).div(max_positions[a]));
  }
  auto grid = torch::stack(fractions, -1);  // [..., N, A]
  // freqs = (grid.unsqueeze(-1) * 2 - 1) * freqs; freqs.transpose(-1, -2).flatten(2)
  auto angles = grid.unsqueeze(-1).mul(2).sub(1).mul(frequencies.to(coords.device()));
  angles = angles.transpose(-1, -2).flatten(-2);  // [..., N, F * A]: pair j A + a
  auto cos = angles.cos(), sin = angles.sin();
  const int64_t padding = dim / 2 - count * axes;  // (dim mod 2A) / 2 identity pairs, first
  if (padding > 0) {
    auto shape = cos.sizes().vec();
    shape.back() = padding;
    cos = torch::cat({torch::ones(shape, cos.options()), cos}, -1);
    sin = torch::cat({torch::zeros(shape, sin.options()), sin}, -1);
  }
  auto per_head = cos.sizes().vec();  // [..., N, dim / 2] -> [..., N, H, Dh / 2]
  per_head.back() = num_heads;
  per_head.push_back(head_dim / 2);
  return {cos.reshape(per_head), sin.reshape(per_head)};
}

}  // namespace posenc
