// linear_fused and mlp_gelu_fused (posenc/kernels/linear.h) against their specification, the
// composition at::linear -> gelu_fused -> at::linear with ATen's autograd, and both against a
// float64 evaluation of the same composition: the forward to the bit (the same bias copy and
// addmm), gradients within float32 rounding (other transposition flags in MKL's products), the
// inputs that need no gradient, second order (a gradient penalty) against the composition's,
// the inputs left to the reference (float64, bf16 autocast, no bias), strided inputs, empty rows.
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "posenc/kernels/gelu.h"
#include "posenc/kernels/linear.h"

namespace {

using posenc::linear_fused;
using posenc::linear_fused_supported;
using posenc::linear_reference;
using posenc::mlp_gelu_fused;
using posenc::mlp_gelu_reference;

// |got - want| / (1 + max |want|)
double relative(const at::Tensor& got, const at::Tensor& want) {
  const auto w = want.to(torch::kDouble);
  return ((got.to(torch::kDouble) - w).abs().max() / (1 + w.abs().max())).item<double>();
}

// Output and gradients (inputs first, then parameters) of f over clones of the inputs, each
// with requires_grad as `needs` says, backward from dy.
template <typename F>
std::vector<at::Tensor> run(F f, const std::vector<at::Tensor>& inputs, const at::Tensor& dy,
                            const std::vector<bool>& needs) {
  std::vector<at::Tensor> in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(inputs[i].detach().clone().requires_grad_(needs[i]));
  auto y = f(in);
  y.backward(dy.to(y.scalar_type()));
  std::vector<at::Tensor> out{y.detach()};
  for (const auto& t : in) out.push_back(t.grad());
  return out;
}

auto linear_of = [](auto fn) {
  return [fn](const std::vector<at::Tensor>& in) { return fn(in[0], in[1], in[2]); };
};
auto mlp_of = [](auto fn) {
  return [fn](const std::vector<at::Tensor>& in) { return fn(in[0], in[1], in[2], in[3], in[4]); };
};

std::vector<at::Tensor> to_double(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.to(torch::kDouble));
  return out;
}

TEST(LinearFused, ForwardIsAtLinearsBitsAndGradientsWithinRounding) {
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {5, 7, 3}, {1, 8, 1}, {2, 16, 96, 288}, {128, 16, 96, 192}, {3, 1, 192, 96}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    torch::manual_seed(shape.back());
    const int64_t n = shape.back(), k = shape[shape.size() - 2];
    std::vector<int64_t> x_shape(shape.begin(), shape.end() - 1), y_shape = x_shape;
    y_shape.back() = n;
    const std::vector<at::Tensor> in{torch::randn(x_shape), torch::randn({n, k}) / std::sqrt(k),
                                     torch::randn({n})};
    const auto dy = torch::randn(y_shape);
    const std::vector<bool> all(3, true);
    const auto got = run(linear_of(linear_fused), in, dy, all);
    const auto ref = run(linear_of(linear_reference), in, dy, all);
    const auto f64 = run(linear_of(linear_reference), to_double(in), dy, all);
    EXPECT_TRUE(torch::equal(got[0], ref[0]));  // the same bias copy and addmm
    // float32 products over K (forward, dx) and over the rows (dW, db): both sides within these
    // of the float64 evaluation, and of each other
    const double rows = static_cast<double>(in[0].numel() / k);
    for (const auto* what : {&ref, &got}) {
      EXPECT_LE(relative((*what)[1], f64[1]), 1e-6 * std::sqrt(n) + 1e-6);
      EXPECT_LE(relative((*what)[2], f64[2]), 1e-6 * std::sqrt(rows) + 1e-6);
      EXPECT_LE(relative((*what)[3], f64[3]), 1e-6 * std::sqrt(rows) + 1e-6);
    }
    for (size_t i = 1; i < 4; ++i) {
      EXPECT_LE(relative(got[i], ref[i]), 2e-6 * std::sqrt(rows) + 1e-6) << i;
      EXPECT_EQ(got[i].sizes(), ref[i].sizes()) << i;
      EXPECT_TRUE(got[i].is_contiguous()) << i;
    }
  }
}

