// The built-in tasks' factories (each in its own file here), for the registry (task_registry.cpp).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>

#include "posenc/train/task.h"

namespace posenc::train {

std::unique_ptr<Task> make_image_classification(const nlohmann::json& config);
std::unique_ptr<Task> make_language_model(const nlohmann::json& config);
std::unique_ptr<Task> make_forecast(const nlohmann::json& config);
std::unique_ptr<Task> make_forecast_packed(const nlohmann::json& config);
std::unique_ptr<Task> make_video_classification(const nlohmann::json& config);
/// video_classification with task.videos / task.labels (video_clips.cpp; make_video_classification
/// dispatches to it).
std::unique_ptr<Task> make_video_clip_classification(const nlohmann::json& config);
std::unique_ptr<Task> make_text_video_matching(const nlohmann::json& config);
std::unique_ptr<Task> make_retrieval(const nlohmann::json& config);
std::unique_ptr<Task> make_audio_language(const nlohmann::json& config);
std::unique_ptr<Task> make_audio_video_text(const nlohmann::json& config);

}  // namespace posenc::train
