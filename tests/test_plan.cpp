// The position plan (posenc/core/plan.h): built once per forward, composition through it
// (RoPE + ALiBi checked against rotating and biasing by hand through attention_reference,
// ALiBi + T5 fused in one kernel call against the materialized sum), per-modality parts on a
// mixed stream, adaptation through the interface, and the errors of a bad composite.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "posenc/config/registry.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using nlohmann::json;
using test::error_of;
using test::max_abs_diff;

// Fused (float32) vs the float64 reference path: accumulation-order differences only.
constexpr double kFusedTolerance = 2e-5;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A RoPE that counts how often it is compiled into a plan.
class CountingRopeImpl : public RopeImpl {
 public:
  using RopeImpl::RopeImpl;
  void contribute(EncodingPlan& plan, const PlanRequest& request) override {
    ++calls;
    RopeImpl::contribute(plan, request);
  }
  int calls = 0;
};
TORCH_MODULE(CountingRope);

TEST(Plan, BuiltOncePerForward) {
  CountingRope rope(RopeOptions(8));
  Transformer stack(TransformerOptions(16, 2, 4).causal(true), as_encoding(rope));
  auto x = torch::randn({2, 12, 16});
  stack->forward(x, Positions::sequence(12));
  EXPECT_EQ(rope->calls, 1);  // 4 blocks, one plan
  // decoding with a cache: one plan per step, for the new token only
  std::vector<KVCache> caches;
  stack->forward(x.narrow(1, 0, 5), Positions::sequence(5), {}, &caches);
  for (int64_t i = 5; i < 8; ++i)
    stack->forward(x.narrow(1, i, 1), Positions::sequence(1, static_cast<double>(i)), {}, &caches);
  EXPECT_EQ(rope->calls, 1 + 1 + 3);
  EXPECT_EQ(caches[0].positions.size(), 8);
}

