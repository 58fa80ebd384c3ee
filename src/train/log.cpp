// metrics.csv and the comparison report; see log.h.
#include "log.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "posenc/io/durable_file.h"
#include "posenc/io/input_file.h"
#include "posenc/train/line_chart.h"
#include "summary.h"

namespace posenc::train {
namespace {

constexpr double kMissing = std::numeric_limits<double>::quiet_NaN();

std::string cell(double value) {
  if (!std::isfinite(value)) return "";
  std::ostringstream out;
  out << std::setprecision(8) << value;
  return out.str();
}

std::vector<std::string> split(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream in(line);
  std::string item;
  while (std::getline(in, item, ',')) cells.push_back(item);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

// A metrics.csv cell or column name as an error message shows it: at most 80 bytes (then its byte
// count), anything but printable ASCII escaped (\xE9).
std::string shown(const std::string& text) {
  std::string out;
  size_t i = 0;
  for (; i < text.size() && out.size() < 80; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// A metrics.csv cell: empty (no value that interval) or a whole finite number, as cell() writes
// it (a subnormal one included: only overflow, inf and nan are refused); anything else is a damaged
// file, one line naming it, the line and the column.
double parse_cell(const std::string& text, const std::string& path, int64_t line,
                  const std::string& column) {
  if (text.empty()) return kMissing;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  const bool whole =
      end == text.c_str() + text.size() && !std::isspace(static_cast<unsigned char>(text[0]));
  TORCH_CHECK(whole && std::isfinite(value), "metrics file '", path, "' line ", line, ": column '",
              shown(column), "' holds '", shown(text),
              "', expected a finite number or an empty cell; the file is damaged (restore it, or "
              "delete that line and the ones after it to resume from the earlier rows)");
  return value;
}

std::string short_number(double v, int precision = 4) {
  std::ostringstream out;
  out << std::setprecision(precision) << v;
  return out.str();
}

std::string encoder_label(const RunResult& r) {
  std::ifstream in(r.output + "/summary.json");
  if (!in) return "";
  try {
    auto summary = nlohmann::json::parse(in);
    const auto& encoder = summary.at("encoder");
    if (encoder.is_null()) return "nope";
    return encoder.value("type", std::string("?"));
  } catch (const std::exception&) {
    return "";
  }
}

}  // namespace

void TrainingLog::add(const LogRow& row) {
  for (const auto& [name, value] : row) {
    if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
      columns_.push_back(name);
    }
  }
  rows_.push_back(row);
}

std::vector<double> TrainingLog::column(const std::string& name) const {
  std::vector<double> values;
  for (const auto& row : rows_) {
    double v = kMissing;
    for (const auto& [k, x] : row) {
      if (k == name) v = x;
    }
    values.push_back(v);
  }
  return values;
}

void TrainingLog::write_csv(const std::string& path) const {
  std::ostringstream out;
  for (size_t i = 0; i < columns_.size(); ++i) out << (i ? "," : "") << columns_[i];
  out << "\n";
  for (const auto& row : rows_) {
    for (size_t i = 0; i < columns_.size(); ++i) {
      double v = kMissing;
      for (const auto& [k, x] : row) {
        if (k == columns_[i]) v = x;
      }
      out << (i ? "," : "") << cell(v);
    }
    out << "\n";
  }
  write_file_atomically(path, out.str());
}

void TrainingLog::read_csv(const std::string& path, int64_t max_step) {
  require_regular_file(path, "metrics file");  // a FIFO or device: one line, no blocking read
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "cannot read metrics file '", path, "'");
  std::string line;
  TORCH_CHECK(static_cast<bool>(std::getline(in, line)), "metrics file '", path, "' is empty");
  const auto header = split(line);
  // every row starts with its step: a resume keeps the rows up to the checkpoint's by it (an
  // empty header: a run stopped before its first row)
  TORCH_CHECK(header.empty() || header.front() == "step", "metrics file '", path,
              "' line 1: expected a header starting with 'step', found '", shown(line),
              "'; the file is damaged (restore it, or delete it to start the log afresh)");
  rows_.clear();
  columns_.clear();
  int64_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const auto cells = split(line);
    TORCH_CHECK(cells.size() == header.size(), "metrics file '", path, "' line ", number,
                ": expected ", header.size(), " cells (the header's), got ", cells.size());
    LogRow row;
    for (size_t i = 0; i < cells.size(); ++i) {
      row.emplace_back(header[i], parse_cell(cells[i], path, number, header[i]));
    }
    TORCH_CHECK(!std::isnan(row.front().second), "metrics file '", path, "' line ", number,
                ": the 'step' cell is empty; the file is damaged (restore it, or delete that line "
                "and the ones after it to resume from the earlier rows)");
    if (row.front().second > static_cast<double>(max_step)) break;
    add(row);
  }
}

void write_comparison(const std::string& folder, const std::string& name,
                      const std::vector<RunResult>& results) {
  if (results.empty()) return;
  const auto& metric = results.front().metric_name;
  std::vector<std::string> settings;
  for (const auto& row : results.front().generalization) settings.push_back(row.setting);
  std::ostringstream md, csv;
  md << "| run | encoder | parameters | steps | time | eval loss | " << metric << " |";
  csv << "run,encoder,parameters,steps,seconds,loss," << metric;
  for (const auto& s : settings) {
    md << " " << metric << " @ " << s << " |";
    csv << "," << metric << " @ " << s;
  }
  md << "\n|---|---|---:|---:|---:|---:|---:|";
  for (size_t i = 0; i < settings.size(); ++i) md << "---:|";
  md << "\n";
  csv << "\n";
  ChartPanel curves{name + ": eval " + metric, "step", metric, {}, false};
  ChartPanel sweep{name + ": " + metric + " by setting", "setting", metric, {}, false};
  double x_min = std::numeric_limits<double>::infinity(), x_max = 0;
  for (const auto& r : results) {
    const auto label = encoder_label(r);
    const int64_t minutes = static_cast<int64_t>(r.seconds) / 60;
    const int64_t seconds = static_cast<int64_t>(r.seconds) % 60;
    md << "| " << r.name << (r.finished ? "" : " (stopped)") << " | " << label << " | "
       << r.parameters << " | " << r.steps << " | " << minutes << "m" << std::setw(2)
       << std::setfill('0') << seconds << "s" << std::setfill(' ') << " | ";
    csv << r.name << "," << label << "," << r.parameters << "," << r.steps << "," << r.seconds;
    if (r.finished) {
      md << short_number(metric_value(r.final_metrics, "loss")) << " | "
         << short_number(metric_value(r.final_metrics, metric)) << " |";
      csv << "," << metric_value(r.final_metrics, "loss") << ","
          << metric_value(r.final_metrics, metric);
    } else {
      md << " | |";
      csv << ",,";
    }
    const int colour = static_cast<int>(&r - results.data());  // one colour per run, every panel
    Series point{r.name, {}, {}, colour};
    for (const auto& s : settings) {
      double v = kMissing;
      for (const auto& row : r.generalization) {
        if (row.setting == s) {
          v = metric_value(row.metrics, metric);
          point.x.push_back(row.x);
          point.y.push_back(v);
          x_min = std::min(x_min, row.x);
          x_max = std::max(x_max, row.x);
        }
      }
      md << " " << (std::isfinite(v) ? short_number(v) : "") << " |";
      csv << "," << cell(v);
    }
    md << "\n";
    csv << "\n";
    sweep.series.push_back(point);
    TrainingLog log;
    if (std::filesystem::exists(r.output + "/metrics.csv")) {
      log.read_csv(r.output + "/metrics.csv", std::numeric_limits<int64_t>::max());
      auto steps = log.column("step"), values = log.column("eval_" + metric);
      Series s{r.name, {}, {}, colour};
      for (size_t i = 0; i < steps.size(); ++i) {
        if (std::isfinite(values[i])) {
          s.x.push_back(steps[i]);
          s.y.push_back(values[i]);
        }
      }
      curves.series.push_back(s);
    }
  }
  write_file_atomically(folder + "/results.md", md.str());
  write_file_atomically(folder + "/results.csv", csv.str());
  std::vector<ChartPanel> panels = {curves};
  if (settings.size() > 1) {
    sweep.log_x = x_min > 0 && x_max / x_min >= 4;
    panels.push_back(sweep);
  }
  plot_panels(folder + "/results.png", panels);
  write_detail_comparison(folder, results);
}

}  // namespace posenc::train
