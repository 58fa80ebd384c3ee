// posenc::apply_rotary's CUDA path on the CPU emulator, to the bit against its plain-ATen
// reference (src/bindings/rotary.cpp, which is transformers' eager formula and checked against
// transformers itself in tests/python/test_hf_parity.py):
//   eager:  y = x[..., :W] * c + rot(x[..., :W]) * s      three element-wise ops, each computing
//           in float32 and rounding to x's dtype (ATen's opmath); no fused multiply-add
//           half:        y_i = x_i c_i - x_{i+F} s_i,    y_{i+F} = x_{i+F} c_{i+F} + x_i s_{i+F}
//           interleaved: y_2j = x_2j c_2j - x_2j+1 s_2j, y_2j+1 = x_2j+1 c_2j+1 + x_2j s_2j+1
//   kernel: rope_table_kernel<T, V, kEager = true> (src/kernels/cuda/rope_cuda.cu), reached
//           through apply_rotary_through (the CUDA dispatch's own views of q, k and the whole
//           tables) and detail::rope_rotate_launch_eager (the glue, tests/cuda_emu/
//           tensor_launch_emu.cpp); every output element reads its own table entries
// Compared as bits (not values: -0.0 vs +0.0 would count), for float32, bfloat16 and float16, the
// half and interleaved layouts, HF's [B, H, N, D] (unsqueeze_dim 1) and [B, N, H, D] (2), q and k
// with different head counts, partial rotary, odd pair counts, batched tables, strided views (a
// slice of a packed qkv row) and in place; with HF's tables (cos/sin of angles, the two members of
// a pair equal) and with random tables whose pair members differ (which the kernel must read
// member by member: the CUDA refusal reads no table value, so it does not know). The cases reach
// every vector width V of the kernel (1, 2, 4 for float32; 1, 2, 4, 8 for the 16-bit types;
// test_cuda_emu.cpp's EveryKernelRan checks that each instantiation ran). The CUDA refusal is
// shown to read no value on meta tensors (which have none: at::equal on them throws). A control
// shows the test can fail: the default rounding (float32 products and sum, rounded once) differs
// from eager in bfloat16 and float16.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "../../src/bindings/rotary.h"
#include "../../src/kernels/cuda/tensor_launch.h"
#include "posenc/posenc.h"

namespace posenc {
namespace {

// The emulated CUDA kernel in its eager mode, as apply_rotary's CUDA dispatch calls it (whole
// tables).
void rotate_emulated_eager(const std::vector<at::Tensor>& inputs,
                           const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                           const at::Tensor& sin, RopeLayout layout) {
  detail::rope_rotate_launch_eager(inputs, outputs, cos, sin, layout, nullptr);
}
const ops::RotaryKernel kEmulatedEager{&rotate_emulated_eager, /*reads_whole_tables=*/true};

// The default mode (rope_rotate's own users: per-pair tables, rounded once): the control.
void rotate_emulated_rounding_once(const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                                   const at::Tensor& sin, RopeLayout layout) {
  detail::rope_rotate_launch(inputs, outputs, cos, sin, layout, /*inverse=*/false, nullptr);
}
const ops::RotaryKernel kEmulatedRoundingOnce{&rotate_emulated_rounding_once,
                                              /*reads_whole_tables=*/false};

// The tensor's bits as integers of its width (contiguous copy), so +0.0 and -0.0 differ.
at::Tensor bits(const at::Tensor& x) {
  const auto dense = x.contiguous();
  return dense.view(dense.element_size() == 4 ? at::kInt : at::kShort);
}

// How many elements differ in their bits ("sizes differ" as -1).
int64_t differing(const at::Tensor& got, const at::Tensor& want) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type()) return -1;
  return bits(got).ne(bits(want)).sum().item<int64_t>();
}

