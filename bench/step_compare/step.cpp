// One transformer step (forward + backward) timed against an *installed* posenc, so two
// versions can be compared side by side with the same program (the API used,
// Transformer::forward(x, positions), is the same before and after the position plan):
//   cmake --install build --prefix /tmp/posenc-new   (an older checkout's into /tmp/posenc-old)
//   cmake -S bench/step_compare -B /tmp/step-new -DCMAKE_PREFIX_PATH=/tmp/posenc-new
//   cmake --build /tmp/step-new                      (the same for -old)
//   /tmp/step-old/step 7; /tmp/step-new/step 7       (alternately, on a quiet machine)
// Prints the median of N steps (ms) for the LM config's model (4 layers, 4 x 1024 tokens; RoPE,
// T5) and the main job's ViT (128 x 16 patches, 2D axial RoPE).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "posenc/config/registry.h"
#include "posenc/posenc.h"
using namespace posenc;
int main(int argc, char** argv) {
  use_all_cores();
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  for (int which = 0; which < 3; ++which) {
    torch::manual_seed(0);
    Transformer stack{nullptr};
    at::Tensor x;
    Positions p;
    if (which == 2) {
      auto e = build_encoder(
          nlohmann::json::parse(
              R"({"type":"rope","mrope_section":[8,8],"per_axis_frequencies":true,"rope_theta":100})"),
          {128, 4, 0});
      stack = Transformer(TransformerOptions(128, 4, 4).mlp_ratio(2), e);
      x = torch::randn({128, 16, 128});
      p = Positions::grid(4, 4);
    } else {
      auto e = build_encoder(nlohmann::json{{"type", which == 0 ? "rope" : "t5"}}, {64, 4, 0});
      stack = Transformer(TransformerOptions(64, 4, 4).causal(true), e);
      x = torch::randn({4, 1024, 64});
      p = Positions::sequence(1024);
    }
    auto step = [&] {
      stack->zero_grad();
      stack->forward(x, p).sum().backward();
    };
    step();
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      step();
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const char* names[3] = {"lm_rope 4x1024", "lm_t5 4x1024", "vit_rope 128x16"};
    std::cout << names[which] << " median_ms " << ms[ms.size() / 2] << "\n";
  }
}
