// The element-wise fused CPU kernels (RoPE, GELU forward and backward, add + LayerNorm forward and
// backward) against the memory-bandwidth floor and against ATen, at two sizes (issue 49: each
// fused kernel at >= 0.9x the copy_ bandwidth of its bytes, at the AVX2 and the AVX-512 level):
//   vit     the main job's activations (configs/vit_fashion.yaml: batch 128 x 16 tokens, D 96,
//           3 heads of 32, MLP 192): everything in L2 or L3
//   large   out of cache: 30 MiB per tensor (7.5 Mi floats; 60-120 MiB per pass, > the 32 MiB L3)
// Per case, the bytes the pass must move (every input read once, every output written once):
//   rope        q, k in, q', k' out (the [N, Dh/2] tables are small)   4 n floats (n = q's size)
//   gelu        x in, y out                                              2 n
//   gelu_bwd    dy, x in, dx out                                         3 n
//   ln          x, r in, h, y out (add + LayerNorm)                      4 n
//   ln_bwd      dy, dh_in, h in, dh out (dw, db: [D] each)               4 n
// Every case writes into outputs allocated once before its loop, so no case pays the kernel's
// page faults for fresh pages (nor malloc's) inside the timed loop:
//   fused   posenc's pass at the process's level (POSENC_CPU_CAPABILITY=avx2|avx512) through the
//           *_out entries (rope_rotate_cpu, gelu_*_cpu_out, add_layer_norm_*_cpu_out)
//   avx2, avx512   (gelu, gelu_bwd) the level's table entry itself, whatever the process's level,
//           chunked as the fused pass chunks: both levels in one process, interleaved
//   aten    what eager LibTorch runs (ATen at its own level; ATEN_CPU_CAPABILITY=avx2 lowers it),
//           its out= kernels into preallocated tensors: rope: q cos + rotate_half(q) sin as
//           mul_out, neg_out, cat_out, mul_out, add_out; gelu: at::gelu_out /
//           at::gelu_backward_out; ln: at::add_out, then at::layer_norm; ln_bwd:
//           at::native_layer_norm_backward, then dh.add_(dh_in). ATen's layer norm has no out=
//           kernel (native_layer_norm.out and its backward's are generated: the functional op,
//           then a copy, one more pass), so those two allocate their outputs, from the heap that
//           GLIBC_TUNABLES keeps (tools/bench_kernel_width.sh: freed tensors below 32 MiB stay)
//   copy    copy_ of the same number of bytes (half read, half written) into preallocated
//           tensors: the floor; GB/s = the kernel's bytes / time.
//   paired  copy and fused back to back in each iteration (alternating which goes first), each
//           timed alone: the median of the per-iteration ratios copy_ time / fused time (the
//           table's "paired" row: the median over repetitions). On a shared machine the load
//           changes between cases run 0.2 s apart; the two halves of a pair see the same load.
// Out of cache the fused passes stream their outputs (non-temporal stores, stream_stores.h; the
// per-level GELU cases too); copy_ (ATen's copy kernel) stores normally, so it also reads every
// destination line before writing it: the ratio can exceed 1.
// Threads: --threads=N (default 1). Run with repetitions and random interleaving on a shared
// machine; the ratio table uses each case's median (ratio_reporter.h):
//   POSENC_CPU_CAPABILITY=avx512 ./build/bench/bench_kernel_width --threads=1 \
//     --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
// tools/bench_kernel_width.sh runs it at both levels and both thread counts.
#include <ATen/Version.h>
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/stream_stores.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/kernels/gelu.h"
#include "posenc/kernels/layer_norm.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using posenc::RopeLayout;

struct Size {
  const char* name;
  int64_t rows, d;                 // gelu and ln: [rows, d]
  int64_t rope_b, rope_n, rope_h;  // rope: [b, n, h, rope_d]
  int64_t rope_d;
};
// vit: gelu on the MLP's [2048, 192], ln on [2048, 96], RoPE on q, k = [128, 16, 3, 32]
// large: 8 Mi floats per tensor ([8192, 1024], q, k = [2, 2048, 16, 128])
constexpr Size kSizes[] = {{"vit", 2048, 96, 128, 16, 3, 32},
                           {"large", 8192, 1024, 2, 2048, 16, 128}};
