// curves.png, summary.json and the printed result of a run; contract in summary.h.
#include "summary.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "../draw/heatmap.h"
#include "posenc/core/errors.h"
#include "posenc/io/durable_file.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/train/line_chart.h"
#include "progress.h"
#include "schedule.h"

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
  ChartPanel loss{title + ": loss", "step", "loss", {}, false};
  loss.series.push_back({"train", log.column("step"), log.column("train_loss")});
  loss.series.push_back({"eval", log.column("step"), log.column("eval_loss")});
  ChartPanel quality{title + ": " + metric, "step", metric, {}, false};
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
                            {"device", result.device},
                            // the fused CPU kernels' level (posenc/kernels/cpu_capability.h)
                            {"cpu_capability", posenc::to_string(posenc::cpu_capability())},
                            // train.precision: float32, or bf16 (CPU autocast; precision.h)
                            {"precision", read_settings(config).precision},
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
  if (!result.details.empty()) {
    nlohmann::json details = nlohmann::json::array();
    for (const auto& t : result.details) {
      details.push_back({{"name", t.name},
                         {"title", t.title},
                         {"row_label", t.row_label},
                         {"col_label", t.col_label},
                         {"rows", t.rows},
                         {"cols", t.cols},
                         {"values", t.values},
                         {"lo", t.lo},
                         {"hi", t.hi}});
    }
    summary["details"] = details;
  }
  write_file_atomically(result.output + "/summary.json", summary.dump(2) + "\n");
  write_details(result);
}

std::string detail_markdown(const DetailTable& table) {
  std::ostringstream md;
  md << "| " << table.row_label << " \\ " << table.col_label << " |";
  for (const auto& c : table.cols) md << " " << c << " |";
  md << "\n|---|";
  for (size_t i = 0; i < table.cols.size(); ++i) md << "---:|";
  md << "\n";
  for (size_t r = 0; r < table.rows.size(); ++r) {
    md << "| " << table.rows[r] << " |";
    for (double v : table.values[r]) md << " " << format_metric(v) << " |";
    md << "\n";
  }
  return md.str();
}

namespace {

draw::Figure detail_figure(const DetailTable& table, const std::string& title) {
  draw::Figure figure;
  figure.title = title;
  figure.x_label = table.col_label;
  figure.y_label = table.row_label;
  figure.row_ticks = table.rows;
  figure.col_ticks = table.cols;
  figure.range = std::make_pair(table.lo, table.hi);
  figure.annotate = table.rows.size() * table.cols.size() <= 200;
  return figure;
}

at::Tensor detail_values(const DetailTable& table) {
  std::vector<double> flat;
  for (const auto& row : table.values) flat.insert(flat.end(), row.begin(), row.end());
  return torch::tensor(flat, torch::kFloat64)
      .view({static_cast<int64_t>(table.rows.size()), static_cast<int64_t>(table.cols.size())});
}

}  // namespace

void write_details(const RunResult& result) {
  for (const auto& t : result.details) {
    write_file_atomically(result.output + "/" + t.name + ".md",
                          "# " + result.name + ": " + t.title + "\n\n" + detail_markdown(t));
    auto figure = detail_figure(t, result.name + ": " + t.title);
    figure.panels.push_back({detail_values(t), ""});
    draw::write_heatmap_png(figure, result.output + "/" + t.name + ".png");
  }
}

void write_detail_comparison(const std::string& folder, const std::vector<RunResult>& results) {
  std::vector<std::string> names;
  for (const auto& r : results)
    for (const auto& t : r.details)
      if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
  for (const auto& name : names) {
    std::ostringstream md;
    std::optional<draw::Figure> figure;
    for (const auto& r : results) {
      for (const auto& t : r.details) {
        if (t.name != name) continue;
        md << "### " << r.name << "\n\n" << detail_markdown(t) << "\n";
        if (!figure) figure = detail_figure(t, t.title);
        if (t.rows == figure->row_ticks && t.cols == figure->col_ticks)
          figure->panels.push_back({detail_values(t), r.name});
      }
    }
    write_file_atomically(folder + "/results_" + name + ".md", md.str());
    draw::write_heatmap_png(*figure, folder + "/results_" + name + ".png");
  }
}

std::vector<DetailTable> details_from_json(const nlohmann::json& summary, const std::string& path) {
  std::vector<DetailTable> tables;
  if (!summary.contains("details")) return tables;
  try {
    for (const auto& d : summary.at("details")) {
      DetailTable t;
      t.name = d.at("name").get<std::string>();
      t.title = d.at("title").get<std::string>();
      t.row_label = d.at("row_label").get<std::string>();
      t.col_label = d.at("col_label").get<std::string>();
      t.rows = d.at("rows").get<std::vector<std::string>>();
      t.cols = d.at("cols").get<std::vector<std::string>>();
      t.values = d.at("values").get<std::vector<std::vector<double>>>();
      t.lo = d.at("lo").get<double>();
      t.hi = d.at("hi").get<double>();
      TORCH_CHECK(t.values.size() == t.rows.size(), "compare: '", path, "': details '", t.name,
                  "' has ", t.values.size(), " rows of values for ", t.rows.size(), " row labels");
      for (const auto& row : t.values)
        TORCH_CHECK(row.size() == t.cols.size(), "compare: '", path, "': details '", t.name,
                    "' has a row of ", row.size(), " values for ", t.cols.size(), " columns");
      tables.push_back(std::move(t));
    }
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "compare: '", path, "': malformed 'details': ", e.what());
  }
  return tables;
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
