// The fused residual add + layer norm (posenc/kernels/layer_norm.h) against its specification,
// h = x + r and at::layer_norm(h) with ATen's autograd, and both against a float64 evaluation:
// forward, backward with and without the residual's gradient, row counts across the row blocks,
// widths, results independent of the thread count, the inputs left to the reference, second
// order (a gradient penalty) against ATen's, a transformer whose residual adds run fused against
// one that does not, the *_out entries (the same bits into the caller's tensors, refusals), and
// streamed outputs (non-temporal stores: the same bits).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/stream_stores.h"
#include "posenc/config/registry.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/kernels/layer_norm.h"
#include "posenc/nn/transformer.h"

namespace {

using posenc::add_layer_norm;
using posenc::add_layer_norm_fused_supported;
using posenc::add_layer_norm_reference;

constexpr double kEps = 1e-5;

#define SKIP_WITHOUT_AVX2()                                                       \
  if (!add_layer_norm_fused_supported(torch::zeros({1, 8}), torch::zeros({1, 8}), \
                                      torch::ones({8}), torch::zeros({8})))       \
  GTEST_SKIP() << "no AVX2+FMA"

struct Grads {
  at::Tensor h, y, dx, dr, dw, db;
};

// forward and backward of f from (dh, dy); either gradient may be left out
template <typename F>
Grads run(F f, const at::Tensor& x0, const at::Tensor& r0, const at::Tensor& w0,
          const at::Tensor& b0, const at::Tensor& dh, const at::Tensor& dy) {
  auto x = x0.detach().clone().requires_grad_(true), r = r0.detach().clone().requires_grad_(true);
  auto w = w0.detach().clone().requires_grad_(true), b = b0.detach().clone().requires_grad_(true);
  auto [h, y] = f(x, r, w, b);
  std::vector<at::Tensor> outs, grads;
  if (dh.defined()) outs.push_back(h), grads.push_back(dh.to(h.scalar_type()));
  if (dy.defined()) outs.push_back(y), grads.push_back(dy.to(y.scalar_type()));
  torch::autograd::backward(outs, grads);
  auto g = [](const at::Tensor& t) { return t.grad().defined() ? t.grad() : torch::zeros_like(t); };
  return {h.detach(), y.detach(), g(x), g(r), g(w), g(b)};
}

auto fused = [](auto&& x, auto&& r, auto&& w, auto&& b) {
  return add_layer_norm(x, r, w, b, kEps);
};
auto reference = [](auto&& x, auto&& r, auto&& w, auto&& b) {
  return add_layer_norm_reference(x, r, w, b, kEps);
};

// |got - want| / (1 + max |want|)
double relative(const at::Tensor& got, const at::Tensor& want) {
  const auto w = want.to(torch::kDouble);
  return ((got.to(torch::kDouble) - w).abs().max() / (1 + w.abs().max())).item<double>();
}

TEST(AddLayerNorm, EqualsItsReferenceAndFloat64) {
  SKIP_WITHOUT_AVX2();
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {1, 8}, {3, 96}, {2, 32, 96}, {65, 128}, {128, 16, 96}, {5, 1024}, {2, 3, 8192}}) {
    SCOPED_TRACE(::testing::PrintToString(shape));
    torch::manual_seed(shape.back() + shape.front());
    const int64_t d = shape.back();
    const auto x = torch::randn(shape) * 3 + 1, r = torch::randn(shape);
    const auto w = 1 + 0.3 * torch::randn({d}), b = 0.3 * torch::randn({d});
    const auto dh = torch::randn(shape), dy = torch::randn(shape);
    const auto got = run(fused, x, r, w, b, dh, dy);
    const auto ref = run(reference, x, r, w, b, dh, dy);
    const auto f64 = run(reference, x.to(torch::kDouble), r.to(torch::kDouble),
                         w.to(torch::kDouble), b.to(torch::kDouble), dh, dy);
    EXPECT_TRUE(torch::equal(got.h, ref.h));  // one float32 add each
    // float32 rounding over a row of D and a column of rows: the fused passes and ATen both
    // within these of the float64 evaluation
    const double rows = static_cast<double>(x.numel() / d);
    for (const auto* what : {&ref, &got}) {
      EXPECT_LE(relative(what->y, f64.y), 2e-6);
      EXPECT_LE(relative(what->dx, f64.dx), 1e-5);
      EXPECT_LE(relative(what->dw, f64.dw), 1e-6 * std::sqrt(rows) + 1e-6);
      EXPECT_LE(relative(what->db, f64.db), 1e-6 * std::sqrt(rows) + 1e-6);
    }
    EXPECT_TRUE(torch::equal(got.dx, got.dr));  // dx = dr = dh
    EXPECT_LE(relative(got.y, ref.y), 2e-6);
    EXPECT_LE(relative(got.dx, ref.dx), 1e-5);
  }
}

