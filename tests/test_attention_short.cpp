// The short-sequence kernel (attention_short) vs its specification: rope_apply on q and k, then
// attention_reference; forward and gradients for q, k, v over sizes (N = 1, 7, 15, 16, 17, 33,
// 36, 64), head dims (8, 32, 36, 40, 64: a tail after the 8-wide sums; partial rotary), both
// layouts, causal, strided views of one qkv tensor, both ways the backward gets P (kept from the
// forward, or recomputed from the log-sum-exp: attention_short_saves_probabilities) and both
// ways the vector form reads its rows (in place where N % 8 == 0 and D % 8 == 0, else through
// padded scratch); results independent of the thread count (1, 2, 3); the attention layer on the
// short path equals the layer without fused kernels; what the kernel refuses. CTest runs these at
// every CPU level in turn (unit_cpu_scalar, unit_cpu_avx2, unit_cpu_avx512).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>

#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/short_attention.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::max_abs_diff;

constexpr double kForwardTolerance = 2e-5;
constexpr double kGradientTolerance = 2e-5;  // relative to the largest gradient entry

struct ShortCase {
  int64_t n, d, pairs;  // pairs 0: no rotation
  bool interleaved, causal;
  bool saved;  // whether the forward keeps P for the backward (the rule's answer, checked)
};

class AttentionShort : public ::testing::TestWithParam<ShortCase> {};

