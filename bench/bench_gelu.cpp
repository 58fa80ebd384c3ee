// The MLP's GELU at the main job's size (batch 128 x 16 tokens x 192 hidden = 393,216 floats),
// forward and backward, each case into an output allocated once (no allocation in the loop):
//   aten   at::gelu_out / at::gelu_backward_out (the kernels torch::gelu's autograd runs)
//   fused  gelu_forward_cpu_out / gelu_backward_cpu_out (posenc/kernels/gelu.h)
//   copy   copy_ of the bytes each pass reads and writes (forward: 1 in, 1 out; backward: 2 in,
//          1 out: add_out): the memory-bound floor
// bench_kernel_width.cpp measures the same passes per CPU level and out of cache.
//   ./build/bench/bench_gelu
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/kernels/gelu.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

const std::vector<int64_t> kShape = {128 * 16, 192};

void BM_AtenForward(benchmark::State& state) {
  const auto x = torch::randn(kShape);
  auto y = at::empty_like(x);
  for (auto _ : state) benchmark::DoNotOptimize(at::gelu_out(y, x).data_ptr());
}
void BM_FusedForward(benchmark::State& state) {
  const auto x = torch::randn(kShape);
  auto y = at::empty_like(x);
  for (auto _ : state) {
    posenc::gelu_forward_cpu_out(x, y);
    benchmark::DoNotOptimize(y.data_ptr());
  }
}
void BM_CopyForward(benchmark::State& state) {
  const auto x = torch::randn(kShape);
  auto y = at::empty_like(x);
  for (auto _ : state) benchmark::DoNotOptimize(y.copy_(x).data_ptr());
}
void BM_AtenBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  auto dx = at::empty_like(x);
  for (auto _ : state) benchmark::DoNotOptimize(at::gelu_backward_out(dx, g, x).data_ptr());
}
void BM_FusedBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  auto dx = at::empty_like(x);
  for (auto _ : state) {
    posenc::gelu_backward_cpu_out(g, x, dx);
    benchmark::DoNotOptimize(dx.data_ptr());
  }
}
void BM_CopyBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  auto sum = at::empty_like(x);
  for (auto _ : state) benchmark::DoNotOptimize(at::add_out(sum, x, g).data_ptr());
}

BENCHMARK(BM_AtenForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_FusedForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_CopyForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_AtenBackward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_FusedBackward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_CopyBackward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    r.row("aten / fused GELU forward", r.time("BM_AtenForward") / r.time("BM_FusedForward"),
          ">= 1.5");
    r.row("aten / fused GELU backward", r.time("BM_AtenBackward") / r.time("BM_FusedBackward"),
          ">= 2");
    r.row("fused / copy_, forward (1 in, 1 out)",
          r.time("BM_FusedForward") / r.time("BM_CopyForward"), "<= 3");
    r.row("fused / add, backward (2 in, 1 out)",
          r.time("BM_FusedBackward") / r.time("BM_CopyBackward"), "<= 3");
  });
}
