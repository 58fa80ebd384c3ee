// CUDA kernels vs the CPU references (rope_apply, attention_reference: the specifications).
// The raw kernels (rope_rotate_tables, attention_forward/backward through cudaMalloc) are tested in
// test_cuda_raw.cpp, which also runs on the CPU emulator (ctest cuda_emu). Here:
//  - the public functions on CUDA tensors (rope_fused*, attention_fused), built only with the glue
//    (POSENC_HAS_CUDA_GLUE): layouts x dtypes x odd sizes, non-contiguous views, position
//    offsets, batched tables; ALiBi/T5 x causal x padding; gradients.
//  - posenc::apply_rotary / apply_rotary_ on CUDA tensors (libposenc_ops.so loaded): the CUDA
//    kernel with eager's roundings equals the plain-ATen reference on CUDA and on the CPU to the
//    bit (tests/cuda_emu/test_rotary_emu.cpp checks the same on the CPU emulator).
// Every test skips (never fails) without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#ifdef POSENC_OPS_LIBRARY_PATH
#include <ATen/core/dispatch/Dispatcher.h>
#include <dlfcn.h>
#endif

#include "posenc/config/registry.h"
#include "posenc/kernels/attention_cuda.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_cuda.h"
#include "posenc/kernels/rope_fused.h"
#include "posenc/posenc.h"
#include "support/bias_forms.h"
#include "support/encoder_cases.h"

namespace posenc {
namespace {

using test::Form;
using test::spec_for;

// fp32 kernel and fp32 reference evaluate the same rotation: a few ulps of |x| <~ 4.
constexpr double kRopeFloat32Tolerance = 5e-6;
// bf16/fp16 outputs are rounded once each from fp32; the reference rounds the same way.
constexpr double kReducedTolerance = 2e-2;
// float32 tiles vs a float32 einsum/softmax: different summation orders, values O(1).
constexpr double kAttentionTolerance = 5e-5;
// Gradients relative to their largest entry (float32 tiles vs autograd through the reference).
constexpr double kGradientTolerance = 1e-4;

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kCPU, torch::kFloat64) - b.to(torch::kCPU, torch::kFloat64))
      .abs()
      .max()
      .item<double>();
}

[[maybe_unused]] double relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return max_abs_diff(a, b) / std::max(1e-12, b.abs().max().item<double>());
}

// ---- public functions on CUDA tensors (the glue)
// --------------------------------------------------
#if POSENC_HAS_CUDA_GLUE

#define SKIP_WITHOUT_TORCH_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

struct RopeCase {
  at::ScalarType dtype;
  RopeLayout layout;
  std::vector<int64_t> shape;  // B, N, H, Dh
  double partial;
  bool batched_table;
  bool non_contiguous;
};

