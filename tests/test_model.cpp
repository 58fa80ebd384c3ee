// The model layer (posenc/nn/transformer.h, models.h): incremental decoding with a key-value
// cache equals the full forward pass for every way into attention (additive, rotary, fused and
// materialized biases); prefix tokens stay unpositioned (RoPE's relative invariance holds with a
// CLS token); a shared encoder's parameters are listed once; masked inputs cannot leak.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

// fp32 sums over a few layers: incremental vs full differ by rounding only.
constexpr double kCacheTolerance = 2e-5;

PositionalEncoding encoder_of(const std::string& json, int64_t dim, int64_t heads) {
  ModelContext context;
  context.dim = dim;
  context.num_heads = heads;
  return build_encoder(nlohmann::json::parse(json), context);
}

class CacheTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CacheTest, IncrementalDecodingEqualsFullForward) {
  torch::manual_seed(0);
  TransformerOptions t(32, 4, 2);
  t.mlp_ratio(2);
  LanguageModel model(LanguageModelOptions(t), encoder_of(GetParam(), 32, 4));
  model->eval();
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(256, {2, 12}, torch::kLong);
  auto full = model(tokens, Positions::sequence(12));  // [2, 12, 256]
  std::vector<KVCache> caches;
  auto first = model->forward(tokens.narrow(1, 0, 5), Positions::sequence(5), &caches);
  EXPECT_LT(test::max_abs_diff(first, full.narrow(1, 0, 5)), kCacheTolerance);
  for (int64_t i = 5; i < 12; ++i) {
    auto step = model->forward(tokens.narrow(1, i, 1), Positions::sequence(1, i), &caches);
    EXPECT_LT(test::max_abs_diff(step, full.narrow(1, i, 1)), kCacheTolerance) << "token " << i;
  }
  EXPECT_EQ(caches.size(), 2u);
  EXPECT_EQ(caches[0].size(), 12);
}

INSTANTIATE_TEST_SUITE_P(
    Encoders, CacheTest,
    ::testing::Values(R"({"type": "nope"})", R"({"type": "sinusoidal"})",
                      R"({"type": "learned", "max_positions": 16})",
                      R"({"type": "rope", "layout": "half"})", R"({"type": "alibi"})",
                      R"({"type": "t5", "num_buckets": 8, "max_distance": 16})",
                      R"({"type": "shaw", "max_relative_position": 4})"));

TEST(Model, GenerateMatchesGreedyWithoutCache) {
  torch::manual_seed(1);
  LanguageModel model(LanguageModelOptions(TransformerOptions(32, 2, 1)),
                      encoder_of(R"({"type": "rope"})", 32, 2));
  model->eval();
  auto prompt = torch::randint(256, {1, 6}, torch::kLong);
  auto generated = model->generate(prompt, 5);  // [1, 5]
  torch::NoGradGuard no_grad;
  auto sequence = prompt;
  for (int i = 0; i < 5; ++i) {
    auto logits = model(sequence, Positions::sequence(sequence.size(1)));
    sequence = torch::cat({sequence, logits.select(1, -1).argmax(-1, true)}, 1);
  }
  EXPECT_TRUE(torch::equal(generated, sequence.narrow(1, 6, 5)));
}

TEST(Model, PrefixTokenIsUnrotated) {
  // A prefix token skips the rotation, which is the rotation at position 0 (R(0) = I): attention
  // with a CLS prefix equals attention over the CLS placed at (0, 0) and rotated like the rest.
  torch::manual_seed(2);
  auto rope = encoder_of(
      R"({"type": "rope", "mrope_section": [4, 4], "per_axis_frequencies": true})", 32, 2);
  SelfAttention with_prefix(AttentionOptions(32, 2).num_prefix_tokens(1), rope);
  SelfAttention positioned(AttentionOptions(32, 2), rope);
  torch::NoGradGuard no_grad;
  positioned->qkv->weight.copy_(with_prefix->qkv->weight);
  positioned->qkv->bias.copy_(with_prefix->qkv->bias);
  positioned->out->weight.copy_(with_prefix->out->weight);
  positioned->out->bias.copy_(with_prefix->out->bias);
  auto x = torch::randn({2, 17, 32});
  auto grid = Positions::grid(4, 4);
  auto cls_at_origin =
      Positions(torch::cat({torch::zeros({1, 2}, torch::kFloat64), grid.coords()}), grid.axes());
  auto a = with_prefix(x, grid), b = positioned(x, cls_at_origin);
  EXPECT_LT(test::max_abs_diff(a, b), 1e-5);
  // And the classifier runs end to end with a CLS token: [B, K] logits.
  TokenClassifier model(
      TokenClassifierOptions(16, 10, TransformerOptions(32, 2, 2)).pooling(Pooling::kCls), rope);
  EXPECT_EQ(model(torch::randn({3, 16, 16}), grid).sizes(), (std::vector<int64_t>{3, 10}));
}