constexpr int64_t kGeluWidthVit = 192;  // the MLP's hidden width (mlp_ratio 2)

int64_t gelu_cols(int64_t size) { return size == 0 ? kGeluWidthVit : kSizes[1].d; }

enum Kernel { kRope, kGelu, kGeluBackward, kLayerNorm, kLayerNormBackward, kKernels };
/// Elements per parallel chunk of the per-level GELU cases (gelu_cpu.cpp's kGeluGrain).
constexpr int64_t kGeluGrain = 1 << 16;
const char* const kKernelNames[] = {"rope", "gelu", "gelu_bwd", "ln", "ln_bwd"};

// floats one pass moves (inputs read + outputs written)
int64_t floats_moved(int kernel, int64_t size) {
  const Size& s = kSizes[size];
  switch (kernel) {
    case kRope:
      return 4 * s.rope_b * s.rope_n * s.rope_h * s.rope_d;
    case kGelu:
      return 2 * s.rows * gelu_cols(size);
    case kGeluBackward:
      return 3 * s.rows * gelu_cols(size);
    default:
      return 4 * s.rows * s.d;
  }
}

void set_threads(int threads) { at::set_num_threads(threads); }

struct RopeInputs {
  at::Tensor q, k, cos, sin, cos_full, sin_full;
  explicit RopeInputs(const Size& s) {
    torch::manual_seed(0);
    q = torch::randn({s.rope_b, s.rope_n, s.rope_h, s.rope_d});
    k = torch::randn({s.rope_b, s.rope_n, s.rope_h, s.rope_d});
    auto inv =
        torch::pow(100.0, -torch::arange(0, s.rope_d, 2, torch::kFloat64) / double(s.rope_d));
    std::tie(cos, sin) = posenc::rope_cos_sin(torch::arange(s.rope_n, torch::kFloat64), inv);
    cos_full = torch::cat({cos, cos}, -1).view({1, s.rope_n, 1, s.rope_d});
    sin_full = torch::cat({sin, sin}, -1).view({1, s.rope_n, 1, s.rope_d});
  }
};

// eager's q cos + rotate_half(q) sin, each op into a preallocated tensor (the same ops as
// `q * cos + torch::cat({-q2, q1}, -1) * sin`)
struct EagerRope {
  at::Tensor product_cos, negated, rotated, product_sin;
  explicit EagerRope(const at::Tensor& x)
      : product_cos(at::empty_like(x)),
        negated(at::empty_like(x.narrow(-1, 0, x.size(-1) / 2))),
        rotated(at::empty_like(x)),
        product_sin(at::empty_like(x)) {}
  void run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
    const int64_t half = x.size(-1) / 2;
    at::mul_out(product_cos, x, cos);
    at::neg_out(negated, x.narrow(-1, half, half));
    at::cat_out(rotated, {negated, x.narrow(-1, 0, half)}, -1);
    at::mul_out(product_sin, rotated, sin);
    at::add_out(out, product_cos, product_sin);
  }
};

struct NormInputs {
  at::Tensor x, r, w, b, dy, dh_in, h, mean, rstd, aten_mean, aten_rstd;
  explicit NormInputs(const Size& s) {
    torch::manual_seed(0);
    x = torch::randn({s.rows, s.d});
    r = torch::randn({s.rows, s.d});
    w = 1 + 0.1 * torch::randn({s.d});
    b = 0.1 * torch::randn({s.d});
    dy = torch::randn({s.rows, s.d});
    dh_in = torch::randn({s.rows, s.d});
    if (posenc::add_layer_norm_fused_supported(x, r, w, b))
      std::tie(h, std::ignore, mean, rstd) =
          posenc::detail::add_layer_norm_forward_cpu(x, r, w, b, 1e-5);
    else
      h = x + r;
    std::tie(std::ignore, aten_mean, aten_rstd) = at::native_layer_norm(h, {s.d}, w, b, 1e-5);
  }
};

