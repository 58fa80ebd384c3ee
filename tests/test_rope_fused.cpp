// Fused RoPE vs the reference rope_apply (its specification): layouts x dtypes x shapes,
// including odd sizes, partial rotary, non-contiguous views, batched tables and offsets;
// gradients of the fused backward vs autograd through the reference; angle accuracy.
#include <ATen/record_function.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "support/dispatcher_calls.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::max_abs_diff;

// fp32 kernels and the fp32 reference evaluate the same expression: a few ulps of |x| <~ 4.
constexpr double kFloat32Tolerance = 2e-6;
// bf16/fp16 outputs are rounded once each from fp32; the reference rounds the same way.
constexpr double kReducedTolerance = 2e-2;

struct FusedCase {
  at::ScalarType dtype;
  RopeLayout layout;
  std::vector<int64_t> shape;  // B, N, H, Dh
  double partial;
  bool batched_table;
  bool non_contiguous;
};

class RopeFused : public ::testing::TestWithParam<FusedCase> {};

TEST_P(RopeFused, MatchesReferenceForwardAndBackward) {
  const auto& c = GetParam();
  torch::manual_seed(7);
  const int64_t b = c.shape[0], n = c.shape[1], h = c.shape[2], dh = c.shape[3];
  auto make = [&] {
    auto base = torch::randn({b, n, h, c.non_contiguous ? 2 * dh : dh});
    auto x = c.non_contiguous ? base.narrow(-1, 0, dh) : base;    // strided rows
    if (c.non_contiguous) x = x.transpose(1, 2).transpose(1, 2);  // same view, strides kept
    return x.to(c.dtype);
  };
  auto q = make(), k = make();
  const int64_t f = static_cast<int64_t>(dh * c.partial) / 2;
  auto positions = c.batched_table ? torch::rand({b, n}, torch::kFloat64) * 5000
                                   : torch::arange(n, torch::kFloat64) + 1234;  // an offset
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * f, 2, torch::kFloat64) / (2.0 * f));
  auto [cos, sin] = rope_cos_sin(positions, inv, 1.0);
  auto [fq, fk] = rope_fused_qk(q, k, cos, sin, c.layout);
  auto rq = rope_apply(q, cos, sin, c.layout);
  auto rk = rope_apply(k, cos, sin, c.layout);
  const double tol = c.dtype == torch::kFloat32 || c.dtype == torch::kFloat64 ? kFloat32Tolerance
                                                                              : kReducedTolerance;
  EXPECT_EQ(fq.scalar_type(), c.dtype);
  EXPECT_LT(max_abs_diff(fq, rq), tol);
  EXPECT_LT(max_abs_diff(fk, rk), tol);
  if (c.dtype != torch::kFloat32 && c.dtype != torch::kFloat64) return;
  // backward: fused (inverse rotation) vs autograd through the reference
  auto q1 = q.detach().requires_grad_(true), k1 = k.detach().requires_grad_(true);
  auto q2 = q.detach().requires_grad_(true), k2 = k.detach().requires_grad_(true);
  auto probe = torch::randn({b, n, h, dh}).to(c.dtype);
  auto [a, bb] = rope_fused_qk(q1, k1, cos, sin, c.layout);
  ((a * probe).sum() + (bb * probe * 2).sum()).backward();
  ((rope_apply(q2, cos, sin, c.layout) * probe).sum() +
   (rope_apply(k2, cos, sin, c.layout) * probe * 2).sum())
      .backward();
  EXPECT_LT(max_abs_diff(q1.grad(), q2.grad()), tol);
  EXPECT_LT(max_abs_diff(k1.grad(), k2.grad()), tol);
}

std::vector<FusedCase> cases() {
  std::vector<FusedCase> out;
  for (auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kFloat16})
    for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
      out.push_back({dtype, layout, {2, 17, 3, 64}, 1.0, false, false});
      out.push_back({dtype, layout, {1, 5, 1, 10}, 1.0, true, false});   // odd F = 5
      out.push_back({dtype, layout, {3, 7, 2, 48}, 0.5, false, true});   // partial, strided
      out.push_back({dtype, layout, {1, 33, 4, 32}, 0.25, true, true});  // batched table
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(DtypeLayoutShape, RopeFused, ::testing::ValuesIn(cases()));

TEST(RopeFusedModule, EncoderUsesFusedAndReferenceAlike) {
  torch::manual_seed(8);
  for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
    Rope fused(RopeOptions(32).layout(layout).partial_rotary_factor(0.5));
    Rope reference(RopeOptions(32).layout(layout).partial_rotary_factor(0.5).fused(false));
    auto q = torch::randn({2, 9, 4, 32}), k = torch::randn({2, 9, 4, 32});
    auto p = Positions::sequence(9, 100);
    auto [a, b] = fused->rotate(q, k, p, p);
    auto [c, d] = reference->rotate(q, k, p, p);
    EXPECT_LT(max_abs_diff(a, c), kFloat32Tolerance);
    EXPECT_LT(max_abs_diff(b, d), kFloat32Tolerance);
    // different q and k positions (cached keys) take the per-tensor path
    auto [e, g] = fused->rotate(q.narrow(1, 0, 3), k, Positions::sequence(3, 106), p);
    auto [e2, g2] = reference->rotate(q.narrow(1, 0, 3), k, Positions::sequence(3, 106), p);
    EXPECT_LT(max_abs_diff(e, e2), kFloat32Tolerance);
    EXPECT_LT(max_abs_diff(g, g2), kFloat32Tolerance);
  }
}