TEST(Plan, HoldsWhatEachPartContributes) {
  auto compose = build_encoder(
      json{{"type", "compose"},
           {"encoders", {{{"type", "rope"}}, {{"type", "alibi"}}, {{"type", "sinusoidal"}}}}},
      {16, 2, 0});
  auto plan = compose->plan(Positions::sequence(6));
  ASSERT_EQ(plan.parts().size(), 3u);
  EXPECT_EQ(plan.parts()[0].role, "rotary");
  EXPECT_EQ(plan.parts()[1].role, "bias (alibi)");
  EXPECT_EQ(plan.parts()[2].role, "additive");
  EXPECT_TRUE(plan.has_rotary() && plan.has_bias() && plan.has_additive());
  EXPECT_TRUE(plan.bias_describable());
  EXPECT_EQ(plan.rotary().q_cos.sizes(), (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(plan.embedding().sizes(), (std::vector<int64_t>{6, 16}));
  // the plan's pieces are exactly what each encoder computes alone
  Sinusoidal sinusoidal(SinusoidalOptions(16));
  auto x = torch::zeros({6, 16});
  EXPECT_LT(max_abs_diff(plan.apply_additive(x), sinusoidal->add(x, Positions::sequence(6))), 1e-7);
  Alibi alibi(AlibiOptions(2));
  EXPECT_LT(max_abs_diff(plan.materialize_bias(2),
                         alibi->bias(Positions::sequence(6), Positions::sequence(6))),
            1e-7);
}

// The attention of a RoPE + ALiBi composite, by hand: q, k rotated by RoPE alone, the ALiBi bias
// added, through the plain-ATen reference.
at::Tensor attention_by_hand(SelfAttention& attention, const at::Tensor& x,
                             const Positions& positions, Rope& rope, Alibi& alibi) {
  const int64_t b = x.size(0), n = x.size(1), h = 2, dh = 8;
  auto parts = attention->qkv->forward(x).view({b, n, 3, h, dh}).unbind(2);
  auto [q, k] = rope->rotate(parts[0], parts[1], positions, positions);
  AttentionMasks masks;
  masks.causal = true;
  auto y = attention_reference(q, k, parts[2], alibi->bias(positions, positions), masks,
                               1.0 / std::sqrt(static_cast<double>(dh)));
  return attention->out->forward(y.reshape({b, n, h * dh}));
}

TEST(Plan, RopePlusAlibiEqualsRotatingThenBiasingByHand) {
  for (bool fused : {true, false}) {
    torch::manual_seed(3);
    Rope rope(RopeOptions(8));
    Alibi alibi(AlibiOptions(2));
    Compose compose(
        std::vector<ComposePart>{{as_encoding(rope), {}, {}}, {as_encoding(alibi), {}, {}}});
    SelfAttention attention(AttentionOptions(16, 2).causal(true).fused(fused),
                            as_encoding(compose));
    auto x = torch::randn({2, 9, 16}, torch::requires_grad());
    auto positions = Positions::sequence(9);
    auto probe = torch::randn({2, 9, 16});
    auto got = attention->forward(x, positions);
    (got * probe).sum().backward();
    auto got_dx = x.grad().clone();
    auto got_dw = attention->qkv->weight.grad().clone();
    x.mutable_grad().reset();
    attention->qkv->weight.mutable_grad().reset();
    auto want = attention_by_hand(attention, x, positions, rope, alibi);
    (want * probe).sum().backward();
    SCOPED_TRACE(fused ? "fused" : "materialized");
    EXPECT_LT(max_abs_diff(got, want), kFusedTolerance);
    EXPECT_LT(max_abs_diff(got_dx, x.grad()), kFusedTolerance);
    EXPECT_LT(max_abs_diff(got_dw, attention->qkv->weight.grad()), kFusedTolerance);
  }
}

TEST(Plan, AlibiPlusT5FusedInOneCallMatchesTheMaterializedSum) {
  torch::manual_seed(5);
  Alibi alibi(AlibiOptions(4));
  T5 t5(T5Options(4).num_buckets(16).max_distance(32));
  auto p = Positions::sequence(37);
  auto parts = std::vector<BiasSpec>{alibi->bias_spec(), t5->bias_spec()};
  auto prepared = fused_bias(parts, p.axis(0), p.axis(0));
  EXPECT_TRUE(prepared->alibi);
  EXPECT_EQ(prepared->table.form, BiasForm::kBucketTable);
  auto q = torch::randn({2, 37, 4, 8}, torch::requires_grad());
  auto k = torch::randn({2, 37, 4, 8}, torch::requires_grad());
  auto v = torch::randn({2, 37, 4, 8}, torch::requires_grad());
  ASSERT_TRUE(attention_fused_supported(*prepared, q));
  AttentionMasks masks;
  masks.causal = true;
  auto probe = torch::randn({2, 37, 4, 8});
  auto got = attention_fused(q, k, v, prepared, masks, 0.35);
  (got * probe).sum().backward();
  auto got_dq = q.grad().clone();
  auto got_dtable = t5->weight.grad().clone();
  q.mutable_grad().reset();
  t5->weight.mutable_grad().reset();
  auto bias = alibi->bias(p, p) + t5->bias(p, p);  // [H, N, N]
  auto want = attention_reference(q, k, v, bias, masks, 0.35);
  (want * probe).sum().backward();
  EXPECT_LT(max_abs_diff(got, want), kFusedTolerance);
  EXPECT_LT(max_abs_diff(got_dq, q.grad()), kFusedTolerance);
  EXPECT_LT(max_abs_diff(got_dtable, t5->weight.grad()), kFusedTolerance);
}

TEST(Plan, WhatOneKernelCannotTakeIsRecorded) {
  T5 t5(T5Options(4));
  Shaw shaw(ShawOptions(8));
  auto p = Positions::sequence(5).axis(0);
  EXPECT_TRUE(contains(fused_bias({t5->bias_spec(), shaw->bias_spec()}, p, p)->unsupported,
                       "two table parts"));
  auto half = Positions::values({0, 0.5, 1}).axis(0);
  EXPECT_TRUE(
      contains(fused_bias({t5->bias_spec()}, half, half)->unsupported, "needs integer positions"));
  // ... and the attention then takes the materialized path, with the same result
  torch::manual_seed(2);
  auto encoder = build_encoder(
      json{{"type", "compose"}, {"encoders", {{{"type", "t5"}}, {{"type", "shaw"}}}}}, {16, 2, 0});
  SelfAttention fused(AttentionOptions(16, 2), encoder);
  SelfAttention plain(AttentionOptions(16, 2).fused(false), encoder);
  plain->qkv = fused->qkv;
  plain->out = fused->out;
  auto x = torch::randn({1, 6, 16});
  EXPECT_LT(max_abs_diff(fused->forward(x, Positions::sequence(6)),
                         plain->forward(x, Positions::sequence(6))),
            1e-6);
}

TEST(Plan, TwoRotaryPartsAreAnError) {
  auto encoder = build_encoder(
      json{{"type", "compose"},
           {"encoders", {{{"type", "rope"}, {"mrope_section", {2, 2}}}, {{"type", "rope_mixed"}}}}},
      {16, 2, 0});
  auto message = error_of([&] { encoder->plan(Positions::grid(2, 2)); });
  EXPECT_TRUE(contains(message, "two rotary parts (rope and rope_mixed)")) << message;
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "compose"}}, {16, 2, 0});
                       }),
                       "'encoders' must be a non-empty list"));
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "compose"},
                                            {"encoders", {{{"type", "rope"}, {"thetta", 1}}}}},
                                       {16, 2, 0});
                       }),
                       "compose config.encoders[0]: rope config: unknown key 'thetta'"));
}

