// Encoder behaviour beyond the fixtures: the relative property of RoPE, layouts as permutations,
// dtypes, batched positions, biases against hand-written loops, and bad input.
#include <gtest/gtest.h>

#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::error_of;
using test::max_abs_diff;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- RoPE ---------------------------------------------------------------------------------

struct RopeCase {
  RopeLayout layout;
  double partial;
};

class RopeProperties : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeProperties, ScoresDependOnlyOnOffset) {
  // <R(m) q, R(n) k> = <R(m+s) q, R(n+s) k> for every shift s (Su et al. 2021, eq. 16).
  torch::manual_seed(0);
  Rope rope(RopeOptions(32).layout(GetParam().layout).partial_rotary_factor(GetParam().partial));
  auto q = torch::randn({1, 1, 2, 32}, torch::kFloat64);
  auto k = torch::randn({1, 1, 2, 32}, torch::kFloat64);
  auto score = [&](double m, double n) {
    auto [rq, rk] = rope->rotate(q, k, Positions::values({m}), Positions::values({n}));
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(3, 10), score(103, 110), 1e-5);
  EXPECT_NEAR(score(7, 2), score(1007, 1002), 1e-5);
  EXPECT_GT(std::abs(score(3, 10) - score(3, 11)), 1e-4);
}

TEST_P(RopeProperties, PassThroughDimsUnchangedAndNormKept) {
  torch::manual_seed(1);
  const int64_t dh = 32;
  Rope rope(RopeOptions(dh).layout(GetParam().layout).partial_rotary_factor(GetParam().partial));
  auto x = torch::randn({2, 5, 3, dh});
  auto [q, k] = rope->rotate(x, x, Positions::sequence(5, 7), Positions::sequence(5, 7));
  const int64_t r = rope->rotary_dim();
  EXPECT_TRUE(torch::equal(q.narrow(-1, r, dh - r), x.narrow(-1, r, dh - r)));
  EXPECT_LT(max_abs_diff(q.norm(2, -1), x.norm(2, -1)), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RopeProperties,
                         ::testing::Values(RopeCase{RopeLayout::kHalf, 1.0},
                                           RopeCase{RopeLayout::kInterleaved, 1.0},
                                           RopeCase{RopeLayout::kHalf, 0.5},
                                           RopeCase{RopeLayout::kInterleaved, 0.25}));

TEST(Rope, HalfAndInterleavedDifferByAPermutation) {
  // Interleaved on x equals half on x permuted so that pair (2i, 2i+1) lands on (i, i + r/2).
  torch::manual_seed(2);
  const int64_t dh = 16;
  auto x = torch::randn({1, 4, 2, dh});
  auto perm = torch::cat({torch::arange(0, dh, 2), torch::arange(1, dh, 2)});
  auto p = Positions::sequence(4, 5);
  Rope half(RopeOptions(dh).layout(RopeLayout::kHalf));
  Rope inter(RopeOptions(dh).layout(RopeLayout::kInterleaved));
  auto a = inter->rotate(x, x, p, p).first.index_select(-1, perm);
  auto b = half->rotate(x.index_select(-1, perm), x, p, p).first;
  EXPECT_LT(max_abs_diff(a, b), 1e-6);
}

TEST(Rope, ReducedPrecisionInputsUseFloat32Angles) {
  torch::manual_seed(3);
  Rope rope(RopeOptions(64));
  auto x = torch::randn({1, 8, 2, 64});
  auto p = Positions::sequence(8, 15960);  // bf16 cannot even hold these positions
  auto reference = rope->rotate(x, x, p, p).first;
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    auto out = rope->rotate(x.to(dtype), x.to(dtype), p, p).first;
    EXPECT_EQ(out.scalar_type(), dtype);
    const double tolerance = dtype == torch::kBFloat16 ? 0.05 : 0.01;  // storage rounding only
    EXPECT_LT(max_abs_diff(out, reference), tolerance) << c10::toString(dtype);
  }
}

TEST(Rope, PositionsBeyond2To24StayDistinct) {
  // float32 cannot tell 2^24 from 2^24 + 1; float64 positions can, so the angles differ.
  Rope rope(RopeOptions(8));
  const double big = 16777216.0;
  auto d = rope->describe(Positions::values({big, big + 1}), {});
  auto cos = d[2].second;
  EXPECT_GT(max_abs_diff(cos[0], cos[1]), 1e-3);
}