TEST(RopeFusedInPlace, RotatesInPlaceAndRefusesAutograd) {
  torch::manual_seed(9);
  auto x = torch::randn({1, 6, 2, 16});
  auto positions = torch::arange(6, torch::kFloat64);
  auto inv = torch::pow(10000.0, -torch::arange(0, 16, 2, torch::kFloat64) / 16.0);
  auto [cos, sin] = rope_cos_sin(positions, inv);
  auto expected = rope_apply(x, cos, sin, RopeLayout::kHalf);
  auto y = x.clone();
  rope_fused_(y, cos, sin, RopeLayout::kHalf);
  EXPECT_LT(max_abs_diff(y, expected), kFloat32Tolerance);
  auto z = x.clone().requires_grad_(true);
  EXPECT_THROW(rope_fused_(z, cos, sin, RopeLayout::kHalf), c10::Error);
}

TEST(RopeFusedErrors, ShapesAreChecked) {
  auto q = torch::randn({1, 4, 2, 8});
  auto [cos, sin] =
      rope_cos_sin(torch::arange(5, torch::kFloat64), torch::ones({4}, torch::kFloat64));
  auto message = test::error_of([&] { rope_fused(q, cos, sin, RopeLayout::kHalf); });
  EXPECT_NE(message.find("rope_rotate: cos/sin have 5 positions but x has N=4"), std::string::npos)
      << message;
  auto [wide_cos, wide_sin] =
      rope_cos_sin(torch::arange(4, torch::kFloat64), torch::ones({5}, torch::kFloat64));
  message = test::error_of([&] { rope_fused(q, wide_cos, wide_sin, RopeLayout::kHalf); });
  EXPECT_NE(message.find("rotary width 2F=10 exceeds head_dim=8"), std::string::npos) << message;
}

// The library's rotation is the dispatcher's operator: the Rope module and rope_fused* reach
// posenc::rope_rotate* through c10::Dispatcher (RecordFunction sees the calls by schema name),
// with a CPU and an Autograd kernel per dispatch key, and its backward is the operator again
// (so differentiable: the gradient of the backward with respect to the incoming gradient).
TEST(RopeOperator, TheLibraryCallsTheOperatorsThroughTheDispatcher) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name :
       {"posenc::rope_rotate", "posenc::rope_rotate_qk", "posenc::rope_rotate_"}) {
    auto op = dispatcher.findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) << name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::Autograd)) << name;
  }
  auto& seen = test::posenc_calls();
  seen.clear();
  auto handle = test::watch_posenc_calls();
  Rope rope(RopeOptions(32));
  auto q = torch::randn({2, 9, 4, 32}, torch::requires_grad()), k = torch::randn({2, 9, 2, 32});
  auto p = Positions::sequence(9);
  auto [a, b] = rope->rotate(q, k, p, p);
  (a.sum() + b.sum()).backward();
  at::removeCallback(handle);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen[0], "posenc::rope_rotate_qk");  // the forward, one pass for q and k
  EXPECT_NE(std::find(seen.begin() + 1, seen.end(), "posenc::rope_rotate_qk"), seen.end())
      << "the backward (both results used) is the operator again";
  // one result used: its gradient alone, through the one-tensor operator
  seen.clear();
  handle = test::watch_posenc_calls();
  auto [c, d] = rope->rotate(q, k, p, p);
  c.sum().backward();
  at::removeCallback(handle);
  // (each operator is seen twice: at its Autograd kernel and at the device kernel it calls)
  EXPECT_EQ(seen.front(), "posenc::rope_rotate_qk");
  EXPECT_NE(std::find(seen.begin(), seen.end(), "posenc::rope_rotate"), seen.end());
}

TEST(RopeOperator, TheBackwardIsDifferentiable) {
  torch::manual_seed(11);
  for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
    auto x = torch::randn({2, 5, 3, 16}, torch::dtype(torch::kFloat64).requires_grad(true));
    auto [cos, sin] =
        rope_cos_sin(torch::arange(5, torch::kFloat64), torch::rand({6}, torch::kFloat64));
    auto v = torch::randn({2, 5, 3, 16}, torch::dtype(torch::kFloat64).requires_grad(true));
    auto w = torch::randn({2, 5, 3, 16}, torch::kFloat64);
    auto y = rope_fused(x, cos, sin, layout);
    auto gx = torch::autograd::grad({y}, {x}, {v}, /*retain_graph=*/true, /*create_graph=*/true)[0];
    EXPECT_LT(max_abs_diff(gx, rope_apply(v, cos, -sin, layout)), 1e-12);  // R^T v
    (gx * w).sum().backward();                                             // d<R^T v, w>/dv = R w
    EXPECT_LT(max_abs_diff(v.grad(), rope_apply(w, cos, sin, layout)), 1e-12);
  }
}