TEST_P(AttentionShort, MatchesRopeThenReference) {
  const auto& c = GetParam();
  torch::manual_seed(5);
  const int64_t b = 3, h = 2;
  // q, k, v as the model has them: strided views of one [B, N, 3, H, D] projection
  auto qkv = torch::randn({b, c.n, 3, h, c.d}, torch::requires_grad());
  auto parts = qkv.unbind(2);
  AttentionRotary rotary;
  at::Tensor cos, sin;
  if (c.pairs > 0) {
    auto angles = torch::rand({c.n, c.pairs}, torch::kFloat64) * 6.0;
    cos = angles.cos().to(torch::kFloat32);
    sin = angles.sin().to(torch::kFloat32);
    rotary = {cos, sin, cos, sin, c.interleaved ? RopeLayout::kInterleaved : RopeLayout::kHalf};
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  ASSERT_TRUE(attention_short_supported(parts[0], parts[1], parts[2], rotary));
  ASSERT_EQ(attention_short_saves_probabilities(c.n, c.d), c.saved) << "n=" << c.n << " d=" << c.d;
  auto fast = attention_short(parts[0], parts[1], parts[2], scale, rotary, c.causal);

  auto qkv_ref = qkv.detach().clone().requires_grad_(true);
  auto ref_parts = qkv_ref.unbind(2);
  at::Tensor q = ref_parts[0], k = ref_parts[1];
  if (c.pairs > 0) {  // the specification: rope_apply with the [N, F] tables
    q = rope_apply(q, cos, sin, rotary.layout);
    k = rope_apply(k, cos, sin, rotary.layout);
  }
  AttentionMasks masks;
  masks.causal = c.causal;
  auto reference = attention_reference(q, k, ref_parts[2], {}, masks, scale);
  ASSERT_EQ(fast.sizes(), reference.sizes());
  EXPECT_LT(max_abs_diff(fast, reference), kForwardTolerance);

  auto probe = torch::randn_like(reference);
  fast.backward(probe);
  reference.backward(probe);
  const double largest = qkv_ref.grad().abs().max().item<double>();
  EXPECT_LT(max_abs_diff(qkv.grad(), qkv_ref.grad()), kGradientTolerance * std::max(1.0, largest))
      << "n=" << c.n << " d=" << c.d << " pairs=" << c.pairs;
}

INSTANTIATE_TEST_SUITE_P(
    Sizes, AttentionShort,
    ::testing::Values(
        ShortCase{16, 32, 16, false, false, true},  // the main job: in place, kept
        ShortCase{16, 32, 16, true, false, true},
        ShortCase{36, 32, 16, false, false, false},  // padded, recomputed
        ShortCase{64, 8, 4, false, true, false},     // in place, recomputed
        ShortCase{32, 8, 4, true, false, false}, ShortCase{1, 32, 16, false, false, false},
        ShortCase{7, 36, 10, true, true, true},  // tail, partial; padded, kept
        ShortCase{15, 32, 16, false, true, true}, ShortCase{17, 32, 16, true, false, false},
        ShortCase{17, 40, 12, false, true, true}, ShortCase{33, 32, 16, false, false, false},
        ShortCase{33, 64, 32, false, true, true}, ShortCase{64, 64, 32, true, false, true},
        ShortCase{16, 32, 0, false, false, true}, ShortCase{16, 36, 0, false, true, true}));

// The rule for keeping P (Np^2 <= N * D, Np = N rounded up to 8), at stated sizes.
TEST(AttentionShort, KeepsProbabilitiesWherePIsNoLargerThanQ) {
  EXPECT_TRUE(attention_short_saves_probabilities(16, 32));   // 256 <= 512: the main job
  EXPECT_TRUE(attention_short_saves_probabilities(32, 32));   // 1024 <= 1024
  EXPECT_FALSE(attention_short_saves_probabilities(33, 32));  // 1600 > 1056
  EXPECT_FALSE(attention_short_saves_probabilities(36, 32));  // 1600 > 1152
  EXPECT_TRUE(attention_short_saves_probabilities(64, 64));   // 4096 <= 4096
  EXPECT_FALSE(attention_short_saves_probabilities(64, 8));
  EXPECT_FALSE(attention_short_saves_probabilities(1, 32));  // 64 > 32
  EXPECT_FALSE(attention_short_saves_probabilities(0, 32));
}

// Whether the forward keeps P (gradients needed) does not change its output: the same bits as
// inference, for a size that keeps P and one that recomputes it; a second backward through the
// same graph (retain_graph) gives the same gradients (the backward leaves the kept P as it was).
TEST(AttentionShort, KeepingPChangesNoBitOfTheForward) {
  for (const int64_t n : {16, 36}) {
    torch::manual_seed(17);
    auto qkv = torch::randn({4, n, 3, 3, 32});
    auto angles = torch::rand({n, 16}, torch::kFloat64) * 6.0;
    const auto cos = angles.cos().to(torch::kFloat32), sin = angles.sin().to(torch::kFloat32);
    const AttentionRotary rotary{cos, sin, cos, sin, RopeLayout::kHalf};
    at::Tensor inference;
    {
      torch::NoGradGuard no_grad;
      inference = attention_short_packed(qkv, 0.2, rotary);
    }
    auto leaf = qkv.clone().requires_grad_(true);
    const auto training = attention_short_packed(leaf, 0.2, rotary);
    EXPECT_TRUE(inference.equal(training)) << n;
    const auto probe = torch::randn_like(training);
    const auto first = torch::autograd::grad({training}, {leaf}, {probe}, /*retain_graph=*/true)[0];
    const auto second = torch::autograd::grad({training}, {leaf}, {probe})[0];
    EXPECT_TRUE(first.equal(second)) << n;
  }
}

// Outputs and gradients to the bit at 1, 2 and 3 threads, P kept (N = 16) and recomputed (N = 36).
TEST(AttentionShort, ResultDoesNotDependOnThreads) {
  const int threads = at::get_num_threads();
  for (const int64_t n : {16, 36}) {
    torch::manual_seed(9);
    auto q = torch::randn({8, n, 4, 32}), k = torch::randn({8, n, 4, 32}),
         v = torch::randn({8, n, 4, 32}), probe = torch::randn({8, n, 4, 32});
    std::vector<at::Tensor> results;
    for (const int t : {1, 2, 3}) {
      at::set_num_threads(t);
      auto qg = q.clone().requires_grad_(true), kg = k.clone().requires_grad_(true),
           vg = v.clone().requires_grad_(true);
      auto out = attention_short(qg, kg, vg, 0.2, {}, /*causal=*/n == 36);
      out.backward(probe);
      results.push_back(torch::cat(
          {out.flatten(), qg.grad().flatten(), kg.grad().flatten(), vg.grad().flatten()}));
    }
    at::set_num_threads(threads);
    EXPECT_TRUE(results[0].equal(results[1])) << n;
    EXPECT_TRUE(results[0].equal(results[2])) << n;
  }
}

// The packed form (q, k, v the parts of one [B, N, 3, H, D] projection; the gradient written as
// one tensor) computes what the three views do, to the bit, outputs and gradients.
TEST(AttentionShort, PackedEqualsViews) {
  for (const bool causal : {false, true})
    for (const int64_t n : {1, 7, 16, 36}) {
      torch::manual_seed(11);
      const int64_t d = n == 7 ? 36 : 32, pairs = n == 7 ? 10 : 16;
      auto angles = torch::rand({n, pairs}, torch::kFloat64) * 6.0;
      const auto cos = angles.cos().to(torch::kFloat32), sin = angles.sin().to(torch::kFloat32);
      const AttentionRotary rotary{cos, sin, cos, sin, RopeLayout::kHalf};
      auto a = torch::randn({3, n, 3, 2, d}, torch::requires_grad());
      auto b = a.detach().clone().requires_grad_(true);
      const auto parts = a.unbind(2);
      const auto views = attention_short(parts[0], parts[1], parts[2], 0.2, rotary, causal);
      const auto packed = attention_short_packed(b, 0.2, rotary, causal);
      EXPECT_TRUE(views.equal(packed)) << n << " " << causal;
      const auto probe = torch::randn_like(views);
      views.backward(probe);
      packed.backward(probe);
      EXPECT_TRUE(a.grad().equal(b.grad())) << n << " " << causal;
    }
  EXPECT_THROW(attention_short_packed(torch::randn({2, 4, 2, 2, 8}), 1.0), c10::Error);
}

// The fused backward has no derivative of its own: a gradient asked for with create_graph is
// refused in one line (it would silently lack attention's second-order terms).
TEST(AttentionShort, SecondOrderGradientsAreRefused) {
  auto qkv = torch::randn({2, 16, 3, 2, 8}, torch::requires_grad());
  const auto out = attention_short_packed(qkv, 0.3);
  try {
    torch::autograd::grad({out.sum()}, {qkv}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    FAIL() << "create_graph was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("second-order"), std::string::npos);
  }
  EXPECT_EQ(torch::autograd::grad({out.sum()}, {qkv})[0].sizes(), qkv.sizes());
}

TEST(AttentionShort, RefusesWhatItCannotTake) {
  auto q = torch::randn({2, 65, 2, 8});
  EXPECT_FALSE(attention_short_supported(q, q, q));  // N > kShortAttentionMaxTokens
  try {
    attention_short(q, q, q, 1.0);
    FAIL() << "N=65 was taken";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("N=65"), std::string::npos)
        << e.what_without_backtrace();
  }
  auto d = torch::randn({2, 16, 2, 8}, torch::kFloat64);
  EXPECT_FALSE(attention_short_supported(d, d, d));  // float64 takes the reference path
  auto f = torch::randn({2, 16, 2, 8});
  auto learned = torch::ones({16, 4}, torch::requires_grad());
  EXPECT_FALSE(attention_short_supported(f, f, f, {learned, learned, learned, learned}));
  auto other = torch::zeros({16, 4});
  auto cos = torch::ones({16, 4});
  EXPECT_FALSE(attention_short_supported(f, f, f, {cos, other, cos, cos}));  // k's sin differs
  auto wide = torch::ones({16, 5});
  EXPECT_FALSE(attention_short_supported(f, f, f, {wide, wide, wide, wide}));  // 2F > D
}

// The layer: a ViT-style stack with 2D axial RoPE takes the short path (fused on) and equals
// the same weights without fused kernels (rope_apply + einsum/softmax), outputs and gradients.
TEST(AttentionShort, LayerEqualsUnfusedLayer) {
  torch::manual_seed(13);
  auto make = [](bool fused) {
    torch::manual_seed(13);
    auto rope = RopeOptions(16)
                    .frequencies(RopeFrequencyOptions::per_axis_ladders(100))
                    .sections(RopeSectionMap().sections({4, 4}))
                    .fused(fused);
    return Transformer(TransformerOptions(64, 4, 2).fused(fused), as_encoding(Rope(rope)));
  };
  auto fast = make(true), slow = make(false);
  auto x = torch::randn({5, 16, 64});
  auto positions = Positions::grid(4, 4);
  auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
  auto ya = fast(xa, positions), yb = slow(xb, positions);
  EXPECT_LT(max_abs_diff(ya, yb), 5e-5);
  auto probe = torch::randn_like(ya);
  ya.backward(probe);
  yb.backward(probe);
  EXPECT_LT(max_abs_diff(xa.grad(), xb.grad()), 5e-5);
  auto pa = fast->parameters(), pb = slow->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i)
    EXPECT_LT(max_abs_diff(pa[i].grad(), pb[i].grad()), 1e-4) << "parameter " << i;
}

