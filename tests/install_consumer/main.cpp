// Uses the installed posenc, one call through each exported target: the core (RoPE, ALiBi), the
// config registry with a real HF config.json, the five modalities and the trainer's config helpers.
#include <posenc/config/hf_config.h>
#include <posenc/config/registry.h>
#include <posenc/posenc.h>
#include <posenc/train/trainer.h>
#include <posenc/version.h>
#include <torch/torch.h>

#include <iostream>

#include "audio/audio_positions.h"
#include "text/gutenberg.h"
#include "timeseries/csv_series.h"
#include "video/video.h"
#include "vision/images.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: consumer POSENC_SOURCE_DIR\n";
    return 2;
  }
  const std::string source = argv[1];
  posenc::Rope rope(posenc::RopeOptions(8));
  auto q = torch::ones({1, 3, 2, 8});
  auto [rq, rk] =
      rope->rotate(q, q, posenc::Positions::sequence(3), posenc::Positions::sequence(3));
  auto slopes = posenc::alibi_slopes(2);
  std::cout << "consumer: rope rotated " << rq.size(1) << " positions; alibi slopes " << slopes[0]
            << " " << slopes[1] << std::endl;
  // posenc::config: a model's config.json as it ships
  auto hf = posenc::load_hf_config(source + "/tests/fixtures/hf_configs/llama-3.1-8b.json");
  auto llama = posenc::build_encoder(hf);
  // posenc::vision, ::video, ::text, ::timeseries
  auto patches = posenc::vision::patchify(torch::zeros({1, 1, 28, 28}), 7);
  auto tubelets = posenc::video::tubeletize(torch::zeros({1, 4, 1, 8, 8}), 2, 4);
  posenc::text::ByteTokenizer tokenizer;
  auto tokens = tokenizer.encode("the dog bit the man");
  auto when = posenc::timeseries::parse_timestamp("2010-01-01 00:00");
  // posenc::audio: AST's patch grid over 128 mels x 1024 frames is 12 x 101
  auto grid = posenc::audio::ast_patch_grid(128, 1024);
  // posenc::train
  auto run = posenc::train::select_run(nlohmann::json{{"name", "x"}}, "");
  std::cout << "consumer: posenc " << POSENC_VERSION << "; " << llama->type() << " theta "
            << hf.config["rope_theta"].get<double>() << "; " << patches.positions.size()
            << " patches, " << tubelets.positions.size() << " tubelets, " << tokens.size(0)
            << " bytes, t=" << when.value_or(-1) << ", AST grid " << grid.freq << "x" << grid.time
            << ", run " << run["name"].get<std::string>() << std::endl;
  return rq.sizes() == q.sizes() && patches.positions.size() == 16 &&
                 tubelets.positions.size() == 8 && grid.freq == 12 && grid.time == 101
             ? 0
             : 1;
}
