// Fused attention with packed samples (AttentionMasks::sample_ids: the block-diagonal mask of
// Moirai-2's packed batches, uni2ts' packed_attention_mask) and the binary variate bias
// (variate_ids + variate_bias [2, H]: uni2ts' BinaryAttentionBias, row 0 different ids, row 1 the
// same) vs attention_reference, which materializes the same mask and bias
// (sample_mask_from_ids, variate_bias_from_ids): float32 / bfloat16 / float16, RoPE inside and
// ALiBi together, causal or not, cached keys, several samples of different lengths per row (tiles
// crossed, so whole tiles are skipped), a sample whose keys are all padded, gradients for q, k, v
// and variate_bias, a float64 central-difference check of the reference's variate_bias gradient,
// and bad ids refused in one line naming the tensor and the first bad index.
// Causal on ids (AttentionMasks::causal_ids: Moirai-2's packed_causal_attention_mask on time_id,
// key j visible to query i when time_j <= time_i): series of several variates packed
// variate-major (time restarts in every variate, so token order is not time order) with the
// sample mask, the variate bias, RoPE and ALiBi, whole tiles skipped (variates longer than a
// tile); random unsorted ids with ties and padded keys; the materialized mask against uni2ts'
// rule written out; refusals (causal together with causal_ids, float ids, a wrong shape).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "posenc/functional/rope.h"
#include "posenc/kernels/attention_fused.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::max_abs_diff;

// float32 tiles vs a float32 einsum/softmax: different summation orders, values O(1).
constexpr double kForwardTolerance = 3e-5;
// Relative to the gradient's largest entry: variate_bias's gradient sums Nq * Nk terms per head.
constexpr double kGradientTolerance = 1e-4;
// bfloat16 / float16 storage: one rounding of inputs and output (2^-8, 2^-11) on each side.
constexpr double kHalfTolerance = 2e-2;

// sample ids [B, N] from run lengths per row (the remainder one more sample), and variate ids:
// two variates per sample, the second starting halfway through it.
std::pair<at::Tensor, at::Tensor> packed_ids(const std::vector<std::vector<int64_t>>& rows,
                                             int64_t n) {
  auto samples = torch::empty({static_cast<int64_t>(rows.size()), n}, torch::kLong);
  auto variates = torch::empty_like(samples);
  for (size_t b = 0; b < rows.size(); ++b) {
    int64_t j = 0, id = 0;
    auto lengths = rows[b];
    int64_t total = 0;
    for (auto l : lengths) total += l;
    if (total < n) lengths.push_back(n - total);
    for (auto l : lengths) {
      for (int64_t t = 0; t < l; ++t, ++j) {
        samples[b][j] = id;
        variates[b][j] = t < l / 2 ? 0 : 1;
      }
      ++id;
    }
  }
  return {samples, variates};
}

// Moirai-2's packing: per row, series of (variates, times) each listing variate 0's times
// 0..T-1, then variate 1's, ... (variate-major); the rest of the row one padding series of one
// variate. sample ids, variate ids and time ids [B, n].
struct VariateMajorIds {
  at::Tensor samples, variates, times;
};

VariateMajorIds variate_major_ids(const std::vector<std::vector<std::pair<int64_t, int64_t>>>& rows,
                                  int64_t n) {
  const auto batch = static_cast<int64_t>(rows.size());
  VariateMajorIds ids{torch::empty({batch, n}, torch::kLong),
                      torch::empty({batch, n}, torch::kLong),
                      torch::empty({batch, n}, torch::kLong)};
  for (int64_t b = 0; b < batch; ++b) {
    auto series = rows[b];
    int64_t total = 0;
    for (auto [variates, times] : series) total += variates * times;
    if (total < n) series.push_back({1, n - total});
    int64_t j = 0;
    for (size_t s = 0; s < series.size(); ++s)
      for (int64_t var = 0; var < series[s].first; ++var)
        for (int64_t t = 0; t < series[s].second && j < n; ++t, ++j) {
          ids.samples[b][j] = static_cast<int64_t>(s);
          ids.variates[b][j] = var;
          ids.times[b][j] = t;
        }
  }
  return ids;
}

struct PackedCase {
  bool causal;
  bool rotary;
  bool alibi;
  int64_t nq, nk;
  at::ScalarType dtype;
  bool time_causal = false;  ///< causal_ids = Moirai-2's time ids (variate-major), not causal
};

class AttentionPacked : public ::testing::TestWithParam<PackedCase> {};

