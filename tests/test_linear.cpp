// linear_fused and mlp_gelu_fused (posenc/kernels/linear.h) against their specification, the
// composition at::linear -> gelu_fused -> at::linear with ATen's autograd, and both against a
// float64 evaluation of the same composition: forward and gradients within float32 rounding
// (posenc's own products, kernels/cpu/linear_gemm.h, sum in another order than MKL's; where they
// do not run, POSENC_LINEAR_GEMM=mkl, the scalar level, widths not a multiple of the vector, the
// forward is at::linear's bits: the same bias copy and addmm), the inputs that need no gradient,
// second order (a gradient penalty) against the composition's, the inputs left to the reference
// (float64, bf16 autocast, no bias), strided and offset inputs, empty rows, 1 to 3 threads. The
// own products alone (LinearGemm.*) against float64 products within the rigorous float32 bound
// of a K-term sum, |got - want| <= (K + 2) 2^-24 sum_k |a_k b_k| (+ |init|) (N. Higham, "Accuracy
// and Stability of Numerical Algorithms", 2002, section 3.1), at row counts that are not
// multiples of the micro-kernel's (1, 5, 17, 63, 65, 129; 0), odd depths, 1 to 3 threads (the same
// bits at each: every element is one thread's fixed-order sum). CTest runs these at each CPU
// level (unit_cpu_scalar, _avx2, _avx512) and with MKL's products (unit_linear_gemm_mkl).
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/linear_gemm_cpu.h"
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

// Whether linear_fused's forward at output width n runs posenc's own product (else at::linear's
// bias copy and addmm: the same bits as the reference).
bool own_forward(int64_t n) { return posenc::detail::linear_gemm_takes(n); }

TEST(LinearFused, ForwardAndGradientsWithinRounding) {
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
    if (own_forward(n)) {
      EXPECT_LE(relative(got[0], f64[0]), 1e-6 * std::sqrt(k) + 1e-6);
      EXPECT_LE(relative(got[0], ref[0]), 2e-6 * std::sqrt(k) + 1e-6);
    } else {
      EXPECT_TRUE(torch::equal(got[0], ref[0]));  // the same bias copy and addmm
    }
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
  // a strided x is made contiguous: the same bits as on its contiguous copy, at::linear's within
  // rounding; an x at an offset in its storage likewise
  for (const int64_t n : {8, 32}) {
    const auto wn = torch::randn({n, 16}), bn = torch::randn({n});
    const auto strided = torch::randn({4, 3, 16}).transpose(0, 1);
    EXPECT_TRUE(
        torch::equal(linear_fused(strided, wn, bn), linear_fused(strided.contiguous(), wn, bn)));
    EXPECT_LE(relative(linear_fused(strided, wn, bn), at::linear(strided, wn, bn)), 1e-5);
    const auto offset = torch::randn({5 + 3 * 4 * 16}).narrow(0, 5, 3 * 4 * 16).view({3, 4, 16});
    ASSERT_TRUE(offset.is_contiguous() && offset.storage_offset() == 5);
    // (the own product's bits do not depend on the alignment; MKL's may)
    if (own_forward(n))
      EXPECT_TRUE(torch::equal(linear_fused(offset, wn, bn), linear_fused(offset.clone(), wn, bn)));
    EXPECT_LE(relative(linear_fused(offset, wn, bn), at::linear(offset, wn, bn)), 1e-5);
  }
  // shapes that disagree: at::linear's own error
  EXPECT_THROW(linear_fused(x, torch::randn({8, 15}), b), c10::Error);
}

TEST(LinearFused, EmptyRows) {
  for (const int64_t n : {8, 32}) {  // MKL's route at AVX-512 (8 < 16 lanes) and the own one
    auto x = torch::randn({0, 4, 16}).requires_grad_(true);
    auto w = torch::randn({n, 16}).requires_grad_(true), b = torch::randn({n}).requires_grad_(true);
    auto y = linear_fused(x, w, b);
    EXPECT_EQ(y.sizes(), torch::IntArrayRef({0, 4, n}));
    y.sum().backward();
    EXPECT_TRUE(torch::equal(w.grad(), torch::zeros({n, 16})));
    EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({n})));
    EXPECT_TRUE(torch::equal(x.grad(), torch::zeros({0, 4, 16})));
  }
}