struct RotaryCase {
  int64_t batch, tokens, q_heads, k_heads, head_dim, width;  // width W: the rotary part
  int64_t unsqueeze_dim;  // 1: q, k [B, H, N, D]; 2: [B, N, H, D]
  bool batched_table;     // cos/sin [B, N, W] (else [1, N, W])
  bool packed;            // q, k slices of one packed row (strided, not dense)
  const char* name;
};

void PrintTo(const RotaryCase& c, std::ostream* os) { *os << c.name; }

// Pairs F = W / 2 chosen for the vector widths: 8 (16-bit half layout V = 8, float32 4;
// interleaved 4 and 2), 6 (V = 2), 3 (V = 1).
const RotaryCase kCases[] = {
    {2, 9, 4, 2, 16, 16, 1, false, false, "HeadsFirstGqaF8"},
    {3, 7, 3, 3, 20, 12, 2, true, false, "TokensFirstPartialBatchedF6"},
    {1, 5, 2, 1, 6, 6, 1, true, false, "OddPairsF3"},
    {2, 6, 2, 2, 24, 16, 1, false, true, "PackedQkvRowF8"},
    {1, 4, 1, 3, 10, 6, 2, false, true, "PackedTokensFirstF3Partial"},
};

class RotaryEmu
    : public ::testing::TestWithParam<std::tuple<at::ScalarType, RopeLayout, RotaryCase>> {};

// q, k as apply_rotary receives them, and HF's tables in q's dtype (cos(cat(freqs, freqs)) or
// repeat_interleave(2): the two members of a pair hold one value, as the kernel needs).
struct Inputs {
  at::Tensor q, k, cos, sin;
};

Inputs make_inputs(at::ScalarType dtype, RopeLayout layout, const RotaryCase& c) {
  const int64_t pairs = c.width / 2;
  // values over several binades, so that the roundings of products and sums differ in places
  auto scale = torch::pow(2.0, torch::randint(-3, 4, {c.head_dim}).to(torch::kFloat32));
  // [B, H, N, D] (unsqueeze_dim 1) or [B, N, H, D] (2); packed: a slice of rows [.., 3 * D], as
  // q and k of one qkv projection (strided, not dense)
  auto make = [&](int64_t heads, int64_t offset) {
    auto shape = c.unsqueeze_dim == 1 ? std::vector<int64_t>{c.batch, heads, c.tokens, c.head_dim}
                                      : std::vector<int64_t>{c.batch, c.tokens, heads, c.head_dim};
    auto values = (torch::randn(shape) * 3.0 * scale).to(dtype);
    if (!c.packed) return values;
    shape.back() = 3 * c.head_dim;
    auto rows = torch::zeros(shape, values.options());
    auto x = rows.narrow(-1, offset * c.head_dim, c.head_dim);
    x.copy_(values);
    return x;
  };
  Inputs in;
  in.q = make(c.q_heads, 0);
  in.k = make(c.k_heads, 1);
  auto positions = c.batched_table ? torch::rand({c.batch, c.tokens}, torch::kFloat64) * 4000
                                   : (torch::arange(c.tokens, torch::kFloat64) + 1000).unsqueeze(0);
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * pairs, 2, torch::kFloat64) / c.width);
  auto freqs = positions.unsqueeze(-1) * inv;  // [1 or B, N, F]
  auto angles =
      layout == RopeLayout::kHalf ? torch::cat({freqs, freqs}, -1) : freqs.repeat_interleave(2, -1);
  in.cos = angles.cos().to(dtype);
  in.sin = angles.sin().to(dtype);
  return in;
}