// One pass of a case, its tensors allocated once (the closure owns them).
using Pass = std::function<void()>;

// copy_ of the kernel's bytes in pieces of at most one of the kernel's tensors, into tensors
// allocated once.
Pass make_copy(int kernel, int64_t size) {
  const int64_t piece = kernel == kGelu || kernel == kGeluBackward
                            ? kSizes[size].rows * gelu_cols(size)
                            : floats_moved(kernel, size) / 4;
  std::vector<at::Tensor> sources, targets;
  for (int64_t left = floats_moved(kernel, size) / 2; left > 0; left -= piece) {
    sources.push_back(torch::randn({std::min(left, piece)}));
    targets.push_back(at::empty_like(sources.back()));
  }
  return [sources, targets]() mutable {
    for (size_t i = 0; i < sources.size(); ++i) {
      targets[i].copy_(sources[i]);
      benchmark::DoNotOptimize(targets[i].data_ptr());
    }
  };
}

// posenc's pass at the process's level into outputs allocated once; empty where it has none.
Pass make_fused(int kernel, int64_t size) {
  const Size& s = kSizes[size];
  if (kernel == kRope) {
    auto in = std::make_shared<RopeInputs>(s);
    const std::vector<at::Tensor> inputs = {in->q, in->k};
    const std::vector<at::Tensor> outputs = {at::empty_like(in->q), at::empty_like(in->k)};
    return [in, inputs, outputs] {
      posenc::rope_rotate_cpu(inputs, outputs, in->cos, in->sin, RopeLayout::kHalf,
                              /*inverse=*/false);
      benchmark::DoNotOptimize(outputs[1].data_ptr());
    };
  }
  if (kernel == kGelu || kernel == kGeluBackward) {
    const auto x = torch::randn({s.rows, gelu_cols(size)});
    const auto dy = torch::randn({s.rows, gelu_cols(size)});
    auto y = at::empty_like(x);
    return [kernel, x, dy, y]() mutable {
      if (kernel == kGelu)
        posenc::gelu_forward_cpu_out(x, y);
      else
        posenc::gelu_backward_cpu_out(dy, x, y);
      benchmark::DoNotOptimize(y.data_ptr());
    };
  }
  auto in = std::make_shared<NormInputs>(s);
  if (!in->mean.defined()) return {};
  auto h = at::empty_like(in->x), y = at::empty_like(in->x);
  auto mean = at::empty_like(in->mean), rstd = at::empty_like(in->rstd);
  auto dw = at::empty_like(in->w), db = at::empty_like(in->b);
  return [kernel, in, h, y, mean, rstd, dw, db]() mutable {
    if (kernel == kLayerNorm)
      posenc::detail::add_layer_norm_forward_cpu_out(in->x, in->r, in->w, in->b, 1e-5, h, y, mean,
                                                     rstd);
    else
      posenc::detail::add_layer_norm_backward_cpu_out(in->dy, in->dh_in, in->h, in->mean, in->rstd,
                                                      in->w, y, dw, db);
    benchmark::DoNotOptimize(y.data_ptr());
  };
}

// state.range(0): the size; --threads sets the thread count before any case runs.
void BM_Copy(benchmark::State& state, int kernel) {
  const int64_t size = state.range(0);
  const Pass pass = make_copy(kernel, size);
  for (auto _ : state) pass();
  state.SetBytesProcessed(state.iterations() * floats_moved(kernel, size) * 4);
}

void BM_Fused(benchmark::State& state, int kernel) {
  const int64_t size = state.range(0);
  const Pass pass = make_fused(kernel, size);
  if (!pass) return state.SkipWithError("no fused LayerNorm at this level");
  for (auto _ : state) pass();
  state.SetBytesProcessed(state.iterations() * floats_moved(kernel, size) * 4);
}

