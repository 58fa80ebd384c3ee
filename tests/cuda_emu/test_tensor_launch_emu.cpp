// The glue between tensors and the CUDA kernels (src/kernels/cuda/tensor_launch.cpp, what
// posenc's operators run on CUDA tensors) driven on CPU tensors through the emulated kernels, and
// checked against the plain-ATen specifications in float64: rope_apply, and attention_reference
// with autograd through it. What test_cuda_raw.cpp cannot reach, since it fills the launch structs
// by hand: the glue's strides of non-contiguous views (q, k, v as [B, H, N, D] transposed; a
// strided rotation in place), positions cast to float64, ALiBi slopes, the T5 bucket lookup built
// with t5_offset_buckets, the padding mask as bytes, delta = dO . O, the float32 gradient buffers
// cast back to each storage type, the empty-input early returns, and its argument checks. Packed
// samples and the variate bias as posenc::attention_fused runs them on CUDA: q, k rotated by the
// RoPE kernel first, sample_ids into per-token sample bounds on the ids' device, the variate
// bias's gradient summed from the kernel's partial sums, dq and dk rotated back.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <tuple>

#include "../../src/kernels/cuda/tensor_launch.h"
#include "posenc/posenc.h"
#include "support/bias_forms.h"

namespace posenc {
namespace {

using test::Form;
using test::spec_for;

// |got - want| <= relative |want| + absolute, per element, against float64.
struct Tolerance {
  double relative, absolute;
};
// fp32: a few ulps of |x| (the rotation), and the attention's fp32 tiles, summation order and the
// emulated __expf (the host's expf) against float64; bf16/fp16 add one rounding of the output
// (half an ulp, 2^-9 / 2^-12 relative, doubled).
Tolerance tolerance_for(at::ScalarType dtype, bool attention) {
  const double absolute = attention ? 5e-5 : 5e-6;
  if (dtype == at::kBFloat16) return {1.0 / 256, absolute};
  if (dtype == at::kHalf) return {1.0 / 2048, absolute};
  return {attention ? 1e-5 : 1e-6, absolute};
}
// Gradients relative to their largest entry: fp32 accumulation over <= 70 keys vs float64, and,
// for bf16/fp16, the rounding of the returned gradient to the storage type and of O, from which
// the glue computes delta = dO . O as FlashAttention does (2^-8 / 2^-11 relative; the T5 table's
// gradient, a sum of P (dP - delta) over every query and key, shows it most: 2e-3 / 3e-4 seen).
double gradient_tolerance(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? 1e-2 : dtype == at::kHalf ? 2e-3 : 1e-4;
}

std::string worst(const at::Tensor& got, const at::Tensor& want, Tolerance t) {
  auto g = got.to(at::kDouble).reshape(-1), w = want.to(at::kDouble).reshape(-1);
  if (g.numel() != w.numel()) return "sizes differ";
  if (g.numel() == 0) return "";
  auto excess = (g - w).abs() - (w.abs() * t.relative + t.absolute);
  excess = torch::where(torch::isnan(g) != torch::isnan(w), torch::full_like(excess, INFINITY),
                        excess.nan_to_num(0.0));
  const int64_t i = excess.argmax().item<int64_t>();
  if (excess[i].item<double>() <= 0.0) return "";
  return "element " + std::to_string(i) + ": got " + std::to_string(g[i].item<double>()) +
         ", want " + std::to_string(w[i].item<double>());
}

double relative_diff(const at::Tensor& got, const at::Tensor& want) {
  auto g = got.to(at::kDouble), w = want.to(at::kDouble);
  if (g.isnan().any().item<bool>()) return INFINITY;
  return (g - w).abs().max().item<double>() / std::max(1e-12, w.abs().max().item<double>());
}

// ---- RoPE: q and k with different head counts, out of place; a strided view rotated in place --

class TensorLaunchRope : public ::testing::TestWithParam<std::tuple<at::ScalarType, RopeLayout>> {};

TEST_P(TensorLaunchRope, QkOutOfPlaceAndStridedInPlaceMatchRopeApply) {
  const auto [dtype, layout] = GetParam();
  const auto t = tolerance_for(dtype, false);
  torch::manual_seed(5);
  const int64_t b = 2, n = 9, f = 12;
  auto positions = torch::rand({b, n}, torch::kFloat64) * 3000;  // per batch: cos/sin [B, N, F]
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * f, 2, torch::kFloat64) / (2.0 * f));
  auto [cos, sin] = rope_cos_sin(positions, inv);  // float32 tables, as the operators pass
  // q [B, N, 4, 32] and k [B, N, 2, 32] as [B, H, N, D] transposed: token stride != H * D
  auto q = torch::randn({b, 4, n, 32}).to(dtype).transpose(1, 2);
  auto k = torch::randn({b, 2, n, 32}).to(dtype).transpose(1, 2);
  auto q_out = torch::empty_like(q), k_out = torch::empty_like(k);
  detail::rope_rotate_launch({q, k}, {q_out, k_out}, cos, sin, layout, false, nullptr);
  auto c64 = cos.to(at::kDouble), s64 = sin.to(at::kDouble);
  EXPECT_EQ(worst(q_out, rope_apply(q.to(at::kDouble), c64, s64, layout), t), "") << "q";
  EXPECT_EQ(worst(k_out, rope_apply(k.to(at::kDouble), c64, s64, layout), t), "") << "k";
  // the inverse undoes it (to the storage type's rounding)
  auto back = torch::empty_like(q_out);
  detail::rope_rotate_launch({q_out}, {back}, cos, sin, layout, true, nullptr);
  EXPECT_EQ(worst(back, rope_apply(q_out.to(at::kDouble), c64, -s64, layout), t), "") << "inverse";
  // in place on a strided view: [B, N, 2, 48] inside rows of 96, rotary width 24 of 48
  auto base = torch::randn({b, n, 2, 96}).to(dtype);
  auto x = base.narrow(3, 0, 48);
  auto want = rope_apply(x.to(at::kDouble), c64.narrow(-1, 0, 6), s64.narrow(-1, 0, 6), layout);
  auto untouched = base.narrow(3, 48, 48).clone();
  detail::rope_rotate_launch({x}, {x}, cos.narrow(-1, 0, 6).contiguous(),
                             sin.narrow(-1, 0, 6).contiguous(), layout, false, nullptr);
  EXPECT_EQ(worst(x, want, t), "") << "strided in place";
  EXPECT_TRUE(torch::equal(base.narrow(3, 48, 48), untouched)) << "the rest of the row";
}

