// Multi-axis positions and encoders: grid/volume builders, axial sin-cos (hand-derived here;
// timm/MAE fixtures in test_multiaxis_reference), sectioned RoPE (M-RoPE, axial) and its config.
#include <gtest/gtest.h>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::error_of;
using test::max_abs_diff;

TEST(MultiAxisPositions, GridAndVolumeAreRowMajor) {
  auto g = Positions::grid(2, 3);
  EXPECT_EQ(g.axes(), (std::vector<std::string>{"h", "w"}));
  EXPECT_TRUE(torch::equal(
      g.coords(), torch::tensor({{0., 0.}, {0., 1.}, {0., 2.}, {1., 0.}, {1., 1.}, {1., 2.}},
                                torch::kFloat64)));
  auto v = Positions::volume(2, 1, 2);
  EXPECT_EQ(v.axes(), (std::vector<std::string>{"t", "h", "w"}));
  EXPECT_TRUE(torch::equal(
      v.coords(),
      torch::tensor({{0., 0., 0.}, {0., 0., 1.}, {1., 0., 0.}, {1., 0., 1.}}, torch::kFloat64)));
  EXPECT_NE(error_of([] { Positions::grid(0, 3); }).find("must be positive, got 0 x 3"),
            std::string::npos);
}

TEST(AxialSincos, HandDerivedBothLayouts) {
  // dim 8, 2 axes: F = 2 frequencies per axis, omega = (1, 100^-1) for temperature 10000.
  auto coords = torch::tensor({{2.0, 3.0}}, torch::kFloat64);  // h = 2, w = 3
  const double w0 = 1.0, w1 = 0.01;
  auto timm = axial_sincos_table(coords, 8, 10000, AxialSincosLayout::kTimm)[0];
  std::vector<double> expected_timm{std::sin(2 * w0), std::sin(2 * w1), std::sin(3 * w0),
                                    std::sin(3 * w1), std::cos(2 * w0), std::cos(2 * w1),
                                    std::cos(3 * w0), std::cos(3 * w1)};
  auto mae = axial_sincos_table(coords, 8, 10000, AxialSincosLayout::kMae)[0];
  std::vector<double> expected_mae{std::sin(3 * w0), std::sin(3 * w1), std::cos(3 * w0),
                                   std::cos(3 * w1), std::sin(2 * w0), std::sin(2 * w1),
                                   std::cos(2 * w0), std::cos(2 * w1)};
  for (int i = 0; i < 8; ++i) {
    EXPECT_NEAR(timm[i].item<double>(), expected_timm[i], 1e-12) << i;
    EXPECT_NEAR(mae[i].item<double>(), expected_mae[i], 1e-12) << i;
  }
  AxialSincos encoder(AxialSincosOptions(12).num_axes(3));
  EXPECT_EQ(encoder->table(Positions::volume(2, 2, 2)).sizes(), torch::IntArrayRef({8, 12}));
  EXPECT_NE(error_of([] {
              AxialSincos(AxialSincosOptions(10));
            }).find("dim must be divisible by 2 * num_axes = 4, got 10"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              encoder->table(Positions::grid(2, 2));
            }).find("axial_sincos: expected positions with 3 axes, got 2 (h, w)"),
            std::string::npos);
}

TEST(SectionedRope, TextTokensMakeMropeEqualTo1dRope) {
  // M-RoPE (Qwen2-VL): a text token has the same index on t, h and w, so with the global
  // frequency ladder its rotation is exactly 1D RoPE.
  torch::manual_seed(31);
  Rope mrope(RopeOptions(16).sections(RopeSectionMap().sections({2, 3, 3})));
  Rope plain(RopeOptions(16));
  auto q = torch::randn({1, 5, 2, 16});
  auto p1 = Positions::sequence(5, 3);
  Positions p3(p1.coords().repeat({1, 3}), {"t", "h", "w"});
  auto a = mrope->rotate(q, q, p3, p3).first;
  auto b = plain->rotate(q, q, p1, p1).first;
  EXPECT_LT(max_abs_diff(a, b), 1e-6);
  // interleaved sections too
  Rope imrope(RopeOptions(16).sections(
      RopeSectionMap().sections({2, 3, 3}).layout(RopeSectionLayout::kInterleaved)));
  EXPECT_LT(max_abs_diff(imrope->rotate(q, q, p3, p3).first, b), 1e-6);
}