TEST(Model, SharedEncoderParametersListedOnce) {
  auto t5 = encoder_of(R"({"type": "t5", "num_buckets": 8})", 32, 4);
  Transformer stack(TransformerOptions(32, 4, 3), t5);
  int64_t t5_tables = 0;
  for (const auto& item : stack->named_parameters()) {
    if (item.value().is_same(t5->parameters().front())) ++t5_tables;
  }
  EXPECT_EQ(t5_tables, 1);
}

TEST(Model, ForecasterIgnoresValuesOfUnobservedSlots) {
  torch::manual_seed(3);
  Forecaster model(ForecasterOptions(2, TransformerOptions(16, 2, 1)),
                   encoder_of(R"({"type": "rope"})", 16, 2));
  model->eval();
  torch::NoGradGuard no_grad;
  auto values = torch::randn({2, 8, 2});
  auto observed = torch::arange(8).lt(6).expand({2, 8});
  auto positions =
      Positions(torch::tensor({0.0, 1.0, 2.0, 5.0, 6.0, 7.0, 9.0, 12.0}).view({8, 1}), {"time"});
  auto a = model(values, observed, positions);
  auto changed = values.clone();
  changed.narrow(1, 6, 2).fill_(100.0);
  EXPECT_EQ(a.sizes(), values.sizes());
  EXPECT_LT(test::max_abs_diff(a, model(changed, observed, positions)), 1e-6);
  EXPECT_GT(test::max_abs_diff(a, model(values, observed, Positions::sequence(8, 0, "time"))),
            1e-4);  // the timestamps matter
}

TEST(Model, MatcherIgnoresPaddedBytes) {
  torch::manual_seed(4);
  TextVideoMatcher model(TextVideoMatcherOptions(8, TransformerOptions(16, 2, 1)),
                         encoder_of(R"({"type": "rope", "mrope_section": [1, 1, 2]})", 16, 2));
  model->eval();
  torch::NoGradGuard no_grad;
  MatchInput in;
  in.video = torch::randn({2, 8, 8});
  in.video_positions = Positions::volume(2, 2, 2);
  in.text = torch::randint(256, {2, 6}, torch::kLong);
  in.text_padding = torch::arange(6).lt(4).expand({2, 6}).contiguous();
  in.text_positions = Positions::sequence(6);
  in.stream_positions = build_stream({Segment::video(2, 2, 2), Segment::text(6)}).positions;
  auto a = model(in);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2}));
  in.text.narrow(1, 4, 2).fill_(7);
  EXPECT_LT(test::max_abs_diff(a, model(in)), 1e-5);
}

