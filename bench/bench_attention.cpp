// Attention-with-position-bias benchmarks (Google Benchmark), baselines in the same process:
//   fused/none     posenc's tiled kernel, no bias            (the cost of attention itself)
//   fused/alibi    the same with ALiBi computed on the fly
//   fused/t5       the same with T5 buckets looked up on the fly
//   fused/shaw     the same with Shaw's query-dependent relative table (K = 16): q . a scores
//                  per row, looked up per pair
//   eager          what a user writes: softmax(q k^T * scale + bias) v, the bias materialized
//                  [H, L, L] once outside the loop (256 MiB at this size); Shaw's depends on q,
//                  so it is materialized in the loop ([B, H, L, L], as the encoder's bias())
//   sdpa           at::scaled_dot_product_attention, the bias as its additive mask (no bias:
//                  ATen's CPU flash kernel; fwd+bwd too, the target ratio >= 1.1 of issue 49)
//   rope           RoPE + attention: rope_fused_qk then the fused kernel (0), RoPE inside the
//                  kernel's tiles (1), eager rotate_half then SDPA (2)
// q, k, v = [1, 2048, 16, 128] fp32. Prints the ratios at the end.
//   ./build/bench/bench_attention
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <iomanip>
#include <iostream>
#include <map>
#include <vector>

#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/mkl_sgemm.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "ratio_reporter.h"