TEST(SectionedRope, AxialScoresDependOnlyOnOffsetsPerAxis) {
  torch::manual_seed(32);
  Rope axial(RopeOptions(16)
                 .sections(RopeSectionMap().sections({4, 4}))
                 .frequencies(RopeFrequencyOptions::per_axis_ladders()));
  auto q = torch::randn({1, 1, 1, 16}, torch::kFloat64),
       k = torch::randn({1, 1, 1, 16}, torch::kFloat64);
  auto score = [&](double h1, double w1, double h2, double w2) {
    Positions a(torch::tensor({{h1, w1}}, torch::kFloat64), {"h", "w"});
    Positions b(torch::tensor({{h2, w2}}, torch::kFloat64), {"h", "w"});
    auto [rq, rk] = axial->rotate(q, k, a, b);
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(1, 2, 3, 5), score(11, 7, 13, 10), 1e-5);
  EXPECT_GT(std::abs(score(1, 2, 3, 5) - score(1, 2, 5, 3)), 1e-4);  // axes are not symmetric
  // per-axis ladders restart: inv_freq = [1, 0.1, 0.01, 0.001] twice for sections of 4 pairs
  auto inv = axial->frequencies().inv_freq;
  EXPECT_NEAR(inv[4].item<double>(), 1.0, 1e-12);
  EXPECT_NEAR(inv[5].item<double>(), inv[1].item<double>(), 1e-15);
}

TEST(SectionedRope, ConfigAndErrors) {
  // Qwen2-VL's config block, as it is
  auto qwen = build_encoder(parse_config(R"({"type": "rope", "head_dim": 128, "rope_theta": 1e6,
      "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})"),
                            {});
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*qwen).options.sections().sections(),
            (std::vector<int64_t>{16, 24, 24}));
  // Qwen3-VL: interleaved
  auto qwen3 = build_encoder(parse_config(R"({"type": "rope", "head_dim": 128, "rope_theta": 5e6,
      "rope_scaling": {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}})"),
                             {});
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*qwen3).options.sections().layout(),
            RopeSectionLayout::kInterleaved);
  EXPECT_NE(error_of([] {
              Rope(RopeOptions(16).sections(RopeSectionMap().sections({2, 2, 2})));
            }).find("mrope_section sums to 6 pairs but the rotary dimension has r/2 = 8"),
            std::string::npos);
  Rope mrope(RopeOptions(16).sections(RopeSectionMap().sections({2, 3, 3})));
  auto q = torch::zeros({1, 4, 1, 16});
  EXPECT_NE(error_of([&] {
              mrope->rotate(q, q, Positions::grid(2, 2), Positions::grid(2, 2));
            }).find("rope: expected positions with 3 axes, got 2 (h, w)"),
            std::string::npos);
}