#ifdef POSENC_OPS_LIBRARY_PATH
// This program links the static core (its rope_rotate operators registered at start-up);
// libposenc_ops.so carries another copy. Loading it must not register the schemas a second time
// (which aborts the process): the first copy registers, the other uses it.
TEST(RopeOperator, ASecondCopyOfTheCoreLoadsBesideTheFirst) {
  ASSERT_TRUE(c10::Dispatcher::singleton().findSchema({"posenc::rope_rotate", ""}).has_value());
  void* handle = dlopen(POSENC_OPS_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  // its own operators are there, and the rotation still runs
  EXPECT_TRUE(c10::Dispatcher::singleton().findSchema({"posenc::apply_rotary", ""}).has_value());
  auto x = torch::randn({1, 4, 2, 8});
  auto [cos, sin] =
      rope_cos_sin(torch::arange(4, torch::kFloat64), torch::rand({4}, torch::kFloat64));
  EXPECT_LT(max_abs_diff(rope_fused(x, cos, sin, RopeLayout::kHalf),
                         rope_apply(x, cos, sin, RopeLayout::kHalf)),
            kFloat32Tolerance);
  // (not closed: its registrations would be undone while this process keeps running tests)
}
#endif

TEST(RopeSections, AxesOfPairsBothLayouts) {
  EXPECT_TRUE(torch::equal(rope_section_axes({2, 3}, RopeSectionLayout::kContiguous),
                           torch::tensor({0, 0, 1, 1, 1}, torch::kLong)));
  // Qwen3-VL style: t h w t h w ..., an axis drops out when its count is used up
  EXPECT_TRUE(torch::equal(rope_section_axes({2, 2, 1}, RopeSectionLayout::kInterleaved),
                           torch::tensor({0, 1, 2, 0, 1}, torch::kLong)));
}

TEST(RopeSections, TablesFollowTheirAxisAndFeedTheFusedKernel) {
  // Hand-derived: pair i rotates by coords[axis(i)] * inv_freq[i].
  auto coords = torch::tensor({{5.0, 7.0}, {1.0, 2.0}}, torch::kFloat64);  // [N=2, A=2]
  auto inv = torch::tensor({1.0, 0.5, 0.25, 0.125, 0.0625}, torch::kFloat64);
  auto [cos, sin] = rope_cos_sin_sections(coords, inv, {2, 3}, RopeSectionLayout::kContiguous);
  const double p[2][5] = {{5, 5, 7, 7, 7}, {1, 1, 2, 2, 2}};
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(cos[n][i].item<double>(), std::cos(p[n][i] * inv[i].item<double>()), 1e-7);
      EXPECT_NEAR(sin[n][i].item<double>(), std::sin(p[n][i] * inv[i].item<double>()), 1e-7);
    }
  // one axis is plain 1D RoPE
  auto [c1, s1] =
      rope_cos_sin_sections(coords.narrow(1, 0, 1), inv, {5}, RopeSectionLayout::kContiguous);
  auto [c2, s2] = rope_cos_sin(coords.select(1, 0), inv);
  EXPECT_TRUE(torch::equal(c1, c2));
  // the fused kernel takes sectioned tables as it takes 1D ones
  auto x = torch::randn({1, 2, 3, 10});
  EXPECT_LT(max_abs_diff(rope_fused(x, cos, sin, RopeLayout::kHalf),
                         rope_apply(x, cos, sin, RopeLayout::kHalf)),
            kFloat32Tolerance);
  auto message = test::error_of([&] {
    rope_cos_sin_sections(coords, inv, {2, 2}, RopeSectionLayout::kContiguous);
  });
  EXPECT_NE(message.find("sections cover 4 pairs but inv_freq has 5"), std::string::npos)
      << message;
}

TEST(RopeAngles, Float32WithinTwoMicroradiansOfFloat64UpTo2To20) {
  // cos/sin tables (float32 values from float64 angles) against a float64 evaluation.
  auto positions = torch::cat({torch::arange(0, 1024, torch::kFloat64),
                               torch::arange(1048576 - 1024, 1048577, torch::kFloat64)});
  auto inv = torch::pow(10000.0, -torch::arange(0, 128, 2, torch::kFloat64) / 128.0);
  auto [cos, sin] = rope_cos_sin(positions, inv);
  auto angles = positions.unsqueeze(-1) * inv;
  EXPECT_LT(max_abs_diff(cos, angles.cos()), 2e-6);
  EXPECT_LT(max_abs_diff(sin, angles.sin()), 2e-6);
}

}  // namespace
}  // namespace posenc
