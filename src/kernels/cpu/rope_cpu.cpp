// Fused RoPE on the CPU: one parallel pass over tokens; per token the F (cos, sin) values are
// read once and applied to every head of every input (q and k). Rows run through the CPU
// level's vector loops (rope_rows.h: float32, and bfloat16 / float16 in the half layout; one
// table entry per level, cpu_kernels.h), other dtypes and the scalar level through a plain loop
// the compiler vectorizes (-O3). Specification: rope_apply (src/functional/rope.cpp); contract in
// include/posenc/kernels/rope_fused.h.
// Float32 outputs of kStreamMinBytes (stream_stores.h) or more are written with non-temporal stores
// (they would not stay in the cache anyway; the pass then moves the bytes copy_ moves); a smaller
// output stays in the cache for the attention that reads it next (streaming a 1.5 MiB output
// cost the main job's RoPE pass up to 2x). Each tensor's pointers and strides are read once per
// pass, not per token (at::Tensor's accessors check the dtype on every call).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <vector>

#include "cpu_kernels.h"
#include "parallel.h"
#include "posenc/kernels/rope_fused.h"
#include "stream_stores.h"

namespace posenc {

namespace {

// Scalar rotation of one row; s already carries the direction's sign. y may alias x (each pair
// is read before it is written). kRoundEach: every product is rounded to T before the sum, as
// eager PyTorch's `x * cos + rotate_half(x) * sin` rounds (three ops, each rounding to x's dtype);
// otherwise reduced types are rotated in float32 and rounded once. float32 and float64 rows give
// the same bits either way (this file is compiled with -ffp-contract=off: no fused multiply-add).
template <typename T, typename Acc, bool kRoundEach>
void rotate_row_scalar(const T* x, T* y, const float* c, const float* s, int64_t begin, int64_t f,
                       bool interleaved) {
  const int64_t step = interleaved ? 1 : f;
  for (int64_t i = begin; i < f; ++i) {
    const int64_t ia = interleaved ? 2 * i : i;
    const int64_t ib = ia + step;
    const Acc a = static_cast<Acc>(x[ia]), b = static_cast<Acc>(x[ib]);
    if constexpr (kRoundEach) {
      const auto r = [](Acc v) { return static_cast<Acc>(static_cast<T>(v)); };
      y[ia] = static_cast<T>(r(a * c[i]) - r(b * s[i]));
      y[ib] = static_cast<T>(r(b * c[i]) + r(a * s[i]));
    } else {
      y[ia] = static_cast<T>(a * c[i] - b * s[i]);
      y[ib] = static_cast<T>(b * c[i] + a * s[i]);
    }
  }
}

// One row through the level's vector loops where it has them (float32 rows of either layout,
// bfloat16 / float16 rows of the half layout), else the plain loop.
template <typename T>
void rotate_any_row(const detail::CpuKernels& k, const T* x, T* y, const float* c, const float* s,
                    int64_t f, bool interleaved, bool round_each_op, bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (k.rope_f32 != nullptr) {
      k.rope_f32(x, y, c, s, f, interleaved, stream && k.rope_f32_stream_ok(x, y, f));
      return;
    }
  }
  if constexpr (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>) {
    const auto reduced = std::is_same_v<T, c10::BFloat16> ? k.rope_bf16 : k.rope_f16;
    if (reduced != nullptr && !interleaved) {
      reduced(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<uint16_t*>(y), c, s, f,
              round_each_op);
      return;
    }
  }
  using Acc = std::conditional_t<std::is_same_v<T, double>, double, float>;
  if (round_each_op) {
    rotate_row_scalar<T, Acc, true>(x, y, c, s, 0, f, interleaved);
  } else {
    rotate_row_scalar<T, Acc, false>(x, y, c, s, 0, f, interleaved);
  }
}

void check_input(const at::Tensor& x, const at::Tensor& reference, const at::Tensor& cos,
                 const char* what) {
  TORCH_CHECK(x.dim() == 4, "rope_fused: ", what, " must be [B, N, H, Dh], got shape ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), "rope_fused: ", what, " must be on the CPU, got ", x.device());
  TORCH_CHECK(x.size(0) == reference.size(0) && x.size(1) == reference.size(1),
              "rope_fused: ", what, " has [B, N] = [", x.size(0), ", ", x.size(1),
              "] but the first input has [", reference.size(0), ", ", reference.size(1), "]");
  TORCH_CHECK(2 * cos.size(-1) <= x.size(3), "rope_fused: rotary width 2F=", 2 * cos.size(-1),
              " exceeds head_dim=", x.size(3), " of ", what);
}

}  // namespace

void rope_rotate_cpu(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos_in, const at::Tensor& sin_in, RopeLayout layout,
                     bool inverse, bool round_each_op) {
  TORCH_CHECK(!inputs.empty() && inputs.size() == outputs.size(),
              "rope_fused: need as many outputs as inputs, got ", inputs.size(), " and ",
              outputs.size());
  const auto& first = inputs[0];
  TORCH_CHECK(cos_in.sizes() == sin_in.sizes(),
              "rope_fused: cos and sin shapes differ: ", cos_in.sizes(), " vs ", sin_in.sizes());
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
  auto sin =
      inverse ? sin_in.to(at::kFloat).contiguous().neg() : sin_in.to(at::kFloat).contiguous();
  const int64_t f = cos.size(-1);
  const bool batched_table = cos.dim() == 3;
  const bool interleaved = layout == RopeLayout::kInterleaved;
  const float* cos_data = cos.data_ptr<float>();
  const float* sin_data = sin.data_ptr<float>();
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, first.size(2) * first.size(3)));
  // Head-major storage ([B, H, N, Dh] contiguous, viewed as [B, N, H, Dh]): walk each head's
  // tokens in memory order instead (one stream per thread, not H strided ones).
  const bool head_major = first.size(2) > 1 && first.stride(2) > first.stride(1);
  const detail::CpuKernels& kernels = detail::cpu_kernels();
  int64_t out_bytes = 0;
  for (const auto& y : outputs) out_bytes += y.numel() * static_cast<int64_t>(y.element_size());
  const bool stream = out_bytes >= detail::kStreamMinBytes;
  if (head_major) {
    AT_DISPATCH_FLOATING_TYPES_AND2(
        at::kBFloat16, at::kHalf, first.scalar_type(), "rope_fused", [&] {
          for (size_t t = 0; t < inputs.size(); ++t) {
            const auto& x = inputs[t];
            const auto& y = outputs[t];
            const int64_t heads = x.size(2), dh = x.size(3);
            const int64_t rows_grain = std::max<int64_t>(1, grain / std::max<int64_t>(1, heads));
            detail::parallel_for(0, batch * heads, rows_grain, [&](int64_t begin, int64_t end) {
              for (int64_t bh = begin; bh < end; ++bh) {
                const int64_t b = bh / heads, h = bh % heads;
                const scalar_t* xb =
                    x.const_data_ptr<scalar_t>() + b * x.stride(0) + h * x.stride(2);
                scalar_t* yb = y.data_ptr<scalar_t>() + b * y.stride(0) + h * y.stride(2);
                for (int64_t n = 0; n < tokens; ++n) {
                  const int64_t row = (batched_table ? b * tokens + n : n) * f;
                  const scalar_t* xr = xb + n * x.stride(1);
                  scalar_t* yr = yb + n * y.stride(1);
                  rotate_any_row<scalar_t>(kernels, xr, yr, cos_data + row, sin_data + row, f,
                                           interleaved, round_each_op, stream);
                  if (xr != yr)
                    for (int64_t d = 2 * f; d < dh; ++d) yr[d] = xr[d];
                }
              }
              detail::stream_fence();
            });
          }
        });
    return;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, first.scalar_type(), "rope_fused", [&] {
    // each tensor's data and strides, read once for the pass
    struct Rows {
      const scalar_t* x;
      scalar_t* y;
      int64_t x_stride[3], y_stride[3], heads, dh;
    };
    std::vector<Rows> rows(inputs.size());
    for (size_t t = 0; t < inputs.size(); ++t) {
      const auto& x = inputs[t];
      const auto& y = outputs[t];
      rows[t] = {x.const_data_ptr<scalar_t>(),
                 y.data_ptr<scalar_t>(),
                 {x.stride(0), x.stride(1), x.stride(2)},
                 {y.stride(0), y.stride(1), y.stride(2)},
                 x.size(2),
                 x.size(3)};
    }
    detail::parallel_for(0, batch * tokens, grain, [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        const int64_t b = token / tokens, n = token % tokens;
        const int64_t row = (batched_table ? token : n) * f;
        const float* c = cos_data + row;
        const float* s = sin_data + row;
        for (const Rows& r : rows) {
          const scalar_t* xb = r.x + b * r.x_stride[0] + n * r.x_stride[1];
          scalar_t* yb = r.y + b * r.y_stride[0] + n * r.y_stride[1];
          const bool alias = xb == yb;
          for (int64_t h = 0; h < r.heads; ++h) {
            const scalar_t* xr = xb + h * r.x_stride[2];
            scalar_t* yr = yb + h * r.y_stride[2];
            rotate_any_row<scalar_t>(kernels, xr, yr, c, s, f, interleaved, round_each_op, stream);
            if (!alias)
              for (int64_t d = 2 * f; d < r.dh; ++d) yr[d] = xr[d];
          }
        }
      }
      detail::stream_fence();  // order the streaming stores before the pass is seen as done
    });
  });
}

}  // namespace posenc
