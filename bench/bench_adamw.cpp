// The optimizer part of a training step at the main job's size: gradient clipping (norm 2,
// max 1) and one AdamW update of the 4-block ViT's 537,866 parameters in 54 tensors (matrices
// with weight decay, vectors without), as posenc train runs it.
//   libtorch  torch::nn::utils::clip_grad_norm_ + torch::optim::AdamW::step (~2,100 ATen ops)
//   fused     clip_grad_norm_fused + FusedAdamW::step (two passes for the clip, one for AdamW)
//   copy      copy_ of the bytes the fused AdamW pass reads and writes (p, g, m, v in; p, m, v
//             out): the memory-bound floor
//   ./build/bench/bench_adamw
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "posenc/posenc.h"
#include "posenc/train/fused_adamw.h"
#include "ratio_reporter.h"

namespace {

using namespace posenc;

struct Setup {
  TokenClassifier model{nullptr};
  std::vector<at::Tensor> params;
  Setup() {
    torch::manual_seed(0);
    model =
        TokenClassifier(TokenClassifierOptions(49, 10, TransformerOptions(128, 4, 4).mlp_ratio(2)),
                        as_encoding(Nope()));
    params = model->parameters();
    for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()) * 0.01;
  }
  std::vector<torch::optim::OptimizerParamGroup> groups() const {
    std::vector<at::Tensor> decay, plain;
    for (const auto& p : params) (p.dim() >= 2 ? decay : plain).push_back(p);
    std::vector<torch::optim::OptimizerParamGroup> g;
    g.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                              torch::optim::AdamWOptions(1e-6).weight_decay(0.05)));
    g.emplace_back(plain, std::make_unique<torch::optim::AdamWOptions>(
                              torch::optim::AdamWOptions(1e-6).weight_decay(0.0)));
    return g;
  }
};

void BM_LibTorch(benchmark::State& state) {
  Setup s;
  torch::optim::AdamW opt(s.groups());
  for (auto _ : state) {
    torch::nn::utils::clip_grad_norm_(s.params, 1.0);
    opt.step();
  }
}

void BM_Fused(benchmark::State& state) {
  Setup s;
  train::FusedAdamW opt(s.groups());
  for (auto _ : state) {
    train::clip_grad_norm_fused(s.params, 1.0);
    opt.step();
  }
}

void BM_Copy(benchmark::State& state) {
  Setup s;
  int64_t n = 0;
  for (const auto& p : s.params) n += p.numel();
  auto in = torch::randn({4, n}), out = torch::empty({3, n});
  for (auto _ : state) out.copy_(in.narrow(0, 0, 3));
  benchmark::DoNotOptimize(out.data_ptr());
}

BENCHMARK(BM_LibTorch)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_Fused)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);
BENCHMARK(BM_Copy)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1);

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    r.row("libtorch / fused (clip + AdamW step)", r.time("BM_LibTorch") / r.time("BM_Fused"),
          ">= 3");
    r.row("fused / copy_ of p, m, v (3 in, 3 out)", r.time("BM_Fused") / r.time("BM_Copy"), "<= 4");
  });
}
