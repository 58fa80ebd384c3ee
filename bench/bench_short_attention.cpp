// Short-sequence attention, forward + backward, at the main job's sizes (a ViT on 7x7 patches of
// 28x28 images: N = 16 tokens; batch 128, 4 heads of 32; the evaluation's batch 500; 1.5x
// resolution: N = 36). What each case computes: RoPE (axial, 16 pairs) on q and k, then
// softmax(q k^T / sqrt(D)) v, gradients for q, k, v.
//   sdpa     rope_fused_qk, then at::scaled_dot_product_attention (CPU flash kernel) on the
//            [B, H, N, D] views: what SelfAttention did before the short kernel
//   eager    rope_fused_qk, then matmul, softmax, matmul (what a user writes without SDPA)
//   tiled    posenc's tiled kernel with RoPE inside its tiles (attention_fused)
//   short    posenc's short-sequence kernel (attention_short) with RoPE inside
//   packed   the same on the packed [B, N, 3, H, D] projection (attention_short_packed), as
//            SelfAttention calls it: the gradient written as one tensor
// q, k, v = [B, N, 4, 32] fp32 views of one [B, N, 3, 4, 32] qkv tensor, as in the model.
//   ./build/bench/bench_short_attention
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/kernels/short_attention.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using namespace posenc;

constexpr int64_t kH = 4, kD = 32;

struct Case {
  int64_t b, n;
};
constexpr Case kCases[] = {{128, 16}, {500, 16}, {128, 36}};

struct Inputs {
  at::Tensor qkv, grad, cos, sin;
  double scale = 1.0 / std::sqrt(double(kD));
  explicit Inputs(Case c) {
    torch::manual_seed(0);
    qkv = torch::randn({c.b, c.n, 3, kH, kD});
    grad = torch::randn({c.b, c.n, kH, kD});
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

#define POSENC_SHORT_BENCH(fn) \
  BENCHMARK(fn)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(1)
POSENC_SHORT_BENCH(BM_Sdpa);
POSENC_SHORT_BENCH(BM_Eager);
POSENC_SHORT_BENCH(BM_Tiled);
POSENC_SHORT_BENCH(BM_Short);
POSENC_SHORT_BENCH(BM_ShortPacked);

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    const char* sizes[] = {"B 128, N 16", "B 500, N 16", "B 128, N 36"};
    for (int i = 0; i < 3; ++i) {
      const std::string a = "/" + std::to_string(i) + "/";
      auto t = [&](const std::string& name) { return r.time(name + a); };
      r.row(std::string("sdpa / short, ") + sizes[i], t("BM_Sdpa") / t("BM_Short"), ">= 2");
      r.row(std::string("eager / short, ") + sizes[i], t("BM_Eager") / t("BM_Short"), ">= 1");
      r.row(std::string("tiled / short, ") + sizes[i], t("BM_Tiled") / t("BM_Short"), ">= 1");
      r.row(std::string("short / short packed, ") + sizes[i], t("BM_Short") / t("BM_ShortPacked"),
            ">= 1");
    }
  });
}