TEST(Rope, BatchedPositions) {
  torch::manual_seed(4);
  Rope rope(RopeOptions(16));
  auto x = torch::randn({2, 3, 1, 16});
  Positions batched(
      torch::tensor({0.0, 1.0, 2.0, 10.0, 11.0, 12.0}, torch::kFloat64).view({2, 3, 1}), {"t"});
  auto out = rope->rotate(x, x, batched, batched).first;
  auto second = rope->rotate(x.slice(0, 1, 2), x.slice(0, 1, 2), Positions::sequence(3, 10),
                             Positions::sequence(3, 10))
                    .first;
  EXPECT_LT(max_abs_diff(out.slice(0, 1, 2), second), 1e-6);
}

TEST(Rope, XposKeepsRelativeProperty) {
  torch::manual_seed(5);
  Rope rope(RopeOptions(16).xpos(true).xpos_scale_base(64));
  auto q = torch::randn({1, 1, 1, 16}, torch::kFloat64);
  auto k = torch::randn({1, 1, 1, 16}, torch::kFloat64);
  auto score = [&](double m, double n) {
    auto [rq, rk] = rope->rotate(q, k, Positions::values({m}), Positions::values({n}));
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(5, 2), score(55, 52), 1e-5);
  // and the scale decays with distance: zeta < 1 for all pairs
  auto d = rope->describe(Positions::values({0, 64}), {});
  EXPECT_EQ(d.back().first, "xpos_scale");
  EXPECT_TRUE((d.back().second[1] < 1).all().item<bool>());
}

TEST(Rope, BadInputNamesExpectedAndActual) {
  EXPECT_TRUE(contains(error_of([] { Rope(RopeOptions(97)); }),
                       "must be even and >= 2, got 97 (head_dim=97"));
  EXPECT_TRUE(contains(error_of([] { Rope(RopeOptions(64).partial_rotary_factor(0.3)); }),
                       "got 19 (head_dim=64, partial_rotary_factor=0.3)"));
  EXPECT_TRUE(contains(error_of([] {
                         Rope(RopeOptions(64).frequencies(RopeFrequencyOptions::ladder(
                             10000, RopeScalingOptions().rope_type(RopeScaling::kLinear))));
                       }),
                       "rope_type 'linear' needs a 'factor'"));
  EXPECT_TRUE(contains(
      error_of([] {
        Rope(RopeOptions(64).frequencies(RopeFrequencyOptions::ladder(
            10000, RopeScalingOptions().rope_type(RopeScaling::kLongRope).short_factor({1.0}))));
      }),
      "short_factor must have r/2 = 32 values, got 1"));
  Rope rope(RopeOptions(64));
  auto q = torch::zeros({1, 4, 2, 32});
  EXPECT_TRUE(contains(
      error_of([&] { rope->rotate(q, q, Positions::sequence(4), Positions::sequence(4)); }),
      "q has head_dim 32 but the encoder was built for head_dim=64"));
  auto q64 = torch::zeros({1, 4, 2, 64});
  EXPECT_TRUE(contains(
      error_of([&] { rope->rotate(q64, q64, Positions::sequence(5), Positions::sequence(4)); }),
      "q has N=4 tokens but 5 positions were given"));
  Positions grid(torch::zeros({4, 2}, torch::kFloat64), {"h", "w"});
  EXPECT_TRUE(contains(error_of([&] { rope->rotate(q64, q64, grid, grid); }),
                       "rope: expected positions with 1 axis, got 2 (h, w)"));
}

// ---- additive -----------------------------------------------------------------------------

TEST(Learned, PastTheEndIsAnError) {
  Learned learned(LearnedOptions(8, 4));
  auto x = torch::zeros({1, 3, 4});
  EXPECT_TRUE(contains(error_of([&] {
                         learned->add(x, Positions::values({0, 5, 8}));
                       }),
                       "position 8 is past the end of the table (max_positions=8"));
  EXPECT_TRUE(contains(error_of([&] {
                         learned->add(x, Positions::values({0, 1.5, 2}));
                       }),
                       "positions must be integers"));
  EXPECT_TRUE(contains(error_of([&] {
                         learned->add(torch::zeros({1, 3, 5}), Positions::sequence(3));
                       }),
                       "x has width 5 but the encoder has dim=4"));
  auto out = learned->add(x, Positions::values({0, 5, 7}));
  EXPECT_TRUE(torch::equal(out[0][1], learned->weight[5]));
}

