// Test support: every registered encoder type (but "hf", which needs a model's config.json) with
// a config that builds and positions of the kind it reads: 1D sequences, real timestamps, 2D
// grids, 3D volumes, (freq, time) coordinates. test_every_encoder.cpp checks that the list covers
// the registry.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/core/positions.h"

namespace posenc::test {

struct EncoderCase {
  std::string type;
  nlohmann::json config;
  Positions positions;
};

inline std::vector<EncoderCase> encoder_cases() {
  const auto seq = Positions::sequence(10);
  // 2024-02-28 23:59:00 UTC onwards, a reading every 7 hours (calendar, time encoders)
  std::vector<double> stamps;
  for (int i = 0; i < 10; ++i) stamps.push_back(1709164740.0 + 7 * 3600.0 * i);
  const auto times = Positions::values(stamps, "time");
  const auto grid = Positions::grid(3, 4);
  auto freq_time =
      Positions(torch::stack({torch::arange(12, torch::kFloat64).remainder(3),
                              torch::arange(12, torch::kFloat64).div(3, "floor") * 0.01},
                             -1),
                {"freq", "time"});
  std::vector<EncoderCase> out;
  auto add = [&](const std::string& type, const Positions& positions) {
    nlohmann::json config = {{"type", type}};
    if (type == "compose")
      config["encoders"] = nlohmann::json::array({nlohmann::json{{"type", "rope"}}});
    out.push_back({type, config, positions});
  };
  for (const char* type :
       {"alibi", "learned", "nope", "rope", "shaw", "sinusoidal", "t5", "compose"})
    add(type, seq);
  for (const char* type : {"time2vec", "time_sinusoidal", "calendar"}) add(type, times);
  for (const char* type :
       {"axial_sincos", "learned_grid", "relative_2d", "rope_mixed", "rope_dinov3"})
    add(type, grid);
  add("learned_spacetime", Positions::volume(2, 2, 3));
  add("rope_fractional", Positions::volume(2, 2, 3));  // LTX-2's (t, h, w); max 20, 2048, 2048
  add("freq_time", freq_time);
  // tokens (patch, variate): 5 patches of variates 0 and 1, variate-major (the packed forecaster's)
  auto patch_variate = Positions(torch::stack({torch::arange(10, torch::kFloat64).remainder(5),
                                               torch::arange(10, torch::kFloat64).div(5, "floor")},
                                              -1),
                                 {"time", "variate"});
  add("variate_bias", patch_variate);
  return out;
}

}  // namespace posenc::test