// A compose encoder with per-modality parts inside the matcher: the stream's token kinds reach the
// plan (video then text), so the text part adds to the text tokens only.
TEST(Model, MatcherTakesPerModalityComposeParts) {
  torch::manual_seed(4);
  const char* config = R"({"type": "compose", "encoders": [
      {"type": "rope", "mrope_section": [1, 1, 2]},
      {"type": "sinusoidal", "modality": "text", "axes": ["t"], "base": 100},
      {"type": "axial_sincos", "modality": "video", "num_axes": 3}]})";
  TextVideoMatcher model(TextVideoMatcherOptions(8, TransformerOptions(24, 3, 1)),
                         encoder_of(config, 24, 3));
  MatchInput in;
  in.video = torch::randn({2, 8, 8});
  in.video_positions = Positions::volume(2, 2, 2);
  in.text = torch::randint(256, {2, 6}, torch::kLong);
  in.text_positions = Positions::sequence(6);
  in.stream_positions = build_stream({Segment::video(2, 2, 2), Segment::text(6)}).positions;
  auto a = model(in);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2}));
  EXPECT_TRUE(torch::isfinite(a).all().item<bool>());
  // wrong kinds are an error, not a silent misassignment
  in.stream_kinds.assign(3, SegmentKind::kText);
  EXPECT_NE(test::error_of([&] { model(in); }).find("token kinds for 14 tokens"),
            std::string::npos);
}

// The stream classifier (experiment 8) gathers each modality's tokens into the layout's order.
// NoPE + mean pooling cannot see order, so the time-aligned layout (video and audio interleaved in
// chunks, markers around them) and the sequential one give the same logits iff every input token
// lands in the stream exactly once; with M-RoPE the two layouts differ. Padded bytes are ignored.
TEST(Model, StreamClassifierGathersTheLayoutsTokens) {
  auto omni = StreamOptions::qwen2_5_omni();
  omni.spatial_merge_size = 1;
  // 6 frames at 1 s each: 3 chunks of 2 s, each 2 frames then 50 audio tokens (150 in all)
  auto aligned =
      build_stream({Segment::video_with_audio(6, 2, 2, 1.0, 150), Segment::text(5)}, omni);
  auto sequential =
      build_stream({Segment::video(6, 2, 2, 1.0), Segment::audio(150), Segment::text(5)}, omni);
  ASSERT_EQ(aligned.kinds.size(), sequential.kinds.size());
  EXPECT_EQ(aligned.kinds[0], SegmentKind::kVisionBos);
  EXPECT_EQ(aligned.kinds[10], SegmentKind::kAudio);  // 2 markers, 2 frames x 4 tubelets, audio
  StreamInput in;
  in.video = torch::randn({2, 24, 8});
  in.audio = torch::randn({2, 150, 12});
  in.text = torch::randint(256, {2, 5}, torch::kLong);
  in.text_padding = torch::arange(5).lt(3).expand({2, 5}).contiguous();
  auto run = [&](StreamClassifier& model, const StreamLayout& layout) {
    in.kinds = layout.kinds;
    in.positions = layout.positions;
    return model(in);
  };
  torch::NoGradGuard no_grad;
  torch::manual_seed(5);
  StreamClassifier nope(StreamClassifierOptions(8, 12, 3, TransformerOptions(16, 2, 1)),
                        as_encoding(Nope()));
  nope->eval();
  auto a = run(nope, aligned);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_LT(test::max_abs_diff(a, run(nope, sequential)), 1e-5);
  torch::manual_seed(5);
  StreamClassifier rope(StreamClassifierOptions(8, 12, 3, TransformerOptions(24, 2, 1)),
                        encoder_of(R"({"type": "rope", "mrope_section": [2, 2, 2]})", 24, 2));
  rope->eval();
  auto b = run(rope, aligned);
  EXPECT_GT(test::max_abs_diff(b, run(rope, sequential)), 1e-4);
  in.text.narrow(1, 3, 2).fill_(9);  // padded bytes
  EXPECT_LT(test::max_abs_diff(b, run(rope, aligned)), 1e-5);
  // a layout that does not match the inputs is an error naming both counts
  in.audio = torch::randn({2, 149, 12});
  auto message = test::error_of([&] { run(rope, aligned); });
  EXPECT_NE(message.find("the stream holds 24 video, 150 audio and 5 text tokens, the inputs 24, "
                         "149 and 5"),
            std::string::npos)
      << message;
  in.audio = torch::randn({2, 150, 12});
  in.kinds = build_stream({Segment::padding(2), Segment::text(1)}).kinds;
  in.positions = Positions::sequence(3);
  message = test::error_of([&] { rope(in); });
  EXPECT_NE(message.find("stream token 0 is 'padding'"), std::string::npos) << message;
}