TEST(Plan, PerModalityPartsOnAMixedStream) {
  auto layout = build_stream({Segment::text(3), Segment::video(2, 2, 2), Segment::text(2)});
  auto encoder =
      build_encoder(json{{"type", "compose"},
                         {"encoders",
                          {{{"type", "rope"}, {"mrope_section", {2, 2, 2}}},
                           {{"type", "sinusoidal"}, {"modality", "text"}, {"axes", {"t"}}},
                           {{"type", "axial_sincos"}, {"modality", "video"}, {"num_axes", 3}}}}},
                    {24, 2, 0});
  PlanRequest request(layout.positions);
  request.token_kinds = layout.kinds;
  auto plan = encoder->plan(request);
  ASSERT_EQ(plan.parts().size(), 3u);
  EXPECT_EQ(plan.parts()[1].encoder, "sinusoidal on text");
  const auto& e = plan.embedding();  // [13, 24]
  ASSERT_EQ(e.sizes(), (std::vector<int64_t>{13, 24}));
  // text rows: 1D sinusoidal at the text tokens' t coordinate; video rows: 3D sin-cos
  Sinusoidal text(SinusoidalOptions(24));
  AxialSincos video(AxialSincosOptions(24).num_axes(3));
  auto t = layout.positions.coords().select(1, 0);
  auto text_rows = torch::tensor({0, 1, 2, 11, 12});
  auto video_rows = torch::arange(3, 11);
  auto want_text =
      text->add(torch::zeros({5, 24}), Positions(t.index_select(0, text_rows).unsqueeze(1), {"t"}));
  auto want_video =
      video->add(torch::zeros({8, 24}),
                 Positions(layout.positions.coords().index_select(0, video_rows), {"t", "h", "w"}));
  EXPECT_LT(max_abs_diff(e.index_select(0, text_rows), want_text), 1e-6);
  EXPECT_LT(max_abs_diff(e.index_select(0, video_rows), want_video), 1e-6);
  // without token kinds the per-modality part says what it needs
  EXPECT_TRUE(contains(error_of([&] { encoder->plan(layout.positions); }),
                       "acts on text tokens, but the positions carry 0 token kinds"));
  // a rotary or bias encoder on one modality is refused
  auto bad = build_encoder(
      json{{"type", "compose"}, {"encoders", {{{"type", "alibi"}, {"modality", "text"}}}}},
      {24, 2, 0});
  PlanRequest text_only(Positions::sequence(3));
  text_only.token_kinds = {SegmentKind::kText, SegmentKind::kText, SegmentKind::kText};
  EXPECT_TRUE(contains(error_of([&] { bad->plan(text_only); }), "must be additive"));
}

TEST(Plan, AdaptsThroughTheInterface) {
  torch::manual_seed(1);
  Learned learned(LearnedOptions(8, 4));
  Relative2d relative(Relative2dOptions(2, 3, 3));
  Compose compose(std::vector<ComposePart>{{as_encoding(relative), {}, {}}});
  PositionalEncoding as_interface = as_encoding(learned);
  auto before = learned->weight.detach().clone();
  auto restore = as_interface->adapt({16});
  EXPECT_EQ(learned->weight.size(0), 16);
  EXPECT_NO_THROW(as_interface->add(torch::zeros({16, 4}), Positions::sequence(16)));
  restore();
  EXPECT_TRUE(torch::equal(learned->weight, before));
  EXPECT_EQ(learned->options.max_positions(), 8);
  // shorter contexts and formulas need nothing
  as_interface->adapt({4})();
  EXPECT_EQ(learned->weight.size(0), 8);
  PositionalEncoding interface = as_encoding(compose);
  auto undo = interface->adapt({5, 5});
  EXPECT_EQ(relative->options.grid_height(), 5);
  EXPECT_NO_THROW(interface->bias(Positions::grid(5, 5), Positions::grid(5, 5)));
  undo();
  EXPECT_EQ(relative->options.grid_height(), 3);
}

TEST(Plan, CompositeTrains) {
  // A copy-the-token-two-back task: only positions say which token that is.
  torch::manual_seed(0);
  auto encoder = build_encoder(
      json{{"type", "compose"}, {"encoders", {{{"type", "rope"}}, {{"type", "alibi"}}}}},
      {32, 4, 0});
  LanguageModel model(LanguageModelOptions(TransformerOptions(32, 4, 2)).vocab_size(16), encoder);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  auto loss_at = [&](bool step) {
    auto tokens = torch::randint(0, 16, {16, 24});
    auto logits = model->forward(tokens, Positions::sequence(24));
    auto loss = torch::cross_entropy_loss(logits.narrow(1, 2, 22).flatten(0, 1),
                                          tokens.narrow(1, 0, 22).flatten());
    if (step) {
      optimizer.zero_grad();
      loss.backward();
      optimizer.step();
    }
    return loss.item<double>();
  };
  const double first = loss_at(false);
  for (int i = 0; i < 150; ++i) loss_at(true);
  const double last = loss_at(false);
  EXPECT_LT(last, 0.5 * first) << "loss " << first << " -> " << last;
}

}  // namespace
}  // namespace posenc
