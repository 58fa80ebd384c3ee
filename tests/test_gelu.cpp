// The fused GELU (posenc/kernels/gelu.h) against its oracle, the float64 GELU: within the
// polynomials' error (the fit's bound, tools/gen_gelu_polynomials.py, plus the last rounding), its
// negative tails to three digits, and within Abramowitz & Stegun's bound (the bound ATen's own
// erf holds); live against ATen in the same process: ATen's own vectorized gelu (A&S erf with
// Sleef's expf) and at::gelu as a user gets it (oneDNN's eltwise_gelu_erf for contiguous float32,
// another approximation per CPU: on AVX-512 it is ~1e-6 off the float64 GELU, beyond A&S's
// bound). Every x from -12 to 12 in steps of 2^-10 (and from -8 to 8 in steps of 2^-14 for the
// fit's bound), random gradients, special values (the mathematics' limits, where ATen gives NaN),
// every tail length, several chunks, streamed outputs (non-temporal stores: the same bits),
// autograd of first and second order, and the inputs it leaves to the reference. Nothing here is
// frozen from one CPU: it holds on AVX2, AVX-512 and AVX-512 BF16 machines, at each posenc CPU
// level (CTest's unit_cpu_scalar / _avx2 / _avx512; the levels give the same bits,
// CpuCapability.GeluGivesTheSameBitsAtEveryLevel) and under ATEN_CPU_CAPABILITY=avx2.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/stream_stores.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/kernels/gelu.h"
#include "support/cpu_capability.h"

