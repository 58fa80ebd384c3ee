// positional_attention's path (src/bindings/positional_route.h), a pure function of what the call
// is: every device's decision checked here, the CUDA one included on machines without a GPU (the
// CUDA kernel itself runs in tests/cuda_emu and on a lent GPU:
// tests/python/test_attention_cuda.py). The lines are those tests/python/test_routes.py and the
// route assertions of the Python suite read (python/posenc/routes.py parses them into an
// AttentionRoute).
#include <gtest/gtest.h>

#include "../src/bindings/positional_route.h"
#include "posenc/kernels/attention_cuda.h"

namespace posenc::ops {
namespace {

PositionalCall cpu_call() {
  PositionalCall c;
  c.head_dim = c.value_dim = 64;
  return c;
}

PositionalCall cuda_call() {
  PositionalCall c = cpu_call();
  c.device = c10::DeviceType::CUDA;
  c.cuda_glue = true;
  return c;
}

TEST(PositionalRoute, TheCpuKernelReadsTheTablesInsideItsTiles) {
  auto c = cpu_call();
  c.rotary = c.alibi = c.t5 = c.causal_ids = true;
  const auto r = route_positional(c);
  EXPECT_EQ(r.path, PositionalPath::kFused);
  EXPECT_TRUE(r.rope_inside);
  EXPECT_FALSE(r.rotate_first);
  EXPECT_TRUE(r.not_taken.empty());
  EXPECT_EQ(describe(r), "fused, RoPE inside");
  for (auto dtype : {c10::ScalarType::BFloat16, c10::ScalarType::Half}) {
    c.dtype = dtype;
    EXPECT_EQ(describe(route_positional(c)), "fused, RoPE inside");
  }
}

TEST(PositionalRoute, TablesTheCpuKernelCannotReadAreRotatedFirst) {
  auto c = cpu_call();
  c.rotary = true;
  c.tables_unreadable = "the two members of a pair read different table values";
  const auto r = route_positional(c);
  EXPECT_EQ(r.path, PositionalPath::kFused);
  EXPECT_TRUE(r.rotate_first);
  EXPECT_FALSE(r.rope_inside);
  EXPECT_EQ(describe(r),
            "fused, RoPE outside: the two members of a pair read different table values");
  c.rotary = false;  // no tables: nothing to read
  EXPECT_EQ(describe(route_positional(c)), "fused");
}

TEST(PositionalRoute, LearnedTablesGoThroughApplyRotaryFirst) {
  auto c = cpu_call();
  c.rotary = c.learned_tables = true;
  c.tables_unreadable = "per-batch tables whose rows differ (the kernel reads one [Nk, W] table)";
  auto r = route_positional(c);
  EXPECT_TRUE(r.apply_rotary_first);
  EXPECT_FALSE(r.rope_inside || r.rotate_first);  // the path sees q, k rotated, no tables
  EXPECT_EQ(describe(r), "apply_rotary first (cos/sin require grad), then fused");
  c.device = c10::DeviceType::CUDA;
  c.cuda_glue = true;
  r = route_positional(c);
  EXPECT_EQ(r.path, PositionalPath::kCuda);
  EXPECT_FALSE(r.rotate_first);
  EXPECT_EQ(describe(r), "apply_rotary first (cos/sin require grad), then CUDA kernel");
  c.dtype = c10::ScalarType::Double;
  EXPECT_EQ(describe(route_positional(c)),
            "apply_rotary first (cos/sin require grad), then reference: a call the CUDA kernel "
            "does not take (float64 (the kernel computes in float32))");
}

TEST(PositionalRoute, TheCpuKernelsRefusals) {
  auto c = cpu_call();
  c.dtype = c10::ScalarType::Double;
  auto r = route_positional(c);
  EXPECT_EQ(r.path, PositionalPath::kReference);
  ASSERT_EQ(r.not_taken.size(), 1u);
  EXPECT_EQ(r.not_taken[0].first, PositionalPath::kFused);
  EXPECT_EQ(describe(r), "reference: float64 (the kernel computes in float32)");
  c = cpu_call();
  c.value_dim = 0;
  EXPECT_EQ(describe(route_positional(c)), "reference: a head dim of 0");
  c.empty = true;  // nothing to compute: the kernel's empty path, not a refusal
  EXPECT_EQ(describe(route_positional(c)), "fused");
  c = cpu_call();
  c.device = c10::DeviceType::Meta;
  EXPECT_EQ(describe(route_positional(c)), "reference: not on the CPU");
}

TEST(PositionalRoute, CudaTensorsTakeTheCudaKernel) {
  auto c = cuda_call();
  EXPECT_EQ(describe(route_positional(c)), "CUDA kernel");
  c.rotary = true;  // RoPE rotated first in float32, readable tables or not
  auto r = route_positional(c);
  EXPECT_EQ(r.path, PositionalPath::kCuda);
  EXPECT_TRUE(r.rotate_first);
  EXPECT_FALSE(r.rope_inside);
  EXPECT_EQ(describe(r), "CUDA kernel, RoPE outside (float32)");
  c.alibi = true;  // one bias part, and the packed ids the kernel reads (no field: not a rule)
  EXPECT_EQ(route_positional(c).path, PositionalPath::kCuda);
  c.alibi = false;
  c.t5 = true;
  EXPECT_EQ(route_positional(c).path, PositionalPath::kCuda);
  c.head_dim = c.value_dim = cuda::kAttentionMaxDim;
  EXPECT_EQ(route_positional(c).path, PositionalPath::kCuda);
}

TEST(PositionalRoute, WhatTheCudaKernelDoesNotTakeGoesToTheReferenceWithWhy) {
  const std::string prefix = "reference: a call the CUDA kernel does not take (";
  struct Case {
    const char* name;
    void (*set)(PositionalCall&);
    const char* why;
  };
  const Case cases[] = {
      {"float64", [](PositionalCall& c) { c.dtype = c10::ScalarType::Double; },
       "float64 (the kernel computes in float32)"},
      {"D = 0", [](PositionalCall& c) { c.head_dim = 0; }, "a head dim of 0"},
      {"Dv = 0", [](PositionalCall& c) { c.value_dim = 0; }, "a head dim of 0"},
      {"D > max", [](PositionalCall& c) { c.head_dim = cuda::kAttentionMaxDim + 1; },
       "a head dim above 256"},
      {"Dv > max", [](PositionalCall& c) { c.value_dim = cuda::kAttentionMaxDim + 1; },
       "a head dim above 256"},
      {"alibi + t5", [](PositionalCall& c) { c.alibi = c.t5 = true; }, "ALiBi and T5 together"},
      {"causal ids", [](PositionalCall& c) { c.causal_ids = true; }, "causal ids"},
      {"no glue", [](PositionalCall& c) { c.cuda_glue = false; }, "this LibTorch has no CUDA glue"},
  };
  for (const auto& k : cases) {
    auto c = cuda_call();
    k.set(c);
    const auto r = route_positional(c);
    EXPECT_EQ(r.path, PositionalPath::kReference) << k.name;
    ASSERT_EQ(r.not_taken.size(), 1u) << k.name;
    EXPECT_EQ(r.not_taken[0].first, PositionalPath::kCuda) << k.name;
    EXPECT_EQ(describe(r), prefix + k.why + ")") << k.name;
  }
}

}  // namespace
}  // namespace posenc::ops
