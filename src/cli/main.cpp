// posenc — command-line tool.
//   posenc inspect --config C --positions P [--dim D] [--heads H] [--seq-len L] [--input V]
//   posenc inspect --hf-config config.json --positions P [--layer-type T] [--angle-dtype float32]
//   posenc plot    --config C --positions P [--dim D] [--heads H] --out FILE.png
//   posenc train   CONFIG.yaml [--run NAME] [--set k=v]... [--out DIR] [--resume] [--stop-after N]
//                  [--profile N] [--nproc N]
//   posenc compare CONFIG.yaml [--set k=v]... [--out DIR] [--resume] [--jobs N]
//   posenc eval    CONFIG.yaml --weights W [--run NAME] [--set k=v]... [--out DIR] [--image F]...
//                  [--video F]...
//   posenc export  RUN --to timm [--out DIR]
// Bad arguments get a one-line error on stderr and exit code 2; never a stack trace.
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <malloc.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli.h"
#include "posenc/core/errors.h"
#include "posenc/core/threads.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/version.h"

namespace {

// Positive integers, with a message that says so (CLI11's PositiveNumber prints a 300-digit range).
const CLI::Validator kPositiveInteger(
    [](std::string& text) -> std::string {
      size_t used = 0;
      long long value = 0;
      try {
        value = std::stoll(text, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != text.size() || value <= 0)
        return "expected a positive integer, got '" + text + "'";
      return "";
    },
    "POSITIVE");

// Warnings from the library (TORCH_WARN) as one line each on stderr.
class LineWarnings : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    std::cerr << "posenc: warning: " << warning.msg() << "\n";
  }
};

void add_encoder_options(CLI::App* command, posenc::cli::EncoderArgs& args) {
  command->add_option("--config", args.config,
                      "encoder config: a JSON/YAML file or a literal {...} (or --hf-config)");
  command->add_option("--hf-config", args.hf_config,
                      "a model's config.json as it ships (HF transformers), resolved the way "
                      "transformers resolves it");
  command->add_option("--layer-type", args.layer_type,
                      "--hf-config with per-layer-type rope_parameters: which layer type");
  command
      ->add_option(
          "--angle-dtype", args.angle_dtype,
          "--hf-config: float64 (exact, default) or float32 (HF's arithmetic, bit for bit)")
      ->check(CLI::IsMember({"float64", "float32"}));
  command
      ->add_option("--positions", args.positions,
                   "positions: start:stop[:step], grid:HxW, volume:TxHxW, "
                   "stream:video=TxHxW[@S],image=HxW,text=N,pad=N (M-RoPE ids; token grids, "
                   "S seconds per grid step), "
                   "stream:omni:text=N,audio=N|Ss,image=HxW,video=TxHxW@S[+audio=N|Ss] "
                   "(Qwen2.5-Omni TMRoPE ids with marker tokens; audio as tokens or seconds), "
                   "times:2010-01-01 00:00,... (epoch seconds) or a JSON array "
                   "([0,3,7], [[0,0],[0,1]])")
      ->required();
  command->add_option("--axes", args.axes, "axis names, comma-separated (default t / h,w / t,h,w)");
  command->add_option("--dim", args.dim, "model width D (rotary: D / heads per head)")
      ->check(kPositiveInteger);
  command
      ->add_option("--heads", args.heads,
                   "attention heads H (bias encoders; rotary uses D / H per head)")
      ->check(kPositiveInteger);
}

}  // namespace