TEST(AddLayerNorm, EitherGradientAlone) {
  SKIP_WITHOUT_AVX2();
  torch::manual_seed(1);
  const auto x = torch::randn({70, 24}), r = torch::randn({70, 24});
  const auto w = 1 + 0.3 * torch::randn({24}), b = 0.3 * torch::randn({24});
  const auto dh = torch::randn({70, 24}), dy = torch::randn({70, 24});
  for (const bool with_dh : {true, false}) {
    const auto got =
        run(fused, x, r, w, b, with_dh ? dh : at::Tensor(), with_dh ? at::Tensor() : dy);
    const auto ref =
        run(reference, x, r, w, b, with_dh ? dh : at::Tensor(), with_dh ? at::Tensor() : dy);
    EXPECT_LE(relative(got.dx, ref.dx), 1e-5) << with_dh;
    EXPECT_LE(relative(got.dw, ref.dw), 1e-5) << with_dh;
    EXPECT_LE(relative(got.db, ref.db), 1e-5) << with_dh;
  }
}

TEST(AddLayerNorm, ResultsDoNotDependOnTheThreadCount) {
  SKIP_WITHOUT_AVX2();
  torch::manual_seed(2);
  const std::vector<int64_t> shape = {1000, 96};  // 16 row blocks, several parallel chunks
  const auto x = torch::randn(shape), r = torch::randn(shape);
  const auto w = 1 + 0.3 * torch::randn({96}), b = 0.3 * torch::randn({96});
  const auto dh = torch::randn(shape), dy = torch::randn(shape);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const auto one = run(fused, x, r, w, b, dh, dy);
  at::set_num_threads(std::max(2, threads));
  const auto many = run(fused, x, r, w, b, dh, dy);
  at::set_num_threads(threads);
  for (const auto& [a, c] :
       {std::pair{one.y, many.y}, {one.dx, many.dx}, {one.dw, many.dw}, {one.db, many.db}})
    EXPECT_TRUE(torch::equal(a, c));
}

TEST(AddLayerNorm, OutEntriesWriteTheSameBitsIntoTheCallersTensors) {
  SKIP_WITHOUT_AVX2();
  torch::manual_seed(7);
  const auto x = torch::randn({70, 24}), r = torch::randn({70, 24});
  const auto w = 1 + 0.3 * torch::randn({24}), b = 0.3 * torch::randn({24});
  const auto dy = torch::randn({70, 24}), dh_in = torch::randn({70, 24});
  namespace d = posenc::detail;
  const auto [h, y, mean, rstd] = d::add_layer_norm_forward_cpu(x, r, w, b, 1e-5);
  auto h2 = torch::full_like(x, 7.0f), y2 = torch::full_like(x, 7.0f);
  auto mean2 = torch::full({70}, 7.0f), rstd2 = torch::full({70}, 7.0f);
  d::add_layer_norm_forward_cpu_out(x, r, w, b, 1e-5, h2, y2, mean2, rstd2);
  for (const auto& [a, c] : {std::pair{h, h2}, {y, y2}, {mean, mean2}, {rstd, rstd2}})
    EXPECT_TRUE(torch::equal(a, c));
  const auto [dh, dw, db] = d::add_layer_norm_backward_cpu(dy, dh_in, h, mean, rstd, w);
  auto dh2 = torch::full_like(x, 7.0f), dw2 = torch::full({24}, 7.0f), db2 = dw2.clone();
  d::add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, w, dh2, dw2, db2);
  for (const auto& [a, c] : {std::pair{dh, dh2}, {dw, dw2}, {db, db2}})
    EXPECT_TRUE(torch::equal(a, c));
  // refusals, one line each: a wrong shape, an output overlapping an input or another output
  auto wrong = torch::empty({70, 25});
  auto alias = x;
  auto short_stats = torch::empty({69});
  const auto one_line = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace()).find('\n') == std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(one_line(
      [&] { d::add_layer_norm_forward_cpu_out(x, r, w, b, 1e-5, wrong, y2, mean2, rstd2); }));
  EXPECT_TRUE(one_line(
      [&] { d::add_layer_norm_forward_cpu_out(x, r, w, b, 1e-5, alias, y2, mean2, rstd2); }));
  EXPECT_TRUE(
      one_line([&] { d::add_layer_norm_forward_cpu_out(x, r, w, b, 1e-5, h2, h2, mean2, rstd2); }));
  EXPECT_TRUE(one_line(
      [&] { d::add_layer_norm_forward_cpu_out(x, r, w, b, 1e-5, h2, y2, short_stats, rstd2); }));
  EXPECT_TRUE(one_line(
      [&] { d::add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, w, wrong, dw2, db2); }));
  auto dy_alias = dy;
  EXPECT_TRUE(one_line([&] {
    d::add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, w, dy_alias, dw2, db2);
  }));
  EXPECT_TRUE(one_line(
      [&] { d::add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, w, dh2, dw2, dw2); }));
}

