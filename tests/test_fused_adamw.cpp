// The fused multi-tensor AdamW and gradient clip (include/posenc/kernels/adamw.h, FusedAdamW)
// against their references: LibTorch's torch::optim::AdamW and clip_grad_norm_ (weights and
// moments after N steps, two parameter groups, sizes across the kernel's chunk boundary), a
// hand-derived first step, the fallback for tensors it cannot fuse, checkpoint state
// compatibility, and a model trained with both optimizers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "posenc/kernels/adamw.h"
#include "posenc/posenc.h"
#include "posenc/train/fused_adamw.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::max_abs_diff;
using train::FusedAdamW;

// Shapes: a scalar, odd sizes, one tensor over two 16384-element chunks.
std::vector<at::Tensor> make_params(uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (auto shape : std::vector<std::vector<int64_t>>{{}, {7}, {33, 5}, {129, 257}, {3, 4, 5}})
    params.push_back(torch::randn(shape).requires_grad_());
  return params;
}

std::vector<torch::optim::OptimizerParamGroup> groups_of(const std::vector<at::Tensor>& params) {
  // Matrices decay (lr 3e-3, wd 0.1), vectors do not (lr 1e-3, other betas and eps).
  std::vector<at::Tensor> decay, plain;
  for (const auto& p : params) (p.dim() >= 2 ? decay : plain).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(3e-3).weight_decay(0.1)));
  groups.emplace_back(
      plain, std::make_unique<torch::optim::AdamWOptions>(
                 torch::optim::AdamWOptions(1e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.0)));
  return groups;
}

void set_gradients(std::vector<at::Tensor>& params, uint64_t seed) {
  torch::manual_seed(seed);
  for (auto& p : params) p.mutable_grad() = torch::randn(p.sizes()) * 0.1;
}

TEST(FusedAdamW, EqualsLibTorchAdamWAfterSteps) {
  auto a = make_params(1), b = make_params(1);
  torch::optim::AdamW reference(groups_of(a));
  FusedAdamW fused(groups_of(b));
  for (int step = 0; step < 25; ++step) {
    set_gradients(a, 100 + step);
    set_gradients(b, 100 + step);
    if (step == 10)  // the schedule changes a group's learning rate mid-run
      for (auto* o : {&reference, static_cast<torch::optim::AdamW*>(&fused)})
        static_cast<torch::optim::AdamWOptions&>(o->param_groups()[0].options()).lr(1e-2);
    reference.step();
    fused.step();
    ASSERT_TRUE(fused.last_step_fused());
  }
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LT(max_abs_diff(a[i], b[i]), 1e-5) << "parameter " << i;
    const auto& sa = static_cast<const torch::optim::AdamWParamState&>(
        *reference.state().at(a[i].unsafeGetTensorImpl()));
    const auto& sb = static_cast<const torch::optim::AdamWParamState&>(
        *fused.state().at(b[i].unsafeGetTensorImpl()));
    EXPECT_EQ(sa.step(), sb.step());
    EXPECT_LT(max_abs_diff(sa.exp_avg(), sb.exp_avg()), 1e-6) << "exp_avg " << i;
    EXPECT_LT(max_abs_diff(sa.exp_avg_sq(), sb.exp_avg_sq()), 1e-7) << "exp_avg_sq " << i;
  }
  // The parameters moved: a no-op optimizer would fail the comparison against the start.
  EXPECT_GT(max_abs_diff(b[3], make_params(1)[3]), 1e-2);
}

TEST(FusedAdamW, FirstStepIsSignDescentWithDecay) {
  // Hand-derived: from zero moments, t = 1: m = (1 - b1) g, v = (1 - b2) g^2, so
  // p' = p (1 - lr wd) - lr g / (|g| + eps)  ~  p (1 - lr wd) - lr sign(g).
  auto p = torch::tensor({1.0f, -2.0f, 0.5f}).requires_grad_();
  p.mutable_grad() = torch::tensor({0.3f, -4.0f, 1e-3f});
  FusedAdamW opt({p}, torch::optim::AdamWOptions(0.1).weight_decay(0.5).eps(1e-8));
  opt.step();
  const double expected[] = {1.0 * 0.95 - 0.1, -2.0 * 0.95 + 0.1, 0.5 * 0.95 - 0.1};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i].item<double>(), expected[i], 1e-5) << i;
}