/// Per paired case ("ln/1"), the median ratio of each of its runs (repetitions).
std::map<std::string, std::vector<double>>& paired_ratios() {
  static std::map<std::string, std::vector<double>> ratios;
  return ratios;
}

// copy_ and the fused pass back to back in every iteration (their order alternating), each timed
// alone: the ratio of the two times per iteration, whose median is robust to load that comes
// and goes on a shared machine (both sides of each ratio saw the same seconds). The iteration's
// time is the pair's.
void BM_Paired(benchmark::State& state, int kernel) {
  const int64_t size = state.range(0);
  const Pass copy = make_copy(kernel, size), fused = make_fused(kernel, size);
  if (!fused) return state.SkipWithError("no fused LayerNorm at this level");
  std::vector<double> ratios;
  const auto timed = [](const Pass& pass) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  for (auto _ : state) {
    const bool copy_first = ratios.size() % 2 == 0;
    const double first = timed(copy_first ? copy : fused);
    const double second = timed(copy_first ? fused : copy);
    ratios.push_back(copy_first ? first / second : second / first);  // copy_'s time / fused's
  }
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  state.counters["copy_over_fused"] = median;
  paired_ratios()[std::string(kKernelNames[kernel]) + "/" + std::to_string(size)].push_back(median);
}

// GELU through one level's table entry (state.range(1): the CpuCapability), whatever the level of
// the process: both vector levels measured in one process.
void BM_GeluLevel(benchmark::State& state, int kernel) {
  const int64_t size = state.range(0);
  const auto level = static_cast<posenc::CpuCapability>(state.range(1));
  const posenc::detail::CpuKernels& table = posenc::detail::cpu_kernels_at(level);
  const auto x = torch::randn({kSizes[size].rows, gelu_cols(size)});
  const auto dy = torch::randn_like(x);
  auto y = at::empty_like(x);
  const float* px = x.const_data_ptr<float>();
  const float* pdy = dy.const_data_ptr<float>();
  float* py = y.mutable_data_ptr<float>();
  // streamed as gelu_cpu.cpp streams: an output of kStreamMinBytes or more
  const bool stream = y.nbytes() >= static_cast<size_t>(posenc::detail::kStreamMinBytes);
  for (auto _ : state) {
    at::parallel_for(0, x.numel(), kGeluGrain, [&](int64_t b, int64_t e) {
      if (kernel == kGelu)
        table.gelu(px + b, py + b, e - b, stream);
      else
        table.gelu_backward(pdy + b, px + b, py + b, e - b, stream);
      if (stream) posenc::detail::stream_fence();
    });
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * floats_moved(kernel, size) * 4);
}

void BM_Aten(benchmark::State& state, int kernel) {
  const int64_t size = state.range(0);
  const Size& s = kSizes[size];
  torch::NoGradGuard no_grad;
  if (kernel == kRope) {
    RopeInputs in(s);
    EagerRope eager_q(in.q), eager_k(in.k);
    auto q = at::empty_like(in.q), k = at::empty_like(in.k);
    for (auto _ : state) {
      eager_q.run(in.q, in.cos_full, in.sin_full, q);
      eager_k.run(in.k, in.cos_full, in.sin_full, k);
      benchmark::DoNotOptimize(k.data_ptr());
    }
  } else if (kernel == kGelu || kernel == kGeluBackward) {
    const auto x = torch::randn({s.rows, gelu_cols(size)});
    const auto dy = torch::randn({s.rows, gelu_cols(size)});
    auto y = at::empty_like(x);
    for (auto _ : state) {
      if (kernel == kGelu)
        at::gelu_out(y, x);
      else
        at::gelu_backward_out(y, dy, x);
      benchmark::DoNotOptimize(y.data_ptr());
    }
  } else {
    NormInputs in(s);
    auto h = at::empty_like(in.x);
    for (auto _ : state) {
      if (kernel == kLayerNorm) {
        at::add_out(h, in.x, in.r);
        auto y = at::layer_norm(h, {s.d}, in.w, in.b, 1e-5);
        benchmark::DoNotOptimize(y.data_ptr());
      } else {
        auto [dh, dw, db] = at::native_layer_norm_backward(
            in.dy, in.h, {s.d}, in.aten_mean, in.aten_rstd, in.w, in.b, {true, true, true});
        dh.add_(in.dh_in);
        benchmark::DoNotOptimize(dh.data_ptr());
      }
    }
  }
  state.SetBytesProcessed(state.iterations() * floats_moved(kernel, size) * 4);
}

