// Files a training run writes that hold tensors, in the zip + pickle format of Python's
// torch.save, readable by torch.load(path, weights_only=True) (no TorchScript type tags). Every
// tensor is written from host memory, whatever device the run computed on (train.device), so a
// file written on a GPU loads on a machine without one; loading copies onto the model's device.
//
//   weights.pt     {name: tensor} for every parameter and buffer (model.state_dict() in Python)
//   weights.safetensors  the same tensors in safetensors format (posenc/train/safetensors.h)
//   checkpoint.pt  {"format": "posenc-checkpoint-1",
//                   "model": {name: tensor},                       as state_dict()
//                   "optimizer": {"state": {i: {"step", "exp_avg", "exp_avg_sq"}},
//                                 "param_groups": [{"lr", "betas", "eps", "weight_decay",
//                                                   "amsgrad", ..., "params": [i, ...]}]},
//                                                                  torch.optim.AdamW's layout
//                   "step": int, "elapsed": float seconds, "log_window": [4] float64,
//                   "config": the run config as JSON text,
//                   "ema": {name: tensor}  (only with train.ema_decay: the weight average),
//                   "checksum": "fnv1a64:<16 hex>" over everything above}
//
// The checksum (FNV-1a, 64 bit) covers every key, number, string and tensor byte in order; a
// checkpoint whose content does not match is refused on resume, naming the file. Saving keeps
// the previous checkpoint as checkpoint.prev.pt; both are written to a temporary file, synced,
// renamed into place and the folder synced.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <map>
#include <string>

namespace posenc::train {

/// The training state beside the weights.
struct CheckpointState {
  int64_t step = 0;
  double elapsed = 0;     ///< seconds of training before this point
  at::Tensor log_window;  ///< [4] float64: loss/metric sums and counts since the last log row
  std::string config;     ///< the run config as JSON text
  std::map<std::string, at::Tensor> ema;  ///< averaged weights by name (train.ema_decay)
};

/// The run config as a resume (and the ranks of a data-parallel run) compare it: parsed, integral
/// floats as integers, without the keys that only say how a run is executed; sorted JSON.
std::string run_config_for_comparison(const std::string& config_text);
/// torch.save's container for a value (dicts, lists, tuples, tensors, numbers, strings).
std::string torch_save_bytes(const c10::IValue& value);
/// torch.load's reading of such a container; errors name `origin`. Every stored record's CRC-32
/// is checked against the zip's central directory first (torch's reader does not), so a file
/// damaged after it was written is refused, naming the record, instead of loading wrong weights.
c10::IValue torch_load_bytes(const std::string& bytes, const std::string& origin);
/// The checkpoint size limit: weights.pt and checkpoint.pt files posenc reads (16 GiB).
inline constexpr int64_t kMaxCheckpointBytes = int64_t{16} << 30;

/// The checkpoint checksum's walk (FNV-1a, 64 bit) over the model's parameters and buffers by
/// name: equal exactly when two models hold the same weights (data-parallel ranks compare it).
int64_t weights_checksum(torch::nn::Module& model);
/// weights.pt: {name: tensor} of parameters and buffers, written atomically; the same tensors
/// beside it as weights.safetensors (posenc/train/safetensors.h, with its checksum).
void save_weights(const std::string& path, torch::nn::Module& model);
/// The safetensors file beside a .pt file (weights.pt -> weights.safetensors).
std::string safetensors_path(const std::string& path);
/// checkpoint.pt as above; the previous one (if any) becomes <path without .pt>.prev.pt.
void save_checkpoint(const std::string& path, torch::nn::Module& model,
                     torch::optim::AdamW& optimizer, const CheckpointState& state);
/// Reads and checks a checkpoint (format, checksum, config equal to expected_config by value:
/// 1 == 1.0, key order free, train.threads and train.log_every ignored), then loads the
/// model's tensors (names and shapes must match) and the optimizer's state. Errors name the file.
CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& model,
                                torch::optim::AdamW& optimizer, const std::string& expected_config);
/// `--init-from` / `posenc eval --weights`: the parameters of a weights.pt or weights.safetensors
/// (or of a checkpoint.pt's "model"; refused where the checkpoint holds a weight average, whose run
/// evaluated the average in weights.pt) copied into the model's, strictly: every parameter of the
/// model must be in the file with its shape, and every tensor of the file must be a parameter or
/// buffer of the model; an error names the file, the tensor and both shapes. Buffers are not read:
/// they are tables the current config computes (RoPE's inverse frequencies, a scaling's attention
/// factor), so a model trained with one encoder config is evaluated or fine-tuned with another.
void load_parameters(const std::string& path, torch::nn::Module& model);
/// The path save_checkpoint keeps the previous checkpoint under (checkpoint.prev.pt).
std::string previous_checkpoint_path(const std::string& path);

}  // namespace posenc::train
