// The time-series foundation models' position recipes as posenc parts (issue: sensor series as
// the field's models encode them), each against values derived by hand here:
//   TimesFM 2.5   patch positions arange(N) - num_padded (left padding shifts them)
//   Moirai-2      binary variate bias table[same variate, h]; packed samples (block-diagonal
//                 attention by sample id, positions restarting per sample); RoPE on part of
//                 each head (partial_rotary_factor 0.5)
//   Toto          interleaved RoPE with xPos (the paper's per-pair scale; Toto's own layout of
//                 the scales is not claimed, see docs/library.md)
//   Chronos-2     unscaled attention (scale 1.0)
// and the bad inputs: ids not integers, sample ids not contiguous runs, a variate id out of
// range, time going backwards inside a sample, each one line naming the tensor and index.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "posenc/config/registry.h"
#include "posenc/core/ids.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"
#include "timeseries/packing.h"

namespace posenc {
namespace {

using nlohmann::json;
using test::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// float32 attention through different summation orders: rounding only.
constexpr double kAttentionTolerance = 1e-5;

TEST(TimeseriesRecipes, LeftPaddedPatchPositions) {
  // TimesFM 2.5: position_ids = arange(4) - num_padded; two padded patches start at -2
  auto p = timeseries::left_padded_positions(torch::tensor({0, 2}, torch::kLong), 4);
  auto want =
      torch::tensor({0.0, 1.0, 2.0, 3.0, -2.0, -1.0, 0.0, 1.0}, torch::kFloat64).view({2, 4});
  EXPECT_TRUE(torch::equal(p, want));
  EXPECT_TRUE(contains(error_of([] {
                         timeseries::left_padded_positions(torch::tensor({0, 5}, torch::kLong), 4);
                       }),
                       "num_padded: id 5 at index [1] is outside [0, 5)"));
  EXPECT_TRUE(contains(error_of([] { timeseries::left_padded_positions(torch::tensor({0.5}), 4); }),
                       "num_padded: 0.5 at index [0] is not an integer"));
}

TEST(TimeseriesRecipes, IdsAreChecked) {
  auto variates = torch::tensor({0.0, 1.0, 1.0, 2.5, 1.0, 0.0}).view({2, 3});
  EXPECT_TRUE(contains(error_of([&] { checked_ids(variates, "variate_ids"); }),
                       "variate_ids: 2.5 at index [1, 0] is not an integer"));
  EXPECT_TRUE(contains(error_of([] {
                         checked_ids(torch::tensor({0, 1, 3}), "variate_ids", 3);
                       }),
                       "variate_ids: id 3 at index [2] is outside [0, 3)"));
  EXPECT_TRUE(contains(error_of([] {
                         checked_ids(torch::tensor({0, -1}), "variate_ids");
                       }),
                       "variate_ids: id -1 at index [1] is outside [0, inf)"));
  // 0 0 1 1 0: sample 0 resumes at index 4
  EXPECT_TRUE(
      contains(error_of([] {
                 checked_sample_ids(torch::tensor({0, 0, 1, 1, 0}).view({1, 5}));
               }),
               "sample_ids: sample 0 is not one contiguous run (it resumes at index [0, 4])"));
  EXPECT_TRUE(torch::equal(checked_sample_ids(torch::tensor({3.0, 3.0, 1.0})),
                           torch::tensor({3, 3, 1}, torch::kLong)));
  // time per (sample, variate): variate 1 of sample 0 goes 5 -> 4 at index 3; variate 0 restarting
  // at index 2 is fine (another series)
  auto times = torch::tensor({0.0, 1.0, 5.0, 4.0, 0.0});
  auto samples = torch::tensor({0, 0, 0, 0, 1});
  auto vars = torch::tensor({0, 0, 1, 1, 0});
  EXPECT_TRUE(
      contains(error_of([&] { check_times_per_sample(times, samples, vars, "times"); }),
               "times: time goes backwards at index [3] (4 after 5 in sample 0, variate 1)"));
  times[3] = 6.0;
  EXPECT_NO_THROW(check_times_per_sample(times, samples, vars, "times"));
  // the plan checks the request's sample ids
  PlanRequest request(Positions::sequence(3));
  request.sample_ids = torch::tensor({0, 1, 0});
  EXPECT_TRUE(contains(error_of([&] { EncodingPlan plan(request); }),
                       "sample_ids: sample 0 is not one contiguous run (it resumes at index [2])"));
}

TEST(TimeseriesRecipes, VariateBiasTableByHand) {
  VariateBias bias(VariateBiasOptions(2).num_variates(3));
  {
    torch::NoGradGuard no_grad;
    // row 0 (other variate) = (-1, -2), row 1 (same variate) = (3, 4)
    bias->table.copy_(torch::tensor({-1.0f, -2.0f, 3.0f, 4.0f}).view({2, 2}));
  }
  auto positions =
      Positions(torch::tensor({0.0, 0.0, 1.0, 0.0, 2.0, 1.0}).view({3, 2}), {"time", "variate"});
  // ids 0 0 1: head 0 [[3 3 -1] [3 3 -1] [-1 -1 3]], head 1 the same with 4 and -2
  auto want = torch::tensor({3.0f, 3.0f, -1.0f, 3.0f, 3.0f, -1.0f, -1.0f, -1.0f, 3.0f,  //
                             4.0f, 4.0f, -2.0f, 4.0f, 4.0f, -2.0f, -2.0f, -2.0f, 4.0f})
                  .view({2, 3, 3});
  EXPECT_TRUE(torch::equal(bias->bias_at(positions, positions), want));
  auto plan = bias->plan(positions);
  ASSERT_TRUE(plan.has_variate_bias());
  EXPECT_TRUE(torch::equal(plan.materialize_bias(2), want));
  // gradient: d sum(bias * w) / d table[s, h] = sum of w over the pairs of kind s in head h
  auto w = torch::arange(18, torch::kFloat32).view({2, 3, 3});
  (plan.materialize_bias(2) * w).sum().backward();
  // same pairs (0,0) (0,1) (1,0) (1,1) (2,2) -> 0+1+3+4+8 = 16; other: 2+5+6+7 = 20; head 1 +9 each
  auto grad = torch::tensor({20.0f, 20.0f + 36.0f, 16.0f, 16.0f + 45.0f}).view({2, 2});
  EXPECT_TRUE(torch::equal(bias->table.grad(), grad));
  // a variate id outside num_variates, or not an integer: one line naming the axis and the index
  auto bad = Positions(torch::tensor({0.0, 0.0, 1.0, 3.0}).view({2, 2}), {"time", "variate"});
  EXPECT_TRUE(
      contains(error_of([&] { bias->plan(bad); }),
               "variate_bias: positions axis 'variate': id 3 at index [1] is outside [0, 3)"));
  auto fraction = Positions(torch::tensor({0.0, 0.5}).view({1, 2}), {"time", "variate"});
  EXPECT_TRUE(
      contains(error_of([&] { bias->plan(fraction); }),
               "variate_bias: positions axis 'variate': 0.5 at index [0] is not an integer"));
}

// Attention over packed samples equals attention over each sample alone (the block-diagonal mask
// is exactly "separate sequences"), forward and backward; with RoPE on the time axis restarting
// per sample and the variate bias.
TEST(TimeseriesRecipes, PackedSamplesEqualSeparateSequences) {
  torch::manual_seed(0);
  const int64_t heads = 2, dh = 8;
  auto encoder = build_encoder(json::parse(R"({"type": "compose", "encoders": [
      {"type": "rope", "axes": ["time"], "partial_rotary_factor": 0.5},
      {"type": "variate_bias", "init_std": 1.0}]})"),
                               {heads * dh, heads, 0});
  // two samples: 3 tokens (variates 0 0 1, times 0 1 0) and 2 tokens (variate 0, times 0 1)
  auto time = torch::tensor({0.0, 1.0, 0.0, 0.0, 1.0});
  auto variate = torch::tensor({0.0, 0.0, 1.0, 0.0, 0.0});
  auto positions = Positions(torch::stack({time, variate}, -1).unsqueeze(0), {"time", "variate"});
  auto q = torch::randn({1, 5, heads, dh}, torch::requires_grad());
  auto k = torch::randn({1, 5, heads, dh}, torch::requires_grad());
  auto v = torch::randn({1, 5, heads, dh}, torch::requires_grad());
  PlanRequest request(positions);
  request.sample_ids = torch::tensor({0, 0, 0, 1, 1}).view({1, 5});
  auto plan = encoder->plan(request);
  ASSERT_TRUE(plan.has_sample_mask() && plan.has_variate_bias() && plan.has_rotary());
  AttentionRoute route;
  auto packed = plan_attention(plan, q, k, v, false, {}, 1.0 / std::sqrt(8.0), &route);
  // the fused kernel reads the sample and variate ids (O(N)); the materialized path is its oracle
  EXPECT_EQ(route.backend, AttentionBackend::kFused) << describe(route);
  {  // the oracle: rotated q, k; logits + the materialized variate bias; -inf across samples
    auto [qr, kr] = plan.apply_rotary(q, k);
    auto logits =
        torch::einsum("bqhd,bkhd->bhqk", {qr, kr}) / std::sqrt(8.0) + plan.materialize_bias(heads);
    auto ids = request.sample_ids.view({1, 1, 5, 1});
    logits = logits.masked_fill(ids != ids.transpose(2, 3), -INFINITY);
    auto want = torch::einsum("bhqk,bkhd->bqhd", {torch::softmax(logits, -1), v});
    EXPECT_LE((packed - want).abs().max().item<double>(), kAttentionTolerance);
    auto grads = torch::autograd::grad({want.pow(2).sum()}, {q, k, v, encoder->parameters()[0]}, {},
                                       /*retain_graph=*/true);
    auto fused = torch::autograd::grad({packed.pow(2).sum()}, {q, k, v, encoder->parameters()[0]},
                                       {}, /*retain_graph=*/true);
    for (size_t i = 0; i < grads.size(); ++i)
      EXPECT_LE((grads[i] - fused[i]).abs().max().item<double>(), kAttentionTolerance) << i;
  }
  auto [gq, gk, gv] = [&] {
    auto grads = torch::autograd::grad({packed.pow(2).sum()}, {q, k, v}, {}, true);
    return std::make_tuple(grads[0], grads[1], grads[2]);
  }();
  for (auto [begin, n] : {std::pair<int64_t, int64_t>{0, 3}, {3, 2}}) {
    auto part = [&](const at::Tensor& t) {
      return t.narrow(1, begin, n).detach().requires_grad_();
    };
    auto qs = part(q), ks = part(k), vs = part(v);
    auto alone = Positions(positions.coords().narrow(1, begin, n), {"time", "variate"});
    auto own = encoder->plan(alone);
    auto y = plan_attention(own, qs, ks, vs, false, {}, 1.0 / std::sqrt(8.0));
    EXPECT_LE((y - packed.narrow(1, begin, n)).abs().max().item<double>(), kAttentionTolerance);
    auto grads = torch::autograd::grad({y.pow(2).sum()}, {qs, ks, vs});
    EXPECT_LE((grads[0] - gq.narrow(1, begin, n)).abs().max().item<double>(), kAttentionTolerance);
    EXPECT_LE((grads[1] - gk.narrow(1, begin, n)).abs().max().item<double>(), kAttentionTolerance);
    EXPECT_LE((grads[2] - gv.narrow(1, begin, n)).abs().max().item<double>(), kAttentionTolerance);
  }
}