TEST_P(AttentionPacked, MatchesReferenceForwardAndBackward) {
  const auto& c = GetParam();
  torch::manual_seed(50);
  const int64_t b = 3, h = 4, d = 16;
  auto make = [&](int64_t n) {
    return torch::randn({b, n, h, d}).to(c.dtype).requires_grad_(true);
  };
  auto q = make(c.nq), k = make(c.nk), v = make(c.nk);
  auto weight = torch::randn({2, h}).requires_grad_(true);
  auto [samples, variates] = packed_ids({{70, 130, 9, 51}, {c.nk}, {1, 180, 64}}, c.nk);
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.time_causal) {  // several variates per series, packed variate-major, causal in time
    auto ids =
        variate_major_ids({{{3, 40}, {2, 150}, {1, 10}}, {{2, 300}}, {{4, 20}, {1, 250}}}, c.nk);
    samples = ids.samples;
    variates = ids.variates;
    masks.causal_ids = ids.times;
  }
  masks.sample_ids = samples;
  masks.variate_ids = variates;
  masks.variate_bias = weight;
  auto pk = torch::arange(c.nk, torch::kFloat64);
  auto pq = pk.narrow(0, c.nk - c.nq, c.nq);
  BiasSpec spec;
  if (c.alibi) {
    spec.form = BiasForm::kAlibi;
    spec.slopes = torch::tensor({0.5, 0.25, 0.125, 0.0625}, torch::kFloat32);
  }
  AttentionRotary rotary;
  at::Tensor qr = q, kr = k;
  if (c.rotary) {  // per-pair tables [N, F] for the kernel; the reference rotates first
    auto inv = torch::pow(10000.0, -torch::arange(0, d, 2, torch::kFloat64) / d);
    auto angles = (pk.unsqueeze(1) * inv).to(torch::kFloat32);  // [Nk, D/2]
    rotary.k_cos = angles.cos();
    rotary.k_sin = angles.sin();
    rotary.q_cos = rotary.k_cos.narrow(0, c.nk - c.nq, c.nq);
    rotary.q_sin = rotary.k_sin.narrow(0, c.nk - c.nq, c.nq);
    auto rotate = [&](const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
      auto x1 = x.narrow(-1, 0, d / 2).to(torch::kFloat32);
      auto x2 = x.narrow(-1, d / 2, d / 2).to(torch::kFloat32);
      auto cs = cos.view({1, -1, 1, d / 2}), sn = sin.view({1, -1, 1, d / 2});
      return torch::cat({x1 * cs - x2 * sn, x2 * cs + x1 * sn}, -1);
    };
    qr = rotate(q, rotary.q_cos, rotary.q_sin);
    kr = rotate(k, rotary.k_cos, rotary.k_sin);
  }
  const double scale = 0.25;
  auto prepared = fused_bias({spec}, pq, pk);
  ASSERT_TRUE(attention_fused_supported(*prepared, q, masks));
  auto fused = attention_fused(q, k, v, prepared, masks, scale, rotary);
  auto bias = bias_from_spec(spec, pq, pk, h);
  auto reference = attention_reference(qr.to(torch::kFloat32), kr.to(torch::kFloat32),
                                       v.to(torch::kFloat32), bias, masks, scale);
  ASSERT_EQ(fused.sizes(), reference.sizes());
  const bool half = c.dtype != torch::kFloat32;
  EXPECT_LT(max_abs_diff(fused.to(torch::kFloat32), reference),
            half ? kHalfTolerance : kForwardTolerance);

  auto probe = torch::randn(reference.sizes());
  auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({(out.to(torch::kFloat32) * probe).sum()}, {q, k, v, weight}, {},
                                 /*retain_graph=*/true);
  };
  auto gf = grads_of(fused);
  auto gr = grads_of(reference);
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i].to(torch::kFloat32), gr[i].to(torch::kFloat32)),
              (half ? kHalfTolerance : kGradientTolerance) *
                  std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i << " (3: variate_bias)";
}