INSTANTIATE_TEST_SUITE_P(StoragesLayouts, TensorLaunchRope,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16, at::kHalf),
                                            ::testing::Values(RopeLayout::kHalf,
                                                              RopeLayout::kInterleaved)));

TEST(TensorLaunchRopeChecks, RefusesBadArgumentsAndCopiesWithoutPairs) {
  auto q = torch::randn({1, 3, 2, 8}), cos = torch::ones({3, 4}), sin = torch::zeros({3, 4});
  auto out = torch::empty_like(q);
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              detail::rope_rotate_launch({q.to(at::kDouble)}, {out.to(at::kDouble)}, cos, sin,
                                         RopeLayout::kHalf, false, nullptr);
            }).find("float32, bfloat16 or float16, got Double"),
            std::string::npos);
  EXPECT_NE(message([&] {
              detail::rope_rotate_launch({q}, {out}, torch::ones({3, 5}), torch::zeros({3, 5}),
                                         RopeLayout::kHalf, false, nullptr);
            }).find("rotary width 2F=10 exceeds head_dim=8"),
            std::string::npos);
  EXPECT_NE(message([&] {
              detail::rope_rotate_launch({q}, {out}, torch::ones({4, 4}), torch::zeros({4, 4}),
                                         RopeLayout::kHalf, false, nullptr);
            }).find("cos/sin have 4 positions but the inputs have N=3"),
            std::string::npos);
  // nothing to rotate: out of place is a copy
  detail::rope_rotate_launch({q}, {out}, torch::ones({3, 0}), torch::zeros({3, 0}),
                             RopeLayout::kHalf, false, nullptr);
  EXPECT_TRUE(torch::equal(out, q));
}

