// The task registry: one table of (name, factory); `task.type` picks the entry, and the list of
// known tasks in errors and --help comes from the same table.
//
// Why a table and not self-registering static objects in each task file: posenc::train is a
// static library, and a linker keeps an archive member only when something refers to it, so a
// task file that only registers itself would be dropped from the `posenc` tool and from users'
// programs.
#include <torch/torch.h>

#include <functional>

#include "posenc/train/task.h"
#include "tasks.h"

namespace posenc::train {

namespace {

using Factory = std::function<std::unique_ptr<Task>(const nlohmann::json&)>;

const std::vector<std::pair<std::string, Factory>>& registry() {
  static const std::vector<std::pair<std::string, Factory>> tasks{
      {"audio_language", make_audio_language},
      {"audio_video_text", make_audio_video_text},
      {"forecast", make_forecast},
      {"forecast_packed", make_forecast_packed},
      {"image_classification", make_image_classification},
      {"language_model", make_language_model},
      {"retrieval", make_retrieval},
      {"text_video_matching", make_text_video_matching},
      {"video_classification", make_video_classification}};
  return tasks;
}

}  // namespace

std::vector<std::string> task_types() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

std::unique_ptr<Task> make_task(const nlohmann::json& config) {
  TORCH_CHECK(config.contains("task") && config.at("task").is_object() &&
                  config.at("task").contains("type"),
              "config: a 'task' section with a 'type' is required");
  TORCH_CHECK(config.contains("model") && config.at("model").is_object(),
              "config: a 'model' section is required");
  const auto& type_value = config.at("task").at("type");
  TORCH_CHECK(type_value.is_string(), "task: 'type' must be a string, got ",
              type_value.type_name());
  const auto type = type_value.get<std::string>();
  for (const auto& [name, factory] : registry())
    if (name == type) return factory(config);
  std::string known;
  for (const auto& t : task_types()) known += (known.empty() ? "" : ", ") + t;
  TORCH_CHECK(false, "task: unknown type '", type, "'; known types: ", known);
}

}  // namespace posenc::train
