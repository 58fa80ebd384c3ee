// curves.png, summary.json and the printed result of a run; contract in summary.h.
#include "summary.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "posenc/core/errors.h"
#include "posenc/train/plot.h"
#include "progress.h"

namespace posenc::train {

namespace {

nlohmann::json metrics_json(const Metrics& metrics) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, v] : metrics) out[k] = v;
  return out;
}

}  // namespace

std::string format_metric(double value) {
  std::ostringstream out;
  out << std::setprecision(4) << value;
  return out.str();
}

void write_curves(const std::string& path, const TrainingLog& log, const std::string& metric,
                  const std::string& title) {
  Panel loss{title + ": loss", "step", "loss", {}, false};
  loss.series.push_back({"train", log.column("step"), log.column("train_loss")});
  loss.series.push_back({"eval", log.column("step"), log.column("eval_loss")});
  Panel quality{title + ": " + metric, "step", metric, {}, false};
  auto train_metric = log.column("train_" + metric);
  if (std::any_of(train_metric.begin(), train_metric.end(),
                  [](double v) { return std::isfinite(v); })) {
    quality.series.push_back({"train", log.column("step"), train_metric});
  }
  quality.series.push_back({"eval", log.column("step"), log.column("eval_" + metric)});
  plot_panels(path, {loss, quality});
}

void write_summary(const RunResult& result, const nlohmann::json& config) {
  nlohmann::json summary = {{"name", result.name},
                            {"steps", result.steps},
                            {"seconds", result.seconds},
                            {"parameters", result.parameters},
                            {"metric", result.metric_name},
                            {"final", metrics_json(result.final_metrics)},
                            {"encoder", config.value("encoder", nlohmann::json(nullptr))}};
  if (result.world_size > 1) {
    summary["ranks"] = {{"world_size", result.world_size},
                        {"weight_checksums", result.rank_checksums}};
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : result.generalization) {
    rows.push_back(
        {{"setting", row.setting}, {"x", row.x}, {"metrics", metrics_json(row.metrics)}});
  }
  summary["generalization"] = rows;
  write_file_atomically(result.output + "/summary.json", summary.dump(2) + "\n");
}

void print_result(const RunResult& result) {
  std::cout << result.name << ": " << result.steps << " steps in " << clock_text(result.seconds)
            << ", " << result.parameters << " parameters;";
  for (const auto& [k, v] : result.final_metrics) std::cout << " " << k << " " << format_metric(v);
  std::cout << "\n";
  for (const auto& row : result.generalization) {
    std::cout << "  " << row.setting << ":";
    for (const auto& [k, v] : row.metrics) std::cout << " " << k << " " << format_metric(v);
    std::cout << "\n";
  }
}

}  // namespace posenc::train