// ---- attention: forward and backward through the glue ------------------------------------------

struct GlueCase {
  at::ScalarType dtype;
  Form form;
  bool causal, padding;
  int64_t batch, heads, nq, nk, d, dv;
  const char* name;
};

void PrintTo(const GlueCase& c, std::ostream* os) { *os << c.name; }

class TensorLaunchAttention : public ::testing::TestWithParam<GlueCase> {};

TEST_P(TensorLaunchAttention, ForwardAndBackwardMatchReference) {
  const auto& c = GetParam();
  torch::manual_seed(31);
  const int64_t b = c.batch, h = c.heads;
  // q, k, v as the attention layer holds them, [B, H, N, D] viewed as [B, N, H, D]
  auto q = torch::randn({b, h, c.nq, c.d}).to(c.dtype).transpose(1, 2);
  auto k = torch::randn({b, h, c.nk, c.d}).to(c.dtype).transpose(1, 2);
  auto v = torch::randn({b, h, c.nk, c.dv}).to(c.dtype).transpose(1, 2);
  auto table = torch::randn({32, h});
  auto spec = spec_for(c.form, h, table);
  auto kp = torch::arange(c.nk, torch::kFloat32) + 7;  // float32 positions: the glue casts them
  auto qp = kp.narrow(0, c.nk - c.nq, c.nq).clone();
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[b - 1].narrow(0, c.nk - 2, 2).fill_(false);
  }
  const double scale = 0.3;
  auto [out, lse] =
      detail::attention_forward_launch(q, k, v, table, spec, qp, kp, masks, scale, nullptr);
  ASSERT_EQ(out.scalar_type(), c.dtype);
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{b, c.nq, h, c.dv}));

  auto q64 = q.to(at::kDouble).requires_grad_(true);
  auto k64 = k.to(at::kDouble).requires_grad_(true);
  auto v64 = v.to(at::kDouble).requires_grad_(true);
  auto table64 = table.to(at::kDouble).requires_grad_(true);
  auto bias =
      bias_from_spec(spec_for(c.form, h, table64), qp.to(at::kDouble), kp.to(at::kDouble), h);
  if (bias.defined()) bias = bias.to(at::kDouble);
  auto want = attention_reference(q64, k64, v64, bias, masks, scale);
  EXPECT_EQ(worst(out, want, tolerance_for(c.dtype, true)), "") << "output";

  auto probe = torch::randn({b, c.nq, h, c.dv}).to(c.dtype);
  auto [dq, dk, dv, dtable] = detail::attention_backward_launch(
      probe, out, lse, q, k, v, table, spec, qp, kp, masks, scale, nullptr);
  (want * probe.to(at::kDouble)).sum().backward();
  EXPECT_EQ(dq.scalar_type(), c.dtype);
  const double g = gradient_tolerance(c.dtype);
  EXPECT_LT(relative_diff(dq, q64.grad()), g) << "dq";
  EXPECT_LT(relative_diff(dk, k64.grad()), g) << "dk";
  EXPECT_LT(relative_diff(dv, v64.grad()), g) << "dv";
  if (spec.form == BiasForm::kBucketTable) {
    ASSERT_TRUE(dtable.defined());
    EXPECT_LT(relative_diff(dtable, table64.grad()), g) << "dtable";
  } else {
    EXPECT_FALSE(dtable.defined());
  }
}

