// The motivating failure (docs/library.md, "Why"): self-attention without positions cannot tell
// "the dog bit the man" from "the man bit the dog" — its outputs are the same up to the
// permutation that swaps "dog" and "man", so any order-free pooling gives identical summaries.
// With each encoder the two sentences get different summaries. NoPE is the control: it fails
// bidirectionally and succeeds with a causal mask (order then comes from the mask alone).
#include <gtest/gtest.h>

#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

constexpr int64_t kDim = 16;
constexpr int64_t kHeads = 2;
// Sentences as token ids: the=0 dog=1 bit=2 man=3.
const std::vector<int64_t> kDogBitMan{0, 1, 2, 0, 3};
const std::vector<int64_t> kManBitDog{0, 3, 2, 0, 1};

struct Outputs {
  torch::Tensor dog_bit_man, man_bit_dog;  // [N, D]
};

Outputs run(PositionalEncoding encoder, bool causal) {
  torch::manual_seed(42);
  auto embedding = torch::randn({4, kDim});
  SelfAttention attention(AttentionOptions(kDim, kHeads).causal(causal), encoder);
  auto positions = Positions::sequence(5);
  auto forward = [&](const std::vector<int64_t>& ids) {
    auto x = embedding.index_select(0, torch::tensor(ids)).unsqueeze(0);
    x = encoder->add(x, positions);
    return attention->forward(x, positions)[0];
  };
  torch::NoGradGuard no_grad;
  return {forward(kDogBitMan), forward(kManBitDog)};
}

double summary_difference(const Outputs& o) {
  return test::max_abs_diff(o.dog_bit_man.mean(0), o.man_bit_dog.mean(0));
}

TEST(WordOrder, WithoutPositionsTheSentencesLookAlike) {
  auto o = run(as_encoding(Nope()), /*causal=*/false);
  // Outputs are permuted copies of each other: swap "dog" (1) and "man" (4).
  auto swap = torch::tensor({0, 4, 2, 3, 1});
  EXPECT_LT(test::max_abs_diff(o.man_bit_dog, o.dog_bit_man.index_select(0, swap)), 1e-5);
  EXPECT_LT(summary_difference(o), 1e-5);
}

TEST(WordOrder, CausalMaskAloneCarriesOrder) {
  EXPECT_GT(summary_difference(run(as_encoding(Nope()), /*causal=*/true)), 1e-3);
}

TEST(WordOrder, EveryEncoderTellsTheSentencesApart) {
  const std::vector<std::pair<std::string, PositionalEncoding>> encoders{
      {"sinusoidal", as_encoding(Sinusoidal(SinusoidalOptions(kDim)))},
      {"learned", as_encoding(Learned(LearnedOptions(16, kDim).init_std(1.0)))},
      {"rope half", as_encoding(Rope(RopeOptions(kDim / kHeads)))},
      {"rope interleaved",
       as_encoding(Rope(RopeOptions(kDim / kHeads).layout(RopeLayout::kInterleaved)))},
      {"t5", as_encoding(T5(T5Options(kHeads).init_std(1.0)))},
      {"shaw",
       as_encoding(Shaw(ShawOptions(kDim / kHeads).max_relative_position(4).init_std(1.0)))},
      {"alibi symmetric", as_encoding(Alibi(AlibiOptions(kHeads).form(AlibiForm::kSymmetric)))},
  };
  for (const auto& [name, encoder] : encoders) {
    EXPECT_GT(summary_difference(run(encoder, /*causal=*/false)), 1e-3) << name;
  }
}

}  // namespace
}  // namespace posenc
