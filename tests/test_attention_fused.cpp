// Fused attention (bias computed on the fly, tiled online softmax) vs attention_reference with
// the bias materialized from the same BiasSpec: forms x masks x odd sizes, forward and gradients
// (q, k, v and the T5 table), and the attention layer on both paths.
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "posenc/kernels/attention_fused.h"
#include "posenc/posenc.h"
#include "support/bias_forms.h"
#include "support/dispatcher_calls.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::Form;
using test::spec_for;

using test::max_abs_diff;

// float32 tiles vs a float32 einsum/softmax: different summation orders, values O(1).
constexpr double kForwardTolerance = 2e-5;
// Relative to the gradient's largest entry: table gradients sum up to 2 * Nq * Nk terms.
constexpr double kGradientTolerance = 1e-4;

struct AttentionCase {
  Form form;
  bool causal;
  bool padding;
  int64_t nq, nk;  // nk > nq: cached keys come first
  // the values' width: 8 takes MKL's products, a multiple of 16 the AVX-512 level's own
  // micro-kernels (src/kernels/cpu/attention_tiles_rows.h; the forward with Nq >= 32)
  int64_t dv = 8;
};

class AttentionFused : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionFused, MatchesReferenceForwardAndBackward) {
  const auto& c = GetParam();
  torch::manual_seed(21);
  const int64_t b = 2, h = 3, d = 16, dv = c.dv;
  auto q = torch::randn({b, c.nq, h, d}, torch::requires_grad());
  auto k = torch::randn({b, c.nk, h, d}, torch::requires_grad());
  auto v = torch::randn({b, c.nk, h, dv}, torch::requires_grad());
  auto table = (torch::randn({16, h})).requires_grad_(true);
  auto spec = spec_for(c.form, h, table);
  auto pk = torch::arange(c.nk, torch::kFloat64);
  auto pq = pk.narrow(0, c.nk - c.nq, c.nq);  // queries are the last positions
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[1].narrow(0, 0, 3).fill_(false);  // sequence 1 starts with 3 pad keys
  }
  const double scale = 0.25;
  ASSERT_TRUE(attention_fused_supported(spec, q, pq, pk));
  auto fused = attention_fused(q, k, v, spec, pq, pk, masks, scale);
  auto bias = bias_from_spec(spec, pq, pk, h);
  auto reference = attention_reference(q, k, v, bias, masks, scale);
  ASSERT_EQ(fused.sizes(), reference.sizes());
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);

  auto probe = torch::randn_like(reference);
  auto grads_of = [&](const at::Tensor& out) {
    std::vector<at::Tensor> inputs{q, k, v};
    if (spec.form == BiasForm::kBucketTable) inputs.push_back(table);
    return torch::autograd::grad({(out * probe).sum()}, inputs, {}, /*retain_graph=*/true);
  };
  auto gf = grads_of(fused);
  auto gr = grads_of(reference);
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i], gr[i]),
              kGradientTolerance * std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i;
}

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> out;
  for (auto form : {Form::kNone, Form::kAlibiCausal, Form::kAlibiSymmetric, Form::kT5Bidirectional,
                    Form::kT5Unidirectional}) {
    out.push_back({form, false, false, 37, 37});
    out.push_back({form, true, false, 37, 37});
    out.push_back({form, true, true, 300, 300});  // several query and key blocks
    out.push_back({form, true, false, 5, 261});   // decoding: 256 cached keys + 5 new
    out.push_back({form, false, true, 129, 513});
    out.push_back({form, true, true, 300, 300, 32});   // the own micro-kernels: a 6- or 8-row
    out.push_back({form, false, false, 37, 37, 48});   // strip tail, a 16-column value panel
    out.push_back({form, false, true, 129, 513, 16});  // past the 32-column blocks
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(FormsMasksSizes, AttentionFused, ::testing::ValuesIn(attention_cases()));

// Shaw's query-dependent relative table (K = 4, so most pairs are clipped) through the tiled
// kernel vs the materialized bias: forward and gradients for q, k, v and the table.
class ShawFused : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(ShawFused, MatchesReferenceForwardAndBackward) {
  const auto& c = GetParam();
  torch::manual_seed(23);
  const int64_t b = 2, h = 3, d = 16, dv = c.dv, max_rel = 4;
  auto q = torch::randn({b, c.nq, h, d}, torch::requires_grad());
  auto k = torch::randn({b, c.nk, h, d}, torch::requires_grad());
  auto v = torch::randn({b, c.nk, h, dv}, torch::requires_grad());
  auto table = torch::randn({2 * max_rel + 1, d}).requires_grad_(true);
  BiasSpec spec;
  spec.form = BiasForm::kRelativeTable;
  spec.table = table;
  spec.max_relative_position = max_rel;
  auto pk = torch::arange(c.nk, torch::kFloat64) + 7;  // an offset: only differences matter
  auto pq = pk.narrow(0, c.nk - c.nq, c.nq);
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[0].narrow(0, c.nk - 2, 2).fill_(false);
  }
  const double scale = 0.25;
  ASSERT_TRUE(attention_fused_supported(spec, q, pq, pk));
  auto fused = attention_fused(q, k, v, spec, pq, pk, masks, scale);
  auto reference = attention_reference(q, k, v, bias_from_spec(spec, pq, pk, h, q), masks, scale);
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);
  auto probe = torch::randn_like(reference);
  auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({(out * probe).sum()}, {q, k, v, table}, {},
                                 /*retain_graph=*/true);
  };
  auto gf = grads_of(fused);
  auto gr = grads_of(reference);
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i], gr[i]),
              kGradientTolerance * std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(MasksSizes, ShawFused,
                         ::testing::Values(AttentionCase{Form::kNone, false, false, 37, 37},
                                           AttentionCase{Form::kNone, true, true, 300, 300},
                                           AttentionCase{Form::kNone, true, false, 5, 261},
                                           AttentionCase{Form::kNone, false, true, 129, 513},
                                           AttentionCase{Form::kNone, true, true, 300, 300, 32}));

