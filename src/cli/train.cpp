// `posenc train` and `posenc compare`: the config-driven trainer (posenc/train/trainer.h) from
// the command line.
//   posenc train   CONFIG [--run NAME] [--set key.path=value]... [--out DIR] [--resume]
//                  [--stop-after STEPS] [--quiet]
//   posenc compare CONFIG [--set key.path=value]... [--out DIR] [--resume] [--quiet]
#include <iostream>

#include "cli.h"
#include "posenc/train/trainer.h"

namespace posenc::cli {

namespace {

train::RunOptions run_options(const TrainArgs& args) {
  train::RunOptions options;
  options.output = args.output;
  options.resume = args.resume;
  options.stop_after = args.stop_after;
  options.quiet = args.quiet;
  options.overrides = args.overrides;
  return options;
}

}  // namespace

int run_train(const TrainArgs& args) {
  auto config = train::select_run(load_config(args.config), args.run);
  auto result = train::run_training(config, run_options(args));
  return result.finished || args.stop_after > 0 ? 0 : 130;
}

int run_compare(const TrainArgs& args) {
  auto results = train::run_comparison(load_config(args.config), run_options(args));
  const std::string folder =
      args.output.empty() ? results.front().output.substr(0, results.front().output.rfind('/'))
                          : args.output;
  std::cout << "comparison written to " << folder << "/results.md\n";
  for (const auto& r : results) {
    if (!r.finished) return 130;
  }
  return 0;
}

}  // namespace posenc::cli
