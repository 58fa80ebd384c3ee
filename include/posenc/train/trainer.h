// The trainer behind `posenc train` and `posenc compare`.
//
// A run config (YAML or JSON; every key checked, an unknown key is an error naming it):
//   name: vit_rope2d            output: runs/vit_rope2d (default runs/<name>)
//   seed: 0
//   task:    {type: image_classification, ...}     see posenc/train/task.h
//   model:   {dim, num_heads, num_layers, mlp_ratio, dropout, pooling, fused}
//   encoder: {type: rope, ...}                     the encoder registry's config
//   train:   {epochs, batch_size, lr, min_lr_ratio, weight_decay, warmup_steps, clip_grad_norm,
//             max_steps, log_every, eval_every, threads, ema_decay, fused_optimizer, device,
//             precision (float32 | bf16: CPU autocast, src/train/precision.h), rank_timeout_s,
//             gradient_sync, bucket_mb, find_unused_parameters}
//   runs:    [{name, encoder, overrides,           for compare: one model per entry, each the
//             init_from, evaluate_only}]           config merged with its overrides (RFC 7396)
//   init_from: NAME | PATH    start from the parameters of another entry of the same comparison
//                             (<comparison folder>/NAME/weights.pt; an earlier entry) or of a
//                             weights.pt / checkpoint.pt path (a name with '/' or '.')
//   evaluate_only: true       no training: the init_from weights evaluated under this entry's
//                             config (e.g. a trained RoPE model with a rope_scaling block added:
//                             inference-time context extension)
// Training: AdamW (no decay on biases and norms), linear warmup then cosine decay to
// min_lr_ratio * lr, global-norm gradient clipping. Reproducible: the epoch's order and each
// step's randomness (augmentation, dropout) are seeded from (seed, epoch) and (seed, step), so a
// resumed run continues exactly where it stopped.
// Output folder: checkpoint.pt (model + optimizer + step; written to a temp file and renamed),
// weights.pt (a {name: tensor} dict that Python's torch.load reads), metrics.csv, curves.png,
// summary.json (final metrics and the generalization table). Ctrl-C finishes the step, saves a
// checkpoint and exits; `--resume` continues from it.
// Data-parallel (RunOptions::distributed, world_size > 1): this process is one rank; each rank
// trains on batch_size / world_size examples of every batch, gradients are averaged over the
// ranks (c10d: Gloo, or NCCL for a run on GPUs), evaluation is sharded, and only rank 0 writes
// (src/train/distributed/).
// train.device (cpu | cuda | cuda:N; src/train/device.h): where the model computes; the data and
// the positions stay in host memory, checkpoints and weights.pt hold host tensors.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "posenc/train/task.h"