// A layer without input or output features (W [N, 0] or [0, K]; at::linear gives the bias rows
// or an empty output): the reference's values and gradients, where the node's [-1, 0] row views
// failed with ATen's "cannot reshape tensor of 0 elements" (found by the hostile review).
TEST(LinearFused, ZeroFeaturesTakeTheReference) {
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{32, 0}, {0, 32}, {0, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(std::vector<int64_t>{n, k}));
    const std::vector<at::Tensor> in{torch::randn({4, 3, k}), torch::randn({n, k}),
                                     torch::randn({n})};
    EXPECT_FALSE(linear_fused_supported(in[0], in[1], in[2]));
    const auto dy = torch::randn({4, 3, n});
    const std::vector<bool> all(3, true);
    const auto got = run(linear_of(linear_fused), in, dy, all);
    const auto ref = run(linear_of(linear_reference), in, dy, all);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], ref[i])) << i;
  }
  // the MLP with no hidden, input or output features
  for (const auto& [f, d, e] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{32, 0, 32}, {0, 32, 32}, {32, 32, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(std::vector<int64_t>{f, d, e}));
    const std::vector<at::Tensor> in{torch::randn({2, 3, d}), torch::randn({f, d}),
                                     torch::randn({f}), torch::randn({e, f}), torch::randn({e})};
    const auto dy = torch::randn({2, 3, e});
    const std::vector<bool> all(5, true);
    const auto got = run(mlp_of(mlp_gelu_fused), in, dy, all);
    const auto ref = run(mlp_of(mlp_gelu_reference), in, dy, all);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::equal(got[i], ref[i])) << i;
  }
}

// Weights that share memory (a guard, from the hostile review): a weight and bias that are rows of
// larger parameters (storage offset; the rest of the parameter's gradient 0), one tensor as both x
// and W, one weight in two layers (tied), against at::linear within rounding; a second backward
// through the same graph (retain_graph) gives the same bits; x or W changed in place after the
// forward is autograd's version error, not a gradient of the new values.
TEST(LinearFused, SharedAndOffsetWeightsAndInPlaceChanges) {
  torch::manual_seed(13);
  const auto fresh = [](const at::Tensor& t) { return t.detach().clone().requires_grad_(true); };
  {
    const auto big = torch::randn({96, 32}), big_b = torch::randn({96});
    const auto x = torch::randn({7, 5, 32}), dy = torch::randn({7, 5, 32});
    std::vector<std::vector<at::Tensor>> runs;
    for (const auto& f : {linear_fused, linear_reference}) {
      std::vector<at::Tensor> in{fresh(x), fresh(big), fresh(big_b)};
      f(in[0], in[1].narrow(0, 32, 32), in[2].narrow(0, 32, 32)).backward(dy);
      runs.push_back({in[0].grad(), in[1].grad(), in[2].grad()});
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(relative(runs[0][i], runs[1][i]), 1e-5) << i;
    EXPECT_TRUE(runs[0][1].narrow(0, 0, 32).eq(0).all().item<bool>());
  }
  {
    const auto w = torch::randn({32, 32}) / 6, t = torch::randn({48, 16}) / 4,
               u = torch::randn({3, 48}), b = torch::randn({32}), tb = torch::randn({48});
    const auto dz = torch::randn({32, 32}), dh = torch::randn({3, 48});
    std::vector<std::vector<at::Tensor>> runs;
    for (const auto& f : {linear_fused, linear_reference}) {
      auto ws = fresh(w), ts = fresh(t), us = fresh(u);
      f(ws, ws, b).backward(dz);              // x = W
      f(us.matmul(ts), ts, tb).backward(dh);  // W tied to the input's projection
      runs.push_back({ws.grad(), ts.grad(), us.grad()});
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_LE(relative(runs[0][i], runs[1][i]), 1e-5) << i;
  }
  auto x = torch::randn({9, 32}, torch::requires_grad()),
       w = torch::randn({32, 32}, torch::requires_grad()),
       b = torch::randn({32}, torch::requires_grad());
  const auto y = linear_fused(x, w, b);
  const auto dy = torch::randn_like(y);
  const auto first = torch::autograd::grad({y}, {x, w, b}, {dy}, /*retain_graph=*/true);
  const auto second = torch::autograd::grad({y}, {x, w, b}, {dy});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(first[i], second[i])) << i;
  for (const int changed : {0, 1}) {
    auto xi = x * 1, wi = w * 1;
    const auto yi = linear_fused(xi, wi, b);
    (changed == 0 ? xi : wi).add_(1);
    EXPECT_THROW(yi.sum().backward(), c10::Error) << changed;
  }
}

// The thread count for a scope, restored after it whatever happens in it.
struct Threads {
  int before = at::get_num_threads();
  explicit Threads(int n) { at::set_num_threads(n); }
  ~Threads() { at::set_num_threads(before); }
};

TEST(LinearFused, GradientsTheSameBitsAtOneTwoAndThreeThreads) {
  torch::manual_seed(11);
  for (const int64_t n : {32, 96}) {
    const std::vector<at::Tensor> in{torch::randn({5, 13, 48}), torch::randn({n, 48}) / 7,
                                     torch::randn({n})};
    const auto dy = torch::randn({5, 13, n});
    const std::vector<bool> all(3, true);
    std::vector<std::vector<at::Tensor>> runs;
    for (const int t : {1, 2, 3}) {
      Threads threads(t);
      runs.push_back(run(linear_of(linear_fused), in, dy, all));
    }
    const auto f64 = run(linear_of(linear_reference), to_double(in), dy, all);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_TRUE(torch::equal(runs[1][i], runs[0][i])) << i;
      EXPECT_TRUE(torch::equal(runs[2][i], runs[0][i])) << i;
      EXPECT_LE(relative(runs[0][i], f64[i]), 2e-5) << i;
    }
  }
}