class CudaRope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(CudaRope, MatchesReferenceForwardBackwardInPlace) {
  SKIP_WITHOUT_TORCH_CUDA();
  const auto& c = GetParam();
  torch::manual_seed(7);
  const int64_t b = c.shape[0], n = c.shape[1], h = c.shape[2], dh = c.shape[3];
  auto make = [&] {
    auto base = torch::randn({b, n, h, c.non_contiguous ? 2 * dh : dh}).to(c.dtype);
    return c.non_contiguous ? base.narrow(-1, 0, dh) : base;  // strided rows
  };
  auto q = make(), k = make();
  const int64_t f = static_cast<int64_t>(dh * c.partial) / 2;
  auto positions = c.batched_table ? torch::rand({b, n}, torch::kFloat64) * 5000
                                   : torch::arange(n, torch::kFloat64) + 1234;  // an offset
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * f, 2, torch::kFloat64) / (2.0 * f));
  auto [cos, sin] = rope_cos_sin(positions, inv, 1.0);
  auto qd = q.cuda(), kd = k.cuda();
  ASSERT_TRUE(rope_fused_supported(qd, cos));
  auto [fq, fk] = rope_fused_qk(qd, kd, cos, sin, c.layout);
  const double tol = c.dtype == torch::kFloat32 ? kRopeFloat32Tolerance : kReducedTolerance;
  EXPECT_TRUE(fq.is_cuda());
  EXPECT_EQ(fq.scalar_type(), c.dtype);
  EXPECT_LT(max_abs_diff(fq, rope_apply(q, cos, sin, c.layout)), tol);
  EXPECT_LT(max_abs_diff(fk, rope_apply(k, cos, sin, c.layout)), tol);
  // one tensor, out of place, tables already on the device
  EXPECT_LT(max_abs_diff(rope_fused(qd, cos.cuda(), sin.cuda(), c.layout), fq), 1e-6);
  // in place (a strided view is rotated where it lives)
  auto qi = qd.clone();
  rope_fused_(qi, cos, sin, c.layout);
  EXPECT_LT(max_abs_diff(qi, fq), 1e-6);
  if (c.dtype != torch::kFloat32) return;
  // backward: the inverse rotation on the device vs autograd through the CPU reference
  auto q1 = qd.detach().requires_grad_(true), k1 = kd.detach().requires_grad_(true);
  auto q2 = q.detach().requires_grad_(true), k2 = k.detach().requires_grad_(true);
  auto probe = torch::randn({b, n, h, dh});
  auto [a1, b1] = rope_fused_qk(q1, k1, cos, sin, c.layout);
  ((a1 * probe.cuda()).sum() + (b1 * probe.cuda() * 2).sum()).backward();
  ((rope_apply(q2, cos, sin, c.layout) * probe).sum() +
   (rope_apply(k2, cos, sin, c.layout) * probe * 2).sum())
      .backward();
  EXPECT_LT(max_abs_diff(q1.grad(), q2.grad()), tol);
  EXPECT_LT(max_abs_diff(k1.grad(), k2.grad()), tol);
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> out;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
      out.push_back({dtype, layout, {2, 17, 3, 64}, 1.0, false, false});      // vector path
      out.push_back({dtype, layout, {1, 5, 1, 10}, 1.0, true, false});        // odd F = 5
      out.push_back({dtype, layout, {3, 7, 2, 48}, 0.5, false, true});        // partial, strided
      out.push_back({dtype, layout, {1, 33, 4, 32}, 0.25, true, true});       // batched table
      out.push_back({dtype, layout, {1, 2048, 16, 128}, 1.0, false, false});  // the bench size
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(LayoutsDtypesShapes, CudaRope, ::testing::ValuesIn(rope_cases()));

TEST(CudaRope, QAndKWithDifferentHeadCounts) {
  SKIP_WITHOUT_TORCH_CUDA();
  torch::manual_seed(8);
  auto q = torch::randn({2, 9, 8, 32}), k = torch::randn({2, 9, 2, 32});  // GQA
  auto inv = torch::pow(10000.0, -torch::arange(0, 32, 2, torch::kFloat64) / 32.0);
  auto [cos, sin] = rope_cos_sin(torch::arange(9, torch::kFloat64), inv);
  auto [fq, fk] = rope_fused_qk(q.cuda(), k.cuda(), cos, sin, RopeLayout::kHalf);
  EXPECT_LT(max_abs_diff(fq, rope_apply(q, cos, sin, RopeLayout::kHalf)), kRopeFloat32Tolerance);
  EXPECT_LT(max_abs_diff(fk, rope_apply(k, cos, sin, RopeLayout::kHalf)), kRopeFloat32Tolerance);
}

struct AttentionCase {
  at::ScalarType dtype;
  Form form;
  bool causal;
  bool padding;
  int64_t nq, nk, d, dv;
};

class CudaAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaAttention, MatchesReferenceForwardAndBackward) {
  SKIP_WITHOUT_TORCH_CUDA();
  const auto& c = GetParam();
  torch::manual_seed(21);
  const int64_t b = 2, h = 3;
  auto q = torch::randn({b, c.nq, h, c.d}).to(c.dtype);
  auto k = torch::randn({b, c.nk, h, c.d}).to(c.dtype);
  auto v = torch::randn({b, c.nk, h, c.dv}).to(c.dtype);
  auto table = torch::randn({32, h});
  auto spec = spec_for(c.form, h, table);
  // positions with an offset; queries are the last nq of the keys (a KV cache)
  auto kp = torch::arange(c.nk, torch::kFloat64) + 100;
  auto qp = kp.narrow(0, c.nk - c.nq, c.nq).clone();
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[1].narrow(0, c.nk - 3, 3).fill_(false);
    masks.key_padding[0][0] = false;
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  auto bias = bias_from_spec(spec, qp, kp, h);
  auto want = attention_reference(q.to(torch::kFloat32), k.to(torch::kFloat32),
                                  v.to(torch::kFloat32), bias, masks, scale);
  AttentionMasks masks_d = masks;
  if (c.padding) masks_d.key_padding = masks.key_padding.cuda();
  ASSERT_TRUE(attention_fused_supported(spec, q.cuda(), qp, kp));
  auto got = attention_fused(q.cuda(), k.cuda(), v.cuda(), spec, qp, kp, masks_d, scale);
  EXPECT_TRUE(got.is_cuda());
  EXPECT_EQ(got.scalar_type(), c.dtype);
  const double tol = c.dtype == torch::kFloat32 ? kAttentionTolerance : kReducedTolerance;
  EXPECT_LT(max_abs_diff(got, want), tol);
  if (c.dtype != torch::kFloat32) return;
  // gradients (the CUDA backward kernels) vs autograd through the reference on the CPU
  auto q1 = q.cuda().requires_grad_(true), k1 = k.cuda().requires_grad_(true),
       v1 = v.cuda().requires_grad_(true);
  auto t1 = table.clone().requires_grad_(true);
  auto probe = torch::randn({b, c.nq, h, c.dv});
  (attention_fused(q1, k1, v1, spec_for(c.form, h, t1), qp, kp, masks_d, scale) * probe.cuda())
      .sum()
      .backward();
  auto q2 = q.clone().requires_grad_(true), k2 = k.clone().requires_grad_(true),
       v2 = v.clone().requires_grad_(true);
  auto t2 = table.clone().requires_grad_(true);
  (attention_reference(q2, k2, v2, bias_from_spec(spec_for(c.form, h, t2), qp, kp, h), masks,
                       scale) *
   probe)
      .sum()
      .backward();
  EXPECT_LT(relative_diff(q1.grad(), q2.grad()), kGradientTolerance);
  EXPECT_LT(relative_diff(k1.grad(), k2.grad()), kGradientTolerance);
  EXPECT_LT(relative_diff(v1.grad(), v2.grad()), kGradientTolerance);
  if (spec.form == BiasForm::kBucketTable) {
    EXPECT_LT(relative_diff(t1.grad(), t2.grad()), kGradientTolerance);
  }
}

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> out;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16}) {
    out.push_back({dtype, Form::kNone, false, false, 33, 33, 16, 8});
    out.push_back({dtype, Form::kAlibiCausal, true, false, 17, 70, 64, 64});  // cached keys
    out.push_back({dtype, Form::kAlibiSymmetric, false, true, 50, 50, 24, 40});
    out.push_back({dtype, Form::kT5Bidirectional, false, true, 31, 31, 128, 128});
    out.push_back({dtype, Form::kT5Unidirectional, true, true, 1, 65, 32, 200});  // one query
  }
  out.push_back({torch::kFloat32, Form::kAlibiCausal, true, true, 300, 300, 256, 256});
  return out;
}

INSTANTIATE_TEST_SUITE_P(FormsMasksSizes, CudaAttention, ::testing::ValuesIn(attention_cases()));

TEST(CudaAttention, NonContiguousInputs) {
  SKIP_WITHOUT_TORCH_CUDA();
  torch::manual_seed(22);
  // q, k, v as views into one fused projection [B, N, 3, H, D]
  auto qkv = torch::randn({2, 41, 3, 4, 32});
  auto q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  auto dev = qkv.cuda();
  auto positions = torch::arange(41, torch::kFloat64);
  BiasSpec spec;
  spec.form = BiasForm::kAlibi;
  spec.slopes = torch::tensor(alibi_slopes(4), torch::kFloat64).to(torch::kFloat32);
  AttentionMasks masks;
  masks.causal = true;
  auto got = attention_fused(dev.select(2, 0), dev.select(2, 1), dev.select(2, 2), spec, positions,
                             positions, masks, 0.125);
  auto want =
      attention_reference(q, k, v, bias_from_spec(spec, positions, positions, 4), masks, 0.125);
  EXPECT_LT(max_abs_diff(got, want), kAttentionTolerance);
}

