// Run selection, overrides and comparisons behind `posenc train --run` and `posenc compare`;
// contract in posenc/train/trainer.h.
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "posenc/config/config_reader.h"
#include "posenc/io/input_file.h"
#include "posenc/train/trainer.h"
#include "run_folder.h"
#include "summary.h"

namespace posenc::train {

namespace fs = std::filesystem;

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const auto& w : words) text += (text.empty() ? "" : ", ") + w;
  return text;
}

}  // namespace

bool is_entry_reference(const std::string& init_from) {
  return init_from.find('/') == std::string::npos && init_from.find('.') == std::string::npos;
}

std::string entry_dependency(const nlohmann::json& config, const std::string& run) {
  for (const auto& entry : config.at("runs")) {
    if (!entry.is_object() || entry.value("name", std::string()) != run) continue;
    if (!entry.contains("init_from") || !entry.at("init_from").is_string()) return "";
    const auto from = entry.at("init_from").get<std::string>();
    return is_entry_reference(from) ? from : "";
  }
  return "";
}

std::string resolve_init_from(const std::string& init_from, const std::string& output) {
  if (!is_entry_reference(init_from)) return init_from;
  const auto parent = fs::path(output).parent_path();
  return ((parent.empty() ? fs::path(".") : parent) / init_from / "weights.pt").string();
}

nlohmann::json select_run(const nlohmann::json& config, const std::string& run) {
  nlohmann::json base = config;
  base.erase("runs");
  std::string wanted = run;
  if (wanted.empty() && base.contains("default_run")) wanted = base.at("default_run");
  base.erase("default_run");
  if (wanted.empty()) return base;
  TORCH_CHECK(config.contains("runs") && config.at("runs").is_array(),
              "config: no 'runs' list, so there is no run '", wanted, "'");
  std::string known;
  for (const auto& entry : config.at("runs")) {
    ConfigReader r(entry, "runs entry");
    const auto name = r.string("name", "");
    TORCH_CHECK(!name.empty(), "config: every entry of 'runs' needs a 'name'");
    known += (known.empty() ? "" : ", ") + name;
    if (name != wanted) continue;
    if (auto encoder = r.object("encoder")) base["encoder"] = *encoder;
    if (auto overrides = r.object("overrides")) base.merge_patch(*overrides);
    if (auto from = r.optional_string("init_from")) base["init_from"] = *from;
    if (r.has("evaluate_only")) base["evaluate_only"] = r.boolean("evaluate_only", false);
    r.finish();
    const std::string parent =
        config.value("output", "runs/" + config.value("name", std::string("run")));
    base["name"] = name;
    base["output"] = parent + "/" + name;
    return base;
  }
  TORCH_CHECK(false, "config: no run named '", wanted, "'; the runs are: ", known);
}

void apply_override(nlohmann::json& config, const std::string& assignment) {
  const auto equals = assignment.find('=');
  TORCH_CHECK(equals != std::string::npos && equals > 0, "--set '", assignment,
              "': expected key.path=value");
  const auto path = assignment.substr(0, equals);
  const auto text = assignment.substr(equals + 1);
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    value = text;  // a bare word is a string
  }
  nlohmann::json* node = &config;
  std::istringstream parts(path);
  std::string part;
  std::vector<std::string> keys;
  while (std::getline(parts, part, '.')) keys.push_back(part);
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    if (!node->contains(keys[i]) || !(*node)[keys[i]].is_object())
      (*node)[keys[i]] = nlohmann::json::object();
    node = &(*node)[keys[i]];
  }
  (*node)[keys.back()] = value;
}

std::string comparison_folder(const nlohmann::json& config, const RunOptions& options) {
  if (!options.output.empty()) return options.output;
  return config.value("output", "runs/" + config.value("name", std::string("compare")));
}