// ---- the own products alone (kernels/cpu/linear_gemm_cpu.h) ----------------------------------

// The float32 bound of a sum of depth products and an init term: (depth + 2) 2^-24 abs_sum.
void expect_within_bound(const at::Tensor& got, const at::Tensor& want64,
                         const at::Tensor& abs_sum64, int64_t depth) {
  const auto bound = abs_sum64 * (static_cast<double>(depth + 2) * std::ldexp(1.0, -24));
  const auto excess = (got.to(torch::kDouble) - want64).abs() - bound;
  EXPECT_LE(excess.numel() == 0 ? 0.0 : excess.max().item<double>(), 0.0);
}

TEST(LinearGemm, ProductsWithinTheFloat32BoundAtAnyRowCountAndThreadCount) {
  const auto* kern = posenc::detail::own_linear_gemm();
  if (kern == nullptr)
    GTEST_SKIP() << "MKL's products at this level (scalar, or POSENC_LINEAR_GEMM=mkl)";
  const int64_t lanes = kern->lanes;
  for (const int64_t m : {0, 1, 5, 17, 63, 65, 129, 600})  // 600: dW over 3 chunks of rows
    for (const int64_t k : {1, 7, 33, 96})
      for (const int64_t n : {lanes, 2 * lanes, 3 * lanes, 6 * lanes}) {
        SCOPED_TRACE(::testing::PrintToString(std::vector<int64_t>{m, k, n}));
        torch::manual_seed(m * 1000 + k * 10 + n);
        const auto x = torch::randn({m, k}), w = torch::randn({n, k}), b = torch::randn({n}),
                   dy = torch::randn({m, n});
        const auto x64 = x.to(torch::kDouble), w64 = w.to(torch::kDouble),
                   b64 = b.to(torch::kDouble), dy64 = dy.to(torch::kDouble);
        std::vector<at::Tensor> first;
        for (const int t : {1, 2, 3}) {
          Threads threads(t);
          auto y = torch::full({m, n}, std::nan(""));
          posenc::detail::linear_forward_own(x, w, b, y);
          expect_within_bound(y, x64.mm(w64.t()) + b64, x64.abs().mm(w64.abs().t()) + b64.abs(), k);
          std::vector<at::Tensor> out{y};
          // dW [R, C] = g^T v and db = the sum of g's rows take C (v's width) a multiple of lanes,
          // any R: once with g = dy, v = x where k is a multiple, once with g = x, v = dy (R = k)
          for (const bool swapped : {false, true}) {
            if (!swapped && k % lanes != 0) continue;
            const auto& g = swapped ? x : dy;
            const auto& v = swapped ? dy : x;
            const auto g64 = g.to(torch::kDouble), v64 = v.to(torch::kDouble);
            auto dw = torch::full({g.size(1), v.size(1)}, std::nan(""));
            auto db = torch::full({g.size(1)}, std::nan(""));
            posenc::detail::linear_weight_grad_own(g, v, dw, &db);
            expect_within_bound(dw, g64.t().mm(v64), g64.abs().t().mm(v64.abs()), m);
            expect_within_bound(db, g64.sum(0), g64.abs().sum(0), m);
            out.push_back(dw);
            out.push_back(db);
          }
          if (k % lanes == 0) {
            auto dx = torch::full({m, k}, std::nan(""));
            posenc::detail::linear_input_grad_own(dy, w, dx);
            expect_within_bound(dx, dy64.mm(w64), dy64.abs().mm(w64.abs()), n);
            out.push_back(dx);
          }
          if (first.empty()) {
            first = out;
          } else {
            for (size_t i = 0; i < out.size(); ++i)
              EXPECT_TRUE(torch::equal(out[i], first[i])) << t << " " << i;
          }
        }
      }
}