std::vector<GlueCase> glue_cases() {
  std::vector<GlueCase> out;
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    out.push_back({dtype, Form::kNone, false, false, 2, 2, 20, 20, 16, 16, "NoBias"});
    out.push_back({dtype, Form::kAlibiCausal, true, true, 2, 3, 9, 40, 32, 24,
                   "AlibiCausalCachedKeysPadding"});
    out.push_back({dtype, Form::kT5Bidirectional, false, true, 2, 2, 33, 33, 64, 64,
                   "T5BidirectionalPadding"});
    out.push_back({dtype, Form::kT5Unidirectional, true, false, 1, 2, 17, 17, 8, 40,
                   "T5UnidirectionalCausal"});
  }
  return out;
}

std::string glue_case_name(const testing::TestParamInfo<GlueCase>& info) {
  const auto d = info.param.dtype;
  return std::string(d == at::kFloat      ? "f32"
                     : d == at::kBFloat16 ? "bf16"
                                          : "f16") +
         "_" + info.param.name;
}

INSTANTIATE_TEST_SUITE_P(StoragesForms, TensorLaunchAttention, ::testing::ValuesIn(glue_cases()),
                         glue_case_name);

TEST(TensorLaunchAttentionChecks, EmptyInputsReturnWithoutALaunch) {
  BiasSpec none;
  AttentionMasks masks;
  auto q = torch::randn({1, 0, 2, 8}), k = torch::randn({1, 5, 2, 8}),
       v = torch::randn({1, 5, 2, 8});
  auto p = torch::arange(5, torch::kDouble);
  auto [out, lse] = detail::attention_forward_launch(q, k, v, torch::zeros({0}), none,
                                                     p.narrow(0, 0, 0), p, masks, 1.0, nullptr);
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{1, 0, 2, 8}));
  // no key for any row: every gradient is zero
  auto q1 = torch::randn({1, 3, 2, 8}), k0 = torch::randn({1, 0, 2, 8}),
       v0 = torch::randn({1, 0, 2, 8});
  auto [dq, dk, dv, dtable] = detail::attention_backward_launch(
      torch::randn({1, 3, 2, 8}), torch::zeros({1, 3, 2, 8}), torch::zeros({1, 2, 3}), q1, k0, v0,
      torch::zeros({0}), none, p.narrow(0, 0, 3), p.narrow(0, 0, 0), masks, 1.0, nullptr);
  EXPECT_TRUE(torch::equal(dq, torch::zeros_like(q1)));
  EXPECT_EQ(dk.sizes(), k0.sizes());
  EXPECT_FALSE(dtable.defined());
}