#ifdef POSENC_OPS_LIBRARY_PATH
// posenc's operators (libposenc_ops.so: apply_rotary lives there, not in the static core this
// program links; its copy of the core registers nothing twice: test_rope_fused.cpp).
using ApplyRotary = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                       const at::Tensor&, const at::Tensor&,
                                                       int64_t, c10::string_view);
using ApplyRotaryInPlace = void(at::Tensor&, at::Tensor&, const at::Tensor&, const at::Tensor&,
                                int64_t, c10::string_view);
using ApplyRotaryRoute = std::string(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                     const at::Tensor&, int64_t, c10::string_view);

template <typename Signature>
c10::TypedOperatorHandle<Signature> posenc_operator(const char* name) {
  static void* const handle = dlopen(POSENC_OPS_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle != nullptr, "cannot load ", POSENC_OPS_LIBRARY_PATH, ": ", dlerror());
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

// The tensor's bits as integers of its width, so that -0.0 and +0.0 differ.
at::Tensor bits(const at::Tensor& x) {
  const auto dense = x.cpu().contiguous();
  return dense.view(dense.element_size() == 4 ? at::kInt : at::kShort);
}

// apply_rotary on CUDA takes the CUDA kernel with eager's roundings (route "fused") and equals
// transformers' formula (the reference) to the bit: on CUDA, and on the CPU (the same IEEE ops).
// HF's tables in q's dtype; q and k [B, H, N, D] (unsqueeze_dim 1) or [B, N, H, D] (2), GQA heads,
// partial rotary (W = 12 of 20), odd pairs (F = 3), a packed qkv row (strided), in place.
TEST(CudaApplyRotary, EqualsEagerReferenceToTheBit) {
  SKIP_WITHOUT_TORCH_CUDA();
  const auto rotary = posenc_operator<ApplyRotary>("posenc::apply_rotary");
  const auto reference = posenc_operator<ApplyRotary>("posenc::apply_rotary_reference");
  const auto in_place = posenc_operator<ApplyRotaryInPlace>("posenc::apply_rotary_");
  const auto route = posenc_operator<ApplyRotaryRoute>("posenc::apply_rotary_route");
  struct Shape {
    int64_t b, n, hq, hk, d, w, unsqueeze_dim;
    bool packed;
  };
  const Shape shapes[] = {{2, 9, 4, 2, 16, 16, 1, false},
                          {3, 7, 3, 3, 20, 12, 2, false},
                          {1, 5, 2, 1, 6, 6, 1, false},
                          {2, 33, 2, 2, 128, 128, 1, true}};
  torch::manual_seed(23);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16})
    for (const char* layout : {"half", "interleaved"})
      for (const auto& s : shapes) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + layout +
                     " D=" + std::to_string(s.d) + " W=" + std::to_string(s.w));
        auto make = [&](int64_t heads, int64_t offset) {
          auto shape = s.unsqueeze_dim == 1 ? std::vector<int64_t>{s.b, heads, s.n, s.d}
                                            : std::vector<int64_t>{s.b, s.n, heads, s.d};
          if (!s.packed) return (torch::randn(shape) * 3).to(dtype).cuda();
          shape.back() = 3 * s.d;  // q, k, v of one projection row
          return (torch::randn(shape) * 3).to(dtype).cuda().narrow(-1, offset * s.d, s.d);
        };
        auto q = make(s.hq, 0), k = make(s.hk, 1);
        auto positions = torch::arange(s.n, torch::kFloat64).unsqueeze(0) + 1000;
        auto inv = torch::pow(10000.0, -torch::arange(0, s.w, 2, torch::kFloat64) / s.w);
        auto freqs = positions.unsqueeze(-1) * inv;  // [1, N, W/2]
        auto angles = std::string(layout) == "half" ? torch::cat({freqs, freqs}, -1)
                                                    : freqs.repeat_interleave(2, -1);
        auto cos = angles.cos().to(dtype).cuda(), sin = angles.sin().to(dtype).cuda();
        EXPECT_EQ(route.call(q, k, cos, sin, s.unsqueeze_dim, layout), "fused");
        auto [got_q, got_k] = rotary.call(q, k, cos, sin, s.unsqueeze_dim, layout);
        auto [want_q, want_k] = reference.call(q, k, cos, sin, s.unsqueeze_dim, layout);
        EXPECT_TRUE(got_q.is_cuda());
        EXPECT_TRUE(torch::equal(bits(got_q), bits(want_q))) << "q";
        EXPECT_TRUE(torch::equal(bits(got_k), bits(want_k))) << "k";
        auto [cpu_q, cpu_k] =
            reference.call(q.cpu(), k.cpu(), cos.cpu(), sin.cpu(), s.unsqueeze_dim, layout);
        EXPECT_TRUE(torch::equal(bits(got_q), bits(cpu_q))) << "q vs the CPU reference";
        EXPECT_TRUE(torch::equal(bits(got_k), bits(cpu_k))) << "k vs the CPU reference";
        auto qi = q.clone(), ki = k.clone();
        in_place.call(qi, ki, cos, sin, s.unsqueeze_dim, layout);
        EXPECT_TRUE(torch::equal(bits(qi), bits(want_q))) << "q in place";
        EXPECT_TRUE(torch::equal(bits(ki), bits(want_k))) << "k in place";
      }
  // float64 stays on the reference on CUDA, with its reason
  auto q = torch::randn({1, 2, 3, 8}, torch::kFloat64).cuda();
  auto cos = torch::ones({1, 3, 8}, torch::kFloat64).cuda();
  EXPECT_EQ(route.call(q, q.clone(), cos, cos.clone(), 1, "half"),
            "reference: float64 (the CUDA kernel stores float32, bfloat16 or float16)");
}
#endif  // POSENC_OPS_LIBRARY_PATH