TEST(LinearGemm, RefusesWhatItDoesNotTake) {
  const auto* kern = posenc::detail::own_linear_gemm();
  if (kern == nullptr)
    GTEST_SKIP() << "MKL's products at this level (scalar, or POSENC_LINEAR_GEMM=mkl)";
  const int64_t n = kern->lanes;
  auto y = torch::empty({4, n + 1});
  EXPECT_FALSE(posenc::detail::linear_gemm_takes(n + 1));
  EXPECT_THROW(posenc::detail::linear_forward_own(torch::randn({4, 3}), torch::randn({n + 1, 3}),
                                                  torch::randn({n + 1}), y),
               c10::Error);
  auto y2 = torch::empty({4, n});
  EXPECT_THROW(posenc::detail::linear_forward_own(torch::randn({3, 4}).t(), torch::randn({n, 3}),
                                                  torch::randn({n}), y2),
               c10::Error);
  EXPECT_THROW(posenc::detail::linear_forward_own(torch::randn({4, 3}, torch::kDouble),
                                                  torch::randn({n, 3}), torch::randn({n}), y2),
               c10::Error);
}

TEST(MlpGeluFused, ForwardAndGradientsWithinRounding) {
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
    if (!own_forward(f) && !own_forward(d))
      EXPECT_TRUE(torch::equal(got[0], ref[0]));  // the same addmm, GELU pass, addmm
    EXPECT_LE(relative(got[0], ref[0]), 2e-5);
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

// The MLP node's forward and gradients are those of its parts, linear_fused -> gelu_fused ->
// linear_fused, to the bit (the own product's GELU applied to its rows in cache, and its input
// gradient's multiplication by GELU's derivative, are the fused GELU passes' values), at row
// counts that split the rows unevenly and at 1 to 3 threads.
TEST(MlpGeluFused, TheSameBitsAsItsFusedParts) {
  if (!posenc::gelu_fused_supported(torch::zeros({8}))) GTEST_SKIP() << "no fused GELU";
  const auto parts = [](const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                        const at::Tensor& w2, const at::Tensor& b2) {
    return linear_fused(posenc::gelu_fused(linear_fused(x, w1, b1)), w2, b2);
  };
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {5, 7, 9, 32}, {3, 43, 96, 192}, {1, 1, 16, 48}, {2, 13, 48, 20}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    torch::manual_seed(shape[1] + shape[3]);
    const int64_t d = shape[2], f = shape[3];
    const std::vector<int64_t> x_shape{shape[0], shape[1], d};
    const std::vector<at::Tensor> in{torch::randn(x_shape), torch::randn({f, d}) / std::sqrt(d),
                                     0.1 * torch::randn({f}), torch::randn({d, f}) / std::sqrt(f),
                                     0.1 * torch::randn({d})};
    const auto dy = torch::randn(x_shape);
    const std::vector<bool> all(5, true);
    for (const int t : {1, 2, 3}) {
      Threads threads(t);
      const auto got = run(mlp_of(mlp_gelu_fused), in, dy, all);
      const auto want = run(mlp_of(parts), in, dy, all);
      for (size_t i = 0; i < 6; ++i) EXPECT_TRUE(torch::equal(got[i], want[i])) << t << " " << i;
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
