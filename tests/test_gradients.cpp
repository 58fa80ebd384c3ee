// Gradients of every trainable encoder (and of the rotation w.r.t. q and k) against float64
// central differences. Losses are random projections so every entry of the gradient matters.
#include <gtest/gtest.h>

#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::expect_gradient_matches_finite_differences;

TEST(Gradients, LearnedTable) {
  torch::manual_seed(10);
  Learned learned(LearnedOptions(6, 3));
  learned->to(torch::kFloat64);
  auto x = torch::randn({2, 4, 3}, torch::kFloat64);
  auto probe = torch::randn({2, 4, 3}, torch::kFloat64);
  auto p = Positions::values({0, 2, 5, 2});
  expect_gradient_matches_finite_differences(
      learned->weight, [&] { return (learned->add(x, p).pow(2) * probe).sum(); });
}

TEST(Gradients, T5Table) {
  torch::manual_seed(11);
  T5 t5(T5Options(2).num_buckets(8).max_distance(16).init_std(1.0));
  t5->to(torch::kFloat64);
  auto p = Positions::sequence(5);
  auto probe = torch::randn({2, 5, 5}, torch::kFloat64);
  expect_gradient_matches_finite_differences(
      t5->weight, [&] { return (torch::softmax(t5->bias(p, p, {}), -1) * probe).sum(); });
}

TEST(Gradients, ShawTableAndQueries) {
  torch::manual_seed(12);
  Shaw shaw(ShawOptions(4).max_relative_position(2).init_std(1.0));
  shaw->to(torch::kFloat64);
  auto q = torch::randn({1, 4, 2, 4}, torch::kFloat64).requires_grad_(true);
  auto p = Positions::sequence(4);
  auto probe = torch::randn({1, 2, 4, 4}, torch::kFloat64);
  auto loss = [&] { return (torch::softmax(shaw->bias(p, p, q), -1) * probe).sum(); };
  expect_gradient_matches_finite_differences(shaw->weight, loss);
  expect_gradient_matches_finite_differences(q, loss);
}

TEST(Gradients, RotationBothLayoutsWithXpos) {
  torch::manual_seed(13);
  for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
    Rope rope(RopeOptions(8).layout(layout).partial_rotary_factor(0.5).xpos(true));
    auto q = torch::randn({1, 3, 2, 8}, torch::kFloat64).requires_grad_(true);
    auto k = torch::randn({1, 3, 2, 8}, torch::kFloat64).requires_grad_(true);
    auto p = Positions::values({0, 3, 9});
    auto probe = torch::randn({1, 2, 3, 3}, torch::kFloat64);
    auto loss = [&] {
      auto [rq, rk] = rope->rotate(q, k, p, p);
      return (torch::einsum("bqhd,bkhd->bhqk", {rq, rk}).tanh() * probe).sum();
    };
    expect_gradient_matches_finite_differences(q, loss);
    expect_gradient_matches_finite_differences(k, loss);
  }
}

TEST(Gradients, AttentionThroughEachEntryPoint) {
  // The attention layer passes gradients into every trainable encoder it holds.
  torch::manual_seed(14);
  for (auto encoder : {as_encoding(T5(T5Options(2).num_buckets(8).max_distance(16))),
                       as_encoding(Shaw(ShawOptions(4).max_relative_position(2)))}) {
    SelfAttention attention(AttentionOptions(8, 2), encoder);
    attention->to(torch::kFloat64);
    auto x = torch::randn({1, 4, 8}, torch::kFloat64);
    auto p = Positions::sequence(4);
    auto param = encoder->parameters()[0];
    expect_gradient_matches_finite_differences(
        param, [&] { return attention->forward(x, p).pow(2).sum(); }, 1e-6, 1e-5);
  }
}

}  // namespace
}  // namespace posenc
