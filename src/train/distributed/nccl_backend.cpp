// ProcessGroupNCCL for a data-parallel run's CUDA tensors; contract in nccl_backend.h. As
// torch.distributed.init_process_group(backend="cpu:gloo,cuda:nccl") with torchrun: each rank
// first binds its GPU (torch.cuda.set_device(LOCAL_RANK)), then creates the group over the
// run's store; the NCCL communicator itself is made at the first collective (ncclCommInitRank
// with the unique id rank 0 leaves in the store), and the collectives run on NCCL's own stream;
// with blocking waits a hung or lost rank is an error from wait() after `timeout`.
#include "nccl_backend.h"

#include <cstdlib>
#include <string>

#include "posenc/core/errors.h"

#ifdef POSENC_HAS_NCCL
#include <c10/cuda/CUDAFunctions.h>

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace posenc::train {

#ifdef POSENC_HAS_NCCL

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world,
                                                    std::chrono::milliseconds timeout,
                                                    c10::Device device) {
  TORCH_CHECK(device.is_cuda() && device.has_index(), "make_nccl_backend: a cuda:N device, got ",
              device.str());
  c10::cuda::set_device(device.index());
  // Blocking waits: a collective's wait() returns when NCCL is done and throws when it failed or
  // ran past `timeout`, so a lost rank reaches the caller's error path (DataParallel names it)
  // instead of ProcessGroupNCCL's watchdog aborting the process. Whoever set it keeps theirs.
  setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, options);
}

#else

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>&, int,
                                                    int, std::chrono::milliseconds,
                                                    c10::Device device) {
  throw EnvironmentError(
      "train: device " + device.str() +
      " in a data-parallel run needs NCCL, and this posenc was built without it (CMake option "
      "POSENC_WITH_NCCL: a LibTorch with libtorch_cuda and NCCL's nccl.h); use device: cpu "
      "(Gloo) or rebuild against a CUDA LibTorch");
}

#endif

}  // namespace posenc::train
