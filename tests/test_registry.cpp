// The registry: every type from JSON and YAML, HF rope blocks pasted as they are, and errors that
// name the unknown type (listing the known ones) or the unknown key.
#include <gtest/gtest.h>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using nlohmann::json;
using test::error_of;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Registry, BuildsEveryType) {
  const ModelContext model{64, 4, 0};
  for (const auto& type : encoder_types()) {
    if (type == "hf") continue;  // needs a model's config.json (tests/test_hf_config.cpp)
    auto config = json{{"type", type}};
    if (type == "compose") config["encoders"] = json::array({json{{"type", "rope"}}});
    auto encoder = build_encoder(config, model);
    // freq_time is a preset: a compose of a part on axis freq and a part on axis time
    EXPECT_EQ(encoder->type(), type == "freq_time" ? "compose" : type);
  }
  EXPECT_EQ(
      encoder_types(),
      (std::vector<std::string>{
          "alibi",       "axial_sincos",    "calendar",          "compose", "freq_time",   "hf",
          "learned",     "learned_grid",    "learned_spacetime", "nope",    "relative_2d", "rope",
          "rope_dinov3", "rope_fractional", "rope_mixed",        "shaw",    "sinusoidal",  "t5",
          "time2vec",    "time_sinusoidal", "variate_bias"}));
}

TEST(Registry, ContextFillsModelSizes) {
  auto rope = build_encoder(json{{"type", "rope"}}, {64, 4, 0});
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*rope).options.head_dim(), 16);
  auto t5 = build_encoder(json{{"type", "t5"}}, {64, 4, 0});
  EXPECT_EQ(dynamic_cast<T5Impl&>(*t5).options.num_heads(), 4);
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "alibi"}, {"num_heads", 8}}, {64, 4, 0});
                       }),
                       "'num_heads' is 8 in the config but the model has 4"));
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "sinusoidal"}}, {0, 1, 0});
                       }),
                       "'dim' is required"));
}

TEST(Registry, UnknownTypeListsKnownOnes) {
  EXPECT_TRUE(
      contains(error_of([] {
                 build_encoder(json{{"type", "ropee"}}, {64, 1, 0});
               }),
               "unknown type 'ropee'; known types: alibi, axial_sincos, calendar, compose, "
               "freq_time, hf, learned, "
               "learned_grid, learned_spacetime, nope, relative_2d, rope, rope_dinov3, "
               "rope_fractional, rope_mixed, shaw, sinusoidal, t5, time2vec, time_sinusoidal"));
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"base", 1}}, {64, 1, 0});
                       }),
                       "'type' is required"));
}

TEST(Registry, UnknownKeysAreNamed) {
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "rope"}, {"rope_thetta", 1e4}}, {64, 1, 0});
                       }),
                       "rope config: unknown key 'rope_thetta'"));
  // In a pasted HF block a key transformers does not read only warns (as transformers does);
  // here the typo leaves yarn without 'factor', and without the context lengths that would
  // replace it, which is an error.
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "rope"},
                                            {"rope_theta", 1e4},
                                            {"rope_scaling",
                                             {{"rope_type", "yarn"},
                                              {"original_max_position_embeddings", 4096},
                                              {"fctor", 2}}}},
                                       {64, 1, 0});
                       }),
                       "'max_position_embeddings' is not given; without 'factor'"));
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "t5"}, {"num_buckets", "many"}}, {64, 1, 0});
                       }),
                       "key 'num_buckets' must be an integer, got string \"many\""));
  EXPECT_TRUE(
      contains(error_of([] {
                 build_encoder(json{{"type", "sinusoidal"}, {"layout", "zigzag"}}, {64, 1, 0});
               }),
               "unknown layout 'zigzag'; expected one of: interleaved, concat"));
}

