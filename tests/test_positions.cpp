// Positions: builders, axes, validation errors that name expected and actual values.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "posenc/core/positions.h"

using posenc::Positions;

TEST(Positions, SequenceIsExactFloat64) {
  auto p = Positions::sequence(5, 3.0);
  EXPECT_EQ(p.size(), 5);
  EXPECT_EQ(p.num_axes(), 1);
  EXPECT_EQ(p.coords().scalar_type(), torch::kFloat64);
  EXPECT_DOUBLE_EQ(p.axis("t")[4].item<double>(), 7.0);
  EXPECT_EQ(p.describe(), "Positions[N=5, axes=(t)]");
}

TEST(Positions, EpochTimestampsStayExact) {
  // 1.7e9 s epoch timestamps one second apart are distinct and exact in float64.
  auto p = Positions::values({1700000000.0, 1700000001.0}, "time");
  EXPECT_DOUBLE_EQ((p.axis(0)[1] - p.axis(0)[0]).item<double>(), 1.0);
}

TEST(Positions, RejectsNonFinite) {
  auto coords = torch::tensor({0.0, 1.0, std::nan("")}, torch::kFloat64).view({3, 1});
  try {
    Positions(coords, {"t"});
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be finite, got nan at index [2, 0]"),
              std::string::npos)
        << e.what();
  }
  auto inf = torch::tensor({INFINITY}, torch::kFloat64).view({1, 1});
  EXPECT_THROW(Positions(inf, {"t"}), c10::Error);
}

TEST(Positions, RejectsMismatchedAxes) {
  auto coords = torch::zeros({4, 2}, torch::kFloat64);
  try {
    Positions(coords, {"t"});
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("coords have 2 axes (last dim) but 1 axis names"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(Positions(coords, {"h", "h"}), c10::Error);
  EXPECT_THROW(Positions(torch::zeros({4, 1}, torch::kLong), {"t"}), c10::Error);
  EXPECT_THROW(Positions(torch::zeros({4}), {"t"}), c10::Error);
}

TEST(Positions, AxisLookupListsAxes) {
  Positions p(torch::zeros({3, 2}, torch::kFloat64), {"h", "w"});
  EXPECT_EQ(p.axis_index("w"), 1);
  try {
    p.axis("t");
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no axis named 't'; the axes are (h, w)"),
              std::string::npos);
  }
  try {
    p.check_num_axes("rope", 1);
    FAIL();
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rope: expected positions with 1 axis, got 2 (h, w)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Positions, BatchedAndShifted) {
  Positions p(torch::arange(6, torch::kFloat64).view({2, 3, 1}), {"t"});
  EXPECT_TRUE(p.batched());
  EXPECT_EQ(p.size(), 3);
  EXPECT_EQ(p.axis(0).sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_DOUBLE_EQ(p.shifted(10).max(), 15.0);
}
