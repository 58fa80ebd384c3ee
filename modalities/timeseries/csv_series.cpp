// CSV time series, timestamp parsing, normalization, time-span windows, reading drop-out;
// contracts in csv_series.h.
#include "csv_series.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include "posenc/functional/time.h"
#include "posenc/io/input_digest.h"
#include "posenc/io/input_file.h"

namespace posenc::timeseries {

namespace {

// The length of the valid UTF-8 sequence starting at s[i], or 0 when s[i] starts none (a Latin-1
// byte, a stray continuation byte, an overlong or surrogate encoding, a cut sequence).
size_t utf8_length(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;
    if (c == 0xED) high = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) return 0;
  }
  return n;
}

// A cell as an error message shows it: at most 80 characters (then its byte count), control
// bytes (a NUL) and bytes that are not UTF-8 (Latin-1 0xE9) escaped as \xE9, never raw.
std::string shown(const std::string& cell) {
  std::string out;
  size_t i = 0;
  while (i < cell.size() && out.size() < 80) {
    const auto c = static_cast<unsigned char>(cell[i]);
    const size_t n = utf8_length(cell, i);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
      ++i;
    } else {
      out.append(cell, i, n);
      i += n;
    }
  }
  if (i < cell.size()) out += "... (" + std::to_string(cell.size()) + " bytes)";
  return out;
}

// `otherwise` for UTF-8 text; else why the text shows \xE9 (" (byte 2 of the field, 0xE9, is
// not UTF-8: ...)"), `what` naming the text ("field", "header").
std::string utf8_note(const std::string& text, const char* what, const char* otherwise) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n == 0) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned char>(text[i]));
      return std::string(" (byte ") + std::to_string(i + 1) + " of the " + what + ", " + hex +
             ", is not UTF-8: the file is not UTF-8 text; Latin-1 or Windows-1252? convert it, "
             "e.g. iconv -f latin1 -t utf-8)";
    }
    i += n;
  }
  return otherwise;
}

// The columns of a header as an error message lists them: the first 20, each shown().
std::string shown_columns(const std::vector<std::string>& header) {
  constexpr size_t kListed = 20;
  std::string names;
  for (size_t i = 0; i < header.size() && i < kListed; ++i)
    names += (i ? ", " : "") + shown(header[i]);
  if (header.size() > kListed) names += " and " + std::to_string(header.size() - kListed) + " more";
  return names;
}

// A number written as a decimal: [+-] digits [. digits] [e [+-] digits]. strtod also reads hex
// floats (0x1p3 = 8), "inf" and "nan"; a CSV of readings means none of them.
bool decimal(const std::string& t) {
  size_t i = 0, digits = 0;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++digits;
  if (i < t.size() && t[i] == '.') {
    ++i;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < t.size() && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < t.size() && (t[i] == '+' || t[i] == '-')) ++i;
    size_t exponent = 0;
    while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i, ++exponent;
    if (exponent == 0) return false;
  }
  return i == t.size();
}

}  // namespace

namespace {

bool leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r\"");
  if (a == std::string::npos) return "";
  const auto b = s.find_last_not_of(" \t\r\"");
  return s.substr(a, b - a + 1);
}

// One CSV record (RFC 4180): fields separated by commas; a field in double quotes may hold
// commas and "" for a quote ("Seattle, WA"). nullopt when a quote is left open.
std::optional<std::vector<std::string>> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  bool quoted = false, was_quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = was_quoted = true;
    } else if (c == ',') {
      out.push_back(was_quoted ? cell : trim(cell));
      cell.clear();
      was_quoted = false;
    } else {
      cell += c;
    }
  }
  if (quoted) return std::nullopt;
  out.push_back(was_quoted ? cell : trim(cell));
  return out;
}

// Plain epoch numbers past the year 9999 are refused: most likely milliseconds or microseconds.
constexpr double kMaxEpochSeconds = 253402300799.0;  // 9999-12-31 23:59:59 UTC

}  // namespace