std::vector<PackedCase> packed_cases() {
  std::vector<PackedCase> out;
  for (bool causal : {false, true})
    for (bool rotary : {false, true})
      out.push_back({causal, rotary, rotary, 300, 300, torch::kFloat32});
  out.push_back({true, true, true, 40, 300, torch::kFloat32});  // cached keys: the last 40 ids
  out.push_back({false, false, true, 300, 300, torch::kFloat32});
  out.push_back({true, true, false, 300, 300, torch::kBFloat16});
  out.push_back({false, true, true, 300, 300, torch::kHalf});
  // causal on Moirai-2's time ids (variate-major): RoPE and ALiBi or not, cached keys, bfloat16
  for (bool rotary : {false, true})
    out.push_back({false, rotary, rotary, 600, 600, torch::kFloat32, true});
  out.push_back({false, true, false, 70, 600, torch::kFloat32, true});
  out.push_back({false, true, true, 600, 600, torch::kBFloat16, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionPacked, ::testing::ValuesIn(packed_cases()));

TEST(AttentionPackedMasks, SampleWithAllKeysPaddedGivesZero) {
  torch::manual_seed(3);
  const int64_t n = 64, h = 2, d = 8;
  auto q = torch::randn({1, n, h, d}), k = torch::randn({1, n, h, d}),
       v = torch::randn({1, n, h, d});
  auto [samples, variates] = packed_ids({{20, 30}}, n);
  AttentionMasks masks;
  masks.sample_ids = samples;
  masks.key_padding = samples != 1;  // every key of sample 1 is padding
  auto pos = torch::arange(n, torch::kFloat64);
  auto fused = attention_fused(q, k, v, fused_bias({}, pos, pos), masks, 0.5);
  auto reference = attention_reference(q, k, v, {}, masks, 0.5);
  EXPECT_TRUE(torch::equal(fused.narrow(1, 20, 30), torch::zeros({1, 30, h, d})));
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);
}

TEST(AttentionPackedMasks, ReferenceVariateGradientMatchesCentralDifferences) {
  torch::manual_seed(4);
  const int64_t n = 10, h = 2, d = 4;
  auto opts = torch::kFloat64;
  auto q = torch::randn({2, n, h, d}, opts), k = torch::randn({2, n, h, d}, opts);
  auto v = torch::randn({2, n, h, d}, opts);
  auto [samples, variates] = packed_ids({{4, 6}, {3, 3, 4}}, n);
  auto weight = torch::randn({2, h}, opts).requires_grad_(true);
  auto probe = torch::randn({2, n, h, d}, opts);
  auto loss = [&](const at::Tensor& w) {
    AttentionMasks masks;
    masks.causal = true;
    masks.sample_ids = samples;
    masks.variate_ids = variates;
    masks.variate_bias = w;
    return (attention_reference(q, k, v, {}, masks, 0.5) * probe).sum();
  };
  auto analytic = torch::autograd::grad({loss(weight)}, {weight})[0];
  const double eps = 1e-6;
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t hh = 0; hh < h; ++hh) {
      auto plus = weight.detach().clone(), minus = weight.detach().clone();
      plus[s][hh] += eps;
      minus[s][hh] -= eps;
      const double numeric = (loss(plus).item<double>() - loss(minus).item<double>()) / (2 * eps);
      EXPECT_NEAR(analytic[s][hh].item<double>(), numeric, 1e-7)
          << "variate_bias[" << s << ", " << hh << "]";
    }
}

// Causal on unsorted ids with ties (several tokens per id), sample runs and padded keys: a query
// whose visible keys are all padding gives 0, as the reference.
TEST(AttentionPackedMasks, CausalIdsRandomWithTiesAndPadding) {
  torch::manual_seed(5);
  const int64_t b = 2, n = 520, h = 3, d = 16;
  auto q = torch::randn({b, n, h, d}).requires_grad_(true);
  auto k = torch::randn({b, n, h, d}).requires_grad_(true);
  auto v = torch::randn({b, n, h, d}).requires_grad_(true);
  AttentionMasks masks;
  masks.causal_ids = torch::randint(0, 40, {b, n}, torch::kLong);
  masks.sample_ids = packed_ids({{300, 200}, {20, 480}}, n).first;
  masks.key_padding = torch::rand({b, n}) > 0.2;
  // query 0 of row 1 holds the row's smallest id, its only equal-id key (itself) padded
  masks.causal_ids[1][0] = -1;
  masks.key_padding[1][0] = false;
  auto pos = torch::arange(n, torch::kFloat64);
  auto fused = attention_fused(q, k, v, fused_bias({}, pos, pos), masks, 0.25);
  auto reference = attention_reference(q, k, v, {}, masks, 0.25);
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);
  EXPECT_TRUE(torch::equal(fused[1][0], torch::zeros({h, d})));
  auto probe = torch::randn(reference.sizes());
  auto gf = torch::autograd::grad({(fused * probe).sum()}, {q, k, v});
  auto gr = torch::autograd::grad({(reference * probe).sum()}, {q, k, v});
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i], gr[i]),
              kGradientTolerance * std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i;
}