// Out-of-cache passes write h, y and dh with non-temporal stores (layer_norm_rows.h,
// stream_stores.h): the same bits as normal stores, row by row at every vector level, and through
// the passes (outputs of kStreamMinBytes on 64-byte lines stream; the same outputs 16 bytes off a
// line do not: every output, the weight and bias gradients included, equal).
TEST(AddLayerNorm, StreamedRowsGiveTheSameBits) {
  SKIP_WITHOUT_AVX2();
  namespace d = posenc::detail;
  torch::manual_seed(8);
  for (const auto level : {posenc::CpuCapability::kAvx2, posenc::CpuCapability::kAvx512}) {
    if (level > posenc::cpu_capability_detected()) continue;
    const auto& k = d::cpu_kernels_at(level);
    for (const int64_t dim : {16, 96, 1024}) {
      SCOPED_TRACE(std::string(posenc::to_string(level)) + " D=" + std::to_string(dim));
      const auto x = torch::randn({dim}) * 3 + 1, r = torch::randn({dim});
      const auto w = 1 + 0.3 * torch::randn({dim}), b = 0.3 * torch::randn({dim});
      const auto dy = torch::randn({dim}), dh_in = torch::randn({dim});
      // rows of h, y, dh, dw, db on 64-byte lines (D % 16 == 0, torch allocates on lines): [0]
      // with normal stores, [1] streamed
      auto out = torch::zeros({2, 5, dim});  // h, y, dh, dw, db
      auto stats = torch::zeros({2, 2});
      for (int streamed = 0; streamed < 2; ++streamed) {
        float* o = out[streamed].data_ptr<float>();
        float* st = stats[streamed].data_ptr<float>();
        ASSERT_TRUE(d::line_aligned(o));
        k.layer_norm_forward_row(x.const_data_ptr<float>(), r.const_data_ptr<float>(),
                                 w.const_data_ptr<float>(), b.const_data_ptr<float>(), o, o + dim,
                                 dim, 1e-5f, st, st + 1, streamed == 1);
        k.layer_norm_backward_row(dy.const_data_ptr<float>(), dh_in.const_data_ptr<float>(), o,
                                  w.const_data_ptr<float>(), st[0], st[1], o + 2 * dim, o + 3 * dim,
                                  o + 4 * dim, dim, streamed == 1);
        d::stream_fence();
      }
      EXPECT_TRUE(torch::equal(out[0], out[1]));
      EXPECT_TRUE(torch::equal(stats[0], stats[1]));
      EXPECT_TRUE(torch::equal(out[0][0], x + r));
    }
  }
  // the passes at [2048, 1024]: h + y are 16 MiB (the forward streams), dh 8 MiB (the backward
  // streams from 16 MiB: [4096, 1024])
  for (const int64_t rows : {2048, 4096}) {
    const int64_t dim = 1024;
    const auto x = torch::randn({rows, dim}), r = torch::randn({rows, dim});
    const auto w = 1 + 0.3 * torch::randn({dim}), b = 0.3 * torch::randn({dim});
    const auto dy = torch::randn({rows, dim}), dh_in = torch::randn({rows, dim});
    const auto [h, y, mean, rstd] = d::add_layer_norm_forward_cpu(x, r, w, b, kEps);
    const auto [dh, dw, db] = d::add_layer_norm_backward_cpu(dy, dh_in, h, mean, rstd, w);
    ASSERT_TRUE(d::line_aligned(h.data_ptr()) && d::line_aligned(dh.data_ptr()));
    // the same outputs 4 floats past a line: normal stores
    const auto off_line = [&] { return torch::empty({rows * dim + 4}).narrow(0, 4, rows * dim); };
    auto h2 = off_line().view({rows, dim}), y2 = off_line().view({rows, dim});
    auto dh2 = off_line().view({rows, dim});
    auto mean2 = torch::empty({rows}), rstd2 = torch::empty({rows});
    auto dw2 = torch::empty({dim}), db2 = torch::empty({dim});
    d::add_layer_norm_forward_cpu_out(x, r, w, b, kEps, h2, y2, mean2, rstd2);
    d::add_layer_norm_backward_cpu_out(dy, dh_in, h, mean, rstd, w, dh2, dw2, db2);
    for (const auto& [a, c] :
         {std::pair{h, h2}, {y, y2}, {mean, mean2}, {rstd, rstd2}, {dh, dh2}, {dw, dw2}, {db, db2}})
      EXPECT_TRUE(torch::equal(a, c)) << rows;
  }
}

