// Forward + backward of the main job's MLP (linear 96 -> 192, GELU, linear 192 -> 96) and its qkv
// projection (linear 96 -> 288) at batch 128 x 16 tokens, as the composition the stack ran before
// (at::linear -> gelu_fused -> at::linear, ATen's autograd: seven nodes for the MLP) and as one
// node each (posenc/kernels/linear.h: mlp_gelu_fused, linear_fused). Each iteration runs the
// forward from a fresh leaf input and backward into the parameters' gradients (cleared first).
// And each product of those layers alone at batch 128 x 16 = 2048 rows, posenc's own
// (kernels/cpu/linear_gemm.h: forward from the bias, dx written, dW with db over the same chunks)
// against MKL's as linear_autograd.cpp calls it otherwise (bias rows + addmm_out beta = 1; at::mm;
// at::mm + sum over rows): BM_Product/<kind>/<K>/<N>/<own>, kind 0 forward, 1 dx, 2 dW + db.
// One intra-op thread (the 1-thread step) unless --threads=T.
//   ./build/bench/bench_linear --benchmark_repetitions=15 --benchmark_enable_random_interleaving
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstring>
#include <string>

#include "kernels/cpu/linear_gemm_cpu.h"
#include "posenc/kernels/gelu.h"
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
// the MLP as linear_fused -> gelu_fused -> linear_fused: the same products and GELU passes as the
// one node, the GELU's over whole tensors rather than over rows in cache
void BM_MlpParts(benchmark::State& state) {
  Mlp m;
  for (auto _ : state) {
    m.clear();
    auto x = m.x0.clone().requires_grad_();
    posenc::linear_fused(posenc::gelu_fused(posenc::linear_fused(x, m.w1, m.b1)), m.w2, m.b2)
        .backward(m.dy);
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

// state.range: kind (0 forward, 1 dx, 2 dW + db), K, N, own (1) or MKL (0)
void BM_Product(benchmark::State& state) {
  const int64_t kind = state.range(0), k = state.range(1), n = state.range(2), m = 2048;
  const bool own = state.range(3) != 0;
  if (own && !posenc::detail::linear_gemm_takes(kind == 0 ? n : k)) {
    state.SkipWithError("no own product at this CPU level or width");
    return;
  }
  const auto x = torch::randn({m, k}), w = torch::randn({n, k}) * 0.1, b = torch::randn({n}),
             dy = torch::randn({m, n});
  auto y = torch::empty({m, n}), dx = torch::empty({m, k}), dw = torch::empty({n, k}),
       db = torch::empty({n});
  for (auto _ : state) {
    if (kind == 0) {
      if (own) {
        posenc::detail::linear_forward_own(x, w, b, y);
      } else {
        float* dst = y.data_ptr<float>();
        for (int64_t i = 0; i < m; ++i)
          std::memcpy(dst + i * n, b.data_ptr<float>(), static_cast<size_t>(n) * 4);
        at::addmm_out(y, y, x, w.t());
      }
      benchmark::DoNotOptimize(y.data_ptr<float>());
    } else if (kind == 1) {
      if (own) {
        posenc::detail::linear_input_grad_own(dy, w, dx);
      } else {
        dx = at::mm(dy, w);
      }
      benchmark::DoNotOptimize(dx.data_ptr<float>());
    } else {
      if (own) {
        posenc::detail::linear_weight_grad_own(dy, x, dw, &db);
      } else {
        dw = at::mm(dy.t(), x);
        db = dy.sum(0);
      }
      benchmark::DoNotOptimize(dw.data_ptr<float>());
    }
  }
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * m * k * n, benchmark::Counter::kIsIterationInvariantRate);
}
void product_args(benchmark::internal::Benchmark* b) {
  for (int64_t kind : {0, 1, 2})
    for (auto kn : {std::pair<int64_t, int64_t>{96, 288}, {96, 96}, {96, 192}, {192, 96}})
      for (int64_t own : {0, 1}) b->Args({kind, kn.first, kn.second, own});
}
BENCHMARK(BM_Product)->Apply(product_args)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_MlpComposition)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MlpOneNode)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MlpParts)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ProjectionAtLinear)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ProjectionOneNode)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--threads=", 10) == 0) threads = std::stoi(argv[i] + 10);
  at::set_num_threads(threads);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