namespace posenc::train {

/// Where this process sits in a data-parallel run (src/train/distributed/): one process when
/// world_size is 1. Filled from torchrun's variables by distributed_from_environment, or by
/// `posenc train --nproc N` for its children.
struct DistributedOptions {
  int rank = 0, world_size = 1;              ///< RANK, WORLD_SIZE
  int local_rank = 0, local_world_size = 1;  ///< LOCAL_RANK, LOCAL_WORLD_SIZE
  std::string master_addr;                   ///< MASTER_ADDR: the TCPStore's host
  int master_port = 0;                       ///< MASTER_PORT
  /// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts the store; every rank, rank 0
  /// too, is a client under /worker/attempt_<restart_count>.
  bool agent_store = false;
  int restart_count = 0;   ///< TORCHELASTIC_RESTART_COUNT
  std::string store_file;  ///< POSENC_STORE_FILE: a FileStore instead (`--nproc` uses one)
};

/// The variables torchrun (or a SLURM script) sets, checked: a malformed or missing one is an
/// error naming it and its value. No RANK and no WORLD_SIZE: one process.
DistributedOptions distributed_from_environment();

struct RunOptions {
  std::string output;      ///< overrides the config's output folder ("" keeps it)
  bool resume = false;     ///< continue from output/checkpoint.pt if it exists
  int64_t stop_after = 0;  ///< > 0: save and stop after this many steps (as Ctrl-C would)
  bool quiet = false;      ///< no progress bar
  /// > 0: profile this many steps after 10 of warm-up, print where the step's time goes, write
  /// it to the output's profile.md and stop (as stop_after).
  int64_t profile_steps = 0;
  /// "key.path=value" assignments applied to the run config (after a run's own encoder and
  /// overrides), e.g. "train.epochs=1".
  std::vector<std::string> overrides;
  DistributedOptions distributed;  ///< world_size > 1: this process is one rank of a run
  /// A weights.pt (or checkpoint.pt) whose parameters start the run (checkpoint.h's
  /// load_parameters: strict names and shapes; the encoder config may differ, e.g. a
  /// rope_scaling block added for a fine-tune at a longer context). A resumed run ignores it.
  std::string init_from;
};

struct RunResult {
  std::string name;
  std::string output;
  bool finished = false;  ///< false when stopped early (Ctrl-C, stop_after)
  int64_t steps = 0;
  double seconds = 0;
  int64_t parameters = 0;
  std::string metric_name;
  Metrics final_metrics;
  std::vector<GeneralizationRow> generalization;
  std::vector<DetailTable> details;     ///< the task's two-way tables (Task::details)
  std::string device = "cpu";           ///< where it computed ("cpu", "cuda:0"; train.device)
  int world_size = 1;                   ///< ranks that trained it (data-parallel runs)
  std::vector<int64_t> rank_checksums;  ///< each rank's final weights, hashed (all equal)
};

/// Checks what can be checked of a run config without loading data, for a run of `world_size`
/// ranks (the train section; a batch the ranks do not divide); an error names the key.
void check_run_config(const nlohmann::json& config, const std::vector<std::string>& overrides,
                      int world_size);
/// Trains the run `config` describes (a plain run config; see above).
RunResult run_training(const nlohmann::json& config, const RunOptions& options);
/// `posenc eval --image` / `--video`: the model of `config` with `weights`, its logits [F, K] for
/// image files (image_classification) or clips (video_classification on clips); `classes`
/// receives the class names.
at::Tensor classify_image_files(const nlohmann::json& config, const RunOptions& options,
                                const std::string& weights, const std::vector<std::string>& files,
                                std::vector<std::string>* classes);
/// `posenc eval`: the model of `config` with the parameters of `weights`, evaluated without
/// training (the task's metrics and its generalization rows: eval_contexts, eval_scales);
/// writes summary.json into options.output (default: the config's output + "/eval").
RunResult run_evaluation(const nlohmann::json& config, const RunOptions& options,
                         const std::string& weights);
/// Trains one model per entry of config.runs; writes results.md, results.csv and results.png
/// into the output folder. Returns the runs' results in order.
std::vector<RunResult> run_comparison(const nlohmann::json& config, const RunOptions& options);
/// The output folder of a comparison: options.output, else the config's output, else
/// runs/<name>; each entry trains into <folder>/<entry name>.
std::string comparison_folder(const nlohmann::json& config, const RunOptions& options);
/// The names of config.runs, in order (checked: a non-empty list, every entry named).
std::vector<std::string> comparison_entries(const nlohmann::json& config);
/// The result a finished run left in its output folder (summary.json).
RunResult read_run_result(const std::string& output);
/// results.md, results.csv and results.png for these runs, into folder.
void write_comparison(const std::string& folder, const std::string& name,
                      const std::vector<RunResult>& results);
/// Whether a config's init_from names an entry of the comparison (no '/' and no '.') rather
/// than a weights file.
bool is_entry_reference(const std::string& init_from);
/// The weights file an init_from value means for a run writing into `output`: an entry name is
/// the sibling folder's weights.pt (<parent of output>/NAME/weights.pt); a path is itself.
std::string resolve_init_from(const std::string& init_from, const std::string& output);
/// The entry that `run` starts from (its init_from, when it names an entry), or "".
std::string entry_dependency(const nlohmann::json& config, const std::string& run);
/// The run config for one named entry of `runs` (or the base config when run is "").
nlohmann::json select_run(const nlohmann::json& config, const std::string& run);
/// Applies "--set a.b.c=value" overrides (value parsed as JSON: numbers, booleans, lists,
/// objects; anything else is a string).
void apply_override(nlohmann::json& config, const std::string& assignment);

}  // namespace posenc::train