TEST(LinearFused, InputsThatNeedNoGradientGetNone) {
  torch::manual_seed(2);
  const std::vector<at::Tensor> in{torch::randn({4, 6, 8}), torch::randn({5, 8}),
                                   torch::randn({5})};
  const auto dy = torch::randn({4, 6, 5});
  for (const auto& needs : std::vector<std::vector<bool>>{
           {false, true, true}, {true, false, false}, {false, true, false}}) {
    const auto got = run(linear_of(linear_fused), in, dy, needs);
    const auto ref = run(linear_of(linear_reference), in, dy, needs);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(got[i + 1].defined(), needs[i]) << i;
      if (needs[i]) EXPECT_LE(relative(got[i + 1], ref[i + 1]), 1e-5) << i;
    }
  }
}

TEST(LinearFused, OtherInputsTakeTheReference) {
  torch::manual_seed(3);
  const auto x = torch::randn({3, 4, 16}), w = torch::randn({8, 16}), b = torch::randn({8});
  EXPECT_TRUE(linear_fused_supported(x, w, b));
  // float64, no bias, a transposed weight: at::linear itself, the same bits
  const auto xd = x.to(torch::kDouble), wd = w.to(torch::kDouble), bd = b.to(torch::kDouble);
  EXPECT_FALSE(linear_fused_supported(xd, wd, bd));
  EXPECT_TRUE(torch::equal(linear_fused(xd, wd, bd), at::linear(xd, wd, bd)));
  EXPECT_FALSE(linear_fused_supported(x, w, at::Tensor()));
  EXPECT_TRUE(torch::equal(linear_fused(x, w, at::Tensor()), at::linear(x, w)));
  const auto wt = w.t().contiguous().t();
  EXPECT_FALSE(linear_fused_supported(x, wt, b));
  EXPECT_TRUE(torch::equal(linear_fused(x, wt, b), at::linear(x, wt, b)));
  // under CPU autocast: the composition, so the product is bf16 as autocast casts it
  {
    struct Autocast {  // on for this scope, off again whatever happens in it
      Autocast() {
        at::autocast::set_autocast_enabled(at::kCPU, true);
        at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      }
      ~Autocast() {
        at::autocast::set_autocast_enabled(at::kCPU, false);
        at::autocast::clear_cache();
      }
    } autocast;
    EXPECT_FALSE(linear_fused_supported(x, w, b));
    EXPECT_EQ(linear_fused(x, w, b).scalar_type(), at::kBFloat16);
    const auto y_mlp =
        mlp_gelu_fused(x, torch::randn({32, 16}), torch::randn({32}), torch::randn({8, 32}), b);
    EXPECT_EQ(y_mlp.scalar_type(), at::kBFloat16);
  }
  // a strided x is made contiguous: the same bits as at::linear on it
  const auto strided = torch::randn({4, 3, 16}).transpose(0, 1);
  EXPECT_TRUE(torch::equal(linear_fused(strided, w, b), at::linear(strided, w, b)));
  // shapes that disagree: at::linear's own error
  EXPECT_THROW(linear_fused(x, torch::randn({8, 15}), b), c10::Error);
}

TEST(LinearFused, EmptyRows) {
  auto x = torch::randn({0, 4, 16}).requires_grad_(true);
  auto w = torch::randn({8, 16}).requires_grad_(true), b = torch::randn({8}).requires_grad_(true);
  auto y = linear_fused(x, w, b);
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({0, 4, 8}));
  y.sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), torch::zeros({8, 16})));
  EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({8})));
}