// Tile skipping at its boundary: ids j, but one id repeated at 127/128 and again at 255/256, so
// a key tile's smallest id equals its query block's largest (forward: queries [128, 256) and keys
// [256, 512); backward the same tiles): those tiles must be visited. And ids = the token positions
// give causal=true's attention.
TEST(AttentionPackedMasks, CausalIdsTileBoundaries) {
  torch::manual_seed(6);
  const int64_t n = 520, h = 2, d = 8;
  auto q = torch::randn({1, n, h, d}).requires_grad_(true);
  auto k = torch::randn({1, n, h, d}).requires_grad_(true);
  auto v = torch::randn({1, n, h, d}).requires_grad_(true);
  auto j = torch::arange(n, torch::kLong);
  AttentionMasks repeated;
  repeated.causal_ids =
      (j - (j >= 128).to(torch::kLong) - (j >= 256).to(torch::kLong)).view({1, n});
  auto pos = torch::arange(n, torch::kFloat64);
  auto fused = attention_fused(q, k, v, fused_bias({}, pos, pos), repeated, 0.5);
  auto reference = attention_reference(q, k, v, {}, repeated, 0.5);
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);
  auto probe = torch::randn(reference.sizes());
  auto gf = torch::autograd::grad({(fused * probe).sum()}, {q, k, v});
  auto gr = torch::autograd::grad({(reference * probe).sum()}, {q, k, v});
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i], gr[i]),
              kGradientTolerance * std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i;
  AttentionMasks positions, causal;
  positions.causal_ids = j.view({1, n});
  causal.causal = true;
  EXPECT_LT(max_abs_diff(attention_fused(q, k, v, fused_bias({}, pos, pos), positions, 0.5),
                         attention_fused(q, k, v, fused_bias({}, pos, pos), causal, 0.5)),
            kForwardTolerance);
}

// causal_mask_from_ids against uni2ts' packed_causal_attention_mask's time rule written out:
// mask[b, i, j] = time[b, j] <= time[b, i], the queries at the last Nq ids.
TEST(AttentionPackedMasks, CausalMaskFromIdsIsUni2tsRule) {
  auto times = torch::tensor({{0, 1, 2, 0, 1, 2, 5}, {3, 3, 1, 0, 2, 2, 0}}, torch::kLong);
  const int64_t nq = 4, nk = 7;
  auto mask = causal_mask_from_ids(times, nq);
  ASSERT_EQ(mask.sizes(), at::IntArrayRef({2, nq, nk}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t j = 0; j < nk; ++j)
        EXPECT_EQ(mask[b][i][j].item<bool>(),
                  times[b][j].item<int64_t>() <= times[b][nk - nq + i].item<int64_t>())
            << b << ", " << i << ", " << j;
}

// The one-line refusal's first line, and that it names what it should.
std::string refusal(const AttentionMasks& masks) {
  auto q = torch::randn({2, 16, 2, 8});
  auto pos = torch::arange(16, torch::kFloat64);
  try {
    attention_fused(q, q, q, fused_bias({}, pos, pos), masks, 0.5);
  } catch (const c10::Error& e) {
    std::string text = e.what_without_backtrace();
    return text.substr(0, text.find('\n'));
  }
  return "(no error)";
}

TEST(AttentionPackedMasks, BadIdsAreOneLine) {
  AttentionMasks runs;
  runs.sample_ids = torch::zeros({2, 16}, torch::kLong);
  runs.sample_ids[1].narrow(0, 4, 4).fill_(1);  // 0 0 0 0 1 1 1 1 0 ...: sample 0 again at 8
  EXPECT_NE(refusal(runs).find("sample_ids[1, 8] = 0 starts a second run"), std::string::npos)
      << refusal(runs);
  AttentionMasks floats;
  floats.sample_ids = torch::zeros({2, 16});
  EXPECT_NE(refusal(floats).find("sample_ids must be an integer tensor"), std::string::npos)
      << refusal(floats);
  AttentionMasks negative;
  negative.variate_ids = torch::zeros({2, 16}, torch::kLong);
  negative.variate_ids[0][3] = -2;
  negative.variate_bias = torch::zeros({2, 2});
  EXPECT_NE(refusal(negative).find("variate_ids[0, 3] = -2 is negative"), std::string::npos)
      << refusal(negative);
  AttentionMasks shape;
  shape.variate_ids = torch::zeros({2, 16}, torch::kLong);
  shape.variate_bias = torch::zeros({3, 2});
  EXPECT_NE(refusal(shape).find("variate_bias must be [2, H] = [2, 2]"), std::string::npos)
      << refusal(shape);
  AttentionMasks both;
  both.causal = true;
  both.causal_ids = torch::zeros({2, 16}, torch::kLong);
  EXPECT_NE(refusal(both).find("causal and causal_ids together are two causal rules"),
            std::string::npos)
      << refusal(both);
  AttentionMasks float_times;
  float_times.causal_ids = torch::zeros({2, 16});
  EXPECT_NE(refusal(float_times).find("causal_ids must be an integer tensor (int64), got Float"),
            std::string::npos)
      << refusal(float_times);
  AttentionMasks short_times;
  short_times.causal_ids = torch::zeros({2, 15}, torch::kLong);
  EXPECT_NE(refusal(short_times).find("causal_ids must be [B, Nk] = [2, 16], got [2, 15]"),
            std::string::npos)
      << refusal(short_times);
}

}  // namespace
}  // namespace posenc
