// The fused GELU (posenc/kernels/gelu.h) against its specification, at::gelu / at::gelu_backward
// (exact form), and against the float64 GELU: every x from -12 to 12 in steps of 2^-10, random
// gradients, special values, every tail length, several chunks, autograd of first and second
// order, and the inputs it leaves to the reference.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "posenc/kernels/gelu.h"

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

#define SKIP_WITHOUT_AVX2() \
  if (!gelu_fused_supported(torch::zeros({1}))) GTEST_SKIP() << "no AVX2+FMA"

TEST(Gelu, ForwardEqualsAtenToItsExponentialsRoundingAndTheFloat64Gelu) {
  SKIP_WITHOUT_AVX2();
  const auto x = grid();
  const auto y = gelu_forward_cpu(x);
  const auto ax = x.abs().to(torch::kDouble);
  // ATen takes the same A&S erf with Sleef's expf: the two differ by the exponential's rounding
  EXPECT_LE(worst_excess(y, at::gelu(x), 2e-7 * ax + 1e-7), 0.0);
  // A&S's |erf error| <= 1.5e-7 and the rounding of 1 + erf (both times |x| / 2), plus the
  // rounding of y: ATen's at::gelu takes the same bound
  const auto bound = 0.5 * (1.5e-7 + 1.2e-7) * ax + 2.4e-7 * gelu64(x).abs();
  EXPECT_LE(worst_excess(y, gelu64(x), bound), 0.0);
  EXPECT_LE(worst_excess(at::gelu(x), gelu64(x), bound), 0.0);
}

TEST(Gelu, BackwardEqualsAtenAndTheFloat64Derivative) {
  SKIP_WITHOUT_AVX2();
  torch::manual_seed(0);
  const auto x = grid();
  const auto dy = torch::randn_like(x);
  const auto dx = gelu_backward_cpu(dy, x);
  const auto ady = dy.abs().to(torch::kDouble), ax = x.abs().to(torch::kDouble);
  EXPECT_LE(worst_excess(dx, at::gelu_backward(dy, x), ady * (3e-7 + 2e-7 * ax) + 1e-7), 0.0);
  EXPECT_LE(
      worst_excess(dx, dy.to(torch::kDouble) * gelu64_grad(x), ady * (1.6e-7 + 2e-7 * ax + 2.4e-7)),
      0.0);
}

TEST(Gelu, SpecialValuesAsAten) {
  SKIP_WITHOUT_AVX2();
  const float inf = std::numeric_limits<float>::infinity();
  const auto x = torch::tensor({0.0f, -0.0f, inf, -inf, std::nanf(""), 1e30f, -1e30f, 3e38f, -3e38f,
                                1e-30f, -1e-30f, 9.0f, -9.0f, 30.0f, -30.0f});
  const auto y = gelu_forward_cpu(x), ref = at::gelu(x);
  const auto dy = torch::ones_like(x);
  const auto dx = gelu_backward_cpu(dy, x), dref = at::gelu_backward(dy, x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float a = y[i].item<float>(), b = ref[i].item<float>();
    EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || a == b)
        << x[i].item<float>() << ": " << a << " vs " << b;
    const float c = dx[i].item<float>(), d = dref[i].item<float>();
    EXPECT_TRUE((std::isnan(c) && std::isnan(d)) || std::abs(c - d) <= 1e-7f)
        << x[i].item<float>() << ": " << c << " vs " << d;
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
  auto x = (torch::randn({64, 192}) * 2).requires_grad_();
  auto xr = x.detach().clone().requires_grad_();
  const auto w = torch::randn({64, 192});
  auto y = gelu_fused(x), yr = at::gelu(xr);
  EXPECT_TRUE(torch::allclose(y, yr, 1e-6, 1e-7));
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
