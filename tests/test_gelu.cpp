// The fused GELU (posenc/kernels/gelu.h) against its oracle, the float64 GELU (within
// Abramowitz & Stegun's bound), and live against ATen in the same process: ATen's own vectorized
// erf (the same A&S polynomial, to the exponential's rounding) and at::gelu as a user gets it
// (oneDNN's eltwise_gelu_erf for contiguous float32, another approximation per CPU: on AVX-512
// it is ~1e-6 off the float64 GELU, beyond A&S's bound). Every x from -12 to 12 in steps of
// 2^-10, random gradients, special values (the mathematics' limits, where ATen gives NaN),
// every tail length, several chunks, autograd of first and second order, and the inputs it
// leaves to the reference. Nothing here is frozen from one CPU: it holds on AVX2, AVX-512 and
// AVX-512 BF16 machines (CTest also runs it under ATEN_CPU_CAPABILITY=avx2).
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

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

// While alive, at::gelu / at::gelu_backward take ATen's own vectorized kernels (oneDNN off).
struct AtenOwnGelu {
  bool was = at::globalContext().userEnabledMkldnn();
  AtenOwnGelu() { at::globalContext().setUserEnabledMkldnn(false); }
  ~AtenOwnGelu() { at::globalContext().setUserEnabledMkldnn(was); }
};

#define SKIP_WITHOUT_AVX2() \
  if (!gelu_fused_supported(torch::zeros({1}))) GTEST_SKIP() << "no AVX2+FMA"

TEST(Gelu, ForwardWithinAbramowitzStegunOfTheFloat64Gelu) {
  SKIP_WITHOUT_AVX2();
  const auto x = grid();
  EXPECT_LE(worst_excess(gelu_forward_cpu(x), gelu64(x), forward_bound(x)), 0.0);
}

TEST(Gelu, ForwardEqualsAtensOwnErfToItsExponentialsRounding) {
  SKIP_WITHOUT_AVX2();
  const auto x = grid();
  const auto y = gelu_forward_cpu(x);
  const auto ax = x.abs().to(torch::kDouble);
  const AtenOwnGelu aten_own;
  // ATen's Vectorized<float>::erf (AVX2 and AVX-512) is the same A&S erf with Sleef's expf: the
  // two differ by the exponential's rounding, and ATen's is within the same bound
  const auto aten = at::gelu(x);
  EXPECT_LE(worst_excess(y, aten, 2e-7 * ax + 1e-7), 0.0) << posenc::test::aten_cpu_capability();
  EXPECT_LE(worst_excess(aten, gelu64(x), forward_bound(x)), 0.0)
      << posenc::test::aten_cpu_capability();
}

TEST(Gelu, ForwardNearAtGeluAsTheUserGetsIt) {
  SKIP_WITHOUT_AVX2();
  // at::gelu with oneDNN on (the default): on AVX-512 its erf is 3.1e-7 |x| off the float64
  // GELU (measured on an AMD EPYC with AVX-512 BF16), on AVX2 within A&S's bound: the two meet
  // within 1e-6 |x| + 1e-7 on every CPU of ours
  const auto x = grid();
  const auto ax = x.abs().to(torch::kDouble);
  EXPECT_LE(worst_excess(gelu_forward_cpu(x), at::gelu(x), 1e-6 * ax + 1e-7), 0.0)
      << posenc::test::aten_cpu_capability();
}

TEST(Gelu, BackwardEqualsAtenAndTheFloat64Derivative) {
  SKIP_WITHOUT_AVX2();
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

TEST(Gelu, SpecialValuesFollowTheMathematics) {
  SKIP_WITHOUT_AVX2();
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
  SKIP_WITHOUT_AVX2();
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

TEST(Gelu, AutogradFirstAndSecondOrderAndTheInputsLeftToTheReference) {
  SKIP_WITHOUT_AVX2();
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
