// The NCCL side of a data-parallel run on GPUs: c10d's ProcessGroupNCCL (NVIDIA's collectives
// over NVLink, PCIe or InfiniBand) for the CUDA tensors of the run (the gradient all-reduce, the
// weight broadcast), beside Gloo for the few host tensors (the step's loss, the checksums), as
// torch.distributed's "cpu:gloo,cuda:nccl". Only nccl_backend.cpp sees NCCL and CUDA headers; it
// is compiled with NCCL when the LibTorch has libtorch_cuda and nccl.h is found
// (POSENC_WITH_NCCL), else as a stub whose make_nccl_backend says what is missing. Internal to
// the trainer (included by data_parallel.cpp alone, after the c10d headers).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace posenc::train {

/// Makes `device` (cuda:LOCAL_RANK) the current CUDA device of this process and returns a
/// ProcessGroupNCCL of `world` ranks over `store` whose collectives time out after `timeout`.
/// Without NCCL in the build: an EnvironmentError saying so.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world,
                                                    std::chrono::milliseconds timeout,
                                                    c10::Device device);

}  // namespace posenc::train
