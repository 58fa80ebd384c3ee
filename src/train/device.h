// Where a run computes: train.device in the run config.
//   cpu          every tensor on the CPU (the default)
//   cuda         one GPU: cuda:0 for one process; cuda:LOCAL_RANK for each rank of a data-parallel
//                run (torchrun's convention: one GPU per local rank), whose gradients then travel
//                over NCCL (c10d's ProcessGroupNCCL) instead of Gloo
//   cuda:N       GPU N, for one process only (a rank's GPU is its LOCAL_RANK)
// The task's data stays in host memory; each batch moves to the device at the model's door
// (Task::on_device), so one code path serves both. Internal to the trainer.
#pragma once

#include <c10/core/Device.h>

#include <string>

#include "posenc/train/trainer.h"

namespace posenc::train {

/// The device that train.device names for this process: a malformed value (or cuda:N in a
/// data-parallel run) is bad input (c10::Error); a CUDA device this LibTorch or this machine
/// does not have is an EnvironmentError that says which (no CUDA in the build, no GPU visible,
/// fewer GPUs than the index).
c10::Device training_device(const std::string& setting, const DistributedOptions& distributed);

/// Checks a train.device value without asking the machine: its spelling ("cpu", "cuda",
/// "cuda:N"), and no cuda:N for a run of world_size > 1 ranks; an error names the value.
void check_device_setting(const std::string& setting, int world_size = 1);

}  // namespace posenc::train
