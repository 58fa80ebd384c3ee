// Shared pieces of the `posenc` tool: reading positions and configs from the command line,
// tensors to JSON, and the two subcommands.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/config/registry.h"
#include "posenc/core/positions.h"

namespace posenc::cli {

struct EncoderArgs {
  std::string config;      ///< literal JSON/YAML object, or a file path
  std::string hf_config;   ///< a model's config.json (instead of config), resolved as HF does
  std::string layer_type;  ///< hf_config: which per-layer-type RoPE ("" = the only one)
  std::string angle_dtype = "float64";  ///< hf_config: float64 (exact) or float32 (HF's)
  std::string positions;  ///< "0:50", "0:100:10" or a JSON array ([0, 3, 7] or [[0, 0], [0, 1]])
  std::string axes;       ///< comma-separated axis names ("" -> t / h,w / t,h,w by count)
  int64_t dim = 0;        ///< model width D
  int64_t heads = 0;      ///< attention heads H (0: unknown)
  int64_t seq_len = -1;   ///< for dynamic scalings
};

/// The positions limit of --positions (a range, grid, volume or stream larger than this is an
/// error with the count, before anything is allocated).
inline constexpr double kMaxPositions = 1 << 24;
/// The exact-position limit: float64 holds every integer up to 2^53 and no odd one above it, so
/// a range or an integer position past it would repeat or round (9007199254740992).
inline constexpr double kMaxExactPosition = 9007199254740992.0;
/// The video length limit of stream positions: frames x seconds per grid (a year).
inline constexpr double kMaxVideoSeconds = 31'536'000.0;

/// "start:stop[:step]" or a JSON array -> Positions; errors say what was expected.
Positions parse_positions(const std::string& text, const std::string& axes);
/// The same as a plan request: a stream ("stream:...") also gives each token's modality.
PlanRequest parse_plan_request(const std::string& text, const std::string& axes);
/// Each part of a plan and what it holds, as JSON: parts (encoder, role, tokens), the additive
/// embedding, the rotary tables, the ALiBi slopes and the summed bias over `heads` heads.
nlohmann::ordered_json plan_to_json(const EncodingPlan& plan, int64_t heads);
/// A tensor as nested JSON arrays of numbers (a 0-dim tensor as a number).
nlohmann::ordered_json tensor_to_json(const at::Tensor& tensor);
/// Builds the encoder the arguments describe; with --hf-config, `resolution` (if given) receives
/// the resolved config and where each value came from.
PositionalEncoding build_from_args(const EncoderArgs& args,
                                   nlohmann::ordered_json* resolution = nullptr);

struct TrainArgs {
  std::string config;                  ///< a run config file (YAML/JSON)
  std::string run;                     ///< one named entry of the config's runs ("" = default)
  std::vector<std::string> overrides;  ///< "key.path=value"
  std::string output;                  ///< output folder ("" = the config's)
  bool resume = false;
  int64_t stop_after = 0;
  int64_t profile_steps = 0;  ///< train: profile this many steps, then stop
  bool quiet = false;
  int64_t jobs = 1;       ///< compare: entries trained at once, each in its own process
  int64_t nproc = 1;      ///< train: ranks of a data-parallel run on this machine (nproc.cpp)
  std::string init_from;  ///< train: start from these weights (weights.pt / checkpoint.pt)
  std::string weights;    ///< eval: the weights to evaluate
  std::vector<std::string> images;  ///< eval --image: classify these files instead
  std::vector<std::string> videos;  ///< eval --video: classify these clips instead
};

/// `posenc inspect`: prints one JSON object; input: "" or a JSON vector.
int run_inspect(const EncoderArgs& args, const std::string& input);
/// `posenc plot`: writes a PNG heatmap (atomically) to `out`.
int run_plot(const EncoderArgs& args, const std::string& out, int64_t reference_patch);

/// `posenc train`: trains one run; 0 when it finished (or stopped by --stop-after), 130 when
/// interrupted.
int run_train(const TrainArgs& args);
/// `posenc eval`: a config's model with given weights, evaluated without training; 0.
int run_eval(const TrainArgs& args);
/// `posenc export RUN --to timm [--out DIR]` (posenc/train/export_timm.h); 0.
int run_export(const std::string& run, const std::string& to, const std::string& out);
/// `posenc train --nproc N`: starts N ranks of the run and waits for them; the first failing
/// rank's exit code, 130 when they stopped on a signal, else 0.
int launch_ranks(const TrainArgs& args);

/// The variable a spawning posenc (`train --nproc`, `compare --jobs`) gives each child: its own
/// pid. A child that finds it asks the kernel for SIGHUP when that parent dies (kill -9, OOM
/// killer), so it saves its checkpoint and stops instead of training on unseen.
inline constexpr const char* kParentPidVariable = "POSENC_PARENT_PID";
/// A spawned child's environment: this process's, without the variables named in `unset` and
/// those `set` gives ("NAME=value"), then `set` and POSENC_PARENT_PID=<this process's pid>.
std::vector<std::string> child_environment(const std::vector<std::string>& unset,
                                           const std::vector<std::string>& set);
/// In a child started by a posenc (POSENC_PARENT_PID set): SIGHUP on the parent's death; a
/// parent already gone is an error (exit 1), a malformed value too (exit 2). Nothing when the
/// variable is absent.
void follow_parent();
/// `posenc compare`: trains every run of the config and writes the comparison.
int run_compare(const TrainArgs& args);

}  // namespace posenc::cli
