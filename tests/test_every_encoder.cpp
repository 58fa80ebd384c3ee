// One suite over every registered encoder (ggml's test-backend-ops, for positions): each encoder
// in a transformer, through the fused paths it takes (short kernel, SDPA, fused bias kernel, the
// fused RoPE pass) and through the reference (TransformerOptions::fused(false): einsum, the
// materialized bias, the reference rotation). Outputs and parameter gradients must agree within
// named tolerances, and sentinel values (1e6) in padded tokens must not reach the real ones (key
// padding masks them out on every path; why not NaN: see the test). The per-feature tests stay
// where they explain something.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "posenc/config/registry.h"
#include "posenc/nn/transformer.h"
#include "support/encoder_cases.h"

namespace posenc {
namespace {

// float32 throughout: different summation orders (tiles, online softmax) differ by rounding.
constexpr double kOutputTolerance = 1e-4;    // relative to 1 + max |y|
constexpr double kGradientTolerance = 2e-3;  // relative to 1 + max |grad|

struct Result {
  at::Tensor y;
  std::vector<at::Tensor> grads;
};

Result run(Transformer& model, const at::Tensor& x, const Positions& positions,
           const at::Tensor& key_padding = {}) {
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  auto y = model(x, positions, key_padding);
  auto loss = key_padding.defined()
                  ? (y * key_padding.unsqueeze(-1).to(y.scalar_type())).nan_to_num(0).pow(2).sum()
                  : y.pow(2).sum();
  loss.backward();
  Result out{y.detach(), {}};
  for (auto& p : model->parameters())
    out.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return out;
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / (1 + want.abs().max().item<double>());
}

TEST(EveryEncoder, TheCasesCoverTheRegistry) {
  std::set<std::string> covered;
  for (const auto& c : test::encoder_cases()) covered.insert(c.type);
  for (const auto& type : encoder_types())
    if (type != "hf")  // a model's config.json: tests/test_hf_architectures.cpp
      EXPECT_TRUE(covered.count(type)) << type << " has no case in tests/support/encoder_cases.h";
}

TEST(EveryEncoder, FusedPathsEqualTheReference) {
  const int64_t dim = 32, heads = 4;
  for (const auto& c : test::encoder_cases()) {
    SCOPED_TRACE(c.type);
    torch::manual_seed(3);
    Transformer model(TransformerOptions(dim, heads, 2), build_encoder(c.config, {dim, heads, 0}));
    const auto x = torch::randn({2, c.positions.size(), dim});
    const auto fused = run(model, x, c.positions);
    for (auto& block : *model->blocks)
      block->as<TransformerBlock>()->attention->options.fused(false);
    const auto reference = run(model, x, c.positions);
    EXPECT_LE(relative(fused.y, reference.y), kOutputTolerance);
    for (size_t i = 0; i < fused.grads.size(); ++i)
      EXPECT_LE(relative(fused.grads[i], reference.grads[i]), kGradientTolerance) << "param " << i;
  }
}

TEST(EveryEncoder, SentinelsInPaddedTokensDoNotReachRealOnes) {
  const int64_t dim = 32, heads = 4;
  for (const bool fused : {true, false}) {
    for (const auto& c : test::encoder_cases()) {
      SCOPED_TRACE(c.type + (fused ? " fused" : " reference"));
      torch::manual_seed(4);
      TransformerOptions options(dim, heads, 1);
      options.fused(fused);
      Transformer model(options, build_encoder(c.config, {dim, heads, 0}));
      const int64_t n = c.positions.size();
      auto x = torch::randn({2, n, dim});
      auto padding = torch::ones({2, n}, torch::kBool);
      padding[1].narrow(0, n - 3, 3).fill_(false);  // the second example's last 3 tokens
      const auto clean = run(model, x, c.positions, padding);
      // Sentinels: 1e6 in the padded tokens (their keys' logits would dominate any softmax that
      // let them in). Not NaN: every attention, torch's SDPA too, multiplies a masked value by
      // its weight 0, and 0 * NaN is NaN by IEEE: measured, every path here, fused or not.
      x[1].narrow(0, n - 3, 3).fill_(1e6f);
      const auto poisoned = run(model, x, c.positions, padding);
      const auto real = padding.unsqueeze(-1).expand_as(poisoned.y);
      EXPECT_TRUE(poisoned.y.masked_select(real).isfinite().all().item<bool>());
      EXPECT_TRUE(torch::equal(poisoned.y.masked_select(real), clean.y.masked_select(real)));
    }
  }
}

}  // namespace
}  // namespace posenc
