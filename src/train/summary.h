// What a run leaves behind for people: curves.png (loss and metric over steps), summary.json
// (what it reached, at what cost, with which encoder) and the result lines on stdout. Internal to
// the trainer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "log.h"
#include "posenc/train/trainer.h"

namespace posenc::train {

/// A metric with 4 significant digits.
std::string format_metric(double value);
/// curves.png: train and eval loss, train and eval metric, over steps.
void write_curves(const std::string& path, const TrainingLog& log, const std::string& metric,
                  const std::string& title);
/// summary.json in result.output, written atomically, and the task's two-way tables beside it
/// (write_details).
void write_summary(const RunResult& result, const nlohmann::json& config);
/// Each of result.details as <name>.md and <name>.png in result.output.
void write_details(const RunResult& result);
/// For a comparison: results_<name>.md (every run's table) and results_<name>.png (a panel per
/// run, one colour scale) for each detail table name the runs have.
void write_detail_comparison(const std::string& folder, const std::vector<RunResult>& results);
/// The markdown of one detail table (a header row of columns, a row per row label).
std::string detail_markdown(const DetailTable& table);
/// summary.json's "details" entries back into tables (absent: none).
std::vector<DetailTable> details_from_json(const nlohmann::json& summary, const std::string& path);
/// "name: N steps in mm:ss, P parameters; metrics" and one line per generalization setting.
void print_result(const RunResult& result);

}  // namespace posenc::train