namespace {

using posenc::gelu_backward_cpu;
using posenc::gelu_forward_cpu;
using posenc::gelu_fused;
using posenc::gelu_fused_supported;

at::Tensor grid() {  // [24577] every multiple of 2^-10 in [-12, 12]
  return torch::arange(-12 * 1024, 12 * 1024 + 1, torch::kFloat) / 1024.0;
}
at::Tensor fine_grid() {  // [262145] every multiple of 2^-14 in [-8, 8]
  return torch::arange(-8 * 16384, 8 * 16384 + 1, torch::kFloat) / 16384.0;
}

// The float64 GELU and its derivative.
at::Tensor gelu64(const at::Tensor& x) {
  const auto d = x.to(torch::kDouble);
  return d * 0.5 * (1 + torch::erf(d * M_SQRT1_2));
}
at::Tensor gelu64_grad(const at::Tensor& x) {
  const auto d = x.to(torch::kDouble);
  return 0.5 * (1 + torch::erf(d * M_SQRT1_2)) + d * torch::exp(-0.5 * d * d) / std::sqrt(2 * M_PI);
}

double worst_excess(const at::Tensor& got, const at::Tensor& want, const at::Tensor& bound) {
  return ((got.to(torch::kDouble) - want.to(torch::kDouble)).abs() - bound).max().item<double>();
}

// A&S's |erf error| <= 1.5e-7 and the rounding of 1 + erf (both times |x| / 2), plus the
// rounding of y: the fused forward's bound against the float64 GELU.
at::Tensor forward_bound(const at::Tensor& x) {
  return 0.5 * (1.5e-7 + 1.2e-7) * x.abs().to(torch::kDouble) + 2.4e-7 * gelu64(x).abs();
}

// The polynomials' error on their own grids (tools/gen_gelu_polynomials.py, gelu_tables.h: 5.16e-8
// for Q, 5.35e-8 for S, float32 evaluation included), with a margin for the points between.
constexpr double kTailQError = 5.5e-8;
constexpr double kTailSError = 5.7e-8;
// Half an ulp of a float32 value v is at most 2^-24 |v| (round to nearest).
constexpr double kHalfUlp = 1.0 / (1 << 24);

// While alive, at::gelu / at::gelu_backward take ATen's own vectorized kernels (oneDNN off).
struct AtenOwnGelu {
  bool was = at::globalContext().userEnabledMkldnn();
  AtenOwnGelu() { at::globalContext().setUserEnabledMkldnn(false); }
  ~AtenOwnGelu() { at::globalContext().setUserEnabledMkldnn(was); }
};

TEST(Gelu, ForwardWithinAbramowitzStegunOfTheFloat64Gelu) {
  const auto x = grid();
  EXPECT_LE(worst_excess(gelu_forward_cpu(x), gelu64(x), forward_bound(x)), 0.0);
}

TEST(Gelu, ForwardWithinThePolynomialsErrorOfTheFloat64Gelu) {
  // y = relu(x) - a Q(a) rounded once: |y - gelu(x)| <= |x| |Q error| + half an ulp of y
  EXPECT_TRUE(gelu_fused_supported(torch::zeros({1})));  // every CPU level has the pass
  for (const auto& x : {fine_grid(), grid()}) {
    const auto want = gelu64(x);
    EXPECT_LE(worst_excess(gelu_forward_cpu(x), want,
                           kTailQError * x.abs().to(torch::kDouble) + kHalfUlp * want.abs()),
              0.0)
        << x.numel();
  }
}

TEST(Gelu, NegativeTailsKeepTheirSignAndThreeDigits) {
  // where Q(a) and |S(a)| are small the fit's error is relative (<= 6e-4 below 1e-3): gelu(x) < 0
  // for every x in [-5.39, 0) (Q is zero past 5.4), and gelu'(x) < 0 for x in [-5.99, -0.76)
  // (S(a) changes sign at a = 0.7518), each within 1e-3 of the float64 value there
  const auto x = fine_grid();
  const auto y = gelu_forward_cpu(x).to(torch::kDouble);
  const auto forward_tail = (x < 0) & (x > -5.39);
  const auto want = gelu64(x);
  EXPECT_TRUE((y.masked_select(forward_tail) < 0).all().item<bool>());
  const auto forward_relative = ((y - want).abs() / want.abs()).masked_select(forward_tail);
  EXPECT_LE(forward_relative.max().item<double>(), 1e-3);
  const auto slope = gelu_backward_cpu(torch::ones_like(x), x).to(torch::kDouble);
  const auto backward_tail = (x < -0.76) & (x > -5.99);
  const auto want_slope = gelu64_grad(x);
  EXPECT_TRUE((slope.masked_select(backward_tail) < 0).all().item<bool>());
  // (the relative error near the zero of S at 0.7518 is not small: from -1 on)
  const auto backward_relative =
      ((slope - want_slope).abs() / want_slope.abs()).masked_select((x < -1) & (x > -5.99));
  EXPECT_LE(backward_relative.max().item<double>(), 1e-3);
}

TEST(Gelu, ForwardNearAtensOwnVectorizedGelu) {
  const auto x = grid();
  const auto y = gelu_forward_cpu(x);
  const auto ax = x.abs().to(torch::kDouble);
  const AtenOwnGelu aten_own;
  // ATen's Vectorized<float>::erf (AVX2 and AVX-512): A&S's erf (|error| <= 1.5e-7, so <= 7.5e-8
  // |x| in y) with Sleef's expf, plus its roundings of 1 + erf and of the products; ours within
  // 5.5e-8 |x| + half an ulp: the two meet within 2e-7 |x| + 1e-7, and ATen's is within A&S's
  // bound of the float64 GELU
  const auto aten = at::gelu(x);
  EXPECT_LE(worst_excess(y, aten, 2e-7 * ax + 1e-7), 0.0) << posenc::test::aten_cpu_capability();
  EXPECT_LE(worst_excess(aten, gelu64(x), forward_bound(x)), 0.0)
      << posenc::test::aten_cpu_capability();
}

TEST(Gelu, ForwardNearAtGeluAsTheUserGetsIt) {
  // at::gelu with oneDNN on (the default): on AVX-512 its erf is 3.1e-7 |x| off the float64
  // GELU (measured on an AMD EPYC with AVX-512 BF16), on AVX2 within A&S's bound: the two meet
  // within 1e-6 |x| + 1e-7 on every CPU of ours
  const auto x = grid();
  const auto ax = x.abs().to(torch::kDouble);
  EXPECT_LE(worst_excess(gelu_forward_cpu(x), at::gelu(x), 1e-6 * ax + 1e-7), 0.0)
      << posenc::test::aten_cpu_capability();
}

TEST(Gelu, BackwardEqualsAtenAndTheFloat64Derivative) {
  torch::manual_seed(0);
  const auto x = grid();
  const auto dy = torch::randn_like(x);
  const auto dx = gelu_backward_cpu(dy, x);
  const auto ady = dy.abs().to(torch::kDouble), ax = x.abs().to(torch::kDouble);
  const AtenOwnGelu aten_own;
  EXPECT_LE(worst_excess(dx, at::gelu_backward(dy, x), ady * (3e-7 + 2e-7 * ax) + 1e-7), 0.0);
  EXPECT_LE(
      worst_excess(dx, dy.to(torch::kDouble) * gelu64_grad(x), ady * (1.6e-7 + 2e-7 * ax + 2.4e-7)),
      0.0);
}

TEST(Gelu, BackwardWithinThePolynomialsErrorOfTheFloat64Derivative) {
  // dx = dy (1 - S) or dy S: |S error| + half an ulp of 1 - S (<= 1.13) + half an ulp of dx
  torch::manual_seed(5);
  const auto x = fine_grid();
  const auto dy = torch::randn_like(x);
  const auto want = dy.to(torch::kDouble) * gelu64_grad(x);
  const auto ady = dy.abs().to(torch::kDouble);
  EXPECT_LE(worst_excess(gelu_backward_cpu(dy, x), want,
                         ady * (kTailSError + kHalfUlp * 1.13) + kHalfUlp * want.abs()),
            0.0);
}

TEST(Gelu, SpecialValuesFollowTheMathematics) {
  // gelu(x) = x Phi(x) and gelu'(x) = Phi(x) + x phi(x), derived by hand at the extremes:
  // gelu(+inf) = +inf, gelu(-inf) = lim x Phi(x) = -0, gelu'(+inf) = 1, gelu'(-inf) = 0 (x phi(x)
  // -> 0); NaN stays NaN; +-3e38 and +-1e30 are past erf's saturation (y = x or -0, slope 1 or
  // 0); tiny x give x / 2 and slope 1/2. ATen differs at the infinities: at::gelu(-inf) and
  // at::gelu_backward(+-inf) are NaN (inf * 0), and oneDNN's at::gelu(+inf) is NaN on AVX-512.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const auto x = torch::tensor(
      {0.0f, -0.0f, inf, -inf, nan, 1e30f, -1e30f, 3e38f, -3e38f, 1e-30f, -1e-30f, 30.0f, -30.0f});
  const auto want_y = torch::tensor(
      {0.0f, -0.0f, inf, -0.0f, nan, 1e30f, -0.0f, 3e38f, -0.0f, 5e-31f, -5e-31f, 30.0f, -0.0f});
  const auto want_slope =
      torch::tensor({0.5f, 0.5f, 1.0f, 0.0f, nan, 1.0f, 0.0f, 1.0f, 0.0f, 0.5f, 0.5f, 1.0f, 0.0f});
  const auto y = gelu_forward_cpu(x);
  const auto dy = torch::full_like(x, 2.0f);
  const auto dx = gelu_backward_cpu(dy, x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float a = y[i].item<float>(), b = want_y[i].item<float>();
    // NaN for NaN, the same infinity or signed zero, else within the rounding of y (3e-7)
    const bool same = (std::isnan(a) && std::isnan(b)) ||
                      (a == b && std::signbit(a) == std::signbit(b)) ||
                      (std::isfinite(b) && b != 0 && std::abs(a - b) <= 3e-7f * std::abs(b));
    EXPECT_TRUE(same) << "gelu(" << x[i].item<float>() << ") = " << a << ", want " << b;
    const float c = dx[i].item<float>(), d = 2 * want_slope[i].item<float>();
    EXPECT_TRUE((std::isnan(c) && std::isnan(d)) || std::abs(c - d) <= 2e-7f)
        << "2 gelu'(" << x[i].item<float>() << ") = " << c << ", want " << d;
  }
}

