// Fused multi-tensor AdamW and gradient-norm clipping on the CPU; the math and its sources are in
// include/posenc/kernels/adamw.h. Every tensor is cut into chunks of kChunk elements and one
// parallel_for runs over the chunks of all tensors, so 50 small tensors and one large one keep
// both cores busy alike. The norm's partial sums are kept per chunk and added in chunk order:
// the result does not depend on the thread count.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "parallel.h"
#include "posenc/kernels/adamw.h"

namespace posenc {
namespace {

constexpr int64_t kChunk = 16384;  // elements per work item (64 KiB of floats per array)

struct Chunk {
  int64_t tensor, begin, end;
};

std::vector<Chunk> chunks_of(const std::vector<int64_t>& sizes) {
  std::vector<Chunk> chunks;
  for (size_t t = 0; t < sizes.size(); ++t)
    for (int64_t b = 0; b < sizes[t]; b += kChunk)
      chunks.push_back({static_cast<int64_t>(t), b, std::min(sizes[t], b + kChunk)});
  return chunks;
}

bool fusable(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         t.layout() == at::kStrided && t.is_contiguous();
}

void check_lists(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                 at::TensorList exp_avg_sqs, size_t hyper) {
  TORCH_CHECK(grads.size() == params.size() && exp_avgs.size() == params.size() &&
                  exp_avg_sqs.size() == params.size() && hyper == params.size(),
              "adamw_step: params, grads, exp_avgs, exp_avg_sqs and hyper must have one entry "
              "per parameter, got ",
              params.size(), ", ", grads.size(), ", ", exp_avgs.size(), ", ", exp_avg_sqs.size(),
              " and ", hyper);
  for (size_t i = 0; i < params.size(); ++i)
    TORCH_CHECK(grads[i].numel() == params[i].numel() && exp_avgs[i].numel() == params[i].numel() &&
                    exp_avg_sqs[i].numel() == params[i].numel(),
                "adamw_step: tensor ", i, " has ", params[i].numel(), " elements but its gradient ",
                grads[i].numel(), ", exp_avg ", exp_avgs[i].numel(), ", exp_avg_sq ",
                exp_avg_sqs[i].numel());
}

// One parameter's constants, rounded to float as ATen rounds the scalars of the reference ops.
struct AdamWConstants {
  bool decay;
  float decay_factor, beta1, one_minus_beta1, beta2, one_minus_beta2, sqrt_bc2, eps, neg_step;
};

AdamWConstants constants_of(const AdamWHyper& h) {
  const double t = static_cast<double>(h.step + 1);
  const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
  return {h.weight_decay != 0,
          static_cast<float>(1 - h.lr * h.weight_decay),
          static_cast<float>(h.beta1),
          static_cast<float>(1 - h.beta1),
          static_cast<float>(h.beta2),
          static_cast<float>(1 - h.beta2),
          static_cast<float>(std::sqrt(bc2)),
          static_cast<float>(h.eps),
          static_cast<float>(-h.lr / bc1)};
}

// The update of elements [0, n); compiled twice: for any x86-64 (SSE2) and with AVX2+FMA (the
// same loop, 8 lanes; the compiler vectorizes both, -fno-math-errno lets it use vsqrtps).
#define POSENC_ADAMW_BODY                                                   \
  if (c.decay)                                                              \
    for (int64_t i = 0; i < n; ++i) p[i] = p[i] * c.decay_factor;           \
  for (int64_t i = 0; i < n; ++i) {                                         \
    const float gi = g[i];                                                  \
    const float mi = m[i] * c.beta1 + c.one_minus_beta1 * gi;               \
    const float vi = v[i] * c.beta2 + c.one_minus_beta2 * (gi * gi);        \
    m[i] = mi;                                                              \
    v[i] = vi;                                                              \
    p[i] = p[i] + c.neg_step * (mi / (std::sqrt(vi) / c.sqrt_bc2 + c.eps)); \
  }

void adamw_range_plain(const AdamWConstants& c, float* __restrict p, const float* __restrict g,
                       float* __restrict m, float* __restrict v, int64_t n) {
  POSENC_ADAMW_BODY
}

// Sum of squares in double: four independent accumulators so the adds do not wait on each other.
double sum_squares_plain(const float* g, int64_t n) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) acc[j] += static_cast<double>(g[i + j]) * g[i + j];
  for (; i < n; ++i) acc[0] += static_cast<double>(g[i]) * g[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void adamw_range_avx2(const AdamWConstants& c,
                                                          float* __restrict p,
                                                          const float* __restrict g,
                                                          float* __restrict m, float* __restrict v,
                                                          int64_t n) {
  POSENC_ADAMW_BODY
}

// 8 floats per iteration widened to two 4-double FMA accumulators (16 doubles in flight).
__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* g, int64_t n) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  __m256d a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(g + i + 8);
    const __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y));
    const __m256d y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
    a0 = _mm256_fmadd_pd(x0, x0, a0);
    a1 = _mm256_fmadd_pd(x1, x1, a1);
    a2 = _mm256_fmadd_pd(y0, y0, a2);
    a3 = _mm256_fmadd_pd(y1, y1, a3);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3)));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += static_cast<double>(g[i]) * g[i];
  return sum;
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#else
bool has_avx2() { return false; }
#endif