TEST(AddLayerNorm, OtherInputsTakeTheReference) {
  torch::manual_seed(3);
  const auto w = torch::ones({12}), b = torch::zeros({12});
  const auto x = torch::randn({4, 12}), r = torch::randn({4, 12});
  EXPECT_FALSE(add_layer_norm_fused_supported(x, r, w, b));  // D % 8 != 0
  EXPECT_FALSE(add_layer_norm_fused_supported(x.to(torch::kDouble), r.to(torch::kDouble),
                                              w.to(torch::kDouble), b.to(torch::kDouble)));
  const auto x8 = torch::randn({8, 4}).t(), r8 = torch::randn({4, 8});
  EXPECT_FALSE(add_layer_norm_fused_supported(x8, r8, torch::ones({8}), torch::zeros({8})));
  EXPECT_FALSE(add_layer_norm_fused_supported(r8, r8, at::Tensor(), at::Tensor()));
  EXPECT_FALSE(add_layer_norm_fused_supported(r8, torch::randn({2, 8}), torch::ones({8}),
                                              torch::zeros({8})));  // shapes differ
  const auto dh = torch::randn({4, 12}), dy = torch::randn({4, 12});
  const auto got = run(fused, x, r, w, b, dh, dy);
  const auto ref = run(reference, x, r, w, b, dh, dy);
  EXPECT_TRUE(torch::equal(got.y, ref.y));
  EXPECT_TRUE(torch::equal(got.dx, ref.dx));
}

TEST(AddLayerNorm, SecondOrderGradientsEqualTheReference) {
  SKIP_WITHOUT_AVX2();
  // a gradient penalty: d/d(x, w) of |dL/dx|^2, with L = sum(y * t) + sum(h * u)
  torch::manual_seed(5);
  const auto x0 = torch::randn({6, 16}), r0 = torch::randn({6, 16});
  const auto w0 = 1 + 0.3 * torch::randn({16}), b0 = 0.3 * torch::randn({16});
  const auto t = torch::randn({6, 16}), u = torch::randn({6, 16});
  auto second = [&](auto f) {
    auto x = x0.clone().requires_grad_(true), r = r0.clone().requires_grad_(true);
    auto w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    auto [h, y] = f(x, r, w, b);
    auto dx = torch::autograd::grad({(y * t).sum() + (h * u).sum()}, {x}, {}, true, true)[0];
    return torch::autograd::grad({dx.pow(2).sum()}, {x, w});
  };
  const auto got = second(fused), want = second(reference);
  EXPECT_LE(relative(got[0], want[0]), 1e-5);
  EXPECT_LE(relative(got[1], want[1]), 1e-5);
}

TEST(AddLayerNorm, WithoutTheNormsGradientWeightAndBiasGetNone) {
  SKIP_WITHOUT_AVX2();
  for (const bool use_fused : {true, false}) {
    auto x = torch::randn({4, 16}).requires_grad_(true);
    auto w = torch::ones({16}).requires_grad_(true), b = torch::zeros({16}).requires_grad_(true);
    auto [h, y] = use_fused ? add_layer_norm(x, torch::randn({4, 16}), w, b, kEps)
                            : add_layer_norm_reference(x, torch::randn({4, 16}), w, b, kEps);
    h.sum().backward();  // y unused
    EXPECT_TRUE(torch::equal(x.grad(), torch::ones({4, 16}))) << use_fused;
    EXPECT_FALSE(w.grad().defined()) << use_fused;
    EXPECT_FALSE(b.grad().defined()) << use_fused;
  }
}

TEST(AddLayerNorm, ATransformerWithFusedResidualsEqualsOneWithout) {
  SKIP_WITHOUT_AVX2();
  torch::manual_seed(4);
  posenc::Transformer model(posenc::TransformerOptions(96, 3, 3).mlp_ratio(2),
                            posenc::build_encoder(nlohmann::json{{"type", "nope"}}, {96, 3, 0}));
  const auto x = torch::randn({8, 16, 96});
  auto pass = [&](bool fused_residuals) {
    model->options.fused(fused_residuals);
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    auto y = model(x, posenc::Positions::sequence(16));
    y.pow(2).sum().backward();
    std::vector<at::Tensor> g{y.detach()};
    for (auto& p : model->parameters()) g.push_back(p.grad().clone());
    return g;
  };
  const auto with = pass(true), without = pass(false);
  // rounding only: the output within 1e-5, parameter gradients (through 3 blocks) within 1e-4
  EXPECT_LE(relative(with[0], without[0]), 1e-5);
  for (size_t i = 1; i < with.size(); ++i) EXPECT_LE(relative(with[i], without[i]), 1e-4) << i;
  EXPECT_FALSE(torch::equal(with[0], without[0]));  // the fused passes ran
}

}  // namespace