TEST(Gelu, EveryTailLengthAndEveryChunkingGiveTheSameValues) {
  torch::manual_seed(1);
  const auto big = torch::randn({300007}) * 3;  // several parallel chunks and a tail of 7
  const auto dy = torch::randn_like(big);
  const auto y = gelu_forward_cpu(big), dx = gelu_backward_cpu(dy, big);
  at::set_num_threads(1);
  const auto y1 = gelu_forward_cpu(big), dx1 = gelu_backward_cpu(dy, big);
  at::set_num_threads(2);
  EXPECT_TRUE(torch::equal(y, y1));  // per element: the chunking changes nothing
  EXPECT_TRUE(torch::equal(dx, dx1));
  for (int64_t n = 0; n <= 19; ++n) {
    const auto part = big.slice(0, 5, 5 + n).contiguous();
    EXPECT_TRUE(torch::equal(gelu_forward_cpu(part), y.slice(0, 5, 5 + n))) << n;
    EXPECT_TRUE(torch::equal(gelu_backward_cpu(dy.slice(0, 5, 5 + n).contiguous(), part),
                             dx.slice(0, 5, 5 + n)))
        << n;
  }
}

TEST(Gelu, OutEntriesWriteTheSameBitsIntoTheCallersTensors) {
  torch::manual_seed(6);
  const auto x = torch::randn({37, 19}) * 3, dy = torch::randn({37, 19});
  const auto y = gelu_forward_cpu(x), dx = gelu_backward_cpu(dy, x);
  auto y_out = torch::full_like(x, 7.0f), dx_out = torch::full_like(x, 7.0f);
  posenc::gelu_forward_cpu_out(x, y_out);
  posenc::gelu_backward_cpu_out(dy, x, dx_out);
  EXPECT_TRUE(torch::equal(y_out, y));
  EXPECT_TRUE(torch::equal(dx_out, dx));
  // in place: the output may be an input, element for element
  auto inplace = x.clone();
  posenc::gelu_forward_cpu_out(inplace, inplace);
  EXPECT_TRUE(torch::equal(inplace, y));
  auto grad_inplace = dy.clone();
  posenc::gelu_backward_cpu_out(grad_inplace, x, grad_inplace);
  EXPECT_TRUE(torch::equal(grad_inplace, dx));
  // refusals, one line each: shape, dtype, layout, a partial overlap
  auto wrong_shape = torch::empty({19, 37});
  auto wrong_dtype = torch::empty({37, 19}, torch::kDouble);
  auto strided = torch::empty({19, 37}).t();
  auto buffer = torch::empty({37 * 19 + 1});
  auto shifted = buffer.slice(0, 1).view({37, 19});
  auto input = buffer.slice(0, 0, 37 * 19).view({37, 19});
  input.copy_(x);
  for (auto* out : {&wrong_shape, &wrong_dtype, &strided}) {
    EXPECT_THROW(posenc::gelu_forward_cpu_out(x, *out), c10::Error);
    EXPECT_THROW(posenc::gelu_backward_cpu_out(dy, x, *out), c10::Error);
  }
  try {
    posenc::gelu_forward_cpu_out(input, shifted);
    ADD_FAILURE() << "a partial overlap was taken";
  } catch (const c10::Error& e) {
    EXPECT_EQ(std::string(e.what_without_backtrace()).find('\n'), std::string::npos);
  }
  EXPECT_THROW(posenc::gelu_backward_cpu_out(input, x, shifted), c10::Error);
}