// The CUDA dispatch's fused route (out of place, then in place on the strided inputs themselves)
// against the reference, as bits.
void expect_eager_bits(const Inputs& in, RopeLayout layout, const RotaryCase& c) {
  const std::string name = to_string(layout);
  // the CUDA dispatch takes these inputs (the float64 clause aside, what the CPU kernel checks)
  ASSERT_EQ(ops::apply_rotary_kernel_refusal(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, layout,
                                             ops::kCudaRotaryKernelTakes),
            "");
  if (c.packed) ASSERT_FALSE(in.q.is_contiguous());
  auto [want_q, want_k] =
      ops::apply_rotary_reference(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, name);
  auto q_out = at::empty_like(in.q), k_out = at::empty_like(in.k);
  ops::apply_rotary_through({in.q, in.k}, {q_out, k_out}, in.cos, in.sin, c.unsqueeze_dim, layout,
                            kEmulatedEager);
  EXPECT_EQ(differing(q_out, want_q), 0) << "q";
  EXPECT_EQ(differing(k_out, want_k), 0) << "k";
  auto q_in = in.q.clone(), k_in = in.k.clone();
  if (c.packed) {  // the clone is dense: rotate slices of packed rows again
    auto rows =
        torch::zeros({in.q.size(0), in.q.size(1), in.q.size(2), 2 * c.head_dim}, in.q.options());
    q_in = rows.narrow(-1, c.head_dim, c.head_dim);
    q_in.copy_(in.q);
  }
  ops::apply_rotary_through({q_in, k_in}, {q_in, k_in}, in.cos, in.sin, c.unsqueeze_dim, layout,
                            kEmulatedEager);
  EXPECT_EQ(differing(q_in, want_q), 0) << "q in place";
  EXPECT_EQ(differing(k_in, want_k), 0) << "k in place";
}

TEST_P(RotaryEmu, RoundEachKernelEqualsEagerReferenceToTheBit) {
  const auto [dtype, layout, c] = GetParam();
  torch::manual_seed(17);
  expect_eager_bits(make_inputs(dtype, layout, c), layout, c);
}

// Tables of random values over several binades (not cos/sin of angles): the two members of each
// pair differ, so only a kernel reading each output element's own entries gives eager's bits.
// Packed cases take the tables as strided slices. float32 q also takes bfloat16 and float16
// tables (eager promotes them to float32, exactly); 16-bit q takes tables of its own dtype (other
// ones promote the result, which the refusal sends to the reference).
TEST_P(RotaryEmu, UnequalPairMembersEqualEagerReferenceToTheBit) {
  const auto [dtype, layout, c] = GetParam();
  torch::manual_seed(19);
  auto in = make_inputs(dtype, layout, c);
  const auto table_dtypes = dtype == at::kFloat
                                ? std::vector<at::ScalarType>{at::kFloat, at::kBFloat16, at::kHalf}
                                : std::vector<at::ScalarType>{dtype};
  for (const auto table_dtype : table_dtypes) {
    SCOPED_TRACE(c10::toString(table_dtype));
    auto random_table = [&] {
      auto shape = in.cos.sizes().vec();
      if (c.packed) shape.back() *= 2;
      auto scale = torch::pow(2.0, torch::randint(-4, 3, shape).to(torch::kFloat32));
      auto t = (torch::randn(shape) * scale).to(table_dtype);
      return c.packed ? t.narrow(-1, 1, in.cos.size(-1)) : t;
    };
    in.cos = random_table();
    in.sin = random_table();
    // what sets these tables apart: the CPU kernel (one entry per pair) must refuse them
    ASSERT_EQ(ops::apply_rotary_kernel_refusal(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, layout,
                                               ops::kCpuRotaryKernelTakes),
              "the two members of a pair read different table values");
    expect_eager_bits(in, layout, c);
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesLayoutsShapes, RotaryEmu,
                         ::testing::Combine(::testing::Values(at::kFloat, at::kBFloat16, at::kHalf),
                                            ::testing::Values(RopeLayout::kHalf,
                                                              RopeLayout::kInterleaved),
                                            ::testing::ValuesIn(kCases)),
                         [](const auto& info) {
                           const auto dtype = std::get<0>(info.param);
                           return std::string(dtype == at::kFloat      ? "f32"
                                              : dtype == at::kBFloat16 ? "bf16"
                                                                       : "f16") +
                                  "_" + to_string(std::get<1>(info.param)) + "_" +
                                  std::get<2>(info.param).name;
                         });

// Float32 tables with bfloat16 q and k promote the result to float32 in eager: the refusal names
// it (the reference runs); the default rounding is not eager's (the control: this test's
// comparison can fail), and float64 stays on the reference on CUDA.
TEST(RotaryEmuControl, DefaultRoundingDiffersFromEagerInSixteenBitTypes) {
  torch::manual_seed(18);
  const RotaryCase c = kCases[0];
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    const auto in = make_inputs(dtype, RopeLayout::kHalf, c);
    auto [want_q, want_k] =
        ops::apply_rotary_reference(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, "half");
    auto q_out = at::empty_like(in.q), k_out = at::empty_like(in.k);
    ops::apply_rotary_through({in.q, in.k}, {q_out, k_out}, in.cos, in.sin, c.unsqueeze_dim,
                              RopeLayout::kHalf, kEmulatedRoundingOnce);
    EXPECT_GT(differing(q_out, want_q) + differing(k_out, want_k), 0) << c10::toString(dtype);
  }
  const auto in = make_inputs(at::kBFloat16, RopeLayout::kHalf, c);
  EXPECT_EQ(
      ops::apply_rotary_kernel_refusal(in.q, in.k, in.cos.to(at::kFloat), in.sin.to(at::kFloat), 1,
                                       RopeLayout::kHalf, ops::kCudaRotaryKernelTakes),
      "cos/sin are of a wider dtype than q (the result would be promoted)");
  auto d = make_inputs(at::kDouble, RopeLayout::kHalf, c);
  d.cos = d.cos.to(at::kFloat).to(at::kDouble);  // tables float32 holds: only the dtype refused
  d.sin = d.sin.to(at::kFloat).to(at::kDouble);
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(d.q, d.k, d.cos, d.sin, 1, RopeLayout::kHalf,
                                             ops::kCudaRotaryKernelTakes),
            "float64 (the CUDA kernel stores float32, bfloat16 or float16)");
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(d.q, d.k, d.cos, d.sin, 1, RopeLayout::kHalf,
                                             ops::kCpuRotaryKernelTakes),
            "");
}