TEST(TensorLaunchAttentionChecks, RefusesBadArguments) {
  BiasSpec none;
  AttentionMasks masks;
  auto p = torch::arange(4, torch::kDouble);
  auto message = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    try {
      detail::attention_forward_launch(q, k, v, torch::zeros({0}), none, p, p, masks, 1.0, nullptr);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  auto x = torch::randn({1, 4, 2, 8});
  EXPECT_NE(message(x, x.to(at::kHalf), x).find("q, k, v must share a dtype"), std::string::npos);
  auto wide = torch::randn({1, 4, 2, 300});
  EXPECT_NE(message(wide, wide, wide).find("head dims up to 256, got D=300"), std::string::npos);
  EXPECT_NE(message(x.to(at::kDouble), x.to(at::kDouble), x.to(at::kDouble))
                .find("float32, bfloat16 or float16, got Double"),
            std::string::npos);
}

// ---- packed samples + variate bias with RoPE and ALiBi, as attention_fused runs them on CUDA ----

struct PackedGlueCase {
  at::ScalarType dtype;
  bool causal;
  int64_t nq;  ///< queries: the last nq of 150 tokens
};

void PrintTo(const PackedGlueCase& c, std::ostream* os) {
  *os << c.dtype << (c.causal ? " causal" : "") << " nq " << c.nq;
}

class TensorLaunchPackedAttention : public ::testing::TestWithParam<PackedGlueCase> {};

TEST_P(TensorLaunchPackedAttention, RopeAlibiSamplesVariatesMatchReference) {
  const auto [dtype, causal, nq] = GetParam();
  torch::manual_seed(41);
  const int64_t b = 2, h = 3, nk = 150, d = 32;
  auto q = torch::randn({b, h, nq, d}).to(dtype).transpose(1, 2);
  auto k = torch::randn({b, h, nk, d}).to(dtype).transpose(1, 2);
  auto v = torch::randn({b, h, nk, d}).to(dtype).transpose(1, 2);
  // samples of 40, 70, 40 tokens and 5, 100, 45; variates in runs of 7 inside each row
  auto sample_ids =
      torch::cat({torch::repeat_interleave(torch::arange(3), torch::tensor({40, 70, 40})),
                  torch::repeat_interleave(torch::arange(3), torch::tensor({5, 100, 45}))})
          .view({b, nk});
  auto variate_ids = (torch::arange(nk).div(7, "floor") % 4).repeat({b, 1});
  auto weight = torch::randn({2, h});
  AttentionMasks masks;
  masks.causal = causal;
  masks.sample_ids = sample_ids;
  masks.variate_ids = variate_ids;
  masks.variate_bias = weight;
  masks.key_padding = torch::ones({b, nk}, torch::kBool);
  masks.key_padding[1].narrow(0, 0, 5).fill_(false);  // row 1's first sample: no key at all
  // RoPE with positions restarting in every sample (Moirai's time_id), 12 of 16 pairs
  auto starts = torch::cat({torch::ones({b, 1}, torch::kBool),
                            sample_ids.narrow(1, 1, nk - 1) != sample_ids.narrow(1, 0, nk - 1)},
                           1);
  auto first = std::get<0>(torch::cummax(torch::where(starts, torch::arange(nk), 0), 1));
  auto time = (torch::arange(nk) - first).to(torch::kFloat64);  // [B, Nk]
  auto inv = torch::pow(10000.0, -torch::arange(0, 24, 2, torch::kFloat64) / 32.0);
  auto [cos, sin] = rope_cos_sin(time, inv);  // [B, Nk, 12] float32
  auto q_cos = cos.narrow(1, nk - nq, nq).contiguous(),
       q_sin = sin.narrow(1, nk - nq, nq).contiguous();
  BiasSpec alibi = spec_for(Form::kAlibiCausal, h, torch::Tensor());
  auto kp = torch::arange(nk, torch::kFloat64);
  auto qp = kp.narrow(0, nk - nq, nq);
  const double scale = 0.25;

  // the operator's CUDA path: rotate, attend, rotate the gradients back
  auto qr = torch::empty_like(q), kr = torch::empty_like(k);
  detail::rope_rotate_launch({q}, {qr}, q_cos, q_sin, RopeLayout::kHalf, false, nullptr);
  detail::rope_rotate_launch({k}, {kr}, cos, sin, RopeLayout::kHalf, false, nullptr);
  auto [out, lse] = detail::attention_forward_launch(qr, kr, v, torch::zeros({0}), alibi, qp, kp,
                                                     masks, scale, nullptr);
  auto probe = torch::randn({b, nq, h, d}).to(dtype);
  at::Tensor dvariate;
  auto [dq, dk, dv, dtable] =
      detail::attention_backward_launch(probe, out, lse, qr, kr, v, torch::zeros({0}), alibi, qp,
                                        kp, masks, scale, nullptr, &dvariate);
  EXPECT_FALSE(dtable.defined());
  ASSERT_TRUE(dvariate.defined());
  EXPECT_EQ(dvariate.sizes(), (at::IntArrayRef{2, h}));
  auto dq_back = torch::empty_like(dq), dk_back = torch::empty_like(dk);
  detail::rope_rotate_launch({dq}, {dq_back}, q_cos, q_sin, RopeLayout::kHalf, true, nullptr);
  detail::rope_rotate_launch({dk}, {dk_back}, cos, sin, RopeLayout::kHalf, true, nullptr);

  // the specification in float64, autograd through the rotation and the variate bias
  auto q64 = q.to(at::kDouble).requires_grad_(true);
  auto k64 = k.to(at::kDouble).requires_grad_(true);
  auto v64 = v.to(at::kDouble).requires_grad_(true);
  auto w64 = weight.to(at::kDouble).requires_grad_(true);
  AttentionMasks masks64 = masks;
  masks64.variate_bias = w64;
  auto c64 = cos.to(at::kDouble), s64 = sin.to(at::kDouble);
  auto qrot =
      rope_apply(q64, c64.narrow(1, nk - nq, nq), s64.narrow(1, nk - nq, nq), RopeLayout::kHalf);
  auto krot = rope_apply(k64, c64, s64, RopeLayout::kHalf);
  // the rotation's output rounded to the storage type, as the RoPE kernel hands it to the
  // attention kernel (the gradient passes through the rounding unchanged)
  auto rounded = [&](const at::Tensor& x) {
    return x + (x.to(dtype).to(at::kDouble) - x).detach();
  };
  auto bias = bias_from_spec(alibi, qp, kp, h).to(at::kDouble);
  auto want = attention_reference(rounded(qrot), rounded(krot), v64, bias, masks64, scale);
  EXPECT_EQ(worst(out, want, tolerance_for(dtype, true)), "") << "output";
  const auto no_key = out.select(0, 1).narrow(0, 0, std::max<int64_t>(0, 5 - (nk - nq)));
  EXPECT_TRUE(torch::equal(no_key, torch::zeros_like(no_key))) << "row 1's queries without a key";
  (want * probe.to(at::kDouble)).sum().backward();
  const double g = gradient_tolerance(dtype);
  EXPECT_LT(relative_diff(dq_back, q64.grad()), g) << "dq";
  EXPECT_LT(relative_diff(dk_back, k64.grad()), g) << "dk";
  EXPECT_LT(relative_diff(dv, v64.grad()), g) << "dv";
  EXPECT_LT(relative_diff(dvariate, w64.grad()), 10 * g) << "dvariate_bias";
}

INSTANTIATE_TEST_SUITE_P(StoragesCausal, TensorLaunchPackedAttention,
                         ::testing::Values(PackedGlueCase{at::kFloat, false, 150},
                                           PackedGlueCase{at::kFloat, true, 150},
                                           PackedGlueCase{at::kFloat, true, 60},
                                           PackedGlueCase{at::kBFloat16, true, 150},
                                           PackedGlueCase{at::kHalf, false, 60}),
                         [](const testing::TestParamInfo<PackedGlueCase>& info) {
                           const auto d = info.param.dtype;
                           return std::string(d == at::kFloat      ? "f32"
                                              : d == at::kBFloat16 ? "bf16"
                                                                   : "f16") +
                                  (info.param.causal ? "_causal" : "") + "_nq" +
                                  std::to_string(info.param.nq);
                         });

TEST(TensorLaunchPackedAttentionChecks, RefusesIdsOfTheWrongShape) {
  BiasSpec none;
  auto x = torch::randn({2, 4, 2, 8});
  auto p = torch::arange(4, torch::kDouble);
  auto message = [&](const AttentionMasks& masks) {
    try {
      detail::attention_forward_launch(x, x, x, torch::zeros({0}), none, p, p, masks, 1.0, nullptr);
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("no error");
  };
  AttentionMasks masks;
  masks.sample_ids = torch::zeros({2, 3}, torch::kLong);
  EXPECT_NE(message(masks).find("sample_ids must be [B, Nk] = [2, 4] with Nq=4 <= Nk, got [2, 3]"),
            std::string::npos)
      << message(masks);
  masks = {};
  masks.variate_ids = torch::zeros({2, 4}, torch::kLong);
  masks.variate_bias = torch::zeros({2, 3});
  EXPECT_NE(message(masks).find("variate_ids needs variate_bias [2, H] = [2, 2]"),
            std::string::npos)
      << message(masks);
}

}  // namespace
}  // namespace posenc
