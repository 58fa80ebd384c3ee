// A residual add and the layer norm after it at the main job's size (batch 128 x 16 tokens x
// D 96), forward and backward through autograd as the transformer runs them, 2 threads:
//   aten   h = x + r; y = at::layer_norm(h) (what an eager pre-norm block runs), backward from
//          (dh, dy) as the stack gives it (the engine adds the residual's gradient)
//   fused  posenc::add_layer_norm (posenc/kernels/layer_norm.h)
//   copy   copy_ of the bytes the forward reads and writes (2 in, 2 out)
//   ./build/bench/bench_layer_norm
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/kernels/layer_norm.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

const std::vector<int64_t> kShape = {128 * 16, 96};

struct Inputs {
  at::Tensor x = torch::randn(kShape).requires_grad_(true);
  at::Tensor r = torch::randn(kShape).requires_grad_(true);
  at::Tensor w = (1 + 0.1 * torch::randn({kShape[1]})).requires_grad_(true);
  at::Tensor b = (0.1 * torch::randn({kShape[1]})).requires_grad_(true);
  at::Tensor dh = torch::randn(kShape), dy = torch::randn(kShape);
};

template <typename F>
void forward_backward(benchmark::State& state, F f) {
  Inputs in;
  for (auto _ : state) {
    auto [h, y] = f(in);
    torch::autograd::backward({h, y}, {in.dh, in.dy});
    in.x.mutable_grad().reset();
    in.r.mutable_grad().reset();
    in.w.mutable_grad().reset();
    in.b.mutable_grad().reset();
  }
}

void BM_AtenForward(benchmark::State& state) {
  Inputs in;
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto h = in.x + in.r;
    benchmark::DoNotOptimize(at::layer_norm(h, {kShape[1]}, in.w, in.b, 1e-5).data_ptr());
  }
}
void BM_FusedForward(benchmark::State& state) {
  Inputs in;
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto [h, y] = posenc::add_layer_norm(in.x, in.r, in.w, in.b, 1e-5);
    benchmark::DoNotOptimize(y.data_ptr());
  }
}
void BM_CopyForward(benchmark::State& state) {
  Inputs in;
  auto a = torch::empty(kShape), c = torch::empty(kShape);
  for (auto _ : state) {
    a.copy_(in.x.detach());
    c.copy_(in.r.detach());
    benchmark::DoNotOptimize(c.data_ptr());
  }
}
void BM_AtenForwardBackward(benchmark::State& state) {
  forward_backward(state, [](const Inputs& in) {
    auto h = in.x + in.r;
    return std::make_tuple(h, at::layer_norm(h, {kShape[1]}, in.w, in.b, 1e-5));
  });
}
void BM_FusedForwardBackward(benchmark::State& state) {
  forward_backward(
      state, [](const Inputs& in) { return posenc::add_layer_norm(in.x, in.r, in.w, in.b, 1e-5); });
}

BENCHMARK(BM_AtenForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_FusedForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_CopyForward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_AtenForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_FusedForwardBackward)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    r.row("aten / fused add + layer norm, forward (no grad)",
          r.time("BM_AtenForward") / r.time("BM_FusedForward"), "> 1");
    r.row("aten / fused add + layer norm, forward + backward (autograd)",
          r.time("BM_AtenForwardBackward") / r.time("BM_FusedForwardBackward"), "> 1");
    r.row("fused / copy_, forward (2 in, 2 out)",
          r.time("BM_FusedForward") / r.time("BM_CopyForward"), "");
  });
}