std::optional<double> parse_timestamp(const std::string& raw) {
  const std::string text = trim(raw);
  if (text.empty()) return std::nullopt;
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  static const int days_in[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  auto valid_date = [&](int yy, int mm, int dd) {
    return mm >= 1 && mm <= 12 && dd >= 1 && dd <= days_in[mm - 1] + (mm == 2 && leap(yy) ? 1 : 0);
  };
  if (text.size() == 8 && std::all_of(text.begin(), text.end(), ::isdigit)) {  // YYYYMMDD
    y = std::stoi(text.substr(0, 4));
    mo = std::stoi(text.substr(4, 2));
    d = std::stoi(text.substr(6, 2));
    if (valid_date(y, mo, d)) return static_cast<double>(days_from_civil(y, mo, d)) * 86400.0;
    return std::nullopt;  // 8 digits that are no date (month 13): refused, never epoch seconds
  }
  char sep1 = 0, sep2 = 0, t = 0;
  int consumed = 0;
  const int fields =
      std::sscanf(text.c_str(), "%4d%c%2d%c%2d%n", &y, &sep1, &mo, &sep2, &d, &consumed);
  if (fields == 5 && sep1 == sep2 && (sep1 == '-' || sep1 == '/')) {
    // [ T]HH:MM[:SS[.fraction]] then Z or a UTC offset +HH:MM / -HH:MM / +HHMM
    std::string rest = text.substr(static_cast<size_t>(consumed));
    double seconds = 0, offset = 0;
    if (!rest.empty()) {
      int used = 0;
      const int n = std::sscanf(rest.c_str(), "%c%2d:%2d%n", &t, &h, &mi, &used);
      if (n != 3 || (t != ' ' && t != 'T')) return std::nullopt;
      std::string tail = rest.substr(static_cast<size_t>(used));
      if (!tail.empty() && tail[0] == ':') {
        size_t end = 1;
        while (end < tail.size() &&
               (std::isdigit(static_cast<unsigned char>(tail[end])) || tail[end] == '.'))
          ++end;
        const std::string field = tail.substr(1, end - 1);
        if (field.size() < 2 || !std::isdigit(static_cast<unsigned char>(field[0])) ||
            !std::isdigit(static_cast<unsigned char>(field[1])) ||
            (field.size() > 2 &&
             (field[2] != '.' || field.size() == 3 || field.find('.', 3) != std::string::npos)))
          return std::nullopt;
        s = std::stoi(field.substr(0, 2));
        seconds = std::stod(field);
        tail = tail.substr(end);
      }
      if (tail == "Z") {
        tail.clear();
      } else if (!tail.empty() && (tail[0] == '+' || tail[0] == '-')) {
        int oh = 0, om = 0, used_o = 0;
        const bool colon = std::sscanf(tail.c_str() + 1, "%2d:%2d%n", &oh, &om, &used_o) == 2 &&
                           used_o == static_cast<int>(tail.size()) - 1 && tail.size() == 6;
        const bool compact = !colon && tail.size() == 5 &&
                             std::all_of(tail.begin() + 1, tail.end(), ::isdigit) &&
                             std::sscanf(tail.c_str() + 1, "%2d%2d", &oh, &om) == 2;
        if ((!colon && !compact) || oh > 23 || om > 59) return std::nullopt;
        offset = (tail[0] == '+' ? 1 : -1) * (oh * 3600.0 + om * 60.0);
        tail.clear();
      }
      if (!tail.empty()) return std::nullopt;
    }
    if (!valid_date(y, mo, d) || h > 23 || mi > 59 || s > 60 || h < 0 || mi < 0 || s < 0)
      return std::nullopt;
    // local time at a UTC offset: UTC = local - offset
    return static_cast<double>(days_from_civil(y, mo, d)) * 86400.0 + h * 3600.0 + mi * 60.0 +
           seconds - offset;
  }
  // plain epoch seconds
  if (!decimal(text)) return std::nullopt;
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size() && std::isfinite(v) && std::abs(v) <= kMaxEpochSeconds) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

Positions Series::positions() const { return Positions(times.unsqueeze(1), {"time"}); }

Series load_csv(const std::string& path, const std::string& time_column,
                const std::vector<std::string>& value_columns, OrderPolicy order,
                MissingPolicy missing) {
  std::error_code error;
  TORCH_CHECK(!std::filesystem::is_directory(path, error), "csv: '", path,
              "' is a folder, not a CSV file");
  require_regular_file(path, "csv file");  // a FIFO or device: one line, no blocking read
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "csv: cannot read '", path, "'");
  std::string line;
  TORCH_CHECK(static_cast<bool>(std::getline(in, line)), "csv: '", path, "' is empty");
  const bool utf16 = line.rfind("\xFF\xFE", 0) == 0 || line.rfind("\xFE\xFF", 0) == 0;
  TORCH_CHECK(!utf16, "csv: '", path, "' is UTF-16 (its byte order mark is ",
              line[0] == '\xFF' ? "FF FE" : "FE FF", "); save it as UTF-8");
  TORCH_CHECK(line.find('\0') == std::string::npos, "csv: '", path,
              "' has NUL bytes in its header (UTF-16 or UTF-32 without a byte order mark?); a CSV "
              "is UTF-8 text");
  if (line.rfind("\xEF\xBB\xBF", 0) == 0) line = line.substr(3);  // a UTF-8 byte order mark
  if (!line.empty() && line.back() == '\r') line.pop_back();
  TORCH_CHECK(line.find('\r') == std::string::npos, "csv: '", path,
              "' uses CR-only line endings (old Mac); convert them to LF or CRLF");
  const auto parsed_header = split_csv(line);
  TORCH_CHECK(parsed_header.has_value(), "csv: ", path, ":1: a quote is not closed");
  const auto header = *parsed_header;
  const std::string header_line = line;
  // a hash of the names, not a pairwise scan: a header of 10^6 columns is checked at once
  std::unordered_map<std::string, size_t> first_column;
  for (size_t b = 0; b < header.size(); ++b) {
    const auto [seen, added] = first_column.emplace(header[b], b);
    TORCH_CHECK(added, "csv: ", path, ":1: column name '", shown(header[b]),
                "' appears twice (columns ", seen->second + 1, " and ", b + 1,
                "); which one is meant cannot be told");
  }
  auto column_of = [&](const std::string& name) {
    const auto it = first_column.find(name);  // a lookup: every column of 10^6 stays linear
    TORCH_CHECK(it != first_column.end(), "csv: '", path, "' has no column '", shown(name),
                "'; columns: ", shown_columns(header), utf8_note(header_line, "header", ""));
    return it->second;
  };
  const size_t time_index = column_of(time_column);
  std::vector<std::string> names = value_columns;
  if (names.empty())
    for (const auto& h : header)
      if (h != time_column) names.push_back(h);
  TORCH_CHECK(!names.empty(), "csv: '", path, "' has no value columns besides '",
              shown(time_column), "'");
  std::vector<size_t> value_index;
  for (const auto& n : names) value_index.push_back(column_of(n));

  std::vector<double> times;
  std::vector<float> values;
  int64_t line_number = 1;
  while (std::getline(in, line)) {
    ++line_number;
    if (trim(line).empty()) continue;
    if (line.back() == '\r') line.pop_back();
    TORCH_CHECK(line.find('\0') == std::string::npos, "csv: ", path, ":", line_number,
                ": a NUL byte; a CSV is text");
    const auto parsed = split_csv(line);
    TORCH_CHECK(parsed.has_value(), "csv: ", path, ":", line_number,
                ": a quote is not closed (fields spanning lines are not supported)");
    const auto& cells = *parsed;
    TORCH_CHECK(cells.size() == header.size(), "csv: ", path, ":", line_number, ": expected ",
                header.size(), " fields, got ", cells.size());
    auto t = parse_timestamp(cells[time_index]);
    TORCH_CHECK(t.has_value(), "csv: ", path, ":", line_number, ": cannot parse timestamp '",
                shown(cells[time_index]), "'",
                utf8_note(cells[time_index], "field",
                          " (expected YYYY-MM-DD[ HH:MM[:SS[.f]]][Z|+HH:MM], '/' or 'T' variants, "
                          "YYYYMMDD, or epoch seconds up to the year 9999 — milliseconds must be "
                          "converted)"));
    bool any_missing = false;
    for (size_t c = 0; c < value_index.size(); ++c) {
      if (!cells[value_index[c]].empty()) continue;
      TORCH_CHECK(missing == MissingPolicy::kDropRow, "csv: ", path, ":", line_number, ": column '",
                  shown(names[c]),
                  "' is empty (a missing reading); MissingPolicy::kDropRow drops such rows");
      any_missing = true;
    }
    if (any_missing) continue;  // the gap stays in the timestamps
    if (order == OrderPolicy::kReject && !times.empty())
      TORCH_CHECK(*t >= times.back(), "csv: ", path, ":", line_number, ": timestamp '",
                  shown(cells[time_index]),
                  "' is earlier than the previous row's (order policy: reject)");
    times.push_back(*t);
    for (size_t c = 0; c < value_index.size(); ++c) {
      const auto& cell = cells[value_index[c]];
      size_t used = 0;
      float v = 0;
      try {
        if (decimal(cell))
          v = static_cast<float>(std::stod(cell, &used));  // 1e39: inf, refused below
      } catch (const std::exception&) {
        used = 0;
      }
      TORCH_CHECK(used > 0 && used == cell.size(), "csv: ", path, ":", line_number, ": column '",
                  shown(names[c]), "' holds '", shown(cell), "', not a decimal number",
                  utf8_note(cell, "field", " (hex, inf and nan are not readings)"));
      TORCH_CHECK(std::isfinite(v), "csv: ", path, ":", line_number, ": column '", shown(names[c]),
                  "' holds '", shown(cell),
                  "', not a finite number (it would reach training as NaN)");
      values.push_back(v);
    }
  }
  TORCH_CHECK(!times.empty(), "csv: '", path, "' has a header but no rows");
  // the ranks of a run compare what they read (posenc/io/input_digest.h): the parsed numbers
  note_input(times.data(), times.size() * sizeof(double));
  note_input(values.data(), values.size() * sizeof(float));
  const auto n = static_cast<int64_t>(times.size());
  Series series;
  series.columns = names;
  series.times = torch::tensor(times, torch::kFloat64);
  series.values =
      torch::tensor(values, torch::kFloat32).view({n, static_cast<int64_t>(names.size())});
  if (order == OrderPolicy::kSort) {
    auto sorted = std::get<1>(series.times.sort(/*stable=*/true, 0, false));
    series.times = series.times.index_select(0, sorted);
    series.values = series.values.index_select(0, sorted);
  }
  // Two readings at one instant that disagree cannot both be true: refused, naming the time.
  if (n > 1) {
    auto same = series.times.narrow(0, 1, n - 1).eq(series.times.narrow(0, 0, n - 1));
    TORCH_CHECK(!same.all().item<bool>(), "csv: '", path, "': all ", n,
                " rows share one timestamp; a series needs its readings at different times");
    auto differ = series.values.narrow(0, 1, n - 1).ne(series.values.narrow(0, 0, n - 1)).any(1);
    auto conflict = (same & differ).nonzero();
    if (conflict.numel() > 0) {
      const auto i = conflict[0][0].item<int64_t>();
      std::ostringstream when;
      when.precision(15);
      when << series.times[i].item<double>();
      TORCH_CHECK(false, "csv: '", path, "': two rows at timestamp ", when.str(),
                  " (epoch seconds) hold different values; ", conflict.size(0),
                  " such conflict(s)");
    }
  }
  return series;
}

