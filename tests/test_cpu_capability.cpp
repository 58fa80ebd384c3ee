// The fused CPU kernels' capability (include/posenc/kernels/cpu_capability.h): the rule that
// picks the level from CPUID and the two environment variables, its one-line refusals, the
// level this process runs at (CTest's unit_cpu_* entries force each in turn), and the vector
// levels against each other in one process: element-wise kernels (GELU, RoPE's float32 rows)
// give the same bits at 8 and 16 lanes (the same IEEE operations per lane), GELU at the scalar
// level too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/cpu_kernels.h"
#include "posenc/kernels/cpu_capability.h"

namespace {

using posenc::choose_cpu_capability;
using posenc::CpuCapability;

// The refusal's one line (TORCH_CHECK's message without its backtrace).
std::string refusal(const char* posenc_value, const char* aten_value, CpuCapability detected) {
  try {
    choose_cpu_capability(posenc_value, aten_value, detected);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

TEST(CpuCapability, NamesRoundTrip) {
  EXPECT_STREQ(posenc::to_string(CpuCapability::kScalar), "scalar");
  EXPECT_STREQ(posenc::to_string(CpuCapability::kAvx2), "avx2");
  EXPECT_STREQ(posenc::to_string(CpuCapability::kAvx512), "avx512");
  for (const auto level : {CpuCapability::kScalar, CpuCapability::kAvx2, CpuCapability::kAvx512})
    EXPECT_EQ(choose_cpu_capability(posenc::to_string(level), nullptr, CpuCapability::kAvx512),
              level);
}

TEST(CpuCapability, UnsetTakesTheWidestTheCpuHas) {
  for (const auto detected : {CpuCapability::kScalar, CpuCapability::kAvx2, CpuCapability::kAvx512})
    EXPECT_EQ(choose_cpu_capability(nullptr, nullptr, detected), detected);
}

TEST(CpuCapability, PosencVariableLowersAndWinsOverAtens) {
  EXPECT_EQ(choose_cpu_capability("avx2", nullptr, CpuCapability::kAvx512), CpuCapability::kAvx2);
  EXPECT_EQ(choose_cpu_capability("scalar", "avx512", CpuCapability::kAvx512),
            CpuCapability::kScalar);
  EXPECT_EQ(choose_cpu_capability("avx512", "avx2", CpuCapability::kAvx512),
            CpuCapability::kAvx512);
}

TEST(CpuCapability, AtensVariableLowersWhenPosencsIsUnset) {
  EXPECT_EQ(choose_cpu_capability(nullptr, "avx2", CpuCapability::kAvx512), CpuCapability::kAvx2);
  EXPECT_EQ(choose_cpu_capability(nullptr, "default", CpuCapability::kAvx512),
            CpuCapability::kScalar);
  // above the CPU, or a name of ATen's that is not ours: what the CPU has (ATen's variable)
  EXPECT_EQ(choose_cpu_capability(nullptr, "avx512", CpuCapability::kAvx2), CpuCapability::kAvx2);
  EXPECT_EQ(choose_cpu_capability(nullptr, "zvector", CpuCapability::kAvx2), CpuCapability::kAvx2);
}

TEST(CpuCapability, BadPosencValuesAreOneLineErrors) {
  const std::string unknown = refusal("avx-512", nullptr, CpuCapability::kAvx512);
  EXPECT_EQ(unknown, "POSENC_CPU_CAPABILITY='avx-512' is not one of scalar, avx2, avx512");
  EXPECT_EQ(refusal("", nullptr, CpuCapability::kAvx512),
            "POSENC_CPU_CAPABILITY='' is not one of scalar, avx2, avx512");
  EXPECT_EQ(refusal("AVX2", nullptr, CpuCapability::kAvx512),
            "POSENC_CPU_CAPABILITY='AVX2' is not one of scalar, avx2, avx512");
  const std::string missing = refusal("avx512", nullptr, CpuCapability::kAvx2);
  EXPECT_EQ(missing,
            "POSENC_CPU_CAPABILITY=avx512 but this CPU's widest level is avx2 (avx512 needs "
            "AVX-512 F, BW, VL and DQ; avx2 needs AVX2, FMA and F16C)");
  EXPECT_EQ(missing.find('\n'), std::string::npos);
  EXPECT_NE(refusal("avx2", nullptr, CpuCapability::kScalar).find("widest level is scalar"),
            std::string::npos);
}

// The process: the forced level (CTest's unit_cpu_scalar / _avx2 / _avx512) is the one the
// kernels' table runs, and --version's line names it.
TEST(CpuCapability, ThisProcessRunsTheChosenLevel) {
  const CpuCapability level = posenc::cpu_capability();
  EXPECT_LE(level, posenc::cpu_capability_detected());
  EXPECT_EQ(posenc::detail::cpu_kernels().capability, level);
  if (const char* forced = std::getenv("POSENC_CPU_CAPABILITY")) {
    EXPECT_STREQ(posenc::to_string(level), forced);
    EXPECT_EQ(posenc::cpu_capability_requested(), level);
  }
  EXPECT_EQ(posenc::cpu_capability_description().rfind(posenc::to_string(level), 0), 0u)
      << posenc::cpu_capability_description();
  for (const auto at : {CpuCapability::kScalar, CpuCapability::kAvx2, CpuCapability::kAvx512})
    EXPECT_EQ(posenc::detail::cpu_kernels_at(at).capability, at);
}

// The vector levels this CPU has (empty: none to compare).
std::vector<const posenc::detail::CpuKernels*> vector_levels() {
  std::vector<const posenc::detail::CpuKernels*> out;
  for (const auto level : {CpuCapability::kAvx2, CpuCapability::kAvx512})
    if (level <= posenc::cpu_capability_detected())
      out.push_back(&posenc::detail::cpu_kernels_at(level));
  return out;
}

TEST(CpuCapability, GeluGivesTheSameBitsAtEveryLevel) {
  // the scalar level's plain loop too (std::fma: the vector levels' operations one at a time)
  auto levels = vector_levels();
  levels.insert(levels.begin(), &posenc::detail::cpu_kernels_at(CpuCapability::kScalar));
  if (levels.size() < 2) GTEST_SKIP() << "one level on this CPU";
  torch::manual_seed(3);
  const float inf = std::numeric_limits<float>::infinity();
  const auto x = torch::cat({torch::randn({1037}) * 4,  // 64 vectors of 16 and a tail of 13
                             torch::arange(-7 * 4096, 7 * 4096 + 1, torch::kFloat) / 4096.0,
                             torch::tensor({0.0f, -0.0f, inf, -inf, 1e30f, -1e30f, 1e-30f, -1e-30f,
                                            5.4f, -5.4f, 6.0f, -6.0f})});
  const auto dy = torch::randn_like(x);
  std::vector<torch::Tensor> ys, dxs;
  for (const auto* k : levels) {
    auto y = torch::empty_like(x), dx = torch::empty_like(x);
    k->gelu(x.data_ptr<float>(), y.data_ptr<float>(), x.numel(), false);
    k->gelu_backward(dy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>(), x.numel(),
                     false);
    ys.push_back(y);
    dxs.push_back(dx);
  }
  for (size_t i = 1; i < levels.size(); ++i) {
    // bits, signed zeros included
    EXPECT_TRUE(torch::equal(ys[0].view(torch::kInt32), ys[i].view(torch::kInt32)))
        << posenc::to_string(levels[i]->capability);
    EXPECT_TRUE(torch::equal(dxs[0].view(torch::kInt32), dxs[i].view(torch::kInt32)))
        << posenc::to_string(levels[i]->capability);
  }
}

TEST(CpuCapability, RopeRowsGiveTheSameBitsAtEveryVectorLevel) {
  const auto levels = vector_levels();
  if (levels.size() < 2) GTEST_SKIP() << "one vector level on this CPU";
  torch::manual_seed(4);
  for (const int64_t f : {1, 4, 7, 8, 12, 16, 23, 32, 40}) {
    const auto x = torch::randn({2 * f + 3});  // 3 values past the rotary part (left alone)
    const auto c = torch::randn({f}), s = torch::randn({f});
    for (const bool interleaved : {false, true}) {
      std::vector<torch::Tensor> ys;
      for (const auto* k : levels) {
        auto y = x.clone();
        k->rope_f32(x.data_ptr<float>(), y.data_ptr<float>(), c.data_ptr<float>(),
                    s.data_ptr<float>(), f, interleaved, false);
        ys.push_back(y);
        // non-temporal stores (the large passes' rows) where the row allows them: the same bits
        auto streamed = x.clone();
        if (k->rope_f32_stream_ok(x.data_ptr<float>(), streamed.data_ptr<float>(), f)) {
          k->rope_f32(x.data_ptr<float>(), streamed.data_ptr<float>(), c.data_ptr<float>(),
                      s.data_ptr<float>(), f, interleaved, true);
#if defined(__x86_64__)
          _mm_sfence();
#endif
          EXPECT_TRUE(torch::equal(streamed, y))
              << "F=" << f << " streamed at " << posenc::to_string(k->capability);
        }
      }
      EXPECT_TRUE(torch::equal(ys[0], ys[1])) << "F=" << f << " interleaved=" << interleaved;
      // and the formula itself, each product and sum rounded alone (as eager's ops)
      auto want = x.clone();
      const auto a = interleaved ? x.slice(0, 0, 2 * f, 2) : x.slice(0, 0, f);
      const auto b = interleaved ? x.slice(0, 1, 2 * f, 2) : x.slice(0, f, 2 * f);
      (interleaved ? want.slice(0, 0, 2 * f, 2) : want.slice(0, 0, f)).copy_(a * c - b * s);
      (interleaved ? want.slice(0, 1, 2 * f, 2) : want.slice(0, f, 2 * f)).copy_(b * c + a * s);
      EXPECT_TRUE(torch::equal(ys[0], want)) << "F=" << f << " interleaved=" << interleaved;
    }
  }
}

}  // namespace