TEST(ShawFused, MaterializedSpecMatchesTheEncodersBias) {
  torch::manual_seed(24);
  Shaw shaw(ShawOptions(8).max_relative_position(3));
  auto q = torch::randn({2, 11, 4, 8});
  auto p = Positions::sequence(11);
  auto want = shaw->bias(p, p, q);  // [B, H, Nq, Nk]
  auto got = bias_from_spec(shaw->bias_spec(), p.axis(0), p.axis(0), 4, q);
  EXPECT_LT(max_abs_diff(got, want), 1e-6);
  // by hand: query 9, key 2 is clipped to offset -3, table row 0
  auto row = torch::dot(q[1][9][2], shaw->weight[0]) / std::sqrt(8.0);
  EXPECT_NEAR(got[1][2][9][2].item<double>(), row.item<double>(), 1e-6);
}

// RoPE applied inside the tiles vs rope_apply on q, k and then the reference: both layouts,
// partial rotary, cached keys, with ALiBi on top; gradients for q, k, v.
struct RotaryCase {
  RopeLayout layout;
  double partial;  // rotary fraction of the head dim
  bool causal, padding;
  int64_t nq, nk;
  int64_t dv = 8;  // as AttentionCase::dv
};

class RotaryInside : public ::testing::TestWithParam<RotaryCase> {};

TEST_P(RotaryInside, MatchesRotateThenReference) {
  const auto& c = GetParam();
  torch::manual_seed(25);
  const int64_t b = 2, h = 3, d = 16, dv = c.dv;
  auto q = torch::randn({b, c.nq, h, d}, torch::requires_grad());
  auto k = torch::randn({b, c.nk, h, d}, torch::requires_grad());
  auto v = torch::randn({b, c.nk, h, dv}, torch::requires_grad());
  const int64_t pairs = static_cast<int64_t>(d * c.partial) / 2;
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * pairs, 2, torch::kFloat64) / (2.0 * pairs));
  auto pk = torch::arange(c.nk, torch::kFloat64) + 11;
  auto pq = pk.narrow(0, c.nk - c.nq, c.nq);
  AttentionRotary rotary;
  std::tie(rotary.q_cos, rotary.q_sin) = rope_cos_sin(pq, inv);
  std::tie(rotary.k_cos, rotary.k_sin) = rope_cos_sin(pk, inv);
  rotary.layout = c.layout;
  auto spec = spec_for(Form::kAlibiCausal, h, {});
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[1].narrow(0, 1, 4).fill_(false);
  }
  const double scale = 0.25;
  auto fused = attention_fused(q, k, v, spec, pq, pk, masks, scale, rotary);
  auto reference = attention_reference(rope_apply(q, rotary.q_cos, rotary.q_sin, c.layout),
                                       rope_apply(k, rotary.k_cos, rotary.k_sin, c.layout), v,
                                       bias_from_spec(spec, pq, pk, h), masks, scale);
  EXPECT_LT(max_abs_diff(fused, reference), kForwardTolerance);
  auto probe = torch::randn_like(reference);
  auto grads_of = [&](const at::Tensor& out) {
    return torch::autograd::grad({(out * probe).sum()}, {q, k, v}, {}, /*retain_graph=*/true);
  };
  auto gf = grads_of(fused);
  auto gr = grads_of(reference);
  for (size_t i = 0; i < gf.size(); ++i)
    EXPECT_LT(max_abs_diff(gf[i], gr[i]),
              kGradientTolerance * std::max(1.0, gr[i].abs().max().item<double>()))
        << "gradient " << i;
}

