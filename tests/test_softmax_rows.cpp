// The CPU attention kernels' softmax rows (src/kernels/cpu/softmax_rows.h) against std::exp, at
// every vector level this CPU has (AVX2 and AVX-512 in one process, through the level tables of
// src/kernels/cpu/cpu_kernels.h).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/softmax_rows.h"

namespace {

// The vector levels' softmax rows: the exp within Cephes' bound of the exact exp over the float
// range, masked scores exactly 0, NaN kept, every tail length through the masked path; the same
// sums as the plain rows to float rounding. Each level this CPU has, in turn.
void check_vector_rows(const ::posenc::detail::CpuKernels& k) {
  std::vector<float> x;
  for (double v = -87.0; v <= 88.0; v += 0.01) x.push_back(static_cast<float>(v));
  auto y = x;
  k.exp_sub_sum(y.data(), static_cast<int64_t>(y.size()), 0.0f);
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double exact = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - exact) / exact);
  }
  EXPECT_LE(worst, std::ldexp(1.0, -22)) << "worst relative error " << worst;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t n = 0; n <= 35; ++n) {  // 0..15 tail lanes, with and without full vectors
    std::vector<float> row(n), plain;
    for (int64_t c = 0; c < n; ++c) row[c] = c % 3 == 0 ? -inf : 0.25f * static_cast<float>(c);
    plain = row;
    const float m = ::posenc::detail::PlainSoftmaxRows::row_max(row.data(), n);
    EXPECT_EQ(k.row_max(row.data(), n), m) << n;
    const float shift = m == -inf ? 0.0f : m;  // (the kernel skips an all-masked row)
    const float fast = k.exp_sub_sum(row.data(), n, shift);
    const float slow = ::posenc::detail::PlainSoftmaxRows::exp_sub_sum(plain.data(), n, shift);
    EXPECT_NEAR(fast, slow, 1e-6f * std::max(1.0f, slow)) << n;
    for (int64_t c = 0; c < n; ++c) {
      if (c % 3 == 0)
        EXPECT_EQ(row[c], 0.0f) << n << " " << c;  // exp(-inf - m): exactly 0
      else
        EXPECT_NEAR(row[c], plain[c], 4e-7f * plain[c]) << n << " " << c;
    }
  }
  std::vector<float> nan_row = {1.0f, std::nanf(""), 2.0f, -100.0f, 0.0f, 1.0f, 3.0f, 0.5f, 1.0f};
  k.exp_sub_sum(nan_row.data(), 9, 3.0f);
  EXPECT_TRUE(std::isnan(nan_row[1]));
  EXPECT_EQ(nan_row[3], 0.0f);  // exp(-103) is below FLT_MIN: 0
  EXPECT_EQ(nan_row[6], 1.0f);  // exp(0)
}

TEST(SoftmaxRows, VectorExpIsCephesAccurateAndKeepsMasksAndNaN) {
  using ::posenc::CpuCapability;
  int levels = 0;
  for (const auto level : {CpuCapability::kAvx2, CpuCapability::kAvx512}) {
    if (level > ::posenc::cpu_capability_detected()) continue;
    SCOPED_TRACE(::posenc::to_string(level));
    check_vector_rows(::posenc::detail::cpu_kernels_at(level));
    ++levels;
  }
  if (levels == 0) GTEST_SKIP() << "no AVX2 on this CPU";
}

}  // namespace
