// RoPE benchmarks (Google Benchmark). Every case runs in one process with its baselines:
//   copy_      the same bytes copied (q and k): the memory-bandwidth limit
//   eager      the code a user writes: q * cos + rotate_half(q) * sin with [N, Dh] tables
//   fused      posenc's kernel (per-pair [N, Dh/2] tables, q and k in one pass): allocating
//              (as rope_fused_qk), into preallocated outputs (as copy_ writes), in place
// and prints the ratios at the end. q, k = [1, 2048, 16, 128] fp32 (the size).
//   ./build/bench/bench_rope --benchmark_min_time=0.5
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <map>

#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using posenc::RopeLayout;

constexpr int64_t kB = 1, kN = 2048, kH = 16, kD = 128;

struct Inputs {
  torch::Tensor q, k, cos, sin, cos_full, sin_full;
  Inputs() {
    torch::manual_seed(0);
    q = torch::randn({kB, kN, kH, kD});
    k = torch::randn({kB, kN, kH, kD});
    auto inv = torch::pow(10000.0, -torch::arange(0, kD, 2, torch::kFloat64) / double(kD));
    std::tie(cos, sin) = posenc::rope_cos_sin(torch::arange(kN, torch::kFloat64), inv);
    cos_full = torch::cat({cos, cos}, -1).view({1, kN, 1, kD});  // HF's emb = cat(freqs, freqs)
    sin_full = torch::cat({sin, sin}, -1).view({1, kN, 1, kD});
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto x1 = x.narrow(-1, 0, kD / 2), x2 = x.narrow(-1, kD / 2, kD / 2);
  return torch::cat({-x2, x1}, -1);
}

void BM_Copy(benchmark::State& state) {
  auto& in = inputs();
  auto q = torch::empty_like(in.q), k = torch::empty_like(in.k);
  for (auto _ : state) {
    q.copy_(in.q);
    k.copy_(in.k);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_EagerRotateHalf(benchmark::State& state) {
  auto& in = inputs();
  for (auto _ : state) {
    auto q = in.q * in.cos_full + rotate_half(in.q) * in.sin_full;
    auto k = in.k * in.cos_full + rotate_half(in.k) * in.sin_full;
    benchmark::DoNotOptimize(q.data_ptr());
    benchmark::DoNotOptimize(k.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_Reference(benchmark::State& state) {
  auto& in = inputs();
  for (auto _ : state) {
    auto q = posenc::rope_apply(in.q, in.cos, in.sin, RopeLayout::kHalf);
    auto k = posenc::rope_apply(in.k, in.cos, in.sin, RopeLayout::kHalf);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_Fused(benchmark::State& state) {
  auto& in = inputs();
  const auto layout = static_cast<RopeLayout>(state.range(0));
  for (auto _ : state) {
    auto [q, k] = posenc::rope_fused_qk(in.q, in.k, in.cos, in.sin, layout);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_FusedIntoPreallocated(benchmark::State& state) {
  auto& in = inputs();
  auto q = torch::empty_like(in.q), k = torch::empty_like(in.k);
  for (auto _ : state) {
    posenc::rope_rotate_cpu({in.q, in.k}, {q, k}, in.cos, in.sin, RopeLayout::kHalf, false);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_FusedInPlace(benchmark::State& state) {
  auto& in = inputs();
  auto q = in.q.clone(), k = in.k.clone();
  for (auto _ : state) {
    posenc::rope_fused_(q, in.cos, in.sin, RopeLayout::kHalf);
    posenc::rope_fused_(k, in.cos, in.sin, RopeLayout::kHalf);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

// 2D (h, w) and 3D (t, h, w) axial RoPE: sectioned tables, the same kernel.
void BM_FusedSectioned(benchmark::State& state) {
  auto& in = inputs();
  const int64_t axes = state.range(0);
  std::vector<int64_t> sections(axes, kD / 2 / axes);
  sections[0] += kD / 2 - sections[0] * axes;  // the remainder goes to the first axis
  auto coords = torch::rand({kN, axes}, torch::kFloat64) * 64;
  auto inv = torch::pow(10000.0, -torch::arange(0, kD, 2, torch::kFloat64) / double(kD));
  auto [cos, sin] =
      posenc::rope_cos_sin_sections(coords, inv, sections, posenc::RopeSectionLayout::kContiguous);
  for (auto _ : state) {
    auto [q, k] = posenc::rope_fused_qk(in.q, in.k, cos, sin, RopeLayout::kHalf);
    benchmark::DoNotOptimize(q.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * 4 * in.q.nbytes());
}

void BM_EagerForwardBackward(benchmark::State& state) {
  auto& in = inputs();
  auto gq = torch::randn_like(in.q), gk = torch::randn_like(in.k);
  for (auto _ : state) {
    auto q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true);
    auto oq = q * in.cos_full + rotate_half(q) * in.sin_full;
    auto ok = k * in.cos_full + rotate_half(k) * in.sin_full;
    torch::autograd::backward({oq, ok}, {gq, gk});
    benchmark::DoNotOptimize(q.grad().data_ptr());
  }
}

void BM_FusedForwardBackward(benchmark::State& state) {
  auto& in = inputs();
  auto gq = torch::randn_like(in.q), gk = torch::randn_like(in.k);
  for (auto _ : state) {
    auto q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true);
    auto [oq, ok] = posenc::rope_fused_qk(q, k, in.cos, in.sin, RopeLayout::kHalf);
    torch::autograd::backward({oq, ok}, {gq, gk});
    benchmark::DoNotOptimize(q.grad().data_ptr());
  }
}

BENCHMARK(BM_Copy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EagerRotateHalf)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Reference)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Fused)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FusedIntoPreallocated)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FusedSectioned)->Arg(2)->Arg(3)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FusedInPlace)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_EagerForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FusedForwardBackward)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    auto t = [&](const std::string& name) { return r.time(name); };
    auto row = [&](const std::string& what, double ratio, const std::string& goal) {
      r.row(what, ratio, goal);
    };
    const std::string fused = "BM_Fused/0/real_time", copy = "BM_Copy/real_time";
    row("fused forward (half) / copy_", t(fused) / t(copy), "<= 1.25");
    row("fused forward (interleaved) / copy_", t("BM_Fused/1/real_time") / t(copy), "<= 1.25");
    row("fused into preallocated q, k / copy_", t("BM_FusedIntoPreallocated/real_time") / t(copy),
        "<= 1.25");
    row("fused in place / copy_", t("BM_FusedInPlace/real_time") / t(copy), "-");
    row("2D sectioned throughput / 1D", t(fused) / t("BM_FusedSectioned/2/real_time"), ">= 0.9");
    row("3D sectioned throughput / 1D", t(fused) / t("BM_FusedSectioned/3/real_time"), ">= 0.9");
    row("eager rotate_half / fused forward", t("BM_EagerRotateHalf/real_time") / t(fused), ">= 5");
    row("reference rope_apply / fused forward", t("BM_Reference/real_time") / t(fused), "-");
    row("eager fwd+bwd / fused fwd+bwd",
        t("BM_EagerForwardBackward/real_time") / t("BM_FusedForwardBackward/real_time"), ">= 3");
  });
}
