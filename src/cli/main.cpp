// posenc — command-line tool.
//   posenc inspect --config C --positions P [--dim D] [--heads H] [--seq-len L] [--input V]
//   posenc plot    --config C --positions P [--dim D] [--heads H] --out FILE.png
//   posenc train   CONFIG.yaml [--run NAME] [--set k=v]... [--out DIR] [--resume] [--stop-after N]
//   posenc compare CONFIG.yaml [--set k=v]... [--out DIR] [--resume] [--jobs N]
// Bad arguments get a one-line error on stderr and exit code 2; never a stack trace.
#include <c10/util/Exception.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "cli.h"
#include "posenc/core/encoder.h"

namespace {

void add_encoder_options(CLI::App* command, posenc::cli::EncoderArgs& args) {
  command
      ->add_option("--config", args.config, "encoder config: a JSON/YAML file or a literal {...}")
      ->required();
  command
      ->add_option("--positions", args.positions,
                   "positions: start:stop[:step], grid:HxW, volume:TxHxW, "
                   "stream:video=TxHxW,image=HxW,text=N,pad=N (M-RoPE ids), "
                   "times:2010-01-01 00:00,... (epoch seconds) or a JSON array "
                   "([0,3,7], [[0,0],[0,1]])")
      ->required();
  command->add_option("--axes", args.axes, "axis names, comma-separated (default t / h,w / t,h,w)");
  command->add_option("--dim", args.dim, "model width D (rotary: D / heads per head)")
      ->check(CLI::PositiveNumber);
  command
      ->add_option("--heads", args.heads,
                   "attention heads H (bias encoders; rotary uses D / H per head)")
      ->check(CLI::PositiveNumber);
}

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  CLI::App app{"posenc: positional encodings for transformers"};
  app.require_subcommand(1);
  posenc::cli::EncoderArgs args;
  std::string input, out;
  int64_t reference_patch = -1;

  auto* inspect = app.add_subcommand("inspect", "print what an encoder computes, as JSON");
  add_encoder_options(inspect, args);
  inspect->add_option("--seq-len", args.seq_len, "sequence length for dynamic scalings");
  inspect->add_option("--input", input,
                      "a vector (JSON array): also print it encoded at each position");

  auto* plot = app.add_subcommand("plot", "draw an encoder as a heatmap PNG");
  add_encoder_options(plot, args);
  plot->add_option("--out", out, "output PNG file")->required();
  plot->add_option("--seq-len", args.seq_len, "sequence length for dynamic scalings");
  plot->add_option("--similarity-to", reference_patch,
                   "additive encoders: plot each position's cosine similarity to this position");

  posenc::cli::TrainArgs train_args;
  auto add_train_options = [&train_args](CLI::App* command) {
    command->add_option("config", train_args.config, "run config (YAML or JSON)")->required();
    command->add_option("--set", train_args.overrides,
                        "override a config key: key.path=value (repeatable)");
    command->add_option("--out", train_args.output, "output folder (default: the config's)");
    command->add_flag("--resume", train_args.resume, "continue from the output's checkpoint");
    command->add_flag("--quiet", train_args.quiet, "no progress bar");
  };
  auto* train = app.add_subcommand("train", "train a model from a run config");
  add_train_options(train);
  train->add_option("--run", train_args.run, "train this named entry of the config's runs");
  train->add_option("--stop-after", train_args.stop_after,
                    "save a checkpoint and stop after this many steps (as Ctrl-C does)");
  auto* compare = app.add_subcommand(
      "compare", "train one model per entry of the config's runs; write a table and a plot");
  add_train_options(compare);
  compare
      ->add_option("--jobs", train_args.jobs,
                   "train this many entries at once, each in its own process with cores/jobs "
                   "threads (default 1: one after another, all cores each)")
      ->check(CLI::Range(1, 64));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (inspect->parsed()) return posenc::cli::run_inspect(args, input);
    if (train->parsed()) return posenc::cli::run_train(train_args);
    if (compare->parsed()) return posenc::cli::run_compare(train_args);
    return posenc::cli::run_plot(args, out, reference_patch);
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    if (auto cut = message.find('\n'); cut != std::string::npos) message = message.substr(0, cut);
    std::cerr << "posenc: error: " << message << "\n";
  } catch (const std::exception& e) {
    std::cerr << "posenc: error: " << e.what() << "\n";
  }
  return 2;
}
