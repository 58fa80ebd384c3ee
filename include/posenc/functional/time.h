// Real-time positions: timestamps are float64 seconds (any origin), gaps kept as they are.
//
// Log-spaced periods (as torch_brain's RotaryTimeEmbedding, and the continuous-time sinusoid of
// time-series transformers): period_i = t_min (t_max / t_min)^(i / (F - 1)), i = 0 .. F-1, so the
// encoding resolves gaps from t_min up to t_max; omega_i = 2 pi / period_i.
//
// Calendar features (Informer, Zhou et al. 2021, utils/timefeatures.py; each in [-0.5, 0.5]):
//   second  s/59 - .5   minute  m/59 - .5   hour    h/23 - .5     weekday (Monday 0) d/6 - .5
//   day     (d-1)/30 - .5   yearday (doy-1)/365 - .5   month (m-1)/11 - .5   week (isoweek-1)/52 -
//   .5
// computed from UTC epoch seconds with exact integer calendar arithmetic (Hinnant's
// civil_from_days), no time-zone database.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace posenc {

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's days_from_civil).
int64_t days_from_civil(int64_t year, int64_t month, int64_t day);

/// F log-spaced periods from t_min to t_max, float64 [F].
at::Tensor time_periods(double t_min, double t_max, int64_t count);
/// The known calendar feature names, in a fixed order.
const std::vector<std::string>& calendar_feature_names();
/// epoch seconds (UTC) [...] -> features [..., F] float64, F = names.size().
at::Tensor calendar_features(const at::Tensor& epoch_seconds,
                             const std::vector<std::string>& names);

}  // namespace posenc