INSTANTIATE_TEST_SUITE_P(
    LayoutsSizes, RotaryInside,
    ::testing::Values(RotaryCase{RopeLayout::kHalf, 1.0, false, false, 37, 37},
                      RotaryCase{RopeLayout::kInterleaved, 1.0, true, true, 300, 300},
                      RotaryCase{RopeLayout::kHalf, 0.5, true, false, 5, 261},
                      RotaryCase{RopeLayout::kInterleaved, 0.25, false, true, 129, 513},
                      RotaryCase{RopeLayout::kHalf, 0.5, true, true, 300, 300, 32}));

TEST(RotaryInside, BadTablesAreErrors) {
  auto q = torch::randn({1, 6, 2, 8}), k = torch::randn({1, 9, 2, 8});
  auto inv = torch::ones({4}, torch::kFloat64);
  AttentionRotary rotary;
  std::tie(rotary.q_cos, rotary.q_sin) = rope_cos_sin(torch::arange(6, torch::kFloat64), inv);
  std::tie(rotary.k_cos, rotary.k_sin) = rope_cos_sin(torch::arange(6, torch::kFloat64), inv);
  auto pq = torch::arange(6, torch::kFloat64), pk = torch::arange(9, torch::kFloat64);
  auto message = test::error_of([&] { attention_fused(q, k, k, {}, pq, pk, {}, 1.0, rotary); });
  EXPECT_NE(message.find("rotary k_cos/k_sin must be [Nk, F] = [9, 4], got [6, 4]"),
            std::string::npos)
      << message;
  std::tie(rotary.k_cos, rotary.k_sin) = rope_cos_sin(pk, inv);
  rotary.q_cos = rotary.q_cos.clone().requires_grad_(true);
  message = test::error_of([&] { attention_fused(q, k, k, {}, pq, pk, {}, 1.0, rotary); });
  EXPECT_NE(message.find("rotary tables are constants here"), std::string::npos) << message;
}

