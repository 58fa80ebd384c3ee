// Fused multi-tensor AdamW and gradient-norm clipping on the CPU; the math and its sources are in
// include/posenc/kernels/adamw.h, the loops (one table entry per CPU level, cpu_kernels.h) in
// adamw_rows.h. Every tensor is cut into chunks of kChunk elements and one
// parallel_for runs over the chunks of all tensors, so 50 small tensors and one large one keep
// both cores busy alike. The norm's partial sums are kept per chunk and added in chunk order:
// the result does not depend on the thread count.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <vector>

#include "cpu_kernels.h"
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

using detail::AdamWConstants;

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
  const auto adamw_range = detail::cpu_kernels().adamw;
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
  const auto sum_squares = detail::cpu_kernels().sum_squares;
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