// Out-of-cache outputs are written with non-temporal stores (gelu_rows.h, stream_stores.h): the
// same bits as normal stores, at every vector level, from any start of the output (the values
// before its first 64-byte line stored normally) and any tail length, and through the passes
// (an output of kStreamMinBytes streams, x's own values).
TEST(Gelu, StreamedOutputsGiveTheSameBits) {
  torch::manual_seed(9);
  const int64_t n = 1037;  // 64 vectors of 16 and a tail of 13
  const auto x = torch::randn({n}) * 4, dy = torch::randn({n});
  const auto* px = x.const_data_ptr<float>();
  const auto* pdy = dy.const_data_ptr<float>();
  for (const auto level : {posenc::CpuCapability::kAvx2, posenc::CpuCapability::kAvx512}) {
    if (level > posenc::cpu_capability_detected()) continue;
    const auto& k = posenc::detail::cpu_kernels_at(level);
    auto y = torch::empty({n}), dx = torch::empty({n});
    k.gelu(px, y.data_ptr<float>(), n, false);
    k.gelu_backward(pdy, px, dx.data_ptr<float>(), n, false);
    // outputs starting 0..16 floats past a 64-byte line, lengths down to a few values
    auto buffer = torch::empty({n + 64});
    const auto line = (64 - reinterpret_cast<uintptr_t>(buffer.data_ptr<float>()) % 64) % 64 / 4;
    for (int64_t offset = 0; offset <= 16; ++offset)
      for (const int64_t count : {n, n - offset, int64_t{20}, int64_t{3}}) {
        float* out = buffer.data_ptr<float>() + line + offset;
        k.gelu(px, out, count, true);
        posenc::detail::stream_fence();
        EXPECT_TRUE(torch::equal(buffer.narrow(0, line + offset, count), y.narrow(0, 0, count)))
            << posenc::to_string(level) << " offset " << offset << " n " << count;
        k.gelu_backward(pdy, px, out, count, true);
        posenc::detail::stream_fence();
        EXPECT_TRUE(torch::equal(buffer.narrow(0, line + offset, count), dx.narrow(0, 0, count)))
            << posenc::to_string(level) << " backward, offset " << offset << " n " << count;
      }
  }
  // the passes: a 16 MiB output streams; the same values as the unstreamed entry at this level
  const auto big = torch::randn({4, 1 << 20}) * 3, big_dy = torch::randn({4, 1 << 20});
  ASSERT_GE(big.nbytes(), static_cast<size_t>(posenc::detail::kStreamMinBytes));
  const auto& k = posenc::detail::cpu_kernels();
  auto want = torch::empty_like(big), want_dx = torch::empty_like(big);
  k.gelu(big.const_data_ptr<float>(), want.data_ptr<float>(), big.numel(), false);
  k.gelu_backward(big_dy.const_data_ptr<float>(), big.const_data_ptr<float>(),
                  want_dx.data_ptr<float>(), big.numel(), false);
  EXPECT_TRUE(torch::equal(gelu_forward_cpu(big), want));
  EXPECT_TRUE(torch::equal(gelu_backward_cpu(big_dy, big), want_dx));
}