TEST(Model, BadShapesNameExpectedAndActual) {
  TokenClassifier model(TokenClassifierOptions(16, 10, TransformerOptions(32, 2, 1)),
                        as_encoding(Nope()));
  auto message = test::error_of([&] { model(torch::randn({1, 4, 12}), Positions::grid(2, 2)); });
  EXPECT_NE(message.find("tokens must be [B, N, 16], got [1, 4, 12]"), std::string::npos)
      << message;
  message = test::error_of([&] { model(torch::randn({1, 4, 16}), Positions::grid(3, 3)); });
  EXPECT_NE(message.find("4 positions are needed, but 9 were given"), std::string::npos) << message;
}

// The attention temperature (issue #12): τ by the formula on a hand-built case; every attention
// path (SDPA, the short kernel with RoPE inside, the fused kernel with a bias or padding, the
// materialized reference) gives the same output; incremental decoding with a cache equals the
// full pass (the cached keys count in n_i); below the training length logn changes nothing.
struct TemperatureCase {
  std::string encoder;
  AttentionTemperature temperature;
  bool causal, padding;
  int64_t n;
};

class TemperatureTest : public ::testing::TestWithParam<TemperatureCase> {};

TEST_P(TemperatureTest, EveryPathAgreesWithTheMaterializedReference) {
  const auto& c = GetParam();
  torch::manual_seed(3);
  auto encoder = encoder_of(c.encoder, 32, 4);
  auto options = AttentionOptions(32, 4).causal(c.causal).temperature(c.temperature).logn_length(4);
  SelfAttention fused(options, encoder), reference(AttentionOptions(options).fused(false), encoder);
  torch::NoGradGuard no_grad;
  if (fused->temperature.defined()) fused->temperature.uniform_(-0.5, 0.5);  // τ away from 1
  auto copy_into = [](SelfAttention& from, SelfAttention& to) {
    auto source = from->named_parameters();
    for (auto& item : to->named_parameters()) item.value().copy_(source[item.key()]);
  };
  copy_into(fused, reference);
  auto x = torch::randn({2, c.n, 32});
  at::Tensor padding;
  if (c.padding) {
    padding = torch::ones({2, c.n}, torch::kBool);
    padding[1].narrow(0, c.n - 2, 2).fill_(false);
  }
  auto positions = Positions::sequence(c.n);
  auto a = fused(x, positions, padding), b = reference(x, positions, padding);
  EXPECT_LT(test::max_abs_diff(a, b), 2e-5);
  auto plain =
      SelfAttention(AttentionOptions(options).temperature(AttentionTemperature::kNone), encoder);
  copy_into(reference, plain);
  EXPECT_GT(test::max_abs_diff(plain(x, positions, padding), b), 1e-4);  // τ did something
}

INSTANTIATE_TEST_SUITE_P(
    Paths, TemperatureTest,
    ::testing::Values(
        TemperatureCase{R"({"type": "nope"})", AttentionTemperature::kLogN, true, false, 24},
        TemperatureCase{R"({"type": "rope"})", AttentionTemperature::kLogN, false, false, 9},
        TemperatureCase{R"({"type": "rope"})", AttentionTemperature::kLearned, false, false, 9},
        TemperatureCase{R"({"type": "alibi"})", AttentionTemperature::kLogN, true, false, 24},
        TemperatureCase{R"({"type": "t5", "num_buckets": 8, "max_distance": 16})",
                        AttentionTemperature::kLearned, true, false, 24},
        TemperatureCase{R"({"type": "rope"})", AttentionTemperature::kLogN, true, true, 24},
        TemperatureCase{R"({"type": "nope"})", AttentionTemperature::kLearned, true, false, 24}));