// No keys (every row sees nothing: zeros, as the reference), no queries, and one query
// (where the [B, N, H, D] -> [B, H, N, D] transpose is already contiguous), for every form.
TEST(AttentionFusedEdges, EmptyQueriesOrKeys) {
  const int64_t h = 2, d = 8;
  auto table_t5 = torch::randn({8, h});
  auto table_shaw = torch::randn({5, d});
  for (auto [nq, nk] : {std::pair<int64_t, int64_t>{3, 0}, {0, 4}, {1, 6}}) {
    auto q = torch::randn({1, nq, h, d}, torch::requires_grad());
    auto k = torch::randn({1, nk, h, d}, torch::requires_grad());
    auto v = torch::randn({1, nk, h, d}, torch::requires_grad());
    auto pq = torch::arange(nq, torch::kFloat64), pk = torch::arange(nk, torch::kFloat64);
    std::vector<BiasSpec> specs = {spec_for(Form::kNone, h, table_t5),
                                   spec_for(Form::kAlibiCausal, h, table_t5),
                                   spec_for(Form::kT5Bidirectional, h, table_t5)};
    BiasSpec shaw;
    shaw.form = BiasForm::kRelativeTable;
    shaw.table = table_shaw;
    shaw.max_relative_position = 2;
    specs.push_back(shaw);
    for (const auto& spec : specs) {
      AttentionMasks masks;
      masks.causal = true;
      auto out = attention_fused(q, k, v, spec, pq, pk, masks, 0.5);
      ASSERT_EQ(out.sizes(), torch::IntArrayRef({1, nq, h, d})) << to_string(spec.form);
      if (nk == 0 && out.numel() > 0) EXPECT_EQ(out.abs().max().item<float>(), 0.0f);
      if (nk > 0 && nq > 0) {
        auto want = attention_reference(q, k, v, bias_from_spec(spec, pq, pk, h, q), masks, 0.5);
        EXPECT_LT(max_abs_diff(out, want), kForwardTolerance) << to_string(spec.form);
      }
      out.sum().backward();
      EXPECT_EQ(q.grad().sizes(), q.sizes());
      q.mutable_grad().reset();
    }
    AttentionRotary rotary;  // RoPE inside with empty tables
    std::tie(rotary.q_cos, rotary.q_sin) = rope_cos_sin(pq, torch::ones({2}, torch::kFloat64));
    std::tie(rotary.k_cos, rotary.k_sin) = rope_cos_sin(pk, torch::ones({2}, torch::kFloat64));
    auto out = attention_fused(q, k, v, specs[0], pq, pk, {}, 0.5, rotary);
    EXPECT_EQ(out.sizes(), torch::IntArrayRef({1, nq, h, d}));
  }
}

// attention_reference: a query that sees no key gives 0 with zero (not NaN) gradients, as the
// fused kernel; a NaN in q stays NaN. It zeroed every NaN weight after softmax: NaN inputs came out
// 0 and the masked row's gradients NaN (found by the hostile review).
TEST(AttentionFusedEdges, ReferenceRowWithoutKeysIsZeroAndNanInputsStayNan) {
  torch::manual_seed(5);
  const int64_t h = 2, n = 4, d = 8;
  auto q = torch::randn({1, n, h, d}, torch::requires_grad());
  auto k = torch::randn({1, n, h, d}, torch::requires_grad());
  auto v = torch::randn({1, n, h, d}, torch::requires_grad());
  AttentionMasks masks;
  masks.causal = true;
  masks.key_padding = torch::ones({1, n}, torch::kBool);
  masks.key_padding[0][0] = false;  // query 0 sees no key
  auto y = attention_reference(q, k, v, {}, masks, 0.5);
  EXPECT_TRUE(torch::equal(y[0][0], torch::zeros({h, d}))) << y[0][0];
  auto grads = torch::autograd::grad({y.square().sum()}, {q, k, v});
  for (const auto& g : grads) EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << g;
  EXPECT_TRUE(torch::equal(grads[0][0][0], torch::zeros({h, d})));
  auto q_nan = q.detach().clone();
  q_nan[0][2][1][3] = std::numeric_limits<float>::quiet_NaN();
  auto y_nan = attention_reference(q_nan, k.detach(), v.detach(), {}, AttentionMasks{}, 0.5);
  EXPECT_TRUE(torch::isnan(y_nan[0][2][1]).all().item<bool>()) << y_nan[0][2][1];
}

// got and want agree in where they are NaN, and within tolerance (relative to want's largest
// finite entry) elsewhere.
void expect_same_nans(const at::Tensor& got, const at::Tensor& want, double tolerance,
                      const std::string& what) {
  auto got_nan = torch::isnan(got), want_nan = torch::isnan(want);
  EXPECT_TRUE(torch::equal(got_nan, want_nan))
      << what << ": NaN at " << got_nan.sum().item<int64_t>() << " entries, the reference at "
      << want_nan.sum().item<int64_t>();
  auto finite = ~(got_nan | want_nan);
  if (!finite.any().item<bool>()) return;
  auto g = got.masked_select(finite), w = want.masked_select(finite);
  EXPECT_LT(max_abs_diff(g, w), tolerance * std::max(1.0, w.abs().max().item<double>())) << what;
}