TEST(Gelu, AutogradFirstAndSecondOrderAndTheInputsLeftToTheReference) {
  torch::manual_seed(2);
  const AtenOwnGelu aten_own;  // the reference's gradients through ATen's own kernels
  auto x = (torch::randn({64, 192}) * 2).requires_grad_();
  auto xr = x.detach().clone().requires_grad_();
  const auto w = torch::randn({64, 192});
  auto y = gelu_fused(x), yr = at::gelu(xr);
  EXPECT_LE(worst_excess(y, gelu64(x.detach()), forward_bound(x.detach())), 0.0);
  auto g = torch::autograd::grad({(y * w).sum()}, {x}, {}, /*retain_graph=*/true,
                                 /*create_graph=*/true)[0];
  auto gr = torch::autograd::grad({(yr * w).sum()}, {xr}, {}, true, true)[0];
  EXPECT_TRUE(torch::allclose(g, gr, 1e-6, 1e-7));
  // second order (create_graph): ATen's gelu'' through ATen's gelu_backward
  const auto gg = torch::autograd::grad({g.sum()}, {x})[0];
  const auto ggr = torch::autograd::grad({gr.sum()}, {xr})[0];
  EXPECT_TRUE(torch::allclose(gg, ggr, 1e-5, 1e-6));
  EXPECT_GT(gg.abs().sum().item<double>(), 0.0);
  // without create_graph the fused backward runs: equal to ATen's to the tolerance above
  auto x2 = x.detach().clone().requires_grad_();
  (gelu_fused(x2) * w).sum().backward();
  const auto tolerance = w.abs() * (3e-7 + 2e-7 * x.detach().abs()) + 1e-7;
  EXPECT_TRUE(((x2.grad() - gr.detach()).abs() <= tolerance).all().item<bool>())
      << (x2.grad() - gr.detach()).abs().max().item<float>();
  // what the fused pass does not take is the reference itself
  const auto base = torch::randn({8, 6});
  for (const auto& other :
       {base.t(), base.to(torch::kDouble), base.to(torch::kBFloat16), base.slice(1, 0, 6, 2)}) {
    EXPECT_FALSE(gelu_fused_supported(other));
    EXPECT_TRUE(torch::equal(gelu_fused(other), at::gelu(other)));
  }
  EXPECT_EQ(gelu_fused(torch::zeros({0, 5})).sizes(), (std::vector<int64_t>{0, 5}));
  EXPECT_THROW(gelu_forward_cpu(base.t()), c10::Error);
  EXPECT_THROW(gelu_backward_cpu(torch::ones({3}), torch::ones({4})), c10::Error);
}

}  // namespace
