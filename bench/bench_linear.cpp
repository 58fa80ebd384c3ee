// Forward + backward of the main job's MLP (linear 96 -> 192, GELU, linear 192 -> 96) and its qkv
// projection (linear 96 -> 288) at batch 128 x 16 tokens, as the composition the stack ran before
// (at::linear -> gelu_fused -> at::linear, ATen's autograd: seven nodes for the MLP) and as one
// node each (posenc/kernels/linear.h: mlp_gelu_fused, linear_fused). Each iteration runs the
// forward from a fresh leaf input and backward into the parameters' gradients (cleared first).
// One intra-op thread (the 1-thread step).
//   ./build/bench/bench_linear --benchmark_repetitions=15 --benchmark_enable_random_interleaving
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/kernels/linear.h"
#include "posenc/posenc.h"

namespace {

struct Mlp {
  at::Tensor x0 = torch::randn({128, 16, 96}), dy = torch::randn({128, 16, 96});
  at::Tensor w1 = (torch::randn({192, 96}) * 0.1).requires_grad_(),
             b1 = torch::randn({192}).requires_grad_(),
             w2 = (torch::randn({96, 192}) * 0.1).requires_grad_(),
             b2 = torch::randn({96}).requires_grad_();
  void clear() {
    for (auto* p : {&w1, &b1, &w2, &b2}) p->mutable_grad() = at::Tensor();
  }
};

struct Projection {
  at::Tensor x0 = torch::randn({128, 16, 96}), dy = torch::randn({128, 16, 288});
  at::Tensor w = (torch::randn({288, 96}) * 0.1).requires_grad_(),
             b = torch::randn({288}).requires_grad_();
  void clear() {
    for (auto* p : {&w, &b}) p->mutable_grad() = at::Tensor();
  }
};

void BM_MlpComposition(benchmark::State& state) {
  Mlp m;
  for (auto _ : state) {
    m.clear();
    auto x = m.x0.clone().requires_grad_();
    posenc::mlp_gelu_reference(x, m.w1, m.b1, m.w2, m.b2).backward(m.dy);
  }
}
void BM_MlpOneNode(benchmark::State& state) {
  Mlp m;
  for (auto _ : state) {
    m.clear();
    auto x = m.x0.clone().requires_grad_();
    posenc::mlp_gelu_fused(x, m.w1, m.b1, m.w2, m.b2).backward(m.dy);
  }
}
void BM_ProjectionAtLinear(benchmark::State& state) {
  Projection p;
  for (auto _ : state) {
    p.clear();
    auto x = p.x0.clone().requires_grad_();
    at::linear(x, p.w, p.b).backward(p.dy);
  }
}
void BM_ProjectionOneNode(benchmark::State& state) {
  Projection p;
  for (auto _ : state) {
    p.clear();
    auto x = p.x0.clone().requires_grad_();
    posenc::linear_fused(x, p.w, p.b).backward(p.dy);
  }
}

BENCHMARK(BM_MlpComposition)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MlpOneNode)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ProjectionAtLinear)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ProjectionOneNode)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  at::set_num_threads(1);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
