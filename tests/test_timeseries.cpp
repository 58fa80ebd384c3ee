// modalities/timeseries: timestamp formats, the real hourly 2010 temperatures of Debian's
// python3-vega-datasets (unpacked by scripts/setup.sh), bad rows naming file and line, order
// policies, time-span windows and reading drop-out. Expected values were read from the same files
// with Python's csv + datetime (calendar.timegm).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "support/fixtures.h"
#include "timeseries/csv_series.h"

namespace posenc::timeseries {
namespace {

const std::string kVega = std::string(POSENC_DATA_DIR) + "/vega";

TEST(Timestamps, FormatsAndInvalidDates) {
  EXPECT_EQ(parse_timestamp("2010-01-01"), 1262304000.0);
  EXPECT_EQ(parse_timestamp("2010/01/01 00:00"), 1262304000.0);
  EXPECT_EQ(parse_timestamp("2010-03-15 13:45:30"), 1268660730.0);
  EXPECT_EQ(parse_timestamp("2010-03-15T13:45:30Z"), 1268660730.0);
  EXPECT_EQ(parse_timestamp("2012-02-29 12:00"), 1330516800.0);  // leap day
  EXPECT_EQ(parse_timestamp("1700000000.5"), 1700000000.5);
  EXPECT_FALSE(parse_timestamp("2010-02-30").has_value());
  EXPECT_FALSE(parse_timestamp("2010-13-01").has_value());
  EXPECT_FALSE(parse_timestamp("2010-01-01 25:00").has_value());
  EXPECT_FALSE(parse_timestamp("yesterday").has_value());
  EXPECT_EQ(parse_timestamp("19580329"), *parse_timestamp("1958-03-29"));  // compact date
  // 8 digits that are no date (month 13) are refused, not read as epoch seconds
  EXPECT_FALSE(parse_timestamp("20101301").has_value());
  EXPECT_FALSE(parse_timestamp("19581399").has_value());
  // fractional seconds and UTC offsets (hand-derived: 13:45:30+02:00 is 11:45:30 UTC)
  EXPECT_EQ(parse_timestamp("2010-03-15T13:45:30.25Z"), 1268660730.25);
  EXPECT_EQ(parse_timestamp("2010-03-15T13:45:30+02:00"), 1268660730.0 - 7200);
  EXPECT_EQ(parse_timestamp("2010-03-15 13:45-0530"), 1268660700.0 + 19800);
  EXPECT_FALSE(parse_timestamp("2010-03-15T13:45:30+25:00").has_value());
  EXPECT_FALSE(parse_timestamp("2010-03-15T13:45:30.").has_value());
  EXPECT_FALSE(parse_timestamp("2010-03-15T13:45:30 UTC").has_value());
}

TEST(VegaTemperatures, RealHourlySeriesWithItsGap) {
  auto seattle = load_csv(kVega + "/seattle-temps.csv", "date");
  ASSERT_EQ(seattle.values.sizes(), torch::IntArrayRef({8759, 1}));
  EXPECT_EQ(seattle.columns, std::vector<std::string>{"temp"});
  EXPECT_EQ(seattle.times[0].item<double>(), 1262304000.0);
  EXPECT_EQ(seattle.times[-1].item<double>(), 1293836400.0);
  auto gaps = seattle.times.diff();
  EXPECT_EQ((gaps == 7200).sum().item<int64_t>(), 1);  // the missing hour is kept as a gap
  EXPECT_EQ(gaps[1730].item<double>(), 7200.0);
  EXPECT_NEAR(seattle.values.mean().item<double>(), 52.028028, 1e-4);
  auto positions = seattle.positions();
  EXPECT_EQ(positions.axes(), std::vector<std::string>{"time"});
  // sf-temps.csv has the columns the other way round and seconds in its dates
  auto sf = load_csv(kVega + "/sf-temps.csv", "date");
  EXPECT_EQ(sf.values.size(0), 8759);
  EXPECT_EQ(sf.times[0].item<double>(), 1262304000.0);
}

TEST(VegaTemperatures, WindowsSpanTimeNotCounts) {
  auto series = load_csv(kVega + "/seattle-temps.csv", "date");
  auto windows = windows_by_span(series, 86400, 86400);
  EXPECT_EQ(windows.size(), 365u);
  for (const auto& [begin, end] : windows)
    EXPECT_LT(series.times[end - 1].item<double>() - series.times[begin].item<double>(), 86400);
  EXPECT_EQ(windows[72].second - windows[72].first, 23);  // the day with the missing hour
  torch::manual_seed(3);
  auto sparse = drop_readings(series, 0.5);
  EXPECT_LT(sparse.times.size(0), 5000);
  EXPECT_TRUE((sparse.times.diff() > 0).all().item<bool>());
  auto sparse_windows = windows_by_span(sparse, 86400, 86400);
  EXPECT_EQ(sparse_windows.size(), 365u);  // still one window a day, fewer readings in each
  auto stats = fit_normalization(series);
  auto normalized = normalize(series, stats);
  EXPECT_NEAR(normalized.values.mean().item<double>(), 0.0, 1e-4);
  EXPECT_NEAR(normalized.values.std().item<double>(), 1.0, 1e-4);
}

TEST(MaunaLoaCo2, WeeklySeriesWithMissingWeeks) {
  const std::string co2 = std::string(POSENC_DATA_DIR) + "/statsmodels/co2.csv";
  // 2284 weekly rows, 59 of them without a reading (Python's csv reads the same counts)
  auto message = test::error_of([&] { load_csv(co2, "date"); });
  EXPECT_NE(message.find(co2 + ":8: column 'co2' is empty"), std::string::npos) << message;
  auto series = load_csv(co2, "date", {"co2"}, OrderPolicy::kReject, MissingPolicy::kDropRow);
  EXPECT_EQ(series.values.size(0), 2225);
  EXPECT_EQ(series.times[0].item<double>(), *parse_timestamp("1958-03-29"));
  EXPECT_NEAR(series.values.mean().item<double>(), 340.142247, 1e-3);
  auto gaps = series.times.diff() / 86400;  // days
  EXPECT_EQ(gaps.min().item<double>(), 7.0);
  EXPECT_GT(gaps.max().item<double>(), 7.0);  // the missing weeks stay as gaps
  EXPECT_EQ((gaps > 7).sum().item<int64_t>() > 0, true);
}

TEST(CsvErrors, BadRowsNameFileAndLine) {
  const auto dir = std::filesystem::temp_directory_path() / "posenc_timeseries_tests";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  auto bad = write("bad.csv", "time,value\n2010-01-01 00:00,1\n2010-01-01 0x:00,2\n");
  auto message = test::error_of([&] { load_csv(bad, "time"); });
  EXPECT_NE(message.find(bad + ":3: cannot parse timestamp '2010-01-01 0x:00'"), std::string::npos)
      << message;
  auto order = write("order.csv", "time,value\n2010-01-02,1\n2010-01-01,2\n");
  message = test::error_of([&] { load_csv(order, "time", {}, OrderPolicy::kReject); });
  EXPECT_NE(message.find(order + ":3: timestamp '2010-01-01' is earlier"), std::string::npos)
      << message;
  auto sorted = load_csv(order, "time");
  EXPECT_EQ(sorted.values[0][0].item<float>(), 2.0f);
  auto text = write("text.csv", "time,value\n2010-01-01,warm\n");
  message = test::error_of([&] { load_csv(text, "time"); });
  EXPECT_NE(message.find(":2: column 'value' holds 'warm', not a decimal number"),
            std::string::npos)
      << message;
  message = test::error_of([&] { load_csv(text, "date"); });
  EXPECT_NE(message.find("has no column 'date'; columns: time, value"), std::string::npos)
      << message;
  // legitimate CSV a spreadsheet writes: a byte order mark, quoted fields with commas, CRLF
  auto excel = write("excel.csv",
                     "\xEF\xBB\xBF"
                     "date,\"place, state\",temp\r\n"
                     "2010-01-01 00:00,\"Seattle, WA\",40.5\r\n"
                     "2010-01-01 01:00,\"Seattle, \"\"the\"\" city\",41\r\n");
  auto series = load_csv(excel, "date", {"temp"});
  EXPECT_EQ(series.values.size(0), 2);
  EXPECT_EQ(series.values[1][0].item<float>(), 41.0f);
  // silent-garbage cases, now errors naming file (and line)
  message =
      test::error_of([&] { load_csv(write("cr.csv", "time,value\r2010-01-01,1\r"), "time"); });
  EXPECT_NE(message.find("CR-only line endings"), std::string::npos) << message;
  message = test::error_of(
      [&] { load_csv(write("nan.csv", "time,value\n2010-01-01,1\n2010-01-02,nan\n"), "time"); });
  EXPECT_NE(message.find(":3: column 'value' holds 'nan', not a decimal number"), std::string::npos)
      << message;
  // 1e39 overflows float: decimal, but not finite
  message =
      test::error_of([&] { load_csv(write("big.csv", "time,value\n2010-01-01,1e39\n"), "time"); });
  EXPECT_NE(message.find("holds '1e39', not a finite number"), std::string::npos) << message;
  // hostile files (hardening round 3): each was read, silently or with a 5 MB error line
  message =
      test::error_of([&] { load_csv(write("hex.csv", "time,value\n2010-01-01,0x1p3\n"), "time"); });
  EXPECT_NE(message.find("holds '0x1p3', not a decimal number"), std::string::npos) << message;
  message = test::error_of(
      [&] { load_csv(write("dupcol.csv", "time,value,value\n2010-01-01,1,2\n"), "time"); });
  EXPECT_NE(message.find(":1: column name 'value' appears twice (columns 2 and 3)"),
            std::string::npos)
      << message;
  message = test::error_of(
      [&] { load_csv(write("utf16.csv", std::string("\xFF\xFEt\0i\0m\0e\0\n\0", 12)), "time"); });
  EXPECT_NE(message.find("is UTF-16 (its byte order mark is FF FE); save it as UTF-8"),
            std::string::npos)
      << message;
  message = test::error_of(
      [&] { load_csv(write("nul.csv", std::string("time,value\n2010-01-01,1\0\n", 25)), "time"); });
  EXPECT_NE(message.find(":2: a NUL byte; a CSV is text"), std::string::npos) << message;
  message = test::error_of([&] {
    load_csv(write("long.csv", "time,value\n2010-01-01," + std::string(5'000'000, '7') + "x\n"),
             "time");
  });
  EXPECT_LT(message.size(), 400u) << message.size();
  EXPECT_NE(message.find("... (5000001 bytes)"), std::string::npos) << message.substr(0, 300);
  message = test::error_of([&] {
    load_csv(write("dup.csv", "time,value\n2010-01-01,1\n2010-01-02,2\n2010-01-01,3\n"), "time");
  });
  EXPECT_NE(message.find("two rows at timestamp 1262304000 (epoch seconds) hold different values"),
            std::string::npos)
      << message;
  message = test::error_of(
      [&] { load_csv(write("one.csv", "time,value\n2010-01-01,1\n2010-01-01,1\n"), "time"); });
  EXPECT_NE(message.find("all 2 rows share one timestamp"), std::string::npos) << message;
  message = test::error_of(
      [&] { load_csv(write("ms.csv", "time,value\n1262304000000,1\n1262307600000,2\n"), "time"); });
  EXPECT_NE(message.find(":2: cannot parse timestamp '1262304000000'"), std::string::npos)
      << message;
  message =
      test::error_of([&] { load_csv(write("open.csv", "time,value\n2010-01-01,\"1\n"), "time"); });
  EXPECT_NE(message.find(":2: a quote is not closed"), std::string::npos) << message;
  message = test::error_of([&] { load_csv(dir.string(), "time"); });
  EXPECT_NE(message.find("is a folder, not a CSV file"), std::string::npos) << message;
}

// Hardening round 4: a header of 5 MB (or of 200000 columns) gave a 5 MB error line (and took
// 47 s to check for duplicate names); a Latin-1 byte reached the message raw.
TEST(CsvErrors, LongHeadersAndNonUtf8BytesStayShortAndNamed) {
  const auto dir = std::filesystem::temp_directory_path() / "posenc_timeseries_tests";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name, std::ios::binary) << text;
    return (dir / name).string();
  };
  auto wide = write("wide.csv", "date," + std::string(5'000'000, 'H') + "\n2010-01-01,1\n");
  auto message = test::error_of([&] { load_csv(wide, "date", {"temp"}); });
  EXPECT_LT(message.size(), 400u) << message.size();
  EXPECT_NE(message.find("has no column 'temp'; columns: date, HHHH"), std::string::npos)
      << message.substr(0, 300);
  EXPECT_NE(message.find("... (5000000 bytes)"), std::string::npos) << message.substr(0, 300);
  std::string header = "date";
  for (int i = 0; i < 200'000; ++i) header += ",c" + std::to_string(i);
  auto many = write("many.csv", header + "\n2010-01-01" + std::string(200'000, ',') + "\n");
  const auto start = std::chrono::steady_clock::now();
  message = test::error_of([&] { load_csv(many, "date", {"temp"}); });
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took.count(), 10.0) << "duplicate-name check is quadratic";
  EXPECT_LT(message.size(), 400u) << message.size();
  EXPECT_NE(message.find("columns: date, c0, c1, "), std::string::npos) << message;
  EXPECT_NE(message.find(", c18 and 199981 more"), std::string::npos) << message;
  // every column but the time column, each looked up: linear too
  const auto all_start = std::chrono::steady_clock::now();
  message = test::error_of([&] { load_csv(many, "date"); });
  const std::chrono::duration<double> all_took = std::chrono::steady_clock::now() - all_start;
  EXPECT_LT(all_took.count(), 10.0) << "column lookup is quadratic";
  // Latin-1 0xE9 in a value, a timestamp and a header: escaped, and named as not UTF-8
  auto ascii = [](const std::string& m) {
    return std::none_of(m.begin(), m.end(), [](char c) { return c & 0x80; });
  };
  message = test::error_of(
      [&] { load_csv(write("latin1.csv", "date,temp\n2010-01-01,3\xE9\n"), "date", {"temp"}); });
  EXPECT_NE(message.find(":2: column 'temp' holds '3\\xE9', not a decimal number (byte 2 of the "
                         "field, 0xE9, is not UTF-8: the file is not UTF-8 text; Latin-1"),
            std::string::npos)
      << message;
  EXPECT_TRUE(ascii(message)) << message;
  message = test::error_of(
      [&] { load_csv(write("latin1_time.csv", "date,temp\n2010-01-0\xE9,3\n"), "date"); });
  EXPECT_NE(message.find("cannot parse timestamp '2010-01-0\\xE9' (byte 10 of the field, 0xE9, "
                         "is not UTF-8"),
            std::string::npos)
      << message;
  EXPECT_TRUE(ascii(message)) << message;
  message = test::error_of([&] {
    load_csv(write("latin1_header.csv", "date,temp\xE9\n2010-01-01,3\n"), "date", {"temp"});
  });
  EXPECT_NE(message.find("columns: date, temp\\xE9 (byte 10 of the header, 0xE9, is not UTF-8"),
            std::string::npos)
      << message;
  // UTF-8 text stays as it is: no note, nothing escaped
  message = test::error_of(
      [&] { load_csv(write("utf8.csv", "date,temp\n2010-01-01,3\xC2\xB0\n"), "date", {"temp"}); });
  EXPECT_NE(message.find("holds '3\xC2\xB0', not a decimal number (hex, inf and nan"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace posenc::timeseries