TEST(TimeseriesRecipes, PackSamplesLaysOutRows) {
  auto sample = [](int64_t n, int64_t variate) {
    timeseries::PackSample s;
    s.tokens = torch::ones({n, 2}) * static_cast<float>(n);
    s.time = torch::arange(n, torch::kFloat64);
    s.variate = torch::full({n}, variate, torch::kLong);
    s.observed = torch::ones({n}, torch::kBool);
    return s;
  };
  // rows of 4: [a a a pad] [b b c c]: 3 does not fit after 3, then 2 + 2 fill the second row
  auto packed = timeseries::pack_samples({sample(3, 0), sample(2, 1), sample(2, 0)}, 4);
  EXPECT_EQ(packed.row, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(packed.offset, (std::vector<int64_t>{0, 0, 2}));
  EXPECT_TRUE(
      torch::equal(packed.sample_ids, torch::tensor({0, 0, 0, 1, 0, 0, 1, 1}).view({2, 4})));
  EXPECT_TRUE(torch::equal(packed.real,
                           torch::tensor({1, 1, 1, 0, 1, 1, 1, 1}).view({2, 4}).to(torch::kBool)));
  // positions restart in every sample; variates as given
  EXPECT_TRUE(torch::equal(
      packed.positions.axis("time"),
      torch::tensor({0.0, 1.0, 2.0, 0.0, 0.0, 1.0, 0.0, 1.0}, torch::kFloat64).view({2, 4})));
  EXPECT_TRUE(torch::equal(
      packed.positions.axis("variate"),
      torch::tensor({0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0}, torch::kFloat64).view({2, 4})));
  auto backwards = sample(3, 0);
  backwards.time = torch::tensor({0.0, 2.0, 1.0}, torch::kFloat64);
  EXPECT_TRUE(contains(error_of([&] { timeseries::pack_samples({backwards}, 4); }),
                       "pack_samples: sample 0 time: time goes backwards at index [2]"));
  EXPECT_TRUE(contains(error_of([&] { timeseries::pack_samples({sample(5, 0)}, 4); }),
                       "pack_samples: sample 0 has 5 tokens; a row holds 1 to 4"));
}

// The packed forecaster gives each sample what it gives that sample alone.
TEST(TimeseriesRecipes, PackedForecasterEqualsOneSampleAtATime) {
  torch::manual_seed(1);
  auto t = TransformerOptions(16, 2, 2).mlp_ratio(2);
  auto encoder = build_encoder(json::parse(R"({"type": "compose", "encoders": [
      {"type": "rope", "axes": ["time"]}, {"type": "variate_bias", "init_std": 0.5}]})"),
                               {16, 2, 0});
  Forecaster model(ForecasterOptions(4, t), encoder);
  model->eval();
  auto sample = [](int64_t patches, int64_t variates) {
    timeseries::PackSample s;
    const int64_t n = patches * variates;
    s.tokens = torch::randn({n, 4});
    s.time = torch::arange(patches, torch::kFloat64).repeat({variates});
    s.variate = torch::arange(variates, torch::kLong).repeat_interleave(patches);
    s.observed = torch::ones({n}, torch::kBool);
    for (int64_t v = 0; v < variates; ++v) s.observed[v * patches + patches - 1] = false;
    return s;
  };
  std::vector<timeseries::PackSample> samples{sample(3, 2), sample(4, 1), sample(2, 3)};
  auto packed = timeseries::pack_samples(samples, 8);
  auto y =
      model->forward_packed(packed.tokens, packed.observed, packed.positions, packed.sample_ids);
  for (size_t s = 0; s < samples.size(); ++s) {
    const auto& one = samples[s];
    auto alone =
        model->forward(one.tokens.unsqueeze(0), one.observed.unsqueeze(0),
                       Positions(torch::stack({one.time, one.variate.to(torch::kFloat64)}, -1),
                                 {"time", "variate"}));
    auto got = y[packed.row[s]].narrow(0, packed.offset[s], one.tokens.size(0));
    EXPECT_LE((got - alone[0]).abs().max().item<double>(), 1e-5) << "sample " << s;
  }
}

