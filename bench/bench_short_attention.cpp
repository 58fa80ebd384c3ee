// Short-sequence attention, forward + backward, at the main job's sizes (a ViT on 7x7 patches of
// 28x28 images: N = 16 tokens; batch 128, 4 heads of 32; the evaluation's batch 500; 1.5x
// resolution: N = 36; case 3: configs/vit_fashion.yaml's model as it trains, batch 128, 3 heads
// of 32). What each case computes: RoPE (axial, 16 pairs) on q and k, then
// softmax(q k^T / sqrt(D)) v, gradients for q, k, v.
//   sdpa     rope_fused_qk, then at::scaled_dot_product_attention (CPU flash kernel) on the
//            [B, H, N, D] views: what SelfAttention did before the short kernel
//   eager    rope_fused_qk, then matmul, softmax, matmul (what a user writes without SDPA)
//   tiled    posenc's tiled kernel with RoPE inside its tiles (attention_fused)
//   short    posenc's short-sequence kernel (attention_short) with RoPE inside
//   packed   the same on the packed [B, N, 3, H, D] projection (attention_short_packed), as
//            SelfAttention calls it: the gradient written as one tensor
//   packed forward   its forward alone without gradients (inference: no probabilities saved)
//   kernel/C/0, kernel/C/1   the CPU kernels alone (short_attention_cpu.h; no autograd, outputs
//            allocated once), forward then backward: /0 recomputing P in the backward from the
//            log-sum-exp, /1 the forward writing P and the backward reading it
// q, k, v = [B, N, H, 32] fp32 views of one [B, N, 3, H, 32] qkv tensor, as in the model.
// Threads: --threads=N (default: every core).
//   ./build/bench/bench_short_attention --threads=1 --benchmark_filter=Packed \
//       --benchmark_repetitions=10 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <vector>

#include "kernels/cpu/short_attention_cpu.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/kernels/short_attention.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using namespace posenc;

constexpr int64_t kD = 32;

struct Case {
  int64_t b, n, h;
};
constexpr Case kCases[] = {{128, 16, 4}, {500, 16, 4}, {128, 36, 4}, {128, 16, 3}};

struct Inputs {
  at::Tensor qkv, grad, cos, sin;
  double scale = 1.0 / std::sqrt(double(kD));
  explicit Inputs(Case c) {
    torch::manual_seed(0);
    qkv = torch::randn({c.b, c.n, 3, c.h, kD});
    grad = torch::randn({c.b, c.n, c.h, kD});
    const int64_t side = c.n == 16 ? 4 : 6;
    auto rows = torch::arange(side, torch::kFloat64).repeat_interleave(side);
    auto cols = torch::arange(side, torch::kFloat64).repeat({side});
    auto inv = torch::pow(100.0, -torch::arange(0, 8, torch::kFloat64) * 2 / 16.0);
    auto angles = torch::cat({rows.unsqueeze(1) * inv, cols.unsqueeze(1) * inv}, 1);  // [N, 16]
    cos = angles.cos().to(torch::kFloat32);
    sin = angles.sin().to(torch::kFloat32);
  }
};

Inputs& inputs(int64_t which) {
  static std::vector<std::unique_ptr<Inputs>> all;
  if (all.empty())
    for (const auto& c : kCases) all.push_back(std::make_unique<Inputs>(c));
  return *all[which];
}

template <typename Attend>
void run(benchmark::State& state, Attend attend) {
  auto& in = inputs(state.range(0));
  for (auto _ : state) {
    auto qkv = in.qkv.detach().requires_grad_(true);
    auto parts = qkv.unbind(2);  // 3 x [B, N, H, D] views
    auto out = attend(in, parts[0], parts[1], parts[2]);
    out.backward(in.grad);
    benchmark::DoNotOptimize(qkv.grad().data_ptr());
  }
}

void BM_Sdpa(benchmark::State& state) {
  run(state, [](Inputs& in, at::Tensor q, at::Tensor k, at::Tensor v) {
    std::tie(q, k) = rope_fused_qk(q, k, in.cos, in.sin, RopeLayout::kHalf);
    auto y = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), {}, 0.0, false, in.scale);
    return y.transpose(1, 2);
  });
}

void BM_Eager(benchmark::State& state) {
  run(state, [](Inputs& in, at::Tensor q, at::Tensor k, at::Tensor v) {
    std::tie(q, k) = rope_fused_qk(q, k, in.cos, in.sin, RopeLayout::kHalf);
    auto logits = torch::matmul(q.transpose(1, 2), k.permute({0, 2, 3, 1})) * in.scale;
    return torch::matmul(torch::softmax(logits, -1), v.transpose(1, 2)).transpose(1, 2);
  });
}

void BM_Tiled(benchmark::State& state) {
  run(state, [](Inputs& in, at::Tensor q, at::Tensor k, at::Tensor v) {
    AttentionRotary rotary{in.cos, in.sin, in.cos, in.sin, RopeLayout::kHalf};
    const auto n = q.size(1);
    auto positions = torch::arange(n, torch::kFloat64);
    return attention_fused(q, k, v, BiasSpec{}, positions, positions, {}, in.scale, rotary);
  });
}

void BM_Short(benchmark::State& state) {
  run(state, [](Inputs& in, at::Tensor q, at::Tensor k, at::Tensor v) {
    AttentionRotary rotary{in.cos, in.sin, in.cos, in.sin, RopeLayout::kHalf};
    return attention_short(q, k, v, in.scale, rotary);
  });
}

