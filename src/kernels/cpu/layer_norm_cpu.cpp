// The residual add and layer norm passes over the CPU level's vector lanes (the row loops:
// layer_norm_rows.h, one table entry per level, cpu_kernels.h); the math and its source are in
// posenc/kernels/layer_norm.h. Rows are split in blocks of kLayerNormRowBlock; a parallel chunk is
// at least kLayerNormGrain elements (the main job's [2048, 96] runs as two chunks). The *_out
// entries write into the caller's tensors (the benchmarks' preallocated outputs).
// A pass whose outputs (h and y forward, dh backward) are kStreamMinBytes or more writes them with
// non-temporal stores (stream_stores.h) where every row starts on a 64-byte line (outputs so
// aligned, D % 16 == 0): normal stores read every output line before writing it (its
// read-for-ownership), which out of cache held the forward at 0.67-1.01x copy_'s bandwidth and the
// backward at 0.54-0.77x (docs/performance.md, "Streaming stores"). In cache (the main job's
// [2048, 96]) the outputs stay in the cache for the op that reads them next.
#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu_kernels.h"
#include "parallel.h"
#include "posenc/kernels/layer_norm.h"
#include "stream_stores.h"

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

// An output the caller passes: float32 contiguous CPU of the given shape, overlapping no input.
void check_output(const char* name, const at::Tensor& out, at::IntArrayRef sizes,
                  std::initializer_list<const at::Tensor*> inputs) {
  TORCH_CHECK(out.defined() && out.device().is_cpu() && out.scalar_type() == at::kFloat &&
                  out.layout() == at::kStrided && out.is_contiguous() && out.sizes().equals(sizes),
              "add_layer_norm: ", name, " must be a contiguous float32 CPU tensor of shape ", sizes,
              ", got ", out.defined() ? out.sizes() : at::IntArrayRef{}, " ",
              out.defined() ? c10::toString(out.scalar_type()) : "undefined",
              out.defined() && !out.is_contiguous() ? " (not contiguous)" : "");
  for (const at::Tensor* in : inputs)
    if (in->defined()) at::assert_no_overlap(out, *in);
}

// Whether a pass writing `outputs` (each [rows, d]) streams them: out of cache and every row on a
// 64-byte line.
bool stream_rows(std::initializer_list<const float*> outputs, int64_t rows, int64_t d) {
  if (d % (detail::kStreamAlignBytes / static_cast<int64_t>(sizeof(float))) != 0 ||
      static_cast<int64_t>(outputs.size() * sizeof(float)) * rows * d < detail::kStreamMinBytes)
    return false;
  for (const float* p : outputs)
    if (!detail::line_aligned(p)) return false;
  return true;
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

void add_layer_norm_forward_cpu_out(const at::Tensor& x, const at::Tensor& r,
                                    const at::Tensor& weight, const at::Tensor& bias, double eps,
                                    at::Tensor& h, at::Tensor& y, at::Tensor& mean,
                                    at::Tensor& rstd) {
  check_inputs(x, r, weight, bias);
  const int64_t d = x.size(-1);
  const int64_t rows = x.numel() / d;
  for (auto [name, out] : {std::pair{"h", &h}, {"y", &y}})
    check_output(name, *out, x.sizes(), {&x, &r, &weight, &bias});
  for (auto [name, out] : {std::pair{"mean", &mean}, {"rstd", &rstd}})
    check_output(name, *out, {rows}, {&x, &r, &weight, &bias, &h, &y});
  at::assert_no_overlap(h, y);
  at::assert_no_overlap(mean, rstd);
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
  const bool stream = stream_rows({ph, py}, rows, d);
  parallel_for(0, blocks, grain_in_blocks(d), [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0 * kLayerNormRowBlock; i < std::min(rows, b1 * kLayerNormRowBlock); ++i)
      forward_row(px + i * d, pr + i * d, pw, pb, ph + i * d, py + i * d, d, e, pm + i, ps + i,
                  stream);
    if (stream) stream_fence();
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward_cpu(
    const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
    double eps) {
  check_inputs(x, r, weight, bias);
  const int64_t rows = x.numel() / x.size(-1);
  auto h = at::empty_like(x);
  auto y = at::empty_like(x);
  auto mean = at::empty({rows}, x.options());
  auto rstd = at::empty({rows}, x.options());
  add_layer_norm_forward_cpu_out(x, r, weight, bias, eps, h, y, mean, rstd);
  return {h, y, mean, rstd};
}

void add_layer_norm_backward_cpu_out(const at::Tensor& dy, const at::Tensor& dh_in,
                                     const at::Tensor& h, const at::Tensor& mean,
                                     const at::Tensor& rstd, const at::Tensor& weight,
                                     at::Tensor& dh, at::Tensor& dweight, at::Tensor& dbias) {
  const int64_t d = h.size(-1);
  const int64_t rows = h.numel() / d;
  TORCH_CHECK(dy.sizes().equals(h.sizes()) && dy.is_contiguous() && dy.scalar_type() == at::kFloat,
              "add_layer_norm backward: dy must be contiguous float32 ", h.sizes(), ", got ",
              dy.sizes(), " ", dy.scalar_type());
  TORCH_CHECK(!dh_in.defined() || (dh_in.sizes().equals(h.sizes()) && dh_in.is_contiguous() &&
                                   dh_in.scalar_type() == at::kFloat),
              "add_layer_norm backward: the gradient of h must be contiguous float32 ", h.sizes());
  check_output("dh", dh, h.sizes(), {&dy, &dh_in, &h, &mean, &rstd, &weight});
  for (auto [name, out] : {std::pair{"dweight", &dweight}, {"dbias", &dbias}})
    check_output(name, *out, {d}, {&dy, &dh_in, &h, &mean, &rstd, &weight, &dh});
  at::assert_no_overlap(dweight, dbias);
  const int64_t blocks = (rows + kLayerNormRowBlock - 1) / kLayerNormRowBlock;
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
  const bool stream = stream_rows({pdh}, rows, d);
  parallel_for(0, blocks, grain_in_blocks(d), [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      float* dw = pp + blk * 2 * d;
      for (int64_t i = blk * kLayerNormRowBlock; i < std::min(rows, (blk + 1) * kLayerNormRowBlock);
           ++i)
        backward_row(pdy + i * d, pin ? pin + i * d : nullptr, ph + i * d, pw, pm[i], ps[i],
                     pdh + i * d, dw, dw + d, d, stream);
    }
    if (stream) stream_fence();
  });
  // the blocks' partial sums added in block order, each of the 2d sums from 0: the same for any
  // thread count. Block after block over the 2d sums (one contiguous read of the partials, the
  // sums vectorized), not sum after sum down the blocks (a strided read: 2d x blocks misses).
  std::vector<float> sums(static_cast<size_t>(2 * d), 0.0f);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float* part = pp + blk * 2 * d;
    for (int64_t j = 0; j < 2 * d; ++j) sums[j] += part[j];
  }
  std::copy(sums.begin(), sums.begin() + d, dweight.mutable_data_ptr<float>());
  std::copy(sums.begin() + d, sums.end(), dbias.mutable_data_ptr<float>());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& dy, const at::Tensor& dh_in, const at::Tensor& h, const at::Tensor& mean,
    const at::Tensor& rstd, const at::Tensor& weight) {
  auto dh = at::empty_like(h);
  auto dweight = at::empty({h.size(-1)}, h.options());
  auto dbias = at::empty({h.size(-1)}, h.options());
  add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, weight, dh, dweight, dbias);
  return {dh, dweight, dbias};
}

}  // namespace detail

}  // namespace posenc