namespace {

// The memory limit: a process's data (heap and anonymous mappings, RLIMIT_DATA) may grow to what
// the machine had available when it started (MemAvailable + SwapFree in /proc/meminfo), so a run
// that outgrows the machine (a 10^6-token context) fails an allocation, exit 1 with one line,
// instead of pushing the machine into swap and the kernel's OOM killer (a kill with no line).
// A lower limit already set (ulimit -d) is kept.
void limit_data_to_available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0, available = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:" || key == "SwapFree:") available += kib * 1024;
  if (available == 0) return;
  // on top of what the process already holds (VmData: with a sanitizer, terabytes of shadow)
  std::ifstream status("/proc/self/status");
  std::string line;
  uint64_t data = 0;
  bool found = false;
  while (std::getline(status, line))
    if (line.rfind("VmData:", 0) == 0) found = std::sscanf(line.c_str(), "VmData: %lu", &data) == 1;
  if (!found) return;
  available += data * 1024;
  rlimit current{};
  if (getrlimit(RLIMIT_DATA, &current) != 0) return;
  if (current.rlim_cur != RLIM_INFINITY && current.rlim_cur <= available) return;
  current.rlim_cur = static_cast<rlim_t>(available);
  setrlimit(RLIMIT_DATA, &current);  // where it cannot be set, nothing changes
}