// The config keys users paste choose RoPE's frequency source and section map; values
// hand-derived: theta^(-2i/r) per ladder, 2 pi / period for log-spaced periods.
TEST(Registry, RopeKeysChooseFrequencySourceAndSectionMap) {
  auto options_of = [](const std::string& text) {
    auto encoder = build_encoder(parse_config(text), {});
    return dynamic_cast<RopeImpl&>(*encoder).options;
  };
  auto ladder = options_of(R"({"type": "rope", "head_dim": 8, "rope_theta": 100})");
  EXPECT_EQ(ladder.frequencies().source(), RopeFrequencySource::kLadder);
  EXPECT_TRUE(ladder.sections().sections().empty());
  // theta 100, r 8: 1, 100^-0.25, 100^-0.5, 100^-0.75
  EXPECT_TRUE(torch::allclose(
      rope_frequencies(ladder).inv_freq,
      torch::tensor({1.0, 0.31622776601683794, 0.1, 0.031622776601683794}, torch::kFloat64)));
  auto axial = options_of(
      R"({"type": "rope", "head_dim": 8, "rope_theta": 100, "mrope_section": [2, 2],
          "per_axis_frequencies": true})");
  EXPECT_EQ(axial.frequencies().source(), RopeFrequencySource::kPerAxisLadders);
  EXPECT_EQ(axial.sections().sections(), (std::vector<int64_t>{2, 2}));
  // one ladder over 2 s = 4 dims per axis: 1, 100^-0.5, 1, 100^-0.5
  EXPECT_TRUE(torch::allclose(rope_frequencies(axial).inv_freq,
                              torch::tensor({1.0, 0.1, 1.0, 0.1}, torch::kFloat64)));
  auto mrope = options_of(
      R"({"type": "rope", "head_dim": 8, "rope_scaling": {"type": "mrope", "mrope_section": [1, 3]},
          "rope_theta": 100})");
  EXPECT_EQ(mrope.frequencies().source(), RopeFrequencySource::kLadder);  // one ladder, sectioned
  EXPECT_TRUE(torch::equal(rope_frequencies(mrope).inv_freq, rope_frequencies(ladder).inv_freq));
  auto periods =
      options_of(R"({"type": "rope", "head_dim": 4, "min_period": 1, "max_period": 100})");
  EXPECT_EQ(periods.frequencies().source(), RopeFrequencySource::kPeriods);
  EXPECT_TRUE(torch::allclose(rope_frequencies(periods).inv_freq,
                              torch::tensor({2 * M_PI, 2 * M_PI / 100}, torch::kFloat64)));
  // A key of another source is an error, never ignored.
  EXPECT_TRUE(contains(error_of([&] {
                         options_of(R"({"type": "rope", "head_dim": 4, "min_period": 1,
                                        "max_period": 100, "rope_theta": 500})");
                       }),
                       "rope_theta (500) would be ignored"));
  EXPECT_TRUE(contains(error_of([&] {
                         options_of(R"({"type": "rope", "head_dim": 8, "min_period": 1,
                                        "max_period": 9, "mrope_section": [2, 2],
                                        "per_axis_frequencies": true})");
                       }),
                       "two frequency sources; give one"));
  EXPECT_TRUE(
      contains(error_of([&] {
                 options_of(R"({"type": "rope", "head_dim": 8, "per_axis_frequencies": true})");
               }),
               "per_axis_frequencies deals one ladder per section; it needs mrope_section"));
  EXPECT_TRUE(contains(error_of([&] {
                         options_of(R"({"type": "rope", "head_dim": 4, "min_period": 1,
                                        "max_period": 9, "rope_type": "linear", "factor": 2})");
                       }),
                       "rope_type must be default, got linear"));
}

TEST(Registry, PastedHfBlocks) {
  // Llama 3.1's config.json rope_scaling block, as it is.
  auto llama = parse_config(R"({"type": "rope", "head_dim": 128, "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"}})");
  auto rope = build_encoder(llama, {});
  auto& options = dynamic_cast<RopeImpl&>(*rope).options;
  EXPECT_EQ(options.frequencies().scaling().rope_type(), RopeScaling::kLlama3);
  EXPECT_EQ(options.frequencies().scaling().original_max_position_embeddings(), 8192);
  // DeepSeek-V3's legacy block says "type".
  auto deepseek = build_encoder(json{{"type", "rope"},
                                     {"head_dim", 64},
                                     {"rope_theta", 10000.0},
                                     {"rope_scaling",
                                      {{"type", "yarn"},
                                       {"factor", 40},
                                       {"mscale", 1.0},
                                       {"mscale_all_dim", 1.0},
                                       {"original_max_position_embeddings", 4096},
                                       {"beta_fast", 32},
                                       {"beta_slow", 1}}}},
                                {});
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*deepseek).frequencies().attention_scaling, 1.0);
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(json{{"type", "rope"},
                                            {"factor", 2},
                                            {"rope_scaling", {{"type", "linear"}, {"factor", 4}}}},
                                       {64, 1, 0});
                       }),
                       "'factor' is given both at the top level and in 'rope_scaling'"));
}