void adamw_range(const AdamWConstants& c, float* p, const float* g, float* m, float* v, int64_t n) {
#if defined(__x86_64__)
  if (has_avx2()) return adamw_range_avx2(c, p, g, m, v, n);
#endif
  adamw_range_plain(c, p, g, m, v, n);
}

double sum_squares(const float* g, int64_t n) {
#if defined(__x86_64__)
  if (has_avx2()) return sum_squares_avx2(g, n);
#endif
  return sum_squares_plain(g, n);
}

}  // namespace

bool adamw_step_fused_supported(at::TensorList params, at::TensorList grads,
                                at::TensorList exp_avgs, at::TensorList exp_avg_sqs) {
  if (grads.size() != params.size() || exp_avgs.size() != params.size() ||
      exp_avg_sqs.size() != params.size())
    return false;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!fusable(params[i]) || !fusable(grads[i]) || !fusable(exp_avgs[i]) ||
        !fusable(exp_avg_sqs[i]))
      return false;
    if (grads[i].numel() != params[i].numel() || exp_avgs[i].numel() != params[i].numel() ||
        exp_avg_sqs[i].numel() != params[i].numel())
      return false;
  }
  return true;
}

void adamw_step_fused(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                      at::TensorList exp_avg_sqs, const std::vector<AdamWHyper>& hyper) {
  check_lists(params, grads, exp_avgs, exp_avg_sqs, hyper.size());
  TORCH_CHECK(adamw_step_fused_supported(params, grads, exp_avgs, exp_avg_sqs),
              "adamw_step_fused: every tensor must be a contiguous float32 CPU tensor "
              "(adamw_step_fused_supported)");
  std::vector<int64_t> sizes;
  std::vector<AdamWConstants> constants;
  for (size_t i = 0; i < params.size(); ++i) {
    sizes.push_back(params[i].numel());
    constants.push_back(constants_of(hyper[i]));
  }
  const auto chunks = chunks_of(sizes);
  detail::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const auto& [t, begin, end] = chunks[k];
      adamw_range(constants[t], params[t].data_ptr<float>() + begin,
                  grads[t].data_ptr<float>() + begin, exp_avgs[t].data_ptr<float>() + begin,
                  exp_avg_sqs[t].data_ptr<float>() + begin, end - begin);
    }
  });
}

void adamw_step_reference(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                          at::TensorList exp_avg_sqs, const std::vector<AdamWHyper>& hyper) {
  check_lists(params, grads, exp_avgs, exp_avg_sqs, hyper.size());
  at::AutoGradMode no_grad(false);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& h = hyper[i];
    auto p = params[i], m = exp_avgs[i], v = exp_avg_sqs[i];
    const auto& g = grads[i];
    if (h.weight_decay != 0) p.mul_(1 - h.lr * h.weight_decay);
    const double t = static_cast<double>(h.step + 1);
    const double bc1 = 1 - std::pow(h.beta1, t), bc2 = 1 - std::pow(h.beta2, t);
    m.mul_(h.beta1).add_(g, 1 - h.beta1);
    v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
    auto denom = (v.sqrt() / std::sqrt(bc2)).add_(h.eps);
    p.addcdiv_(m, denom, -h.lr / bc1);
  }
}

double grad_norm_clip_fused_(const std::vector<at::Tensor>& grads, double max_norm) {
  std::vector<at::Tensor> defined;
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  if (defined.empty()) return 0.0;
  for (const auto& g : defined)
    if (!fusable(g)) return grad_norm_clip_reference_(grads, max_norm);
  std::vector<int64_t> sizes;
  for (const auto& g : defined) sizes.push_back(g.numel());
  const auto chunks = chunks_of(sizes);
  std::vector<double> partial(chunks.size(), 0.0);
  detail::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const auto& [t, begin, end] = chunks[k];
      // Each square in double: the sum does not lose the small gradients to the large ones.
      partial[k] = sum_squares(defined[t].data_ptr<float>() + begin, end - begin);
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  const double norm = std::sqrt(total);
  const float coef = static_cast<float>(max_norm / (static_cast<float>(norm) + 1e-6));
  if (coef < 1.0f) {
    detail::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const auto& [t, begin, end] = chunks[k];
        float* g = defined[t].data_ptr<float>();
        for (int64_t i = begin; i < end; ++i) g[i] = g[i] * coef;
      }
    });
  }
  return norm;
}

double grad_norm_clip_reference_(const std::vector<at::Tensor>& grads, double max_norm) {
  std::vector<at::Tensor> norms, defined;
  for (const auto& g : grads)
    if (g.defined()) {
      defined.push_back(g);
      norms.push_back(g.norm(2));
    }
  if (defined.empty()) return 0.0;
  at::AutoGradMode no_grad(false);
  auto total = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  auto coef = at::clamp(max_norm / (total + 1e-6), c10::nullopt, 1.0);
  for (auto& g : defined) g.mul_(coef);
  return total.item<double>();
}

}  // namespace posenc