TEST(FusedAdamW, ReferenceFunctionEqualsLibTorch) {
  auto a = make_params(2), b = make_params(2);
  torch::optim::AdamW reference(a, torch::optim::AdamWOptions(2e-3).weight_decay(0.05));
  std::vector<at::Tensor> grads, m, v;
  std::vector<AdamWHyper> hyper;
  for (auto& p : b) {
    m.push_back(torch::zeros_like(p));
    v.push_back(torch::zeros_like(p));
  }
  for (int step = 0; step < 5; ++step) {
    set_gradients(a, 200 + step);
    set_gradients(b, 200 + step);
    reference.step();
    grads.clear();
    hyper.clear();
    for (auto& p : b) {
      grads.push_back(p.grad());
      hyper.push_back({2e-3, 0.9, 0.999, 1e-8, 0.05, step});
    }
    std::vector<at::Tensor> data;
    for (auto& p : b) data.push_back(p.detach());
    adamw_step_reference(data, grads, m, v, hyper);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(max_abs_diff(a[i], b[i]), 1e-7) << i;
}

TEST(FusedAdamW, FallsBackForTensorsItCannotFuse) {
  // A non-contiguous parameter (a transposed leaf) and amsgrad: LibTorch's own step, same result.
  torch::manual_seed(3);
  auto base = torch::randn({6, 4});
  auto a = base.clone().t().requires_grad_(), b = base.clone().t().requires_grad_();
  ASSERT_FALSE(b.is_contiguous());
  torch::optim::AdamW reference({a}, torch::optim::AdamWOptions(1e-2));
  FusedAdamW fused({b}, torch::optim::AdamWOptions(1e-2));
  auto g = torch::randn({4, 6});
  a.mutable_grad() = g.clone();
  b.mutable_grad() = g.clone();
  reference.step();
  fused.step();
  EXPECT_FALSE(fused.last_step_fused());
  EXPECT_TRUE(torch::equal(a, b));

  auto c = make_params(4), d = make_params(4);
  torch::optim::AdamW ams_ref(c, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  FusedAdamW ams(d, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  set_gradients(c, 9);
  set_gradients(d, 9);
  ams_ref.step();
  ams.step();
  EXPECT_FALSE(ams.last_step_fused());
  for (size_t i = 0; i < c.size(); ++i) EXPECT_TRUE(torch::equal(c[i], d[i])) << i;
}

TEST(FusedAdamW, ResumesFromLibTorchStateAndBack) {
  // State written by one is continued by the other (what a checkpoint carries across
  // train.fused_optimizer): 5 reference steps, then 5 fused, vs 10 reference steps.
  auto a = make_params(5), b = make_params(5);
  torch::optim::AdamW all_reference(groups_of(a));
  torch::optim::AdamW first(groups_of(b));
  for (int step = 0; step < 10; ++step) {
    set_gradients(a, 300 + step);
    all_reference.step();
  }
  for (int step = 0; step < 5; ++step) {
    set_gradients(b, 300 + step);
    first.step();
  }
  FusedAdamW second(groups_of(b));
  std::stringstream buffer;
  {
    torch::serialize::OutputArchive out;
    first.save(out);
    out.save_to(buffer);
  }
  torch::serialize::InputArchive in;
  in.load_from(buffer);
  second.load(in);
  for (int step = 5; step < 10; ++step) {
    set_gradients(b, 300 + step);
    second.step();
    ASSERT_TRUE(second.last_step_fused());
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(max_abs_diff(a[i], b[i]), 1e-5) << i;
}

TEST(FusedClip, EqualsClipGradNorm) {
  for (double max_norm : {0.5, 1e6}) {  // clipping and not
    auto a = make_params(6), b = make_params(6);
    set_gradients(a, 7);
    set_gradients(b, 7);
    a[1].mutable_grad() = at::Tensor();  // a parameter without a gradient is skipped
    b[1].mutable_grad() = at::Tensor();
    const double na = torch::nn::utils::clip_grad_norm_(a, max_norm);
    const double nb = train::clip_grad_norm_fused(b, max_norm);
    EXPECT_NEAR(na, nb, 1e-5 * na) << max_norm;
    for (size_t i = 0; i < a.size(); ++i) {
      if (i == 1) {
        EXPECT_FALSE(b[1].grad().defined());
        continue;
      }
      EXPECT_LT(max_abs_diff(a[i].grad(), b[i].grad()), 1e-7) << i;
    }
    // The hand check: the clipped total norm is max_norm when clipping.
    double total = 0;
    for (auto& p : b)
      if (p.grad().defined()) total += p.grad().pow(2).sum().item<double>();
    if (max_norm < na) EXPECT_NEAR(std::sqrt(total), max_norm, 1e-5);
    EXPECT_NEAR(grad_norm_clip_reference_({}, max_norm), 0.0, 0.0);
  }
}

TEST(FusedAdamW, TrainsAModelAsTheReference) {
  // A 2-block transformer classifier, 8 steps with clipping: fused vs LibTorch's AdamW + clip.
  auto make = [] {
    torch::manual_seed(11);
    TransformerOptions t(32, 2, 2);
    return TokenClassifier(TokenClassifierOptions(12, 3, t), as_encoding(Nope()));
  };
  auto ma = make(), mb = make();
  torch::optim::AdamW ra(ma->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.05));
  FusedAdamW fb(mb->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.05));
  torch::manual_seed(12);
  auto x = torch::randn({16, 9, 12});
  auto y = torch::randint(0, 3, {16}, torch::kLong);
  auto positions = Positions::sequence(9);
  for (int step = 0; step < 8; ++step) {
    ra.zero_grad();
    torch::cross_entropy_loss(ma(x, positions), y).backward();
    torch::nn::utils::clip_grad_norm_(ma->parameters(), 0.5);
    ra.step();
    fb.zero_grad();
    torch::cross_entropy_loss(mb(x, positions), y).backward();
    train::clip_grad_norm_fused(mb->parameters(), 0.5);
    fb.step();
  }
  auto pa = ma->parameters(), pb = mb->parameters();
  ASSERT_EQ(pa.size(), pb.size());
  // The key bias (the middle third of qkv.bias) has an exact gradient of 0 (it adds one constant
  // to every score of a softmax row); its computed gradient is rounding noise that Adam
  // normalizes to steps of +-lr, so it is left out; every other entry must agree.
  auto named_a = ma->named_parameters(), named_b = mb->named_parameters();
  ASSERT_EQ(named_a.size(), named_b.size());
  for (size_t i = 0; i < named_a.size(); ++i) {
    auto a = named_a[i].value().detach(), b = named_b[i].value().detach();
    const auto& name = named_a[i].key();
    if (name.size() >= 8 && name.compare(name.size() - 8, 8, "qkv.bias") == 0) {
      const int64_t d = a.size(0) / 3;
      a = torch::cat({a.narrow(0, 0, d), a.narrow(0, 2 * d, d)});
      b = torch::cat({b.narrow(0, 0, d), b.narrow(0, 2 * d, d)});
    }
    EXPECT_LT(max_abs_diff(a, b), 2e-5) << name;
  }
}

}  // namespace
}  // namespace posenc