TEST(RopeMixed, InitFollowsTheReferenceAndScoresAreRelative) {
  torch::manual_seed(51);
  RopeMixed mixed(RopeMixedOptions(8, 2));
  ASSERT_EQ(mixed->freqs.sizes(), torch::IntArrayRef({2, 2, 4}));
  // magnitudes 10^(-4i/8) for i < 2, a unit direction per head, then the orthogonal one
  auto f = mixed->freqs.to(torch::kFloat64);
  auto norms = (f[0].pow(2) + f[1].pow(2)).sqrt();  // [H, F]
  EXPECT_NEAR(norms[0][0].item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(norms[1][1].item<double>(), std::pow(10.0, -0.5), 1e-6);
  EXPECT_NEAR(norms[0][2].item<double>(), 1.0, 1e-6);
  EXPECT_NEAR((f[0][0][0] * f[0][0][2] + f[1][0][0] * f[1][0][2]).item<double>(), 0.0, 1e-6);
  mixed->to(torch::kFloat64);
  auto q = torch::randn({1, 1, 2, 8}, torch::kFloat64),
       k = torch::randn({1, 1, 2, 8}, torch::kFloat64);
  auto score = [&](double h1, double w1, double h2, double w2) {
    Positions a(torch::tensor({{h1, w1}}, torch::kFloat64), {"h", "w"});
    Positions b(torch::tensor({{h2, w2}}, torch::kFloat64), {"h", "w"});
    auto [rq, rk] = mixed->rotate(q, k, a, b);
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(1, 2, 3, 5), score(4, 6, 6, 9), 1e-9);  // same (dh, dw) offset
  // gradients reach the learned frequencies (float64 finite differences)
  auto p = Positions::grid(2, 2);
  auto x = torch::randn({1, 4, 2, 8}, torch::kFloat64);
  auto probe = torch::randn({1, 4, 2, 8}, torch::kFloat64);
  test::expect_gradient_matches_finite_differences(
      mixed->freqs, [&] { return (mixed->rotate(x, x, p, p).first * probe).sum(); });
}

TEST(Relative2d, SwinIndexTranslationInvarianceResizeAndErrors) {
  torch::manual_seed(52);
  Relative2d rel(Relative2dOptions(2, 3, 4).init_std(1.0));
  auto p = Positions::grid(3, 4);
  auto bias = rel->bias(p, p, {});
  ASSERT_EQ(bias.sizes(), torch::IntArrayRef({2, 12, 12}));
  // Swin's index: (dh + Gh - 1) * (2 Gw - 1) + (dw + Gw - 1), dh = h_q - h_k
  for (int64_t i = 0; i < 12; ++i)
    for (int64_t j = 0; j < 12; ++j) {
      const int64_t dh = i / 4 - j / 4, dw = i % 4 - j % 4;
      const int64_t index = (dh + 2) * 7 + (dw + 3);
      EXPECT_EQ(bias[1][i][j].item<float>(), rel->weight[index][1].item<float>());
    }
  // same offset, same bias: patches (0,0)->(1,2) and (1,1)->(2,3)
  EXPECT_EQ(bias[0][0][6].item<float>(), bias[0][5][11].item<float>());
  auto message =
      test::error_of([&] { rel->bias(Positions::grid(4, 4), Positions::grid(4, 4), {}); });
  EXPECT_NE(message.find("offsets reach (3, 3) but the table covers a 3x4 window"),
            std::string::npos)
      << message;
  rel->resize(4, 4);
  EXPECT_EQ(rel->weight.sizes(), torch::IntArrayRef({49, 2}));
  EXPECT_EQ(rel->bias(Positions::grid(4, 4), Positions::grid(4, 4), {}).sizes(),
            torch::IntArrayRef({2, 16, 16}));
  // the attention layer takes it through the materialized path
  SelfAttention attention(AttentionOptions(8, 2), as_encoding(rel));
  EXPECT_EQ(attention->forward(torch::randn({1, 16, 8}), Positions::grid(4, 4)).sizes(),
            torch::IntArrayRef({1, 16, 8}));
}

TEST(LearnedSpacetime, SpatialPlusTemporalAndErrors) {
  LearnedSpacetime st(LearnedSpacetimeOptions(3, 2, 2, 4).init_std(1.0));
  auto p = Positions::volume(3, 2, 2);
  auto table = st->lookup(p);
  // token 7 = (t 1, h 1, w 1)
  EXPECT_TRUE(torch::allclose(table[7], st->spatial[3] + st->temporal[1]));
  // frames differ only by the temporal row: the time axis is what tells frames apart
  EXPECT_TRUE(torch::allclose(table[4] - table[0], st->temporal[1] - st->temporal[0]));
  auto message = test::error_of([&] { st->lookup(Positions::volume(4, 2, 2)); });
  EXPECT_NE(message.find("frame 3 is past the temporal table (frames=3)"), std::string::npos)
      << message;
}

}  // namespace
}  // namespace posenc
