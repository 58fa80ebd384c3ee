// The MLP's GELU at the main job's size (batch 128 x 16 tokens x 192 hidden = 393,216 floats),
// forward and backward, 2 threads:
//   aten   at::gelu / at::gelu_backward (what torch::gelu's autograd runs)
//   fused  gelu_forward_cpu / gelu_backward_cpu (posenc/kernels/gelu.h)
//   copy   copy_ of the bytes each pass reads and writes (forward: 1 in, 1 out; backward: 2 in,
//          1 out): the memory-bound floor
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
  for (auto _ : state) benchmark::DoNotOptimize(at::gelu(x).data_ptr());
}
void BM_FusedForward(benchmark::State& state) {
  const auto x = torch::randn(kShape);
  for (auto _ : state) benchmark::DoNotOptimize(posenc::gelu_forward_cpu(x).data_ptr());
}
void BM_CopyForward(benchmark::State& state) {
  const auto x = torch::randn(kShape);
  for (auto _ : state) benchmark::DoNotOptimize(x.clone().data_ptr());
}
void BM_AtenBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  for (auto _ : state) benchmark::DoNotOptimize(at::gelu_backward(g, x).data_ptr());
}
void BM_FusedBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  for (auto _ : state) benchmark::DoNotOptimize(posenc::gelu_backward_cpu(g, x).data_ptr());
}
void BM_CopyBackward(benchmark::State& state) {
  const auto x = torch::randn(kShape), g = torch::randn(kShape);
  for (auto _ : state) benchmark::DoNotOptimize(at::add(x, g).data_ptr());
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
