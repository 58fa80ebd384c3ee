// Data-parallel training on PyTorch's own distributed engine, c10d (Gloo on CPU, NCCL for the CUDA
// tensors of a run on GPUs: nccl_backend.h): the ranks of a
// run, their rendezvous and their collectives. Internal to the trainer; no c10d type leaves the
// .cpp, so the rest of the trainer compiles without the distributed headers.
//
// Semantics (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel
// Training"; torch.nn.parallel.DistributedDataParallel): every rank holds the whole model, takes
// B / W examples of each global batch of B, and before the optimizer step every gradient is
// replaced by its mean over the W ranks,
//   g = (1 / W) sum_r g_r,   g_r = d/dθ mean_{i in shard r} loss_i,
// which is the gradient of the mean loss over the global batch (shards of equal size). The
// optimizer then takes the same step on every rank, so the ranks stay equal bit for bit (checked
// at every checkpoint: checksums of every parameter and buffer, gathered from all ranks).
//
// Rendezvous as torchrun does it (torch/distributed/rendezvous.py, `env://`): rank 0 hosts a
// TCPStore at MASTER_ADDR:MASTER_PORT and the others connect; with torchrun's agent store
// (TORCHELASTIC_USE_AGENT_STORE=True) the agent hosts it and every rank is a client under the
// prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>; `posenc train --nproc N` uses a FileStore.
//
// Faults: a collective that fails (a rank killed: its sockets close; a rank hung: the timeout)
// is turned into one error naming the lost rank. Survivors leave their word in the store and wait
// kLostRankWait for the others' word; a rank that failed by itself leaves its error message there
// first, so the survivors can quote it. A collective that fails on this rank for a reason of its
// own (an exception that is not a Gloo or c10d communication error, thrown on this thread or on a
// Gloo worker thread: an allocation, a tensor check) is that error as it is, not a lost rank.
#pragma once

#include <c10/core/Device.h>
#include <torch/nn/module.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "posenc/train/trainer.h"

namespace posenc::train {

/// How the ranks average their gradients.
enum class GradientSync {
  kOverlap,        ///< c10d's Reducer: buckets all-reduced while backward still runs (DDP)
  kAfterBackward,  ///< one flat all-reduce of every gradient once backward has finished
};
/// "overlap" / "after_backward" (the config's train.gradient_sync); anything else is an error.
GradientSync gradient_sync_from_string(const std::string& name);

/// After a failed collective, how long survivors wait for every rank's word in the store.
inline constexpr std::chrono::seconds kLostRankWait{3};
/// The gradient bucket of DDP's first bucket (small, so the first all-reduce starts early).
inline constexpr int64_t kFirstBucketBytes = 1024 * 1024;

/// True when this posenc was built with the distributed backend (Gloo headers found).
bool distributed_available();

class DataParallel {
 public:
  /// Joins the run `options` describes, waiting up to `timeout` for the other ranks (the same
  /// timeout bounds every collective after). world_size 1: a group of one, no store, no sockets;
  /// every collective returns its input.
  /// `device`: where the model computes (device.h's training_device): a CUDA device gives the
  /// group an NCCL backend for CUDA tensors (nccl_backend.h) beside Gloo for host tensors.
  DataParallel(const DistributedOptions& options, std::chrono::milliseconds timeout,
               c10::Device device = c10::Device(c10::kCPU));
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  bool active() const { return options_.world_size > 1; }
  /// Rank 0: the one that writes logs, checkpoints, plots and weights.
  bool lead() const { return options_.rank == 0; }
  /// Where this rank's model computes (train.device).
  c10::Device device() const { return device_; }

  /// Copies rank 0's parameters and buffers to every rank.
  void broadcast_module(torch::nn::Module& module);
  /// From now on backward() leaves the mean gradient over the ranks in every parameter's grad.
  /// kOverlap: c10d's Reducer with buckets of bucket_bytes (kFirstBucketBytes first);
  /// find_unused: also reduce parameters the step did not use (a graph walk per step).
  void sync_gradients(torch::nn::Module& model, GradientSync mode, int64_t bucket_bytes,
                      bool find_unused);
  /// Around every training step: before the forward, then backward through this.
  void before_forward();
  /// Runs loss.backward() of training step `step` with the gradient all-reduce.
  void backward(const at::Tensor& loss, int64_t step);

  /// The element-wise sums of `values` over the ranks (float64; the same on every rank).
  std::vector<double> sum(std::vector<double> values, const std::string& what);
  /// Every rank's `value`, in rank order.
  std::vector<int64_t> gather(int64_t value, const std::string& what);
  /// Every rank's text under `key` (through the store, not a collective: ranks whose models
  /// differ in shape can still compare their configs before any tensor is sent), in rank order.
  std::vector<std::string> gather_text(const std::string& key, const std::string& value,
                                       const std::string& what);

  /// Leaves this rank's error in the store for the others to quote (best effort; no throw).
  void report_failure(const std::string& message) noexcept;

 private:
  struct Impl;
  DistributedOptions options_;
  c10::Device device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace posenc::train
