// posenc — command-line tool.
//   posenc inspect --config C --positions P [--dim D] [--heads H] [--seq-len L] [--input V]
//   posenc plot    --config C --positions P [--dim D] [--heads H] --out FILE.png
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
                   "positions: start:stop[:step], grid:HxW, volume:TxHxW or a JSON array "
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

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (inspect->parsed()) return posenc::cli::run_inspect(args, input);
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
