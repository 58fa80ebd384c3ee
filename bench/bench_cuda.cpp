// CUDA benchmarks (Google Benchmark), built with the glue (a CUDA-enabled LibTorch). Every case
// runs in one process with its baselines:
//   copy_   the same bytes copied on the device (q and k): the memory-bandwidth limit
//   eager   q * cos + rotate_half(q) * sin with [N, Dh] tables, as a user writes it in LibTorch
//   fused   posenc's kernel through rope_fused_qk (allocating) and rope_fused_ (in place)
// Sizes: 0 = the q, k = [1, 2048, 16, 128]; 1 = [4, 4096, 32, 128] (256 MiB each, well
// past the L2), where the bandwidth ratio is meant. Attention: the on-the-fly ALiBi kernels
// (forward; forward + backward) vs SDPA with the bias materialized.
// Timing: kRepeat launches between two device synchronizations (manual time per launch), so the
// sync's latency is amortized.
//   ./build-gpu/bench/bench_cuda --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using posenc::RopeLayout;

constexpr int kRepeat = 20;

struct Size {
  int64_t b, n, h, d;
};
constexpr Size kSizes[] = {{1, 2048, 16, 128}, {4, 4096, 32, 128}};

struct Inputs {
  torch::Tensor q, k, cos, sin, cos_full, sin_full;
  explicit Inputs(const Size& s, torch::ScalarType dtype) {
    torch::manual_seed(0);
    auto options = torch::dtype(dtype).device(torch::kCUDA);
    q = torch::randn({s.b, s.n, s.h, s.d}, options);
    k = torch::randn({s.b, s.n, s.h, s.d}, options);
    auto inv = torch::pow(10000.0, -torch::arange(0, s.d, 2, torch::kFloat64) / double(s.d));
    std::tie(cos, sin) = posenc::rope_cos_sin(torch::arange(s.n, torch::kFloat64), inv);
    cos = cos.cuda();
    sin = sin.cuda();
    // HF's emb = cat(freqs, freqs), in the activations' dtype
    cos_full = torch::cat({cos, cos}, -1).view({1, s.n, 1, s.d}).to(dtype);
    sin_full = torch::cat({sin, sin}, -1).view({1, s.n, 1, s.d}).to(dtype);
  }
};

Inputs& inputs(int64_t size, torch::ScalarType dtype = torch::kFloat32) {
  static std::map<std::pair<int64_t, int>, std::unique_ptr<Inputs>> cache;
  auto& slot = cache[{size, static_cast<int>(dtype)}];
  if (!slot) slot = std::make_unique<Inputs>(kSizes[size], dtype);
  return *slot;
}

torch::ScalarType dtype_arg(int64_t arg) { return arg == 0 ? torch::kFloat32 : torch::kBFloat16; }

// Times kRepeat calls of `body` per iteration, per call.
template <typename Body>
void run_timed(benchmark::State& state, int64_t bytes_per_call, Body body) {
  if (!torch::cuda::is_available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  body();  // warm up (allocator, first launch)
  torch::cuda::synchronize();
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < kRepeat; ++r) body();
    torch::cuda::synchronize();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    state.SetIterationTime(took.count() / kRepeat);
  }
  state.SetBytesProcessed(state.iterations() * bytes_per_call);
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// args: size, dtype (0 fp32, 1 bf16)
void BM_Copy(benchmark::State& state) {
  if (!torch::cuda::is_available()) return state.SkipWithError("no CUDA device");
  auto& in = inputs(state.range(0), dtype_arg(state.range(1)));
  auto q = torch::empty_like(in.q), k = torch::empty_like(in.k);
  run_timed(state, 4 * in.q.nbytes(), [&] {
    q.copy_(in.q);
    k.copy_(in.k);
  });
}

void BM_EagerRotateHalf(benchmark::State& state) {
  if (!torch::cuda::is_available()) return state.SkipWithError("no CUDA device");
  auto& in = inputs(state.range(0), dtype_arg(state.range(1)));
  run_timed(state, 4 * in.q.nbytes(), [&] {
    auto q = in.q * in.cos_full + rotate_half(in.q) * in.sin_full;
    auto k = in.k * in.cos_full + rotate_half(in.k) * in.sin_full;
    benchmark::DoNotOptimize(q.data_ptr());
    benchmark::DoNotOptimize(k.data_ptr());
  });
}

// args: size, dtype, layout
void BM_Fused(benchmark::State& state) {
  if (!torch::cuda::is_available()) return state.SkipWithError("no CUDA device");
  auto& in = inputs(state.range(0), dtype_arg(state.range(1)));
  const auto layout = static_cast<RopeLayout>(state.range(2));
  run_timed(state, 4 * in.q.nbytes(), [&] {
    auto [q, k] = posenc::rope_fused_qk(in.q, in.k, in.cos, in.sin, layout);
    benchmark::DoNotOptimize(q.data_ptr());
  });
}