#endif  // POSENC_HAS_CUDA_GLUE

// Every registered encoder inside a transformer on the GPU (the trainer's train.device: cuda),
// its positions in host memory (as the trainer keeps them) or on the GPU: the same outputs and
// the same parameter gradients as the same model on the CPU. Catches any table, index or mask
// built on one device and used on the other.
TEST(CudaModel, EveryEncoderOnTheGpuMatchesTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device (or a CPU-only LibTorch)";
  const int64_t dim = 32, heads = 4;
  for (const auto& c : test::encoder_cases()) {
    SCOPED_TRACE(c.type);
    torch::manual_seed(5);
    Transformer model(TransformerOptions(dim, heads, 1), build_encoder(c.config, {dim, heads, 0}));
    auto x = torch::randn({2, c.positions.size(), dim});
    auto run = [&](const at::Tensor& input, const Positions& positions) {
      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
      auto y = model(input, positions);
      y.pow(2).sum().backward();
      std::vector<at::Tensor> grads;
      for (auto& p : model->parameters())
        grads.push_back(p.grad().defined() ? p.grad().cpu() : torch::zeros_like(p).cpu());
      return std::make_pair(y.detach().cpu(), grads);
    };
    const auto [want, want_grads] = run(x, c.positions);
    model->to(torch::kCUDA);
    const auto on_host = run(x.cuda(), c.positions);
    const auto on_gpu = run(x.cuda(), c.positions.to(torch::Device(torch::kCUDA)));
    for (const auto* got : {&on_host, &on_gpu}) {
      EXPECT_LT(max_abs_diff(got->first, want), 1e-4 * (1 + want.abs().max().item<double>()));
      for (size_t i = 0; i < want_grads.size(); ++i) {
        const double scale = 1 + want_grads[i].abs().max().item<double>();
        EXPECT_LT(max_abs_diff(got->second[i], want_grads[i]), kGradientTolerance * scale) << i;
      }
    }
  }
}

}  // namespace
}  // namespace posenc
