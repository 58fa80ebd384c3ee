// Real-time helpers: log-spaced periods and Informer calendar features; formulas in
// include/posenc/functional/time.h.
#include "posenc/functional/time.h"

#include <torch/torch.h>

#include <cmath>

namespace posenc {

at::Tensor time_periods(double t_min, double t_max, int64_t count) {
  TORCH_CHECK(t_min > 0 && t_max >= t_min && std::isfinite(t_max),
              "time: periods need 0 < t_min <= t_max, got t_min=", t_min, ", t_max=", t_max);
  TORCH_CHECK(count >= 1, "time: need at least one period, got ", count);
  if (count == 1) return torch::tensor({t_min}, torch::kFloat64);
  auto i = torch::arange(count, torch::kFloat64) / static_cast<double>(count - 1);
  return t_min * torch::pow(t_max / t_min, i);
}

const std::vector<std::string>& calendar_feature_names() {
  static const std::vector<std::string> names{"second", "minute",  "hour",  "weekday",
                                              "day",    "yearday", "month", "week"};
  return names;
}

int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

namespace {

// days since 1970-01-01 -> (year, month 1..12, day 1..31); Hinnant, "chrono-compatible
// low-level date algorithms".
void civil_from_days(int64_t z, int64_t& y, int64_t& m, int64_t& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = yoe + era * 400 + (m <= 2 ? 1 : 0);
}

int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0) && ((a < 0) != (b < 0))); }

int64_t weekday_of(int64_t days) { return ((days % 7) + 7 + 3) % 7; }  // 1970-01-01: Thursday (3)

// ISO 8601 week number (1..53).
int64_t iso_week(int64_t days) {
  const int64_t wd = weekday_of(days);     // Monday 0
  const int64_t thursday = days - wd + 3;  // the Thursday of this ISO week decides its year
  int64_t ty, tm, td;
  civil_from_days(thursday, ty, tm, td);
  return (thursday - days_from_civil(ty, 1, 1)) / 7 + 1;
}

}  // namespace

at::Tensor calendar_features(const at::Tensor& epoch_seconds,
                             const std::vector<std::string>& names) {
  TORCH_CHECK(!names.empty(), "calendar: at least one feature is required");
  std::vector<int> which;
  for (const auto& name : names) {
    const auto& known = calendar_feature_names();
    auto it = std::find(known.begin(), known.end(), name);
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    TORCH_CHECK(it != known.end(), "calendar: unknown feature '", name, "'; known: ", list);
    which.push_back(static_cast<int>(it - known.begin()));
  }
  // a loop over dates in host memory (the timestamps may be on a GPU: read them back)
  auto t = epoch_seconds.to(torch::kCPU, torch::kFloat64).contiguous();
  TORCH_CHECK(at::isfinite(t).all().item<bool>(), "calendar: timestamps must be finite");
  // The proleptic Gregorian years 1..9999 (as ISO 8601 and Python's datetime): beyond them an
  // int64 day count overflows and every date would read as the same garbage.
  constexpr double kFirst = -62135596800.0;  // 0001-01-01 00:00:00 UTC
  constexpr double kLast = 253402300799.0;   // 9999-12-31 23:59:59 UTC
  if (t.numel() > 0) {
    const double lo = t.min().item<double>(), hi = t.max().item<double>();
    TORCH_CHECK(lo >= kFirst && hi <= kLast, "calendar: timestamp ", lo < kFirst ? lo : hi,
                " s is outside the years 1 to 9999 (epoch seconds ", kFirst, " to ", kLast, ")");
  }
  auto out = torch::empty({t.numel(), static_cast<int64_t>(names.size())}, torch::kFloat64);
  const double* src = t.data_ptr<double>();
  double* dst = out.data_ptr<double>();
  for (int64_t n = 0; n < t.numel(); ++n) {
    const auto seconds = static_cast<int64_t>(std::floor(src[n]));
    const int64_t days = floor_div(seconds, 86400);
    const int64_t in_day = seconds - days * 86400;
    int64_t y, m, d;
    civil_from_days(days, y, m, d);
    const int64_t yearday = days - days_from_civil(y, 1, 1) + 1;
    const double values[8] = {(in_day % 60) / 59.0 - 0.5,   (in_day / 60 % 60) / 59.0 - 0.5,
                              (in_day / 3600) / 23.0 - 0.5, weekday_of(days) / 6.0 - 0.5,
                              (d - 1) / 30.0 - 0.5,         (yearday - 1) / 365.0 - 0.5,
                              (m - 1) / 11.0 - 0.5,         (iso_week(days) - 1) / 52.0 - 0.5};
    for (size_t f = 0; f < which.size(); ++f) dst[n * which.size() + f] = values[which[f]];
  }
  auto sizes = epoch_seconds.sizes().vec();
  sizes.push_back(static_cast<int64_t>(names.size()));
  return out.view(sizes).to(epoch_seconds.device());
}

}  // namespace posenc