TEST(MlpGeluFused, ForwardIsTheCompositionsBitsAndGradientsWithinRounding) {
  if (!posenc::gelu_fused_supported(torch::zeros({8}))) GTEST_SKIP() << "no fused GELU";
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {5, 7, 9, 3}, {2, 16, 96, 192}, {128, 16, 96, 192}, {3, 1, 24, 40}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    torch::manual_seed(shape[2] + shape[3]);
    const int64_t d = shape[2], f = shape[3];
    std::vector<int64_t> x_shape{shape[0], shape[1], d};
    const std::vector<at::Tensor> in{torch::randn(x_shape), torch::randn({f, d}) / std::sqrt(d),
                                     0.1 * torch::randn({f}), torch::randn({d, f}) / std::sqrt(f),
                                     0.1 * torch::randn({d})};
    const auto dy = torch::randn(x_shape);
    const std::vector<bool> all(5, true);
    const auto got = run(mlp_of(mlp_gelu_fused), in, dy, all);
    const auto ref = run(mlp_of(mlp_gelu_reference), in, dy, all);
    const auto f64 = run(mlp_of(mlp_gelu_reference), to_double(in), dy, all);
    EXPECT_TRUE(torch::equal(got[0], ref[0]));  // the same addmm, GELU pass, addmm
    const double rows = static_cast<double>(in[0].numel() / d);
    // float32 products and the GELU polynomial's 5.4e-8 slope error: both sides within these of
    // the float64 composition, and of each other
    for (const auto* what : {&ref, &got}) {
      EXPECT_LE(relative((*what)[0], f64[0]), 1e-5);
      for (size_t i = 1; i < 6; ++i)
        EXPECT_LE(relative((*what)[i], f64[i]), 2e-6 * std::sqrt(rows) + 1e-5) << i;
    }
    for (size_t i = 1; i < 6; ++i) {
      EXPECT_LE(relative(got[i], ref[i]), 2e-6 * std::sqrt(rows) + 1e-5) << i;
      EXPECT_EQ(got[i].sizes(), ref[i].sizes()) << i;
    }
  }
}

TEST(MlpGeluFused, InputsThatNeedNoGradientGetNone) {
  if (!posenc::gelu_fused_supported(torch::zeros({8}))) GTEST_SKIP() << "no fused GELU";
  torch::manual_seed(6);
  const std::vector<at::Tensor> in{torch::randn({4, 6, 8}), torch::randn({12, 8}),
                                   torch::randn({12}), torch::randn({8, 12}), torch::randn({8})};
  const auto dy = torch::randn({4, 6, 8});
  for (const auto& needs : std::vector<std::vector<bool>>{{false, true, true, true, true},
                                                          {true, false, false, false, false},
                                                          {false, false, false, true, true},
                                                          {false, true, false, false, true}}) {
    const auto got = run(mlp_of(mlp_gelu_fused), in, dy, needs);
    const auto ref = run(mlp_of(mlp_gelu_reference), in, dy, needs);
    for (size_t i = 0; i < 5; ++i) {
      ASSERT_EQ(got[i + 1].defined(), needs[i]) << i;
      if (needs[i]) EXPECT_LE(relative(got[i + 1], ref[i + 1]), 1e-5) << i;
    }
  }
}

TEST(MlpGeluFused, SecondOrderGradientsEqualTheReference) {
  if (!posenc::gelu_fused_supported(torch::zeros({8}))) GTEST_SKIP() << "no fused GELU";
  // a gradient penalty: d/d(x, w1, w2) of |dL/dx|^2, L = sum(y * t)
  torch::manual_seed(7);
  const std::vector<at::Tensor> in{torch::randn({3, 5, 8}), torch::randn({16, 8}),
                                   torch::randn({16}), torch::randn({8, 16}), torch::randn({8})};
  const auto t = torch::randn({3, 5, 8});
  auto second = [&](auto fn, bool mlp = true) {
    std::vector<at::Tensor> p;
    for (const auto& v : in) p.push_back(v.clone().requires_grad_(true));
    auto y = fn(p[0], p[1], p[2], p[3], p[4]);
    auto dx = torch::autograd::grad({(y * t).sum()}, {p[0]}, {}, true, true)[0];
    return torch::autograd::grad({dx.pow(2).sum()}, mlp ? std::vector<at::Tensor>{p[0], p[1], p[3]}
                                                        : std::vector<at::Tensor>{p[0], p[1]});
  };
  const auto got = second(mlp_gelu_fused), want = second(mlp_gelu_reference);
  for (size_t i = 0; i < 3; ++i) EXPECT_LE(relative(got[i], want[i]), 1e-5) << i;
  const auto got_linear =
      second([](auto&& x, auto&& w1, auto&& b1, auto&&,
                auto&&) { return linear_fused(x, w1, b1).pow(2).sum(-1, true); },
             false);
  const auto want_linear =
      second([](auto&& x, auto&& w1, auto&& b1, auto&&,
                auto&&) { return linear_reference(x, w1, b1).pow(2).sum(-1, true); },
             false);
  EXPECT_LE(relative(got_linear[0], want_linear[0]), 1e-5);
  EXPECT_LE(relative(got_linear[1], want_linear[1]), 1e-5);
}

}  // namespace