// A NaN in q, k or v (or an inf in q: inf - inf in the row's softmax) gives the NaNs of
// attention_reference and its autograd, at N = 1, 8, 17, 64 and head dims 8 and 36 (in place and
// through padded scratch), causal or not; the rows without one are unchanged.
TEST(AttentionShort, NonFiniteInputsGiveTheReferencesNans) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int64_t b = 2, h = 2;
  for (int64_t n : {1, 8, 17, 64}) {
    for (int64_t d : {8, 36}) {
      for (bool causal : {false, true}) {
        for (int where = 0; where < 4; ++where) {  // q NaN, k NaN, v NaN, q inf
          torch::manual_seed(n * 100 + d);
          auto q = torch::randn({b, n, h, d}), k = torch::randn({b, n, h, d});
          auto v = torch::randn({b, n, h, d});
          const int64_t i = n - 1, j = n / 2;  // the last row sees key j
          if (where == 0) q[1][i][1][3] = kNan;
          if (where == 1) k[1][j][1][3] = kNan;
          if (where == 2) {
            if (causal) continue;  // a masked key's v: never read vs 0 * NaN
            v[1][j][1][3] = kNan;
          }
          if (where == 3) {
            // one key with a -inf score is a row without keys for the reference (0), a softmax
            // of one -inf for this kernel (NaN, as SDPA's math): not compared
            if (n == 1) continue;
            q[1][i][1][3] = kInf;
          }
          for (auto* t : {&q, &k, &v}) t->requires_grad_(true);
          const std::string what = "n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                   " causal=" + std::to_string(causal) +
                                   " case=" + std::to_string(where);
          const double scale = 0.25;
          AttentionMasks masks;
          masks.causal = causal;
          auto fast = attention_short(q, k, v, scale, AttentionRotary{}, causal);
          auto reference = attention_reference(q, k, v, {}, masks, scale);
          auto nan_fast = torch::isnan(fast), nan_reference = torch::isnan(reference);
          EXPECT_TRUE(torch::equal(nan_fast, nan_reference)) << what;
          auto finite = ~(nan_fast | nan_reference);
          EXPECT_LT(max_abs_diff(fast.masked_select(finite), reference.masked_select(finite)),
                    kForwardTolerance)
              << what;
          if (where == 3) continue;  // inf's gradients: -inf scores are not masks (see the fused)
          auto probe = torch::randn_like(reference);
          auto gf = torch::autograd::grad({(fast * probe).sum()}, {q, k, v});
          auto gr = torch::autograd::grad({(reference * probe).sum()}, {q, k, v});
          for (size_t g = 0; g < gf.size(); ++g) {
            // a masked NaN key enters the reference's dq as 0 * NaN; the plain loops never read
            // it, the vector form's padded products do: either is the masked key's 0 weight
            if (where == 1 && causal && g == 0) continue;
            EXPECT_TRUE(torch::equal(torch::isnan(gf[g]), torch::isnan(gr[g])))
                << what << " gradient " << g;
          }
        }
      }
    }
  }
}