// The vector levels this CPU has (the per-level GELU cases).
std::vector<posenc::CpuCapability> vector_levels() {
  std::vector<posenc::CpuCapability> out;
  for (const auto level : {posenc::CpuCapability::kAvx2, posenc::CpuCapability::kAvx512})
    if (level <= posenc::cpu_capability_detected()) out.push_back(level);
  return out;
}

void register_cases() {
  const auto configure = [](benchmark::internal::Benchmark* b) {
    b->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(0.2);
  };
  for (int kernel = 0; kernel < kKernels; ++kernel) {
    const std::string k = kKernelNames[kernel];
    for (auto [name, f] : {std::pair{"copy", &BM_Copy},
                           {"fused", &BM_Fused},
                           {"aten", &BM_Aten},
                           {"paired", &BM_Paired}})
      configure(benchmark::RegisterBenchmark((std::string(name) + "/" + k).c_str(), f, kernel)
                    ->Arg(0)
                    ->Arg(1));
    if (kernel != kGelu && kernel != kGeluBackward) continue;
    for (const auto level : vector_levels())
      configure(
          benchmark::RegisterBenchmark((std::string(posenc::to_string(level)) + "/" + k).c_str(),
                                       &BM_GeluLevel, kernel)
              ->Args({0, static_cast<int64_t>(level)})
              ->Args({1, static_cast<int64_t>(level)}));
  }
}

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  int threads = 1;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0)
      threads = std::stoi(argv[i] + 10);
    else
      args.push_back(argv[i]);
  }
  set_threads(threads);
  int count = static_cast<int>(args.size());
  register_cases();
  std::cout << "threads: " << at::get_num_threads()
            << ", ATen CPU capability: " << at::get_cpu_capability()
            << ", posenc CPU level: " << posenc::to_string(posenc::cpu_capability()) << "\n";
  return posenc::bench::run_with_ratios(
      count, args.data(), [](const posenc::bench::RatioReporter& r) {
        for (int kernel = 0; kernel < kKernels; ++kernel)
          for (int64_t size = 0; size < 2; ++size) {
            const std::string tail =
                std::string(kKernelNames[kernel]) + "/" + std::to_string(size) + "/";
            const double fused = r.time("fused/" + tail), copy = r.time("copy/" + tail),
                         aten = r.time("aten/" + tail);
            if (fused <= 0) continue;
            const double gbs = floats_moved(kernel, size) * 4 / (fused * 1e-6) / 1e9;
            const std::string what = std::string(kKernelNames[kernel]) + " " + kSizes[size].name;
            r.value(what + ": fused", gbs, "GB/s");
            r.row(what + ": fused bandwidth / copy_'s", copy / fused, ">= 0.9");
            const auto paired = paired_ratios().find(std::string(kKernelNames[kernel]) + "/" +
                                                     std::to_string(size));
            if (paired != paired_ratios().end()) {
              std::vector<double> medians = paired->second;
              std::sort(medians.begin(), medians.end());
              r.row(what + ": the same, paired (median)", medians[medians.size() / 2], ">= 0.9");
            }
            r.row(what + ": aten time / fused", aten / fused, "> 1");
            if (kernel != kGelu && kernel != kGeluBackward) continue;
            for (const auto level : vector_levels()) {
              const std::string name = posenc::to_string(level);
              const double at_level = r.time(name + "/" + tail);
              if (at_level <= 0) continue;
              r.row(what + ": " + name + " level's bandwidth / copy_'s", copy / at_level, ">= 0.9");
              r.row(what + ": aten time / " + name + " level", aten / at_level, "> 1");
            }
          }
      });
}
