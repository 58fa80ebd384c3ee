// The RoPE scaling units (include/posenc/functional/rope_scaling.h) against their table's
// promises and against transformers: tests/fixtures/rope.json (tools/gen_fixtures.py, from
// transformers 5.24's ROPE_INIT_FUNCTIONS). Every unit has a fixture case; every fixture's type a
// unit; each case's float32 arithmetic equals transformers' inv_freq to the last float32 bit
// (kFloat32Rtol says why one ulp) and the float64 one agrees within 1e-6 relative.
#include <gtest/gtest.h>

#include <set>

#include "posenc/config/registry.h"
#include "posenc/functional/rope_scaling.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::load_fixture;
using test::to_tensor;

// float64 against HF's float32 values: ~1 ulp of float32, a few through yarn's blend.
constexpr double kExactRtol = 1e-6;
// The float32 arithmetic against the fixture: one float32 ulp. transformers' own float32 result
// depends on the CPU's vector path (ATen's pow differs in the last bit between its AVX2 and
// AVX-512 kernels: yarn_f4_partial0.75, regenerated on another machine, moves by 1 ulp); on one
// machine posenc equals transformers to the bit (tests/python/test_hf_parity.py, live).
constexpr double kFloat32Rtol = 1.2e-7;

TEST(RopeScalingUnits, TheTableIsIndexedByTheEnumAndNamesRoundTrip) {
  const auto& units = rope_scaling_units();
  ASSERT_GE(units.size(), 7u);  // every unit at its enum value (a new one: CONTRIBUTING.md)
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& u = units[i];
    SCOPED_TRACE(u.name);
    EXPECT_EQ(static_cast<size_t>(u.type), i);
    EXPECT_EQ(&rope_scaling_unit(u.type), &u);
    EXPECT_EQ(rope_scaling_from_string(u.name), u.type);
    EXPECT_EQ(to_string(u.type), u.name);
    for (const auto& alias : u.aliases) EXPECT_EQ(rope_scaling_from_string(alias), u.type);
    EXPECT_TRUE(u.exact && u.hf32);
    EXPECT_FALSE(u.reference.empty());
    for (const auto& key : u.keys) {
      EXPECT_TRUE(rope_scaling_takes(u.type, key));
      const auto& all = rope_scaling_keys();
      EXPECT_NE(std::find(all.begin(), all.end(), key), all.end()) << key;
    }
    // a type whose factor is required lists it among its keys
    if (!u.default_factor) EXPECT_TRUE(rope_scaling_takes(u.type, "factor"));
  }
  EXPECT_EQ(rope_scaling_from_string("su"), RopeScaling::kLongRope);
  const std::string error = test::error_of([] { rope_scaling_from_string("ntk"); });
  EXPECT_NE(error.find("unknown rope_type 'ntk'; expected one of: default, linear, dynamic, yarn, "
                       "llama3, longrope, proportional, ntk_alpha"),
            std::string::npos)
      << error;
}

TEST(RopeScalingUnits, EveryUnitHasAFixtureAndEveryFixtureAUnit) {
  const auto fixture = load_fixture("rope.json");
  std::set<std::string> covered;
  for (const auto& c : fixture["cases"]) {
    const std::string type = c["rope_parameters"]["rope_type"].get<std::string>();
    EXPECT_NO_THROW(rope_scaling_from_string(type)) << type << " has no unit";
    covered.insert(type);
  }
  for (const auto& u : rope_scaling_units())
    EXPECT_TRUE(covered.count(u.name))
        << u.name << " has no case in tests/fixtures/rope.json (CONTRIBUTING.md, step 4)";
}

TEST(RopeScalingUnits, BothArithmeticsOfEveryUnitMatchTransformers) {
  const auto fixture = load_fixture("rope.json");
  int exact_cases = 0;
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const int64_t seq_len = c["seq_len"].is_null() ? -1 : c["seq_len"].get<int64_t>();
    const auto expected = to_tensor(c["inv_freq"]);
    for (const std::string dtype : {"float64", "float32"}) {
      nlohmann::json config{{"type", "rope"},
                            {"head_dim", c["head_dim"]},
                            {"max_position_embeddings", c["max_position_embeddings"]},
                            {"rope_parameters", c["rope_parameters"]},
                            {"angle_dtype", dtype}};
      auto encoder = build_encoder(config, {});
      auto* rope = dynamic_cast<RopeImpl*>(encoder.get());
      ASSERT_NE(rope, nullptr);
      const auto f = rope->frequencies(seq_len);
      ASSERT_EQ(f.inv_freq.sizes(), expected.sizes()) << dtype;
      EXPECT_NEAR(f.attention_scaling, c["attention_scaling"].get<double>(), 1e-12) << dtype;
      const auto got = f.inv_freq.to(torch::kFloat64);
      const auto scale = expected.abs().clamp_min(1e-30);
      const double rel = ((got - expected).abs() / scale).max().item<double>();
      if (dtype == "float32") {
        EXPECT_LE(rel, kFloat32Rtol) << "float32";
      } else {
        EXPECT_LE(rel, kExactRtol);
        ++exact_cases;
      }
    }
  }
  EXPECT_GE(exact_cases, 30);
}

}  // namespace
}  // namespace posenc