// Inputs changed in place after a forward that kept P (N 16, D 32) or the log-sum-exp (N 36):
// autograd's version error, not gradients of the new values (a guard, from the hostile review);
// q, k, v of other layouts (k expanded over the batch, v a permuted tensor) equal the reference
// on both ways the kernel reads rows (in place at N 16, padded scratch at N 17).
TEST(AttentionShort, InPlaceChangesAreVersionErrorsAndStridesTheReference) {
  for (const int64_t n : {16, 36}) {
    auto qkv = torch::randn({2, n, 3, 2, 32}, torch::requires_grad());
    for (int changed = 0; changed < 4; ++changed) {
      auto q = qkv.select(2, 0) * 1, k = qkv.select(2, 1) * 1, v = qkv.select(2, 2) * 1;
      auto packed = qkv * 1;
      const auto out = changed < 3 ? attention_short(q, k, v, 0.2, {}, false)
                                   : attention_short_packed(packed, 0.2, {}, false);
      (changed == 0 ? q : changed == 1 ? k : changed == 2 ? v : packed).add_(1);
      EXPECT_THROW(out.sum().backward(), c10::Error) << n << " " << changed;
    }
  }
  for (const int64_t n : {16, 17}) {
    torch::manual_seed(n);
    const auto q0 = torch::randn({3, n, 2, 32}), k0 = torch::randn({1, n, 2, 32}),
               v0 = torch::randn({3, 2, n, 32}), probe = torch::randn({3, n, 2, 32});
    std::vector<std::vector<at::Tensor>> runs;
    for (const bool fast : {true, false}) {
      auto q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
           v = v0.clone().requires_grad_(true);
      const auto ke = k.expand({3, n, 2, 32}), vp = v.permute({0, 2, 1, 3});
      AttentionMasks masks;
      masks.causal = true;
      const auto out = fast ? attention_short(q, ke, vp, 0.3, {}, true)
                            : attention_reference(q, ke, vp, {}, masks, 0.3);
      out.backward(probe);
      runs.push_back({out.detach(), q.grad(), k.grad(), v.grad()});
    }
    EXPECT_LT(max_abs_diff(runs[0][0], runs[1][0]), kForwardTolerance) << n;
    for (size_t i = 1; i < 4; ++i) {
      const double largest = runs[1][i].abs().max().item<double>();
      EXPECT_LT(max_abs_diff(runs[0][i], runs[1][i]), kGradientTolerance * std::max(1.0, largest))
          << n << " " << i;
    }
  }
}

}  // namespace
}  // namespace posenc