TEST(Temperature, LognByHand) {
  // causal, L = 2: query i (1-based) sees i keys, τ_i = max(1, log i / log 2) = 1, 1, log2(3), 2
  AttentionOptions causal(8, 2);
  causal.causal(true).temperature(AttentionTemperature::kLogN).logn_length(2);
  auto tau = attention_temperature(causal, 0, 4, 4, {}, torch::kFloat).flatten();
  auto expected = torch::tensor({1.0f, 1.0f, static_cast<float>(std::log2(3.0)), 2.0f});
  EXPECT_TRUE(torch::allclose(tau, expected)) << tau;
  // with 5 cached keys the new query is the 6th: log2(6)
  auto later = attention_temperature(causal, 5, 1, 6, {}, torch::kFloat).flatten();
  EXPECT_NEAR(later.item<float>(), std::log2(6.0), 1e-6);
  // not causal: every query sees all 8 keys: log 8 / log 2 = 3
  AttentionOptions full = causal;
  full.causal(false);
  auto all = attention_temperature(full, 0, 8, 8, {}, torch::kFloat).flatten();
  EXPECT_TRUE(torch::allclose(all, torch::full({8}, 3.0f)));
  // learned: exp(t) per head
  AttentionOptions learned(8, 2);
  learned.temperature(AttentionTemperature::kLearned);
  auto per_head =
      attention_temperature(learned, 0, 3, 3, torch::tensor({0.0f, std::log(2.0f)}), torch::kFloat);
  EXPECT_EQ(per_head.sizes(), (std::vector<int64_t>{1, 1, 2, 1}));
  EXPECT_TRUE(torch::allclose(per_head.flatten(), torch::tensor({1.0f, 2.0f})));
  // the materialized logits by hand: one head, q k^T / sqrt(Dh) * τ_i, softmax, v, out
  torch::manual_seed(5);
  SelfAttention attention(AttentionOptions(4, 1)
                              .causal(true)
                              .fused(false)
                              .temperature(AttentionTemperature::kLogN)
                              .logn_length(2),
                          as_encoding(Nope()));
  torch::NoGradGuard no_grad;
  auto x = torch::randn({1, 4, 4});
  auto qkv = attention->qkv(x).view({4, 3, 4});
  auto q = qkv.select(1, 0), k = qkv.select(1, 1), v = qkv.select(1, 2);
  auto logits = q.matmul(k.t()) / 2.0 * expected.view({4, 1});
  logits = logits.masked_fill(torch::ones({4, 4}, torch::kBool).triu(1), -INFINITY);
  auto by_hand = attention->out(torch::softmax(logits, -1).matmul(v)).unsqueeze(0);
  EXPECT_LT(test::max_abs_diff(attention(x, Positions::sequence(4)), by_hand), 1e-6);
}

TEST(Temperature, CachedDecodingAndShortContexts) {
  torch::manual_seed(2);
  TransformerOptions t(32, 4, 2);
  t.mlp_ratio(2).temperature(AttentionTemperature::kLogN).logn_length(4);
  LanguageModel model(LanguageModelOptions(t), encoder_of(R"({"type": "rope"})", 32, 4));
  model->eval();
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(256, {1, 10}, torch::kLong);
  auto full = model(tokens, Positions::sequence(10));
  std::vector<KVCache> caches;
  model->forward(tokens.narrow(1, 0, 3), Positions::sequence(3), &caches);
  for (int64_t i = 3; i < 10; ++i) {
    auto step = model->forward(tokens.narrow(1, i, 1), Positions::sequence(1, i), &caches);
    EXPECT_LT(test::max_abs_diff(step, full.narrow(1, i, 1)), kCacheTolerance) << i;
  }
  // up to the training length (4 tokens) logn is the identity
  TransformerOptions plain_options = t;
  plain_options.temperature(AttentionTemperature::kNone);
  LanguageModel plain(LanguageModelOptions(plain_options),
                      encoder_of(R"({"type": "rope"})", 32, 4));
  plain->eval();
  auto source = model->named_parameters();
  for (auto& item : plain->named_parameters()) item.value().copy_(source[item.key()]);
  EXPECT_LT(test::max_abs_diff(plain(tokens.narrow(1, 0, 4), Positions::sequence(4)),
                               full.narrow(1, 0, 4)),
            1e-6);
  EXPECT_GT(test::max_abs_diff(plain(tokens, Positions::sequence(10)), full), 1e-4);
}

}  // namespace
}  // namespace posenc