// The CUDA refusal reads no value: meta tensors have none (at::equal on them throws, as the CPU
// refusal's pair-member check shows, the control), yet it answers for them, with equal or
// unequal members alike; float64 tables are refused by dtypes alone (with float32 q the result is
// promoted; float64 q is not the CUDA kernel's), so their values are never read either.
TEST(RotaryEmuControl, CudaRefusalReadsNoTableValue) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const auto q = at::empty({2, 4, 9, 16}, meta.dtype(dtype)),
               k = at::empty({2, 2, 9, 16}, meta.dtype(dtype)),
               cos = at::empty({1, 9, 16}, meta.dtype(dtype)),
               sin = at::empty({1, 9, 16}, meta.dtype(dtype));
    for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved}) {
      EXPECT_EQ(
          ops::apply_rotary_kernel_refusal(q, k, cos, sin, 1, layout, ops::kCudaRotaryKernelTakes),
          "");
      EXPECT_ANY_THROW(
          ops::apply_rotary_kernel_refusal(q, k, cos, sin, 1, layout, ops::kCpuRotaryKernelTakes));
    }
  }
  const auto q = at::empty({2, 4, 9, 16}, meta.dtype(at::kFloat)),
             wide = at::empty({1, 9, 16}, meta.dtype(at::kDouble));
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(q, q, wide, wide, 1, RopeLayout::kHalf,
                                             ops::kCudaRotaryKernelTakes),
            "cos/sin are of a wider dtype than q (the result would be promoted)");
  const auto q64 = at::empty({2, 4, 9, 16}, meta.dtype(at::kDouble));
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(q64, q64, wide, wide, 1, RopeLayout::kHalf,
                                             ops::kCudaRotaryKernelTakes),
            "float64 (the CUDA kernel stores float32, bfloat16 or float16)");
}

}  // namespace
}  // namespace posenc