// Freed tensors stay in the heap for the next step's (glibc: a fixed mmap threshold of 32 MiB, the
// most it takes, and the heap trimmed only above 1 GiB free). With glibc's defaults a
// step's 1.5-2.4 MiB activations were mapped afresh and page-faulted on first touch again and
// again: 2.9% of a 1-thread training step in the kernel (perf, the main job), 0.6% with these
// settings (issue 49). A user's own GLIBC_TUNABLES for malloc wins.
void keep_freed_memory_in_the_heap() {
  if (const char* tunables = std::getenv("GLIBC_TUNABLES");
      tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr)
    return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace

int main(int argc, char** argv) {
  posenc::use_all_cores();
  limit_data_to_available_memory();
  keep_freed_memory_in_the_heap();
  // c10d logs its socket errors (with stack traces) before it throws them; the exception becomes
  // our one line, so its log is only wanted when asked for (TORCH_CPP_LOG_LEVEL=INFO/WARNING).
  if (std::getenv("TORCH_CPP_LOG_LEVEL") == nullptr) FLAGS_caffe2_log_level = 3;  // FATAL only
  LineWarnings warnings;
  c10::WarningUtils::WarningHandlerGuard warning_guard(&warnings);
  CLI::App app{"posenc: positional encodings for transformers"};
  // the version and the fused CPU kernels' level (a bad POSENC_CPU_CAPABILITY: its one line)
  app.set_version_flag("--version", [] {
    std::string level;
    try {
      level = posenc::cpu_capability_description();
    } catch (const c10::Error& e) {
      level = e.what_without_backtrace();
    }
    return std::string("posenc ") + POSENC_VERSION + "\nCPU kernels: " + level;
  });
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
                   "additive encoders: plot each position's cosine similarity to this position")
      ->check(CLI::NonNegativeNumber);

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
  train
      ->add_option("--profile", train_args.profile_steps,
                   "profile this many steps after 10 of warm-up: print where the step's time "
                   "goes (also to OUTPUT/profile.md), save and stop")
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  train->add_option("--init-from", train_args.init_from,
                    "start from the parameters of this weights.pt or checkpoint.pt (names and "
                    "shapes must match; the encoder config may differ)");
  train
      ->add_option("--nproc", train_args.nproc,
                   "data-parallel training: start this many ranks on this machine (c10d/Gloo), "
                   "cores split between them; torchrun's variables work as well")
      ->check(CLI::Range(int64_t{1}, int64_t{256}));
  auto* compare = app.add_subcommand(
      "compare", "train one model per entry of the config's runs; write a table and a plot");
  add_train_options(compare);
  compare
      ->add_option("--jobs", train_args.jobs,
                   "train this many entries at once, each in its own process with cores/jobs "
                   "threads (default 1: one after another, all cores each)")
      ->check(CLI::Range(1, 64));

  auto* eval = app.add_subcommand(
      "eval", "evaluate a config's model with trained weights, without training (summary.json)");
  eval->add_option("config", train_args.config, "run config (YAML or JSON)")->required();
  eval->add_option("--weights", train_args.weights, "weights.pt or checkpoint.pt")->required();
  eval->add_option("--run", train_args.run, "the named entry of the config's runs");
  eval->add_option("--set", train_args.overrides,
                   "override a config key: key.path=value (repeatable)");
  eval->add_option("--out", train_args.output, "output folder (default: the config's + /eval)");
  eval->add_option("--image", train_args.images,
                   "classify this image file instead (repeatable; one JSON line each)");
  eval->add_option("--video", train_args.videos,
                   "classify this clip instead (a video_classification run on clips: "
                   "repeatable; one JSON line each)");
  std::string export_run, export_to, export_out;
  auto* export_command = app.add_subcommand(
      "export",
      "write a trained run's model for another library (timm: model.safetensors + "
      "timm.json; a ViT with additive or no positions as timm's VisionTransformer, one with "
      "axial, mixed or DINOv3 RoPE as timm's Eva; no timm twin: refused in one line)");
  export_command->add_option("run", export_run, "the run folder (config.json, weights)")
      ->required();
  export_command->add_option("--to", export_to, "the library: timm")->required();
  export_command->add_option("--out", export_out, "output folder (default: RUN/timm)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line and exit 2, as for every other bad input (CLI11's own codes are 100+).
    std::string message = e.what();
    if (auto cut = message.find('\n'); cut != std::string::npos) message = message.substr(0, cut);
    std::cerr << "posenc: error: " << message << " (posenc --help)\n";
    return 2;
  }
  for (auto* command : {train, compare, eval})  // '--out ""' used to mean the config's folder
    if (command->parsed() && command->count("--out") > 0 && train_args.output.empty()) {
      std::cerr << "posenc: error: --out is empty; give the output folder, or leave --out out "
                   "for the config's\n";
      return 2;
    }
  try {
    if (inspect->parsed()) return posenc::cli::run_inspect(args, input);
    if (train->parsed()) return posenc::cli::run_train(train_args);
    if (compare->parsed()) return posenc::cli::run_compare(train_args);
    if (eval->parsed()) return posenc::cli::run_eval(train_args);
    if (export_command->parsed()) return posenc::cli::run_export(export_run, export_to, export_out);
    return posenc::cli::run_plot(args, out, reference_patch);
  } catch (const posenc::EnvironmentError& e) {  // disk full, no permission: exit 1
    std::cerr << "posenc: error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    std::cerr << "posenc: error: out of memory\n";
    return 1;
  } catch (const c10::OutOfMemoryError& e) {
    std::string message = e.what_without_backtrace();
    std::cerr << "posenc: error: out of memory: " << message.substr(0, message.find('\n')) << "\n";
    return 1;
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    if (auto cut = message.find('\n'); cut != std::string::npos) message = message.substr(0, cut);
    // LibTorch's CPU allocator reports a failed allocation as a plain c10::Error ("[enforce fail
    // at alloc_cpu.cpp] ... can't allocate memory: you tried to allocate N bytes"): the
    // environment (exit 1), said in one line with the size
    if (const auto at = message.find("you tried to allocate ");
        at != std::string::npos && message.find("can't allocate memory") != std::string::npos) {
      const auto size = message.substr(at + 22, message.find(' ', at + 22) - at - 22);
      std::cerr << "posenc: error: out of memory: an allocation of " << size
                << " bytes failed (lower the sizes in the config, or free memory)\n";
      return 1;
    }
    std::cerr << "posenc: error: " << message << "\n";
  } catch (const std::filesystem::filesystem_error& e) {
    // creating a run folder on a read-only or full filesystem is the environment (exit 1); a
    // path that cannot be a folder (a file in the way) is the input (exit 2)
    std::cerr << "posenc: error: " << e.what() << "\n";
    return posenc::is_environment_errno(e.code().value()) ? 1 : 2;
  } catch (const std::exception& e) {
    std::cerr << "posenc: error: " << e.what() << "\n";
  }
  return 2;
}
