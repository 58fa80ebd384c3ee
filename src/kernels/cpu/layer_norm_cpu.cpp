// The residual add and layer norm passes over the CPU level's vector lanes (the row loops:
// layer_norm_rows.h, one table entry per level, cpu_kernels.h); the math and its source are in
// posenc/kernels/layer_norm.h. Rows are split in blocks of kLayerNormRowBlock; a parallel chunk is
// at least kLayerNormGrain elements (the main job's [2048, 96] runs as two chunks).
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "parallel.h"
#include "posenc/kernels/layer_norm.h"

namespace posenc {

namespace {

/// Elements per parallel chunk, at least (a smaller tensor stays on the calling thread).
constexpr int64_t kLayerNormGrain = 1 << 15;

int64_t grain_in_blocks(int64_t d) {
  return std::max<int64_t>(1, kLayerNormGrain / (kLayerNormRowBlock * d));
}

void check_inputs(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                  const at::Tensor& bias) {
  TORCH_CHECK(add_layer_norm_fused_supported(x, r, weight, bias),
              "add_layer_norm: the fused passes take contiguous float32 CPU x and r of one shape "
              "[..., D] with D % 8 == 0 and D <= ",
              kMaxLayerNormDim,
              ", weight and bias [D], at CPU level avx2 or avx512 (this process: ",
              to_string(cpu_capability()), "); got x ", x.sizes(), " ", x.scalar_type(), ", r ",
              r.sizes(), ", weight ", weight.defined() ? weight.sizes() : at::IntArrayRef{},
              ", bias ", bias.defined() ? bias.sizes() : at::IntArrayRef{});
}

}  // namespace

bool add_layer_norm_fused_supported(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& weight, const at::Tensor& bias) {
  auto plain = [](const at::Tensor& t) {
    return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
           t.layout() == at::kStrided && t.is_contiguous();
  };
  if (!plain(x) || !plain(r) || !plain(weight) || !plain(bias) || x.dim() < 1 ||
      !x.sizes().equals(r.sizes()))
    return false;
  const int64_t d = x.size(-1);
  return d > 0 && d % 8 == 0 && d <= kMaxLayerNormDim && weight.dim() == 1 && weight.size(0) == d &&
         bias.dim() == 1 && bias.size(0) == d &&
         detail::cpu_kernels().layer_norm_forward_row != nullptr;
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_reference(const at::Tensor& x,
                                                            const at::Tensor& r,
                                                            const at::Tensor& weight,
                                                            const at::Tensor& bias, double eps) {
  auto h = x + r;
  auto y = at::layer_norm(h, {h.size(-1)}, weight, bias, eps);
  return {h, y};
}

namespace detail {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward_cpu(
    const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
    double eps) {
  check_inputs(x, r, weight, bias);
  const int64_t d = x.size(-1);
  const int64_t rows = x.numel() / d;
  auto h = at::empty_like(x);
  auto y = at::empty_like(x);
  auto mean = at::empty({rows}, x.options());
  auto rstd = at::empty({rows}, x.options());
  const float* px = x.const_data_ptr<float>();
  const float* pr = r.const_data_ptr<float>();
  const float* pw = weight.const_data_ptr<float>();
  const float* pb = bias.const_data_ptr<float>();
  float* ph = h.mutable_data_ptr<float>();
  float* py = y.mutable_data_ptr<float>();
  float* pm = mean.mutable_data_ptr<float>();
  float* ps = rstd.mutable_data_ptr<float>();
  const auto e = static_cast<float>(eps);
  const int64_t blocks = (rows + kLayerNormRowBlock - 1) / kLayerNormRowBlock;
  const auto forward_row = cpu_kernels().layer_norm_forward_row;
  parallel_for(0, blocks, grain_in_blocks(d), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0 * kLayerNormRowBlock; i < std::min(rows, b1 * kLayerNormRowBlock); ++i)
      forward_row(px + i * d, pr + i * d, pw, pb, ph + i * d, py + i * d, d, e, pm + i, ps + i);
  });
  return {h, y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& dy, const at::Tensor& dh_in, const at::Tensor& h, const at::Tensor& mean,
    const at::Tensor& rstd, const at::Tensor& weight) {
  const int64_t d = h.size(-1);
  const int64_t rows = h.numel() / d;
  TORCH_CHECK(dy.sizes().equals(h.sizes()) && dy.is_contiguous() && dy.scalar_type() == at::kFloat,
              "add_layer_norm backward: dy must be contiguous float32 ", h.sizes(), ", got ",
              dy.sizes(), " ", dy.scalar_type());
  TORCH_CHECK(!dh_in.defined() || (dh_in.sizes().equals(h.sizes()) && dh_in.is_contiguous() &&
                                   dh_in.scalar_type() == at::kFloat),
              "add_layer_norm backward: the gradient of h must be contiguous float32 ", h.sizes());
  const int64_t blocks = (rows + kLayerNormRowBlock - 1) / kLayerNormRowBlock;
  auto dh = at::empty_like(h);
  auto partial = at::zeros({blocks, 2, d}, h.options());  // per block: dw, db
  const float* pdy = dy.const_data_ptr<float>();
  const float* pin = dh_in.defined() ? dh_in.const_data_ptr<float>() : nullptr;
  const float* ph = h.const_data_ptr<float>();
  const float* pm = mean.const_data_ptr<float>();
  const float* ps = rstd.const_data_ptr<float>();
  const float* pw = weight.const_data_ptr<float>();
  float* pdh = dh.mutable_data_ptr<float>();
  float* pp = partial.mutable_data_ptr<float>();
  const auto backward_row = cpu_kernels().layer_norm_backward_row;
  TORCH_CHECK(backward_row != nullptr, "add_layer_norm backward: no fused pass at CPU level ",
              to_string(cpu_capability()), " (the forward took the reference there)");
  parallel_for(0, blocks, grain_in_blocks(d), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      float* dw = pp + blk * 2 * d;
      for (int64_t i = blk * kLayerNormRowBlock; i < std::min(rows, (blk + 1) * kLayerNormRowBlock);
           ++i)
        backward_row(pdy + i * d, pin ? pin + i * d : nullptr, ph + i * d, pw, pm[i], ps[i],
                     pdh + i * d, dw, dw + d, d);
    }
  });
  // the blocks' partial sums added in block order: the same for any thread count
  auto dwb = at::empty({2, d}, h.options());
  float* out = dwb.mutable_data_ptr<float>();
  for (int64_t j = 0; j < 2 * d; ++j) {
    float acc = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) acc += pp[blk * 2 * d + j];
    out[j] = acc;
  }
  return {dh, dwb[0], dwb[1]};
}

}  // namespace detail

}  // namespace posenc
