// The attention backends' rules (posenc/nn/attention_backend.h): which backend a call runs and
// why the ones above it were passed over, and that the chosen one computes what the reference
// does.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "posenc/config/registry.h"
#include "posenc/kernels/short_attention.h"
#include "posenc/nn/attention.h"
#include "posenc/nn/attention_backend.h"

namespace posenc {
namespace {

using nlohmann::json;

struct Call {
  SelfAttention layer{nullptr};
  at::Tensor x;
  Positions positions;
  AttentionRoute route(const at::Tensor& key_padding = {}, KVCache* cache = nullptr) {
    const int64_t b = x.size(0), n = x.size(1), h = layer->options.num_heads();
    auto parts = layer->qkv->forward(x).view({b, n, 3, h, layer->options.dim() / h}).unbind(2);
    const auto plan = layer->encoder->plan(plan_request(x, positions, cache));
    return layer->route(plan, parts[0], parts[1], parts[2], key_padding, cache);
  }
};

Call make(const json& encoder, int64_t n, AttentionOptions options = AttentionOptions(32, 2)) {
  torch::manual_seed(0);
  Call c;
  c.layer = SelfAttention(options, build_encoder(encoder, {32, 2}));
  c.x = torch::randn({2, n, 32});
  c.positions = Positions::sequence(n);
  return c;
}

std::string reasons(const AttentionRoute& r) { return describe(r); }

TEST(AttentionBackend, APatchGridWithRopeTakesTheShortKernelWithRopeInside) {
  auto c = make({{"type", "rope"}}, 16);
  const auto r = c.route();
  EXPECT_EQ(r.backend, AttentionBackend::kShortRotary) << reasons(r);
  EXPECT_TRUE(r.rotary_inside);
  EXPECT_TRUE(r.not_taken.empty()) << reasons(r);
}

TEST(AttentionBackend, ALongSequenceWithoutBiasTakesSdpaAndSaysWhyNotTheShortKernel) {
  auto c = make({{"type", "rope"}}, kShortAttentionMaxTokens + 1);
  const auto r = c.route();
  EXPECT_EQ(r.backend, AttentionBackend::kSdpa) << reasons(r);
  ASSERT_EQ(r.not_taken.size(), 2u);
  EXPECT_EQ(r.not_taken[0].second, "the short kernel does not take these shapes");
  EXPECT_FALSE(r.rotary_inside);
}

TEST(AttentionBackend, ABiasTakesTheFusedKernelAndEqualsTheReference) {
  auto c = make({{"type", "alibi"}}, 40);
  const auto r = c.route();
  EXPECT_EQ(r.backend, AttentionBackend::kFused) << reasons(r);
  ASSERT_EQ(r.not_taken.size(), 3u);
  for (const auto& [backend, why] : r.not_taken) EXPECT_EQ(why, "the plan has a bias");
  auto fused = c.layer->forward(c.x, c.positions);
  c.layer->options.fused(false);
  const auto reference = c.route();
  EXPECT_EQ(reference.backend, AttentionBackend::kReference);
  ASSERT_EQ(reference.not_taken.size(), 4u);
  for (const auto& [backend, why] : reference.not_taken) EXPECT_EQ(why, "options.fused is off");
  EXPECT_TRUE(torch::allclose(fused, c.layer->forward(c.x, c.positions), 1e-5, 1e-5));
}

TEST(AttentionBackend, CausalDecodingOverCachedKeysSkipsSdpa) {
  auto c = make({{"type", "rope"}}, 4, AttentionOptions(32, 2).causal(true));
  KVCache cache;
  c.layer->forward(c.x, c.positions, {}, &cache);  // 4 keys cached
  c.x = torch::randn({2, 1, 32});
  c.positions = Positions::sequence(1, 4);
  const auto r = c.route({}, &cache);
  EXPECT_EQ(r.backend, AttentionBackend::kFused) << reasons(r);
  ASSERT_EQ(r.not_taken.size(), 3u);
  EXPECT_EQ(r.not_taken[0].second, "a key-value cache is given");
  EXPECT_EQ(r.not_taken[2].second, "a causal mask over cached keys (SDPA aligns it top-left)");
  EXPECT_FALSE(r.rotary_inside);  // keys in the cache are stored rotated
  EXPECT_NE(describe(r).find("fused (short_rotary: a key-value cache is given;"), std::string::npos)
      << describe(r);
}

}  // namespace
}  // namespace posenc
