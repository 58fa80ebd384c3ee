// Relative-position helpers: T5 buckets, ALiBi slopes, Shaw clipping.
// Formulas and sources in include/posenc/functional/relative.h.
#include "posenc/functional/relative.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

at::Tensor t5_relative_position_bucket(const at::Tensor& rel_in, bool bidirectional,
                                       int64_t num_buckets, int64_t max_distance) {
  TORCH_CHECK(num_buckets >= 2, "t5: num_buckets must be >= 2, got ", num_buckets);
  auto rel = rel_in.round().to(torch::kLong);
  auto buckets = torch::zeros_like(rel);
  int64_t n_buckets = num_buckets;
  if (bidirectional) {
    n_buckets /= 2;
    buckets += (rel > 0).to(torch::kLong) * n_buckets;
    rel = rel.abs();
  } else {
    rel = -torch::min(rel, torch::zeros_like(rel));
  }
  const int64_t max_exact = n_buckets / 2;
  TORCH_CHECK(max_exact >= 1 && max_distance > max_exact, "t5: max_distance (", max_distance,
              ") must exceed the exact range (", max_exact, " for num_buckets=", num_buckets,
              bidirectional ? ", bidirectional" : "", ")");
  auto is_small = rel < max_exact;
  // float32 as HF: log(n / e) / log(max_distance / e) * (buckets - e), truncated toward zero.
  auto large = (torch::log(rel.to(torch::kFloat32) / static_cast<float>(max_exact)) /
                static_cast<float>(std::log(static_cast<double>(max_distance) / max_exact)) *
                static_cast<float>(n_buckets - max_exact))
                   .to(torch::kLong) +
               max_exact;
  large = torch::min(large, torch::full_like(large, n_buckets - 1));
  return buckets + torch::where(is_small, rel, large);
}

OffsetBuckets t5_offset_buckets(const at::Tensor& q_positions, const at::Tensor& k_positions,
                                bool bidirectional, int64_t num_buckets, int64_t max_distance) {
  OffsetBuckets out;
  if (q_positions.numel() == 0 || k_positions.numel() == 0) {
    out.buckets = torch::empty({0}, torch::kLong);
    return out;
  }
  auto iq = q_positions.to(torch::kCPU, torch::kFloat64).round().to(torch::kLong);
  auto ik = k_positions.to(torch::kCPU, torch::kFloat64).round().to(torch::kLong);
  const int64_t q_min = iq.min().item<int64_t>(), q_max = iq.max().item<int64_t>();
  const int64_t k_min = ik.min().item<int64_t>(), k_max = ik.max().item<int64_t>();
  out.offset_min = k_min - q_max;
  const int64_t count = k_max - q_min - out.offset_min + 1;
  auto offsets = torch::arange(out.offset_min, out.offset_min + count, torch::kLong);
  out.buckets = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance);
  return out;
}

std::vector<double> alibi_slopes(int64_t num_heads) {
  TORCH_CHECK(num_heads >= 1, "alibi: num_heads must be >= 1, got ", num_heads);
  auto power_of_two = [](int64_t n) {
    std::vector<double> out;
    const double start = std::pow(2.0, -8.0 / static_cast<double>(n));
    for (int64_t i = 0; i < n; ++i) out.push_back(std::pow(start, static_cast<double>(i + 1)));
    return out;
  };
  const int64_t closest = int64_t{1} << static_cast<int64_t>(std::floor(std::log2(num_heads)));
  if (closest == num_heads) return power_of_two(num_heads);
  auto slopes = power_of_two(closest);
  auto extra = alibi_slopes(2 * closest);
  for (int64_t i = 0; i < num_heads - closest; ++i) slopes.push_back(extra[2 * i]);
  return slopes;
}

at::Tensor relative_positions(const at::Tensor& q_positions, const at::Tensor& k_positions) {
  return k_positions.to(torch::kFloat64).unsqueeze(-2) -
         q_positions.to(torch::kFloat64).unsqueeze(-1);
}

at::Tensor shaw_relative_index(const at::Tensor& rel, int64_t max_relative_position) {
  TORCH_CHECK(max_relative_position >= 1, "shaw: max_relative_position must be >= 1, got ",
              max_relative_position);
  return rel.round().clamp(-max_relative_position, max_relative_position).to(torch::kLong) +
         max_relative_position;
}

}  // namespace posenc