void BM_FusedInPlace(benchmark::State& state) {
  if (!torch::cuda::is_available()) return state.SkipWithError("no CUDA device");
  auto& in = inputs(state.range(0), dtype_arg(state.range(1)));
  auto q = in.q.clone(), k = in.k.clone();
  run_timed(state, 4 * in.q.nbytes(), [&] {
    posenc::rope_fused_(q, in.cos, in.sin, RopeLayout::kHalf);
    posenc::rope_fused_(k, in.cos, in.sin, RopeLayout::kHalf);
  });
}

// Attention [1, 2048, 16, 64] bf16, ALiBi, causal. args: implementation (0 fused with the bias
// on the fly, 1 SDPA with the bias and the causal mask materialized as one float mask), pass
// (0 forward, 1 forward + backward for a fixed dO).
void BM_AttentionAlibiCausal(benchmark::State& state) {
  if (!torch::cuda::is_available()) return state.SkipWithError("no CUDA device");
  const int64_t b = 1, n = 2048, h = 16, d = 64;
  const bool backward = state.range(1) == 1;
  auto options = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  auto q = torch::randn({b, n, h, d}, options).requires_grad_(backward);
  auto k = torch::randn({b, n, h, d}, options).requires_grad_(backward);
  auto v = torch::randn({b, n, h, d}, options).requires_grad_(backward);
  auto dout = torch::randn({b, n, h, d}, options);
  auto positions = torch::arange(n, torch::kFloat64);
  posenc::BiasSpec spec;
  spec.form = posenc::BiasForm::kAlibi;
  spec.slopes = torch::tensor(posenc::alibi_slopes(h), torch::kFloat64).to(torch::kFloat32);
  posenc::AttentionMasks masks;
  masks.causal = true;
  const double scale = 0.125;
  std::function<torch::Tensor()> forward;
  torch::Tensor attn_mask;
  if (state.range(0) == 0) {
    forward = [&] {
      return posenc::attention_fused(q, k, v, spec, positions, positions, masks, scale);
    };
  } else {
    auto bias = posenc::bias_from_spec(spec, positions, positions, h).cuda();  // [H, N, N]
    auto i = torch::arange(n).unsqueeze(1), j = torch::arange(n).unsqueeze(0);
    auto mask = torch::zeros({n, n}).masked_fill(j > i, -INFINITY).cuda();
    attn_mask = (bias + mask).unsqueeze(0).to(torch::kBFloat16);
    forward = [&] {
      return at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2), attn_mask, 0.0, false, scale)
          .transpose(1, 2);
    };
  }
  run_timed(state, 0, [&] {
    auto out = forward();
    if (backward) {
      out.backward(dout);
      benchmark::DoNotOptimize(q.grad().data_ptr());
    } else {
      benchmark::DoNotOptimize(out.data_ptr());
    }
  });
}

#define CUDA_CASE(name) BENCHMARK(name)->UseManualTime()->Unit(benchmark::kMicrosecond)
CUDA_CASE(BM_Copy)->Args({0, 0})->Args({1, 0})->Args({1, 1});
CUDA_CASE(BM_EagerRotateHalf)->Args({0, 0})->Args({1, 0})->Args({1, 1});
CUDA_CASE(BM_Fused)->Args({0, 0, 0})->Args({1, 0, 0})->Args({1, 0, 1})->Args({1, 1, 0});
CUDA_CASE(BM_FusedInPlace)->Args({0, 0})->Args({1, 0});
CUDA_CASE(BM_AttentionAlibiCausal)->Args({0, 0})->Args({1, 0})->Args({0, 1})->Args({1, 1});

}  // namespace

int main(int argc, char** argv) {
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    auto t = [&](const std::string& name) { return r.time(name); };
    auto row = [&](const std::string& what, double ratio, const std::string& goal) {
      r.row(what, ratio, goal);
    };
    const std::string copy_large = "BM_Copy/1/0/", fused_large = "BM_Fused/1/0/0/";
    row("copy_ / fused (half, fp32, large): bandwidth", t(copy_large) / t(fused_large), ">= 0.85");
    row("copy_ / fused (interleaved, fp32, large)", t(copy_large) / t("BM_Fused/1/0/1/"),
        ">= 0.85");
    row("copy_ / fused (half, bf16, large)", t("BM_Copy/1/1/") / t("BM_Fused/1/1/0/"), ">= 0.85");
    row("copy_ / fused in place (fp32, large)", t(copy_large) / t("BM_FusedInPlace/1/0/"), "-");
    row("copy_ / fused (half, fp32, [1,2048,16,128])", t("BM_Copy/0/0/") / t("BM_Fused/0/0/0/"),
        "-");
    row("eager rotate_half / fused (fp32, large)", t("BM_EagerRotateHalf/1/0/") / t(fused_large),
        ">= 3");
    row("eager rotate_half / fused (bf16, large)",
        t("BM_EagerRotateHalf/1/1/") / t("BM_Fused/1/1/0/"), ">= 3");
    row("SDPA + materialized ALiBi / fused attention",
        t("BM_AttentionAlibiCausal/1/0/") / t("BM_AttentionAlibiCausal/0/0/"), "-");
    row("SDPA + materialized ALiBi / fused attention, fwd+bwd",
        t("BM_AttentionAlibiCausal/1/1/") / t("BM_AttentionAlibiCausal/0/1/"), "-");
  });
}