Normalization fit_normalization(const Series& series) {
  auto std = series.values.std(0).clamp_min(1e-8);
  return {series.values.mean(0), std};
}

Series normalize(const Series& series, const Normalization& stats) {
  TORCH_CHECK(stats.mean.numel() == series.values.size(1), "normalize: statistics for ",
              stats.mean.numel(), " columns, series has ", series.values.size(1));
  Series out = series;
  out.values = (series.values - stats.mean) / stats.std;
  return out;
}

std::vector<std::pair<int64_t, int64_t>> windows_by_span(const Series& series, double span,
                                                         double stride, int64_t min_readings) {
  TORCH_CHECK(span > 0 && stride > 0, "windows_by_span: span and stride must be positive, got ",
              span, " and ", stride);
  std::vector<std::pair<int64_t, int64_t>> out;
  const auto n = series.times.size(0);
  if (n == 0) return out;
  const double* t = series.times.data_ptr<double>();
  int64_t begin = 0, end = 0;
  for (double start = t[0]; start <= t[n - 1]; start += stride) {
    while (begin < n && t[begin] < start) ++begin;
    end = std::max(end, begin);
    while (end < n && t[end] < start + span) ++end;
    if (end - begin >= min_readings) out.emplace_back(begin, end);
  }
  return out;
}

Series drop_readings(const Series& series, double p) {
  TORCH_CHECK(p >= 0 && p < 1, "drop_readings: p must be in [0, 1), got ", p);
  auto keep = (torch::rand({series.times.size(0)}) >= p).nonzero().squeeze(1);
  Series out = series;
  out.times = series.times.index_select(0, keep);
  out.values = series.values.index_select(0, keep);
  return out;
}

}  // namespace posenc::timeseries