// A NaN reading in an observed token does not stay in its sample: a masked key still enters the
// fused kernel's tile (0 * NaN = NaN in P V; SDPA with the materialized mask does the same), so
// the other samples in its row forecast NaN and training stops with "lower the learning rate".
// pack_samples refuses it in one line; an unobserved token may hold anything (the forecaster
// reads its place, never its value), and the other samples keep their forecasts.
TEST(TimeseriesRecipes, PackSamplesRefusesNonFiniteObservedReadings) {
  torch::manual_seed(2);
  auto t = TransformerOptions(16, 2, 1).mlp_ratio(2);
  auto encoder = build_encoder(json::parse(R"({"type": "compose", "encoders": [
      {"type": "rope", "axes": ["time"]}, {"type": "variate_bias", "init_std": 0.5}]})"),
                               {16, 2, 0});
  Forecaster model(ForecasterOptions(4, t), encoder);
  model->eval();
  torch::NoGradGuard no_grad;
  auto sample = [](int64_t n) {
    timeseries::PackSample s;
    s.tokens = torch::randn({n, 4});
    s.time = torch::arange(n, torch::kFloat64);
    s.variate = torch::zeros({n}, torch::kLong);
    s.observed = torch::ones({n}, torch::kBool);
    s.observed[n - 1] = false;
    return s;
  };
  std::vector<timeseries::PackSample> samples{sample(5), sample(6), sample(4)};
  auto clean = timeseries::pack_samples(samples, 16);
  auto y_clean =
      model->forward_packed(clean.tokens, clean.observed, clean.positions, clean.sample_ids);
  auto bad = samples;
  bad[0].tokens = samples[0].tokens.clone();
  bad[0].tokens[2][1] = std::nanf("");
  EXPECT_TRUE(contains(error_of([&] { timeseries::pack_samples(bad, 16); }),
                       "pack_samples: sample 0 tokens: nan at index [2, 1] is not finite"));
  bad[0].tokens[2][1] = INFINITY;
  EXPECT_TRUE(contains(error_of([&] { timeseries::pack_samples(bad, 16); }),
                       "pack_samples: sample 0 tokens: inf at index [2, 1] is not finite"));
  // where the token is not observed, its value is never read: packed, and sample 1 and 2 as before
  bad[0].tokens = samples[0].tokens.clone();
  bad[0].tokens[4][0] = std::nanf("");
  auto packed = timeseries::pack_samples(bad, 16);
  auto y =
      model->forward_packed(packed.tokens, packed.observed, packed.positions, packed.sample_ids);
  EXPECT_FALSE(y.isnan().any().item<bool>());
  EXPECT_TRUE(torch::equal(y, y_clean));
}