// The packed form SelfAttention takes: the [B, N, 3, H, D] projection in, its gradient out as one
// tensor (no stack of dq, dk, dv).
void BM_ShortPacked(benchmark::State& state) {
  auto& in = inputs(state.range(0));
  AttentionRotary rotary{in.cos, in.sin, in.cos, in.sin, RopeLayout::kHalf};
  for (auto _ : state) {
    auto qkv = in.qkv.detach().requires_grad_(true);
    attention_short_packed(qkv, in.scale, rotary).backward(in.grad);
    benchmark::DoNotOptimize(qkv.grad().data_ptr());
  }
}

// The packed forward as inference runs it (no gradients): what the forward costs alone, and that
// it saves nothing for a backward.
void BM_ShortPackedForward(benchmark::State& state) {
  auto& in = inputs(state.range(0));
  AttentionRotary rotary{in.cos, in.sin, in.cos, in.sin, RopeLayout::kHalf};
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = attention_short_packed(in.qkv, in.scale, rotary);
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

// The kernels alone on the packed projection's views, both ways of getting P to the backward.
void BM_ShortKernel(benchmark::State& state) {
  auto& in = inputs(state.range(0));
  const bool saved = state.range(1) == 1;
  const auto q = in.qkv.select(2, 0), k = in.qkv.select(2, 1), v = in.qkv.select(2, 2);
  posenc::detail::ShortAttentionProblem p;
  p.q = q.data_ptr<float>();
  p.k = k.data_ptr<float>();
  p.v = v.data_ptr<float>();
  for (int i = 0; i < 3; ++i) {
    p.q_stride[i] = q.stride(i);
    p.k_stride[i] = k.stride(i);
    p.v_stride[i] = v.stride(i);
  }
  p.batch = q.size(0);
  p.n = q.size(1);
  p.heads = q.size(2);
  p.dim = q.size(3);
  p.scale = static_cast<float>(in.scale);
  p.cos = in.cos.data_ptr<float>();
  p.sin = in.sin.data_ptr<float>();
  p.pairs = in.cos.size(1);
  const int64_t np = posenc::detail::short_attention_padded(p.n);
  auto out = torch::empty_like(q, at::MemoryFormat::Contiguous);
  auto lse = torch::empty({p.batch, p.heads, p.n});
  auto probabilities = torch::empty({p.batch * p.heads, np, np});
  auto dq = torch::empty_like(out), dk = torch::empty_like(out), dv = torch::empty_like(out);
  if (saved) p.probabilities = probabilities.data_ptr<float>();
  float* lse_data = saved ? nullptr : lse.data_ptr<float>();  // as the autograd node passes them
  for (auto _ : state) {
    posenc::detail::short_attention_forward_cpu(p, out.data_ptr<float>(), lse_data);
    posenc::detail::short_attention_backward_cpu(p, out.data_ptr<float>(), lse_data,
                                                 in.grad.data_ptr<float>(), dq.data_ptr<float>(),
                                                 dk.data_ptr<float>(), dv.data_ptr<float>());
    benchmark::DoNotOptimize(dv.data_ptr());
  }
}
BENCHMARK(BM_ShortKernel)
    ->ArgsProduct({{0, 1, 2, 3}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1);

#define POSENC_SHORT_BENCH(fn)        \
  BENCHMARK(fn)                       \
      ->Arg(0)                        \
      ->Arg(1)                        \
      ->Arg(2)                        \
      ->Arg(3)                        \
      ->Unit(benchmark::kMillisecond) \
      ->UseRealTime()                 \
      ->MinTime(1)
POSENC_SHORT_BENCH(BM_Sdpa);
POSENC_SHORT_BENCH(BM_Eager);
POSENC_SHORT_BENCH(BM_Tiled);
POSENC_SHORT_BENCH(BM_Short);
POSENC_SHORT_BENCH(BM_ShortPacked);
POSENC_SHORT_BENCH(BM_ShortPackedForward);

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      at::set_num_threads(std::stoi(argv[i] + 10));
    else
      args.push_back(argv[i]);
  }
  int count = static_cast<int>(args.size());
  std::cout << "threads: " << at::get_num_threads()
            << ", posenc CPU level: " << posenc::to_string(posenc::cpu_capability()) << "\n";
  return posenc::bench::run_with_ratios(
      count, args.data(), [](const posenc::bench::RatioReporter& r) {
        const char* sizes[] = {"B 128, N 16, H 4", "B 500, N 16, H 4", "B 128, N 36, H 4",
                               "B 128, N 16, H 3"};
        for (int i = 0; i < 4; ++i) {
          const std::string a = "/" + std::to_string(i) + "/";
          auto t = [&](const std::string& name) { return r.time(name + a); };
          r.row(std::string("sdpa / short, ") + sizes[i], t("BM_Sdpa") / t("BM_Short"), ">= 2");
          r.row(std::string("eager / short, ") + sizes[i], t("BM_Eager") / t("BM_Short"), ">= 1");
          r.row(std::string("tiled / short, ") + sizes[i], t("BM_Tiled") / t("BM_Short"), ">= 1");
          r.row(std::string("short / short packed, ") + sizes[i],
                t("BM_Short") / t("BM_ShortPacked"), ">= 1");
        }
      });
}