// Hostile config text: one clear error each, never a crash, a hang or the last of two keys.
TEST(Registry, ConfigTextLimits) {
  // 100000-deep nesting (a stack overflow before the depth check existed)
  const std::string deep = "{\"type\":\"rope\",\"head_dim\":" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  EXPECT_TRUE(contains(error_of([&] { parse_config(deep, "d.json"); }),
                       "d.json: nested 100001 levels deep; configs are limited to 64 levels"));
  EXPECT_TRUE(contains(error_of([&] {
                         parse_config("a: " + std::string(5000, '[') + "1" + std::string(5000, ']'),
                                      "d.yaml");
                       }),
                       "the config depth limit"));
  // "billion laughs": nested aliases expand exponentially
  std::string laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'j'; ++c)
    laughs += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ", *" + char(c - 1) + ", *" +
              char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) +
              ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + ", *" +
              char(c - 1) + "]\n";
  EXPECT_TRUE(contains(error_of([&] { parse_config(laughs, "laughs.yaml"); }),
                       "laughs.yaml: more than 1000000 values once aliases are expanded"));
  // size
  EXPECT_TRUE(contains(error_of([] { parse_config(std::string(kMaxConfigBytes + 1, ' '), "big"); }),
                       "configs are limited to 4194304 bytes"));
  // duplicate keys, in both syntaxes, and a second YAML document
  EXPECT_TRUE(contains(error_of([] { parse_config(R"({"type": "rope", "type": "alibi"})", "c"); }),
                       "c: key 'type' appears twice in one object"));
  EXPECT_TRUE(
      contains(error_of([] { parse_config("type: rope\nrope_theta: 1\nrope_theta: 2\n", "c"); }),
               "c: line 3: key 'rope_theta' appears twice in one mapping"));
  EXPECT_TRUE(contains(error_of([] { parse_config("type: rope\n---\ntype: alibi\n", "c"); }),
                       "c: 2 YAML documents"));
  // overflow, a folder given as a config
  EXPECT_TRUE(contains(error_of([] { parse_config("x: 1e400\n", "c"); }), "out of the range"));
  EXPECT_TRUE(contains(error_of([] { load_config("/tmp"); }), "'/tmp' is a folder, not a file"));
  // non-finite list entries and integers out of range name the key
  EXPECT_TRUE(contains(error_of([] {
                         build_encoder(
                             parse_config("type: rope\nhead_dim: 8\nmrope_section: [inf]\n"), {});
                       }),
                       "key 'mrope_section'[0] must be finite, got inf"));
  EXPECT_TRUE(
      contains(error_of([] { build_encoder(parse_config("type: sinusoidal\ndim: 1e300\n"), {}); }),
               "outside the 64-bit integer range"));
  // found by tests/fuzz: yaml-cpp 0.7 ran out of memory on these; invalid UTF-8 escaped as an
  // exception of the JSON library
  for (const char* text : {",", ", a\nb: c\n", "# c\n,", "!x ,", "&a ,", " \"rope\", rue\n",
                           "\"a\",", "a: 1\n'b', c\n"})
    EXPECT_TRUE(contains(error_of([&] { parse_config(text, "f.yaml"); }),
                         "f.yaml: invalid YAML: a ',' outside [...] or {...}"))
        << text;
  // a comma inside plain text, quotes or flow collections is fine
  EXPECT_EQ(parse_config("a: x, y\nb: [1, 2]\nc: \"p, q\"\nd: {e: 1, f: 2}\n")["a"], "x, y");
  EXPECT_TRUE(contains(error_of([] { parse_config("type: \"r\xB1pe\"\n", "u.yaml"); }),
                       "u.yaml: byte 8 is not valid UTF-8"));
  // nested, but within the limits: fine
  EXPECT_EQ(parse_config("a: [[[1]]]\n")["a"][0][0][0], 1);
}

TEST(Registry, YamlAndJsonAgree) {
  auto from_yaml = parse_config("type: alibi\nnum_heads: 6\nform: symmetric\n");
  auto from_json = parse_config(R"({"type": "alibi", "num_heads": 6, "form": "symmetric"})");
  EXPECT_EQ(from_yaml, from_json);
  auto alibi = build_encoder(from_yaml, {});
  EXPECT_EQ(dynamic_cast<AlibiImpl&>(*alibi).options.form(), AlibiForm::kSymmetric);
  EXPECT_TRUE(contains(error_of([] { parse_config("{\"type\": "); }), "invalid JSON"));
  EXPECT_TRUE(contains(error_of([] { load_config("/nonexistent/x.yaml"); }),
                       "cannot read config file '/nonexistent/x.yaml': no such file"));
}

}  // namespace
}  // namespace posenc