// A NaN anywhere in a row's scores (q, k, the bias table; inf - inf after a +inf score) gives
// that row NaN, a NaN in v NaN in its columns, as attention_reference and its autograd; a row
// whose keys are all masked stays 0. Key counts 1, 17, 100, 129 (panel and block tails), query
// rows that take MKL's products (8-wide values) and the CPU level's own micro-kernels (16-wide,
// Nq >= 32), causal or not: run at every level by unit_cpu_* and unit_attention_gemm_*.
TEST(AttentionFusedEdges, NonFiniteScoresGiveTheReferencesNans) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  enum class Where { kQ, kK, kV, kTableNan, kTableInf };
  const int64_t b = 2, h = 3, d = 16, buckets = 8;
  for (int64_t nk : {1, 17, 100, 129}) {
    for (int64_t nq : {nk, int64_t{40}}) {
      for (int64_t dv : {8, 16}) {
        for (bool causal : {false, true}) {
          for (auto where : {Where::kQ, Where::kK, Where::kV, Where::kTableNan, Where::kTableInf}) {
            if (where == Where::kV && causal) continue;  // a masked key's v: skipped vs 0 * NaN
            torch::manual_seed(nq * 1000 + nk);
            auto q = torch::randn({b, nq, h, d}), k = torch::randn({b, nk, h, d});
            auto v = torch::randn({b, nk, h, dv}), table = torch::randn({buckets, h});
            const int64_t i = causal ? nq - 1 : nq / 2, j = nk / 2;  // row i sees key j
            if (where == Where::kQ) q[1][i][1][3] = kNan;
            if (where == Where::kK) k[1][j][1][3] = kNan;
            if (where == Where::kV) v[1][j][1][3] = kNan;
            if (where == Where::kTableNan) table.select(1, 1).fill_(kNan);
            if (where == Where::kTableInf) table.select(1, 1).fill_(kInf);
            for (auto* t : {&q, &k, &v, &table}) t->requires_grad_(true);
            auto spec = spec_for(Form::kT5Bidirectional, h, table);
            auto pk = torch::arange(nk, torch::kFloat64);
            auto pq = torch::arange(nq, torch::kFloat64) + static_cast<double>(nk - nq);
            AttentionMasks masks;
            masks.causal = causal;
            const std::string what = "nq=" + std::to_string(nq) + " nk=" + std::to_string(nk) +
                                     " dv=" + std::to_string(dv) +
                                     " causal=" + std::to_string(causal) + " case " +
                                     std::to_string(static_cast<int>(where));
            auto fused = attention_fused(q, k, v, spec, pq, pk, masks, 0.25);
            auto reference =
                attention_reference(q, k, v, bias_from_spec(spec, pq, pk, h), masks, 0.25);
            EXPECT_TRUE(torch::isnan(reference).any().item<bool>()) << what;
            expect_same_nans(fused, reference, kForwardTolerance, what);
            auto probe = torch::randn_like(reference);
            auto gf = torch::autograd::grad({(fused * probe).sum()}, {q, k, v, table});
            auto gr = torch::autograd::grad({(reference * probe).sum()}, {q, k, v, table});
            for (size_t g = 0; g < gf.size(); ++g)
              expect_same_nans(gf[g], gr[g], kGradientTolerance,
                               what + " gradient " + std::to_string(g));
          }
        }
      }
    }
  }
}

TEST(AttentionFusedLayer, LayerUsesFusedPathAndMatchesMaterialized) {
  torch::manual_seed(22);
  for (auto encoder :
       {as_encoding(Alibi(AlibiOptions(4))), as_encoding(T5(T5Options(4).init_std(1.0))),
        as_encoding(Rope(RopeOptions(8))), as_encoding(Nope()),
        as_encoding(Shaw(ShawOptions(8).max_relative_position(5).init_std(0.5)))}) {
    SelfAttention fused(AttentionOptions(32, 4).causal(true), encoder);
    SelfAttention materialized(AttentionOptions(32, 4).causal(true).fused(false), encoder);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < fused->parameters().size(); ++i)
        materialized->parameters()[i].copy_(fused->parameters()[i]);
    }
    auto x = torch::randn({2, 50, 32});
    auto p = Positions::sequence(50);
    EXPECT_LT(max_abs_diff(fused->forward(x, p), materialized->forward(x, p)), kForwardTolerance)
        << encoder->type();
  }
}