TEST(TimeseriesRecipes, UnscaledAttention) {
  // Chronos-2: softmax(q k^T) v, no 1/sqrt(Dh)
  torch::manual_seed(2);
  SelfAttention attention(AttentionOptions(8, 2).scale(1.0), as_encoding(Nope()));
  auto x = torch::randn({1, 5, 8});
  auto y = attention(x, Positions::sequence(5));
  auto qkv = attention->qkv(x).view({1, 5, 3, 2, 4});
  auto q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  auto weights = torch::softmax(torch::einsum("bqhd,bkhd->bhqk", {q, k}), -1);
  auto want = attention->out(torch::einsum("bhqk,bkhd->bqhd", {weights, v}).reshape({1, 5, 8}));
  EXPECT_LE((y - want).abs().max().item<double>(), kAttentionTolerance);
  EXPECT_TRUE(contains(
      error_of([] { SelfAttention(AttentionOptions(8, 2).scale(-1.0), as_encoding(Nope())); }),
      "attention: scale must be finite and >= 0"));
}

TEST(TimeseriesRecipes, InterleavedRopeWithXposByHand) {
  // xPos (Sun et al. 2022) on interleaved pairs (2i, 2i + 1), one scale per pair, base 256 (the
  // issue's Toto setting; Toto's own get_scale lays the scales out differently: docs/library.md);
  // Dh = 4, theta = 10000:
  // inv_freq = (1, 0.01); zeta_i = (2i + 0.4 * 4) / (1.4 * 4) = (2/7, 9/14)
  // q at p = 256 is scaled by zeta_i, k at p = 256 by 1 / zeta_i
  Rope rope(RopeOptions(4).layout(RopeLayout::kInterleaved).xpos(true).xpos_scale_base(256));
  auto plan = rope->plan(Positions::values({256.0}));
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 1, 4});
  auto [q, k] = plan.apply_rotary(x, x);
  const double zeta[2] = {2.0 / 7.0, 9.0 / 14.0};
  const double angle[2] = {256.0, 2.56};
  const double pair[2][2] = {{1, 2}, {3, 4}};
  for (int i = 0; i < 2; ++i) {
    const double c = std::cos(angle[i]), s = std::sin(angle[i]);
    const double a = pair[i][0] * c - pair[i][1] * s, b = pair[i][1] * c + pair[i][0] * s;
    EXPECT_NEAR(q[0][0][0][2 * i].item<double>(), a * zeta[i], 1e-5);
    EXPECT_NEAR(q[0][0][0][2 * i + 1].item<double>(), b * zeta[i], 1e-5);
    EXPECT_NEAR(k[0][0][0][2 * i].item<double>(), a / zeta[i], 1e-5);
    EXPECT_NEAR(k[0][0][0][2 * i + 1].item<double>(), b / zeta[i], 1e-5);
  }
}

TEST(TimeseriesRecipes, HalfTheHeadRotates) {
  // Moirai-2: RoPE over half of each head; Dh = 8, factor 0.5 -> r = 4, pairs (0, 2), (1, 3)
  // (half layout), dims 4..7 pass through. At p = 1: inv_freq = (1, 0.01).
  Rope rope(RopeOptions(8).partial_rotary_factor(0.5));
  auto plan = rope->plan(Positions::values({1.0}));
  auto x = torch::arange(1, 9, torch::kFloat32).view({1, 1, 1, 8});
  auto [q, k] = plan.apply_rotary(x, x);
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  const double want[8] = {
      1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1, 5, 6, 7, 8};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(q[0][0][0][i].item<double>(), want[i], 1e-6) << i;
}

}  // namespace
}  // namespace posenc
