// Timestamp encoders: calendar features against the Informer fixture (tests/fixtures/
// time_features.json, hand-derived with Python datetime by tools/gen_fixtures_multiaxis.py),
// continuous-time sinusoids (hand-derived values, epoch precision), Time2Vec gradients, RoPE with
// periods over real time.
#include <gtest/gtest.h>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
#include "support/fixtures.h"

namespace posenc {
namespace {

using test::max_abs_diff;

TEST(CalendarReference, InformerTimeFeatures) {
  const auto fixture = test::load_fixture("time_features.json");
  const std::vector<std::pair<std::string, std::string>> names{
      {"second", "SecondOfMinute"}, {"minute", "MinuteOfHour"}, {"hour", "HourOfDay"},
      {"weekday", "DayOfWeek"},     {"day", "DayOfMonth"},      {"yearday", "DayOfYear"},
      {"month", "MonthOfYear"},     {"week", "WeekOfYear"}};
  std::vector<std::string> ours;
  for (const auto& [name, informer] : names) ours.push_back(name);
  for (const auto& c : fixture["cases"]) {
    SCOPED_TRACE(c["timestamp"].get<std::string>());
    auto t = torch::tensor({c["epoch_seconds_utc"].get<double>()}, torch::kFloat64);
    auto f = calendar_features(t, ours)[0];
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_NEAR(f[i].item<double>(), c["features"][names[i].second].get<double>(), 1e-12)
          << names[i].first;
  }
}

TEST(Calendar, ModuleProjectsFeaturesAndNamesBadOnes) {
  Calendar calendar(CalendarOptions(8));
  auto p = Positions::values({1268660730.0, 1268664330.0}, "time");  // one hour apart
  auto d = calendar->describe(p, {});
  EXPECT_NEAR((d[0].second[1][0] - d[0].second[0][0]).item<double>(), 1.0 / 23, 1e-12);
  EXPECT_EQ(calendar->add(torch::zeros({1, 2, 8}), p).sizes(), torch::IntArrayRef({1, 2, 8}));
  auto message = test::error_of([] {
    Calendar(CalendarOptions(8).features({"hour", "fortnight"}));
  });
  EXPECT_NE(message.find("unknown feature 'fortnight'"), std::string::npos) << message;
}

TEST(TimeSinusoidal, HandDerivedAndExactAtEpochTimestamps) {
  // dim 4: periods t_min=1 and t_max=100; omega = 2 pi and 2 pi / 100.
  TimeSinusoidal encoder(TimeSinusoidalOptions(4).t_min(1).t_max(100));
  auto table = encoder->table(Positions::values({0.25}, "time"))[0];
  EXPECT_NEAR(table[0].item<double>(), 1.0, 1e-12);  // sin(2 pi 0.25)
  EXPECT_NEAR(table[1].item<double>(), 0.0, 1e-12);
  EXPECT_NEAR(table[2].item<double>(), std::sin(2 * M_PI * 0.25 / 100), 1e-12);
  // epoch seconds with the origin subtracted in float64: identical to small times
  const double origin = 1.7e9;
  TimeSinusoidal epoch(TimeSinusoidalOptions(64).t_min(0.5).t_max(86400).origin(origin));
  TimeSinusoidal small(TimeSinusoidalOptions(64).t_min(0.5).t_max(86400));
  auto a = epoch->table(Positions::values({origin + 0.25, origin + 3600.5}, "time"));
  auto b = small->table(Positions::values({0.25, 3600.5}, "time"));
  EXPECT_LT(max_abs_diff(a, b), 1e-12);
}

TEST(Time2Vec, LinearFirstThenPeriodicAndGradients) {
  torch::manual_seed(41);
  Time2Vec t2v(Time2VecOptions(4).time_scale(10));
  t2v->to(torch::kFloat64);
  auto p = Positions::values({0, 5, 20}, "time");
  auto e = t2v->encode(p);
  const double w0 = t2v->omega[0].item<double>(), p0 = t2v->phi[0].item<double>();
  EXPECT_NEAR(e[1][0].item<double>(), w0 * 0.5 + p0, 1e-12);
  EXPECT_NEAR(e[2][3].item<double>(),
              std::sin(t2v->omega[3].item<double>() * 2 + t2v->phi[3].item<double>()), 1e-12);
  auto probe = torch::randn({3, 4}, torch::kFloat64);
  test::expect_gradient_matches_finite_differences(t2v->omega,
                                                   [&] { return (t2v->encode(p) * probe).sum(); });
}

TEST(TimeRope, PeriodsOverRealTimeKeepTheRelativeProperty) {
  Rope rope(RopeOptions(8).frequencies(RopeFrequencyOptions::periods(1, 1000)));
  auto inv = rope->frequencies().inv_freq;
  EXPECT_NEAR(inv[0].item<double>(), 2 * M_PI, 1e-12);
  EXPECT_NEAR(inv[3].item<double>(), 2 * M_PI / 1000, 1e-12);
  torch::manual_seed(42);
  auto q = torch::randn({1, 1, 1, 8}, torch::kFloat64),
       k = torch::randn({1, 1, 1, 8}, torch::kFloat64);
  auto score = [&](double a, double b) {
    auto [rq, rk] =
        rope->rotate(q, k, Positions::values({a}, "time"), Positions::values({b}, "time"));
    return (rq * rk).sum().item<double>();
  };
  EXPECT_NEAR(score(1.5, 4.25), score(101.5, 104.25), 1e-6);  // real gaps, not indices
  auto built = build_encoder(
      parse_config(R"({"type": "rope", "min_period": 60, "max_period": 86400})"), {32, 1, 0});
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*built).options.frequencies().max_period(), 86400);
  EXPECT_EQ(dynamic_cast<RopeImpl&>(*built).options.frequencies().source(),
            RopeFrequencySource::kPeriods);
}

// Issue #14 item 13: +-1e300 s gave identical (garbage) features before.
TEST(Calendar, TimestampsOutsideYears1To9999AreAnError) {
  auto message =
      test::error_of([] { calendar_features(torch::tensor({1e300}, torch::kFloat64), {"hour"}); });
  EXPECT_NE(message.find("outside the years 1 to 9999"), std::string::npos) << message;
  EXPECT_NO_THROW(calendar_features(
      torch::tensor({253402300799.0, -62135596800.0}, torch::kFloat64), {"month"}));
}

}  // namespace
}  // namespace posenc