namespace {

using namespace posenc;

constexpr int64_t kB = 1, kN = 2048, kH = 16, kD = 128;

struct Inputs {
  torch::Tensor q, k, v, positions, alibi_bias, t5_bias;
  BiasSpec none, alibi, t5, shaw;
  double scale = 1.0 / std::sqrt(double(kD));
  Inputs() {
    torch::manual_seed(0);
    q = torch::randn({kB, kN, kH, kD});
    k = torch::randn({kB, kN, kH, kD});
    v = torch::randn({kB, kN, kH, kD});
    positions = torch::arange(kN, torch::kFloat64);
    Alibi alibi_encoder(AlibiOptions(kH).form(AlibiForm::kSymmetric));
    T5 t5_encoder{T5Options(kH)};
    alibi = alibi_encoder->bias_spec();
    t5 = t5_encoder->bias_spec();
    t5.table = t5.table.detach();
    Shaw shaw_encoder(ShawOptions(kD).max_relative_position(16));
    shaw = shaw_encoder->bias_spec();
    shaw.table = shaw.table.detach();
    alibi_bias = bias_from_spec(alibi, positions, positions, kH);
    t5_bias = bias_from_spec(t5, positions, positions, kH);
  }
};

Inputs& inputs() {
  static Inputs in;
  return in;
}

const BiasSpec& spec(int64_t which) {
  auto& in = inputs();
  return which == 0 ? in.none : which == 1 ? in.alibi : which == 2 ? in.t5 : in.shaw;
}

// The bias as eager code has it: precomputed, or (Shaw) computed from q [B, N, H, D] each time.
torch::Tensor bias(int64_t which, const torch::Tensor& q) {
  auto& in = inputs();
  if (which == 3) return bias_from_spec(in.shaw, in.positions, in.positions, kH, q);
  return which == 0 ? torch::Tensor() : which == 1 ? in.alibi_bias : in.t5_bias;
}

void BM_Fused(benchmark::State& state) {
  auto& in = inputs();
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = attention_fused(in.q, in.k, in.v, spec(state.range(0)), in.positions, in.positions,
                               {}, in.scale);
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void BM_Eager(benchmark::State& state) {
  auto& in = inputs();
  torch::NoGradGuard no_grad;
  auto q = in.q.transpose(1, 2), k = in.k.transpose(1, 2), v = in.v.transpose(1, 2);
  for (auto _ : state) {
    auto b = bias(state.range(0), in.q);
    auto logits = torch::matmul(q, k.transpose(-1, -2)) * in.scale;
    if (b.defined()) logits = logits + b;
    auto out = torch::matmul(torch::softmax(logits, -1), v);
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void BM_Sdpa(benchmark::State& state) {
  auto& in = inputs();
  torch::NoGradGuard no_grad;
  auto q = in.q.transpose(1, 2), k = in.k.transpose(1, 2), v = in.v.transpose(1, 2);
  for (auto _ : state) {
    auto b = bias(state.range(0), in.q);
    auto out = at::scaled_dot_product_attention(
        q, k, v, b.defined() ? std::optional<at::Tensor>(b) : std::nullopt);
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void BM_Rope(benchmark::State& state) {
  auto& in = inputs();
  torch::NoGradGuard no_grad;
  auto inv = torch::pow(10000.0, -torch::arange(0, kD, 2, torch::kFloat64) / double(kD));
  AttentionRotary rotary;
  std::tie(rotary.q_cos, rotary.q_sin) = rope_cos_sin(in.positions, inv);
  rotary.q_cos = rotary.q_cos.to(torch::kFloat32);
  rotary.q_sin = rotary.q_sin.to(torch::kFloat32);
  rotary.k_cos = rotary.q_cos;
  rotary.k_sin = rotary.q_sin;
  auto cos_full = torch::cat({rotary.q_cos, rotary.q_cos}, -1).view({kN, 1, kD});
  auto sin_full = torch::cat({rotary.q_sin, rotary.q_sin}, -1).view({kN, 1, kD});
  auto rotate_half = [](const torch::Tensor& x) {
    return torch::cat({-x.narrow(-1, kD / 2, kD / 2), x.narrow(-1, 0, kD / 2)}, -1);
  };
  const int64_t which = state.range(0);
  for (auto _ : state) {
    torch::Tensor out;
    if (which == 0) {
      auto [q, k] = rope_fused_qk(in.q, in.k, rotary.q_cos, rotary.q_sin, RopeLayout::kHalf);
      out = attention_fused(q, k, in.v, in.none, in.positions, in.positions, {}, in.scale);
    } else if (which == 1) {
      out = attention_fused(in.q, in.k, in.v, in.none, in.positions, in.positions, {}, in.scale,
                            rotary);
    } else {
      auto q = in.q * cos_full + rotate_half(in.q) * sin_full;
      auto k = in.k * cos_full + rotate_half(in.k) * sin_full;
      out = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             in.v.transpose(1, 2));
    }
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void BM_FusedForwardBackward(benchmark::State& state) {
  auto& in = inputs();
  auto grad = torch::randn_like(in.q);
  for (auto _ : state) {
    auto q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true),
         v = in.v.detach().requires_grad_(true);
    auto out =
        attention_fused(q, k, v, spec(state.range(0)), in.positions, in.positions, {}, in.scale);
    out.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
  }
}

// SDPA forward + backward without a bias, from the same [B, N, H, D] leaves as the fused one
// (what a user writes: the heads-first views in, the output transposed back).
void BM_SdpaForwardBackward(benchmark::State& state) {
  auto& in = inputs();
  auto grad = torch::randn_like(in.q);
  for (auto _ : state) {
    auto q = in.q.detach().requires_grad_(true), k = in.k.detach().requires_grad_(true),
         v = in.v.detach().requires_grad_(true);
    auto out =
        at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            .transpose(1, 2);
    out.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
  }
}

void BM_EagerForwardBackward(benchmark::State& state) {
  auto& in = inputs();
  auto grad = torch::randn_like(in.q).transpose(1, 2);
  for (auto _ : state) {
    auto q_in = in.q.detach().requires_grad_(true);
    auto q = q_in.transpose(1, 2);
    auto k = in.k.detach().transpose(1, 2).requires_grad_(true);
    auto v = in.v.detach().transpose(1, 2).requires_grad_(true);
    auto b = bias(state.range(0), q_in);
    auto logits = torch::matmul(q, k.transpose(-1, -2)) * in.scale;
    if (b.defined()) logits = logits + b;
    torch::matmul(torch::softmax(logits, -1), v).backward(grad);
    benchmark::DoNotOptimize(q_in.grad().data_ptr());
  }
}

// Other sizes, no bias: [1, N, 16, D] for N in 512..4096 and D in 64, 128 (state: N, D).
struct ShapeInputs {
  torch::Tensor q, k, v, positions;
};

const ShapeInputs& shape_inputs(int64_t n, int64_t d) {
  static std::map<std::pair<int64_t, int64_t>, ShapeInputs> cache;
  auto& in = cache[{n, d}];
  if (!in.q.defined()) {
    torch::manual_seed(1);
    in.q = torch::randn({1, n, kH, d});
    in.k = torch::randn({1, n, kH, d});
    in.v = torch::randn({1, n, kH, d});
    in.positions = torch::arange(n, torch::kFloat64);
  }
  return in;
}

void BM_FusedShape(benchmark::State& state) {
  const auto& in = shape_inputs(state.range(0), state.range(1));
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    auto out = attention_fused(in.q, in.k, in.v, {}, in.positions, in.positions, {},
                               1.0 / std::sqrt(double(state.range(1))));
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

void BM_SdpaShape(benchmark::State& state) {
  const auto& in = shape_inputs(state.range(0), state.range(1));
  torch::NoGradGuard no_grad;
  auto q = in.q.transpose(1, 2), k = in.k.transpose(1, 2), v = in.v.transpose(1, 2);
  for (auto _ : state) {
    auto out = at::scaled_dot_product_attention(q, k, v);
    benchmark::DoNotOptimize(out.data_ptr());
  }
}

// One forward tile's two products alone, one thread: S = scale Q K^T for a 128-query block
// against 256 keys, then O += S V (D = Dv = 128, the operands' rows H D apart as the kernel reads
// them; 8 key blocks in turn), 2 * 2 * 128 * 256 * 128 flops. 0: MKL's sgemm per product (it
// packs every operand every call); 1: the MKL path of attention_cpu.cpp (K^T, V and Q packed once
// with cblas_sgemm_pack, S packed by MKL in each P V product); 2: the CPU level's own
// micro-kernels (attention_tiles_rows.h; K, V, Q packed once, P read in place). The softmax
// between the products is left out (the same in all three).
void BM_TileProducts(benchmark::State& state) {
  const int64_t which = state.range(0);
  const auto& tiles = posenc::detail::cpu_kernels().capability == CpuCapability::kAvx512
                          ? posenc::detail::kAvx512AttentionTiles
                          : posenc::detail::kAvx2AttentionTiles;
  if (which < 2 && (sgemm_ == nullptr || cblas_sgemm_pack == nullptr)) {
    state.SkipWithError("LibTorch without MKL");
    return;
  }
  if (which == 2 && posenc::detail::cpu_kernels().capability == CpuCapability::kScalar) {
    state.SkipWithError("the scalar level has no micro-kernels");
    return;
  }
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto& in = inputs();
  constexpr int rows = 128, cols = 256, dim = static_cast<int>(kD), blocks = 8;
  const int ld = static_cast<int>(kH * kD), lds = cols;
  const float scale = static_cast<float>(in.scale), one = 1.0f, zero = 0.0f;
  const float* q = in.q.data_ptr<float>();  // head 0's rows [0, 128)
  const float* k = in.k.data_ptr<float>();
  const float* v = in.v.data_ptr<float>();
  std::vector<float> s(rows * (cols + 16)), o(rows * dim, 0.0f), alpha(rows, 1.0f);
  // packed operands (the kernels' layouts, outside the timed loop as in the kernels: once per
  // head or query block)
  constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kA = 161, kB = 162;
  std::vector<float> kp, vp, qp;
  const int64_t r = tiles.rows, panel = posenc::detail::kTilePanel;
  if (which == 1) {
    const auto kp_size = cblas_sgemm_pack_get_size(kB, rows, cols, dim) / 4 + 16;
    const auto vp_size = cblas_sgemm_pack_get_size(kB, rows, dim, cols) / 4 + 16;
    kp.resize(kp_size * blocks);
    vp.resize(vp_size * blocks);
    qp.resize(cblas_sgemm_pack_get_size(kA, rows, cols, dim) / 4 + 16);
    for (int t = 0; t < blocks; ++t) {
      cblas_sgemm_pack(kRowMajor, kB, kTrans, rows, cols, dim, scale, k + t * cols * ld, ld,
                       kp.data() + t * kp_size);
      cblas_sgemm_pack(kRowMajor, kB, kNoTrans, rows, dim, cols, 1.0f, v + t * cols * ld, ld,
                       vp.data() + t * vp_size);
    }
    cblas_sgemm_pack(kRowMajor, kA, kNoTrans, rows, cols, dim, 1.0f, q, ld, qp.data());
  } else if (which == 2) {
    kp.assign(blocks * cols * dim, 0.0f);
    vp.assign(blocks * cols * dim, 0.0f);
    qp.assign((rows + r - 1) / r * r * dim, 0.0f);
    const int64_t nk = blocks * cols;
    for (int64_t c = 0; c < nk; ++c)
      for (int64_t d = 0; d < dim; ++d) {
        kp[(c / panel) * panel * dim + d * panel + c % panel] = k[c * ld + d];
        vp[(d / panel) * panel * nk + c * panel + d % panel] = v[c * ld + d];
      }
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t d = 0; d < dim; ++d) qp[(i / r) * r * dim + d * r + i % r] = q[i * ld + d];
  }
  int64_t t = 0;
  for (auto _ : state) {
    const int block = static_cast<int>(t++ % blocks);
    if (which == 0) {  // column-major: S^T = K Q^T, O^T += V^T S^T
      const int m = rows, n = cols, kk = dim;
      sgemm_("T", "N", &n, &m, &kk, &scale, k + block * cols * ld, &ld, q, &ld, &zero, s.data(),
             &lds);
      sgemm_("N", "N", &kk, &m, &n, &one, v + block * cols * ld, &ld, s.data(), &lds, &one,
             o.data(), &kk);
    } else if (which == 1) {
      const size_t kp_size = kp.size() / blocks, vp_size = vp.size() / blocks;
      cblas_sgemm_compute(kRowMajor, kPacked, kPacked, rows, cols, dim, qp.data(), dim,
                          kp.data() + block * kp_size, cols, 0.0f, s.data(), lds);
      cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, rows, dim, cols, s.data(), lds,
                          vp.data() + block * vp_size, dim, 1.0f, o.data(), dim);
    } else {
      const int64_t nk = blocks * cols;
      for (int64_t r0 = 0; r0 < rows; r0 += r) {
        tiles.scores(qp.data() + r0 * dim, kp.data() + block * cols * dim, cols / panel, dim, scale,
                     s.data(), cols + 16, std::min<int64_t>(r, rows - r0));
        tiles.accumulate(s.data(), cols + 16, std::min<int64_t>(r, rows - r0), cols,
                         vp.data() + block * cols * panel, panel * nk, dim, alpha.data() + r0,
                         o.data() + r0 * dim, dim);
      }
    }
    benchmark::DoNotOptimize(o.data());
  }
  at::set_num_threads(threads);
  state.counters["GFLOP/s"] = benchmark::Counter(
      4.0 * rows * cols * dim * state.iterations() * 1e-9, benchmark::Counter::kIsRate);
}

#define POSENC_ATTENTION_BENCH(fn)    \
  BENCHMARK(fn)                       \
      ->Arg(0)                        \
      ->Arg(1)                        \
      ->Arg(2)                        \
      ->Arg(3)                        \
      ->Unit(benchmark::kMillisecond) \
      ->UseRealTime()                 \
      ->MinTime(2)
POSENC_ATTENTION_BENCH(BM_Fused);
POSENC_ATTENTION_BENCH(BM_Eager);
POSENC_ATTENTION_BENCH(BM_Sdpa);
BENCHMARK(BM_Rope)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(2);
BENCHMARK(BM_FusedForwardBackward)
    ->Arg(0)
    ->Arg(1)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_SdpaForwardBackward)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
#define POSENC_SHAPE_BENCH(fn)                            \
  BENCHMARK(fn)                                           \
      ->ArgsProduct({{512, 1024, 2048, 4096}, {64, 128}}) \
      ->Unit(benchmark::kMillisecond)                     \
      ->UseRealTime()
POSENC_SHAPE_BENCH(BM_FusedShape);
POSENC_SHAPE_BENCH(BM_SdpaShape);
BENCHMARK(BM_TileProducts)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_EagerForwardBackward)
    ->Arg(0)
    ->Arg(1)
    ->Arg(3)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  return posenc::bench::run_with_ratios(argc, argv, [](const posenc::bench::RatioReporter& r) {
    auto t = [&](const std::string& name) { return r.time(name); };
    auto row = [&](const std::string& what, double ratio, const std::string& goal) {
      r.row(what, ratio, goal);
    };
    row("sdpa no bias / fused no bias", t("BM_Sdpa/0/") / t("BM_Fused/0/"), ">= 1.1");
    row("sdpa fwd+bwd no bias / fused fwd+bwd no bias",
        t("BM_SdpaForwardBackward/0/") / t("BM_FusedForwardBackward/0/"), ">= 1.1");
    for (const char* shape : {"512/64/", "1024/64/", "2048/64/", "4096/64/", "512/128/",
                              "1024/128/", "2048/128/", "4096/128/"})
      row(std::string("sdpa / fused no bias, N/D ") + shape,
          t(std::string("BM_SdpaShape/") + shape) / t(std::string("BM_FusedShape/") + shape),
          ">= 1.1");
    row("tile products: MKL sgemm / own micro-kernels (time)",
        t("BM_TileProducts/0") / t("BM_TileProducts/2"), "-");
    row("tile products: MKL packed once / own micro-kernels (time)",
        t("BM_TileProducts/1") / t("BM_TileProducts/2"), "> 1");
    row("fused ALiBi / fused no bias", t("BM_Fused/1/") / t("BM_Fused/0/"), "<= 1.15");
    row("fused T5 / fused no bias", t("BM_Fused/2/") / t("BM_Fused/0/"), "<= 1.15");
    row("eager materialized ALiBi / eager no bias", t("BM_Eager/1/") / t("BM_Eager/0/"), "~1.4");
    row("eager materialized T5 / eager no bias", t("BM_Eager/2/") / t("BM_Eager/0/"), "-");
    row("eager ALiBi / fused ALiBi", t("BM_Eager/1/") / t("BM_Fused/1/"), "-");
    row("sdpa ALiBi mask / fused ALiBi", t("BM_Sdpa/1/") / t("BM_Fused/1/"), "-");
    row("fused ALiBi fwd+bwd / fused no bias fwd+bwd",
        t("BM_FusedForwardBackward/1/") / t("BM_FusedForwardBackward/0/"), "-");
    row("eager ALiBi fwd+bwd / fused ALiBi fwd+bwd",
        t("BM_EagerForwardBackward/1/") / t("BM_FusedForwardBackward/1/"), "-");
    row("RoPE pass + fused attention / RoPE inside the tiles", t("BM_Rope/0/") / t("BM_Rope/1/"),
        "-");
    row("eager rotate_half + SDPA / RoPE inside the tiles", t("BM_Rope/2/") / t("BM_Rope/1/"), "-");
    row("fused Shaw / fused no bias", t("BM_Fused/3/") / t("BM_Fused/0/"), "-");
    row("eager materialized Shaw / fused Shaw", t("BM_Eager/3/") / t("BM_Fused/3/"), "-");
    row("sdpa Shaw mask / fused Shaw", t("BM_Sdpa/3/") / t("BM_Fused/3/"), "-");
    row("fused Shaw fwd+bwd / fused no bias fwd+bwd",
        t("BM_FusedForwardBackward/3/") / t("BM_FusedForwardBackward/0/"), "-");
    row("eager Shaw fwd+bwd / fused Shaw fwd+bwd",
        t("BM_EagerForwardBackward/3/") / t("BM_FusedForwardBackward/3/"), "-");
    std::cout << "\nextra memory for the bias: materialized [H, L, L] fp32 = "
              << kH * kN * kN * 4 / (1 << 20) << " MiB; fused: ALiBi " << kH * 4
              << " B of slopes, T5 a [H, 2L-1] lookup = " << kH * (2 * kN - 1) * 4 / 1024
              << " KiB, Shaw [B, H, L, 2K+1] q.a scores = " << kB * kH * kN * 33 * 4 / 1024
              << " KiB, plus one [128, 256] fp32 tile (128 KiB) per thread\n";
  });
}