// The library's fused attention is the dispatcher's operator: attention_fused (and the layers)
// reach posenc::attention_fused through c10::Dispatcher, whose Autograd kernel runs the forward
// and backward operators, each with a CPU kernel (and a CUDA one where the LibTorch has CUDA).
TEST(AttentionOperator, TheLibraryCallsTheOperatorsThroughTheDispatcher) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name : {"posenc::attention_fused", "posenc::_attention_fused_forward",
                           "posenc::_attention_fused_backward"}) {
    auto op = dispatcher.findSchema({name, ""});
    ASSERT_TRUE(op.has_value()) << name;
    EXPECT_TRUE(op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) << name;
  }
  EXPECT_TRUE(dispatcher.findSchema({"posenc::attention_fused", ""})
                  ->hasKernelForDispatchKey(c10::DispatchKey::Autograd));
  torch::manual_seed(5);
  const int64_t h = 2, d = 8;
  auto q = torch::randn({2, 5, h, d}, torch::requires_grad());
  auto k = torch::randn({2, 7, h, d}, torch::requires_grad());
  auto v = torch::randn({2, 7, h, d}, torch::requires_grad());
  auto pq = torch::arange(2, 7, torch::kFloat64), pk = torch::arange(7, torch::kFloat64);
  auto spec = spec_for(Form::kAlibiCausal, h, torch::randn({8, h}));
  AttentionRotary rotary;
  auto inv = torch::rand({2}, torch::kFloat64);
  std::tie(rotary.q_cos, rotary.q_sin) = rope_cos_sin(pq, inv);
  std::tie(rotary.k_cos, rotary.k_sin) = rope_cos_sin(pk, inv);
  auto& seen = test::posenc_calls();
  seen.clear();
  auto handle = test::watch_posenc_calls();
  auto out = attention_fused(q, k, v, spec, pq, pk, {}, 0.5, rotary);
  out.square().sum().backward();
  at::removeCallback(handle);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen.front(), "posenc::attention_fused");
  EXPECT_NE(std::find(seen.begin(), seen.end(), "posenc::_attention_fused_forward"), seen.end());
  EXPECT_NE(std::find(seen.begin(), seen.end(), "posenc::_attention_fused_backward"), seen.end());
  // the same numbers as the specification: rotate, materialize the bias, attend
  auto qr = rope_apply(q, rotary.q_cos, rotary.q_sin, RopeLayout::kHalf);
  auto kr = rope_apply(k, rotary.k_cos, rotary.k_sin, RopeLayout::kHalf);
  auto want = attention_reference(qr, kr, v, bias_from_spec(spec, pq, pk, h), {}, 0.5);
  EXPECT_LT(max_abs_diff(out, want), 1e-5);
  auto grads = torch::autograd::grad({want.square().sum()}, {q, k, v});
  EXPECT_LT(max_abs_diff(q.grad(), grads[0]), 1e-4);
  EXPECT_LT(max_abs_diff(k.grad(), grads[1]), 1e-4);
  EXPECT_LT(max_abs_diff(v.grad(), grads[2]), 1e-4);
}

TEST(AttentionFusedErrors, UnsupportedAndMismatched) {
  auto q = torch::randn({1, 4, 2, 8});
  BiasSpec shaw;
  shaw.form = BiasForm::kRelativeTable;
  shaw.max_relative_position = 2;
  shaw.table = torch::zeros({4, 8});
  auto p = torch::arange(4, torch::kFloat64);
  EXPECT_FALSE(attention_fused_supported(shaw, q, p + 0.5, p));  // clip() needs integer offsets
  auto table_message = test::error_of([&] { attention_fused(q, q, q, shaw, p, p, {}, 1.0); });
  EXPECT_NE(table_message.find("must be [2K+1, D] = [5, 8], got [4, 8]"), std::string::npos)
      << table_message;
  BiasSpec t5;
  t5.form = BiasForm::kBucketTable;
  EXPECT_FALSE(attention_fused_supported(t5, q, p + 0.5, p));  // buckets need integer positions
  BiasSpec alibi;
  alibi.form = BiasForm::kAlibi;
  alibi.slopes = torch::ones({3});
  auto message = test::error_of([&] { attention_fused(q, q, q, alibi, p, p, {}, 1.0); });
  EXPECT_NE(message.find("3 ALiBi slopes for 2 heads"), std::string::npos) << message;
}

}  // namespace
}  // namespace posenc
