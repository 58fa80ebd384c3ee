// posenc::apply_rotary's CUDA path on the CPU emulator, to the bit against its plain-ATen
// reference (src/bindings/rotary.cpp, which is transformers' eager formula and checked against
// transformers itself in tests/python/test_hf_parity.py):
//   eager:  y = x[..., :W] * c + rot(x[..., :W]) * s      three element-wise ops, each computing
//           in float32 and rounding to x's dtype (ATen's opmath); no fused multiply-add
//   kernel: rope_table_kernel<T, V, kRoundEach = true> (src/kernels/cuda/rope_cuda.cu), reached
//           through apply_rotary_through (the CUDA dispatch's own views of q, k and the per-pair
//           tables) and detail::rope_rotate_launch (the glue, tests/cuda_emu/tensor_launch_emu.cpp)
// Compared as bits (not values: -0.0 vs +0.0 would count), for float32, bfloat16 and float16, the
// half and interleaved layouts, HF's [B, H, N, D] (unsqueeze_dim 1) and [B, N, H, D] (2), q and k
// with different head counts, partial rotary, odd pair counts, batched tables, strided views (a
// slice of a packed qkv row) and in place. The cases reach every vector width V of the kernel
// (1, 2, 4 for float32; 1, 2, 4, 8 for the 16-bit types; test_cuda_emu.cpp's EveryKernelRan
// checks that each instantiation ran). A control shows the test can fail: the default rounding
// (float32 products and sum, rounded once) differs from eager in bfloat16 and float16.
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

// The emulated CUDA kernel with eager's roundings, as apply_rotary's CUDA dispatch calls it.
void rotate_emulated(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                     const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) {
  detail::rope_rotate_launch(inputs, outputs, cos, sin, layout, /*inverse=*/false, nullptr,
                             /*round_each_op=*/true);
}

// The same with the default rounding (rope_rotate's own users): the control.
void rotate_emulated_rounding_once(const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                                   const at::Tensor& sin, RopeLayout layout) {
  detail::rope_rotate_launch(inputs, outputs, cos, sin, layout, /*inverse=*/false, nullptr,
                             /*round_each_op=*/false);
}

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

TEST_P(RotaryEmu, RoundEachKernelEqualsEagerReferenceToTheBit) {
  const auto [dtype, layout, c] = GetParam();
  torch::manual_seed(17);
  const auto in = make_inputs(dtype, layout, c);
  const std::string name = to_string(layout);
  // the CUDA dispatch takes these inputs (the float64 clause aside, what the CPU kernel checks)
  ASSERT_EQ(ops::apply_rotary_kernel_refusal(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, layout,
                                             /*kernel_takes_float64=*/false),
            "");
  if (c.packed) ASSERT_FALSE(in.q.is_contiguous());
  auto [want_q, want_k] =
      ops::apply_rotary_reference(in.q, in.k, in.cos, in.sin, c.unsqueeze_dim, name);
  auto q_out = at::empty_like(in.q), k_out = at::empty_like(in.k);
  ops::apply_rotary_through({in.q, in.k}, {q_out, k_out}, in.cos, in.sin, c.unsqueeze_dim, layout,
                            &rotate_emulated);
  EXPECT_EQ(differing(q_out, want_q), 0) << "q";
  EXPECT_EQ(differing(k_out, want_k), 0) << "k";
  // in place, on the (strided) inputs themselves
  auto q_in = in.q.clone(), k_in = in.k.clone();
  if (c.packed) {  // the clone is dense: rotate slices of packed rows again
    auto rows =
        torch::zeros({in.q.size(0), in.q.size(1), in.q.size(2), 2 * c.head_dim}, in.q.options());
    q_in = rows.narrow(-1, c.head_dim, c.head_dim);
    q_in.copy_(in.q);
  }
  ops::apply_rotary_through({q_in, k_in}, {q_in, k_in}, in.cos, in.sin, c.unsqueeze_dim, layout,
                            &rotate_emulated);
  EXPECT_EQ(differing(q_in, want_q), 0) << "q in place";
  EXPECT_EQ(differing(k_in, want_k), 0) << "k in place";
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
                              RopeLayout::kHalf, &rotate_emulated_rounding_once);
    EXPECT_GT(differing(q_out, want_q) + differing(k_out, want_k), 0) << c10::toString(dtype);
  }
  const auto in = make_inputs(at::kBFloat16, RopeLayout::kHalf, c);
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(in.q, in.k, in.cos.to(at::kFloat),
                                             in.sin.to(at::kFloat), 1, RopeLayout::kHalf, false),
            "cos/sin are of a wider dtype than q (the result would be promoted)");
  auto d = make_inputs(at::kDouble, RopeLayout::kHalf, c);
  d.cos = d.cos.to(at::kFloat).to(at::kDouble);  // tables float32 holds: only the dtype refused
  d.sin = d.sin.to(at::kFloat).to(at::kDouble);
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(d.q, d.k, d.cos, d.sin, 1, RopeLayout::kHalf, false),
            "float64 (the CUDA kernel stores float32, bfloat16 or float16)");
  EXPECT_EQ(ops::apply_rotary_kernel_refusal(d.q, d.k, d.cos, d.sin, 1, RopeLayout::kHalf, true),
            "");
}

}  // namespace
}  // namespace posenc