TEST(Sinusoidal, OddDimAndShapeErrors) {
  EXPECT_TRUE(contains(error_of([] { Sinusoidal(SinusoidalOptions(7)); }),
                       "dim must be positive and even, got 7"));
  Sinusoidal s(SinusoidalOptions(8));
  EXPECT_TRUE(contains(error_of([&] {
                         s->add(torch::zeros({2, 3, 8}), Positions::sequence(4));
                       }),
                       "x has 3 tokens but 4 positions were given"));
}

// ---- biases -------------------------------------------------------------------------------

TEST(Alibi, BiasIsMinusSlopeTimesDistance) {
  Alibi causal(AlibiOptions(3));
  Alibi symmetric(AlibiOptions(3).form(AlibiForm::kSymmetric));
  auto p = Positions::values({0, 1, 2.5, 4});  // real-valued gaps are used as they are
  auto b = causal->bias(p, p, {});
  auto s = symmetric->bias(p, p, {});
  ASSERT_EQ(b.sizes(), torch::IntArrayRef({3, 4, 4}));
  auto slopes = alibi_slopes(3);  // 2^-4, 2^-8, then 2^-2 from the 4-head list (Press)
  std::vector<double> pos{0, 1, 2.5, 4};
  for (int h = 0; h < 3; ++h)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        EXPECT_NEAR(b[h][i][j].item<double>(), -slopes[h] * (pos[i] - pos[j]), 1e-6);
        EXPECT_NEAR(s[h][i][j].item<double>(), -slopes[h] * std::abs(pos[i] - pos[j]), 1e-6);
      }
  EXPECT_EQ(causal->bias_spec().form, BiasForm::kAlibi);
  EXPECT_FALSE(causal->bias_spec().symmetric);
  EXPECT_TRUE(symmetric->bias_spec().symmetric);
}

TEST(T5, BiasLooksUpTheBucketTable) {
  T5 t5(T5Options(2).num_buckets(8).max_distance(20));
  auto p = Positions::sequence(6);
  auto bias = t5->bias(p, p, {});
  auto buckets = t5->buckets(p, p);
  ASSERT_EQ(bias.sizes(), torch::IntArrayRef({2, 6, 6}));
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j)
        EXPECT_EQ(bias[h][i][j].item<float>(),
                  t5->weight[buckets[i][j].item<int64_t>()][h].item<float>());
  // key after query lands in the upper half (bidirectional), as HF
  EXPECT_GE(buckets[0][1].item<int64_t>(), 4);
  EXPECT_LT(buckets[1][0].item<int64_t>(), 4);
  EXPECT_EQ(t5->bias_spec().form, BiasForm::kBucketTable);
  EXPECT_TRUE(contains(error_of([] { T5(T5Options(2).num_buckets(32).max_distance(4)); }),
                       "max_distance must exceed 8"));
}

TEST(Shaw, BiasMatchesAnExplicitLoop) {
  torch::manual_seed(6);
  Shaw shaw(ShawOptions(4).max_relative_position(2).init_std(1.0));
  auto q = torch::randn({2, 5, 3, 4});
  auto p = Positions::sequence(5);
  auto bias = shaw->bias(p, p, q);
  ASSERT_EQ(bias.sizes(), torch::IntArrayRef({2, 3, 5, 5}));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 3; ++h)
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) {
          const int64_t index = std::clamp(j - i, -2, 2) + 2;
          const double expected = (q[b][i][h] * shaw->weight[index]).sum().item<double>() / 2.0;
          EXPECT_NEAR(bias[b][h][i][j].item<double>(), expected, 1e-5);
        }
  EXPECT_TRUE(contains(error_of([&] { shaw->bias(p, p, {}); }), "q [B, Nq, H, Dh] is required"));
}

TEST(Nope, AllEntriesAreIdentities) {
  Nope nope;
  auto x = torch::randn({1, 3, 4});
  auto p = Positions::sequence(3);
  EXPECT_TRUE(torch::equal(nope->add(x, p), x));
  EXPECT_FALSE(nope->bias(p, p, {}).defined());
  EXPECT_TRUE(nope->plan(p).parts().empty());
}

// Issue #14 item 13: positions +-1e300 apart biased by +-inf (printed as null) before.
TEST(Alibi, SpanBeyondFloat32IsAnError) {
  Alibi alibi(AlibiOptions(2));
  auto p = Positions::values({-1e300, 1e300});
  EXPECT_TRUE(contains(error_of([&] { alibi->bias(p, p); }), "beyond the float32 logits' range"));
  EXPECT_NO_THROW(alibi->bias(Positions::values({0, 1e9}), Positions::values({0, 1e9})));
}

}  // namespace
}  // namespace posenc
