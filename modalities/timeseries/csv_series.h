// Time series from CSV with a timestamp column: values + real-time Positions (axis "time",
// float64 UTC epoch seconds; gaps kept as they are, never rounded to indices).
// Timestamps: "YYYY-MM-DD", "YYYY-MM-DD HH:MM", "YYYY-MM-DD HH:MM:SS[.fraction]", the same with
// '/' between date fields or 'T' before the time, then optionally 'Z' or a UTC offset ("+02:00",
// "-0530": the instant is converted to UTC); compact "YYYYMMDD" (exactly eight digits: read as a
// date, and refused when they are none, e.g. month 13 — never as epoch seconds), or plain epoch
// seconds. NaN and infinite values are errors naming file and line.
// An empty value cell is a missing reading: an error, or (MissingPolicy::kDropRow) the row is
// dropped and the gap stays in the timestamps.
// A bad row is an error naming file and line; timestamps out of order are sorted (kSort, stable)
// or rejected (kReject) as the caller chooses; duplicate timestamps are kept.
// Real data: Debian's python3-vega-datasets ships hourly 2010 temperatures (seattle-temps.csv,
// sf-temps.csv) and python3-statsmodels the weekly Mauna Loa CO2 series (co2.csv, 1958-2001, with
// missing weeks); scripts/setup.sh extracts them without installing the packages.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "posenc/core/positions.h"

namespace posenc::timeseries {

/// Parses one timestamp (formats above) to UTC epoch seconds; nullopt if it is none of them.
std::optional<double> parse_timestamp(const std::string& text);

enum class OrderPolicy { kSort, kReject };
enum class MissingPolicy { kError, kDropRow };

struct Series {
  at::Tensor times;                  ///< [N] float64 epoch seconds, ascending
  at::Tensor values;                 ///< [N, C] float32
  std::vector<std::string> columns;  ///< C names
  Positions positions() const;       ///< times as Positions on axis "time"
};

/// Reads `path`; value_columns empty = every column but the time column.
Series load_csv(const std::string& path, const std::string& time_column,
                const std::vector<std::string>& value_columns = {},
                OrderPolicy order = OrderPolicy::kSort,
                MissingPolicy missing = MissingPolicy::kError);

struct Normalization {
  at::Tensor mean, std;  ///< [C]
};
/// Per-column statistics of a (training) series.
Normalization fit_normalization(const Series& series);
/// (values - mean) / std.
Series normalize(const Series& series, const Normalization& stats);

/// Windows of a fixed time span (not a fixed count): [begin, end) index ranges of readings with
/// t in [t0 + k * stride, t0 + k * stride + span), for every k whose window holds >= min_readings.
std::vector<std::pair<int64_t, int64_t>> windows_by_span(const Series& series, double span,
                                                         double stride, int64_t min_readings = 1);
/// Drops each reading with probability p (sensor loss), keeping order and real timestamps.
Series drop_readings(const Series& series, double p);

}  // namespace posenc::timeseries
