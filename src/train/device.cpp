// train.device resolved to a c10::Device; contract in device.h. CUDA is asked through LibTorch's
// device-independent hooks (torch::cuda::is_available, device_count: false and 0 in a LibTorch
// without libtorch_cuda), so this file compiles and answers in every build.
#include "device.h"

#include <ATen/Context.h>
#include <torch/cuda.h>

#include <charconv>

#include "posenc/core/errors.h"

namespace posenc::train {

namespace {

constexpr int kMaxDeviceIndex = 1024;  // cuda:N: N in [0, kMaxDeviceIndex)

// -1 for "cuda", N for "cuda:N"; throws for anything else that starts with "cuda".
int cuda_index(const std::string& setting) {
  if (setting == "cuda") return -1;
  const std::string digits = setting.substr(5);
  int index = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  TORCH_CHECK(setting.rfind("cuda:", 0) == 0 && !digits.empty() && error == std::errc() &&
                  end == digits.data() + digits.size() && index >= 0 && index < kMaxDeviceIndex,
              "train: device must be 'cpu', 'cuda' or 'cuda:N' (N in [0, ", kMaxDeviceIndex,
              ")), got '", setting, "'");
  return index;
}

}  // namespace

void check_device_setting(const std::string& setting, int world_size) {
  if (setting == "cpu") return;
  TORCH_CHECK(setting.rfind("cuda", 0) == 0,
              "train: device must be 'cpu', 'cuda' or 'cuda:N', got '", setting, "'");
  TORCH_CHECK(cuda_index(setting) < 0 || world_size == 1, "train: device '", setting,
              "' in a data-parallel run of ", world_size,
              " ranks: use 'cuda' (each rank takes the GPU of its LOCAL_RANK)");
}

c10::Device training_device(const std::string& setting, const DistributedOptions& distributed) {
  check_device_setting(setting, distributed.world_size);
  if (setting == "cpu") return c10::Device(c10::kCPU);
  if (!torch::cuda::is_available()) {
    throw EnvironmentError(
        "train: device is '" + setting + "' but " +
        (at::hasCUDA() ? std::string("no GPU is visible (CUDA_VISIBLE_DEVICES, the driver)")
                       : std::string("this LibTorch has no CUDA (a CPU-only build: libtorch_cuda "
                                     "missing); use device: cpu")));
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  const bool ranks = distributed.world_size > 1;
  int index = cuda_index(setting);
  // a rank's GPU is cuda:LOCAL_RANK (torchrun), or the one GPU it sees when the scheduler binds one
  // per task (SLURM's --gpus-per-task: CUDA_VISIBLE_DEVICES names one device)
  if (index < 0) index = ranks && count != 1 ? distributed.local_rank : 0;
  if (index >= count) {
    throw EnvironmentError(
        "train: device '" + setting + "' needs cuda:" + std::to_string(index) +
        (ranks ? " (LOCAL_RANK " + std::to_string(distributed.local_rank) + ")" : std::string()) +
        " but " + std::to_string(count) + " GPU" + (count == 1 ? " is" : "s are") + " visible" +
        (ranks ? "; run at most one rank per GPU on a machine" : std::string()));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace posenc::train
