// Fused RoPE on the CPU: one parallel pass over tokens; per token the F (cos, sin) values are
// read once and applied to every head of every input (q and k). Rows are rotated by loops the
// compiler vectorizes (-O3, with an AVX2+FMA clone picked at run time by target_clones for
// float32). Specification: rope_apply (src/functional/rope.cpp); contract in
// include/posenc/kernels/rope.h.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "posenc/kernels/rope.h"

namespace posenc {

namespace {

// y[i], y[i+F] from x[i], x[i+F] (half) or y[2i], y[2i+1] from x[2i], x[2i+1] (interleaved);
// s already carries the sign of the direction.
__attribute__((target_clones("avx2,fma", "default"))) void rotate_row_f32(
    const float* __restrict x, float* __restrict y, const float* __restrict c,
    const float* __restrict s, int64_t f, bool interleaved) {
  if (!interleaved) {
    for (int64_t i = 0; i < f; ++i) {
      const float a = x[i], b = x[i + f];
      y[i] = a * c[i] - b * s[i];
      y[i + f] = b * c[i] + a * s[i];
    }
  } else {
    for (int64_t i = 0; i < f; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      y[2 * i] = a * c[i] - b * s[i];
      y[2 * i + 1] = b * c[i] + a * s[i];
    }
  }
}

template <typename T, typename Acc>
void rotate_row(const T* x, T* y, const float* c, const float* s, int64_t f, bool interleaved) {
  const int64_t step = interleaved ? 1 : f;
  for (int64_t i = 0; i < f; ++i) {
    const int64_t ia = interleaved ? 2 * i : i;
    const int64_t ib = ia + step;
    const Acc a = static_cast<Acc>(x[ia]), b = static_cast<Acc>(x[ib]);
    y[ia] = static_cast<T>(a * c[i] - b * s[i]);
    y[ib] = static_cast<T>(b * c[i] + a * s[i]);
  }
}

template <typename T>
void rotate_any_row(const T* x, T* y, const float* c, const float* s, int64_t f, bool interleaved,
                    bool x_aliases_y) {
  if constexpr (std::is_same_v<T, float>) {
    if (!x_aliases_y) {
      rotate_row_f32(x, y, c, s, f, interleaved);
      return;
    }
  }
  rotate_row<T, std::conditional_t<std::is_same_v<T, double>, double, float>>(x, y, c, s, f,
                                                                               interleaved);
}

void check_input(const at::Tensor& x, const at::Tensor& reference, const at::Tensor& cos,
                 const char* what) {
  TORCH_CHECK(x.dim() == 4, "rope_fused: ", what, " must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), "rope_fused: ", what, " must be on the CPU, got ", x.device());
  TORCH_CHECK(x.size(0) == reference.size(0) && x.size(1) == reference.size(1), "rope_fused: ",
              what, " has [B, N] = [", x.size(0), ", ", x.size(1), "] but the first input has [",
              reference.size(0), ", ", reference.size(1), "]");
  TORCH_CHECK(2 * cos.size(-1) <= x.size(3), "rope_fused: rotary width 2F=", 2 * cos.size(-1),
              " exceeds head_dim=", x.size(3), " of ", what);
}

}  // namespace

void rope_rotate_cpu(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos_in, const at::Tensor& sin_in, RopeLayout layout,
                     bool inverse) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(),
              "rope_fused: need as many outputs as inputs, got ", inputs.size(), " and ",
              outputs.size());
  const auto& first = inputs[0];
  TORCH_CHECK(cos_in.sizes() == sin_in.sizes(), "rope_fused: cos and sin shapes differ: ",
              cos_in.sizes(), " vs ", sin_in.sizes());
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.dim() == 3,
              "rope_fused: cos/sin must be [N, F] or [B, N, F], got ", cos_in.sizes());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_input(inputs[i], first, cos_in, i == 0 ? "q" : "k");
    TORCH_CHECK(outputs[i].sizes() == inputs[i].sizes() &&
                    outputs[i].scalar_type() == inputs[i].scalar_type(),
                "rope_fused: output ", i, " must match its input's shape and dtype");
    TORCH_CHECK(inputs[i].scalar_type() == first.scalar_type(), "rope_fused: q is ",
                first.scalar_type(), " but k is ", inputs[i].scalar_type());
    TORCH_CHECK(inputs[i].stride(3) == 1 && outputs[i].stride(3) == 1,
                "rope_fused: the last dim must be contiguous");
  }
  const int64_t batch = first.size(0), tokens = first.size(1);
  TORCH_CHECK(cos_in.size(-2) == tokens, "rope_fused: cos/sin have ", cos_in.size(-2),
              " positions but the inputs have N=", tokens);
  TORCH_CHECK(cos_in.dim() == 2 || cos_in.size(0) == batch, "rope_fused: cos/sin batch ",
              cos_in.size(0), " does not match B=", batch);
  auto cos = cos_in.to(at::kFloat).contiguous();
  auto sin = inverse ? sin_in.to(at::kFloat).neg() : sin_in.to(at::kFloat).contiguous();
  const int64_t f = cos.size(-1);
  const bool batched_table = cos.dim() == 3;
  const bool interleaved = layout == RopeLayout::kInterleaved;
  const float* cos_data = cos.data_ptr<float>();
  const float* sin_data = sin.data_ptr<float>();
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, first.size(2) * first.size(3)));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, first.scalar_type(), "rope_fused", [&] {
    at::parallel_for(0, batch * tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        const int64_t b = token / tokens, n = token % tokens;
        const int64_t row = (batched_table ? token : n) * f;
        const float* c = cos_data + row;
        const float* s = sin_data + row;
        for (size_t t = 0; t < inputs.size(); ++t) {
          const auto& x = inputs[t];
          const auto& y = outputs[t];
          const scalar_t* xb = x.const_data_ptr<scalar_t>() + b * x.stride(0) + n * x.stride(1);
          scalar_t* yb = y.data_ptr<scalar_t>() + b * y.stride(0) + n * y.stride(1);
          const int64_t heads = x.size(2), dh = x.size(3);
          const bool alias = xb == yb;
          for (int64_t h = 0; h < heads; ++h) {
            const scalar_t* xr = xb + h * x.stride(2);
            scalar_t* yr = yb + h * y.stride(2);
            rotate_any_row<scalar_t>(xr, yr, c, s, f, interleaved, alias);
            if (!alias)
              for (int64_t d = 2 * f; d < dh; ++d) yr[d] = xr[d];
          }
        }
      }
    });
  });
}

}  // namespace posenc