std::vector<std::string> comparison_entries(const nlohmann::json& config) {
  TORCH_CHECK(config.contains("runs") && config.at("runs").is_array() && !config.at("runs").empty(),
              "compare: the config needs a non-empty 'runs' list");
  std::vector<std::string> names;
  for (const auto& entry : config.at("runs")) {
    TORCH_CHECK(entry.is_object() && entry.contains("name") && entry.at("name").is_string(),
                "config: every entry of 'runs' needs a 'name' (a string)");
    const auto name = entry.at("name").get<std::string>();
    check_run_name(name, "config: runs");
    TORCH_CHECK(std::find(names.begin(), names.end(), name) == names.end(),
                "config: runs: two entries are named '", name, "'; each needs its own name");
    // An entry that starts from another entry's weights must come after it (entries train in
    // order; --jobs waits for it), so a typo or a cycle is an error before anything trains.
    if (entry.contains("init_from")) {
      TORCH_CHECK(entry.at("init_from").is_string(), "config: runs entry '", name,
                  "': init_from must be a string (an earlier entry's name or a weights path)");
      const auto from = entry.at("init_from").get<std::string>();
      if (is_entry_reference(from))
        TORCH_CHECK(std::find(names.begin(), names.end(), from) != names.end(),
                    "config: runs entry '", name, "': init_from '", from,
                    "' is not an earlier entry (entries run in order; the earlier ones are: ",
                    names.empty() ? std::string("none") : join(names), ")");
    }
    names.push_back(name);
  }
  return names;
}

// The summary limit: a summary.json is a few KB; 64 MiB is more than any run writes.
constexpr int64_t kMaxSummaryBytes = int64_t{64} << 20;

static RunResult run_result_from(const nlohmann::json& summary, const std::string& output,
                                 const std::string& path);

RunResult read_run_result(const std::string& output) {
  const std::string path = output + "/summary.json";
  std::error_code missing;
  TORCH_CHECK(std::filesystem::exists(std::filesystem::symlink_status(path, missing)),
              "compare: no '", path, "' (the run did not finish)");
  // a regular file of bounded size (a FIFO or a huge file in its place is one line, no hang)
  const auto text = read_regular_file(path, "run summary", kMaxSummaryBytes, "the summary limit");
  nlohmann::json summary;
  try {
    summary = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "compare: '", path, "' is not valid JSON: ", e.what());
  }
  try {
    return run_result_from(summary, output, path);
  } catch (const nlohmann::json::exception& e) {  // a key missing or of another type
    TORCH_CHECK(false, "compare: '", path,
                "' is damaged (not as posenc train writes it): ", e.what(),
                "; run that entry again");
  }
}

// A metric as write_summary stores it: NaN (a metric with nothing to measure) is JSON null.
static double metric_of(const nlohmann::json& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

static RunResult run_result_from(const nlohmann::json& summary, const std::string& output,
                                 const std::string& path) {
  RunResult r;
  r.name = summary.at("name").get<std::string>();
  r.output = output;
  r.finished = true;
  r.steps = summary.at("steps").get<int64_t>();
  r.seconds = summary.at("seconds").get<double>();
  r.parameters = summary.at("parameters").get<int64_t>();
  r.metric_name = summary.at("metric").get<std::string>();
  r.device = summary.value("device", std::string("cpu"));  // runs before train.device: the CPU
  for (const auto& [k, v] : summary.at("final").items())
    r.final_metrics.emplace_back(k, metric_of(v));
  for (const auto& row : summary.at("generalization")) {
    GeneralizationRow g;
    g.setting = row.at("setting").get<std::string>();
    g.x = row.at("x").get<double>();
    for (const auto& [k, v] : row.at("metrics").items()) g.metrics.emplace_back(k, metric_of(v));
    r.generalization.push_back(g);
  }
  r.details = details_from_json(summary, path);
  return r;
}

std::vector<RunResult> run_comparison(const nlohmann::json& config, const RunOptions& options) {
  const auto entries = comparison_entries(config);
  const std::string folder = comparison_folder(config, options);
  fs::create_directories(folder);
  std::vector<RunResult> results;
  for (const auto& run : entries) {
    auto run_config = select_run(config, run);
    run_config["output"] = folder + "/" + run;
    RunOptions run_options = options;
    run_options.output = folder + "/" + run;
    results.push_back(run_training(run_config, run_options));
    if (!results.back().finished) break;  // interrupted: keep what finished
  }
  write_comparison(folder, config.value("name", std::string("compare")), results);
  return results;
}

}  // namespace posenc::train
