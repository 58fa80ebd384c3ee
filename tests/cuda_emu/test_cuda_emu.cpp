// The emulator's own checks, each shown to fire on a small kernel written to break it (divergent
// barrier or shuffle, a thread that exits before a barrier, a read before a write, shared memory
// overrun, launch limits, copies outside a buffer), under the fiber schedules and the thread engine
// where they apply, its shuffles and fp16/bf16 conversions against their definitions, the thread
// engine's one OS thread per CUDA thread, and, after a full run, that every launchable posenc
// kernel ran.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include "cuda_emu.h"

namespace posenc::cuda_emu {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// Runs `launch` and returns the fault it caused ("" if none), clearing it.
template <typename F>
std::string fault_of(F&& launch) {
  clear_fault();
  launch();
  const cudaError_t e = cudaDeviceSynchronize();
  std::string message = last_fault();
  if (e != cudaSuccess && message.empty()) message = "error without a message";
  clear_fault();
  return message;
}

std::string site(int line) { return "test_cuda_emu.cpp:" + std::to_string(line); }

// Schedules set for one test.
class ScheduleScope {
 public:
  explicit ScheduleScope(const char* schedule) {
    const char* old = std::getenv("POSENC_CUDA_EMU_SCHEDULE");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("POSENC_CUDA_EMU_SCHEDULE", schedule, 1);
  }
  ~ScheduleScope() {
    if (had_)
      setenv("POSENC_CUDA_EMU_SCHEDULE", old_.c_str(), 1);
    else
      unsetenv("POSENC_CUDA_EMU_SCHEDULE");
  }

 private:
  bool had_ = false;
  std::string old_;
};

const char* const kSchedules[] = {"lockstep", "warp-serial", "reverse", "lockstep-reverse"};
// The fiber schedules and the thread engine: the call-site checks hold under every one.
const char* const kEngines[] = {"lockstep", "warp-serial", "reverse", "lockstep-reverse",
                                "threads"};

// ---- barriers ----------------------------------------------------------------------------------
constexpr int kBarrierA = __LINE__ + 3;
__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 40)
    __syncthreads();
  else
    __syncthreads();
  out[threadIdx.x] = 1;
}

constexpr int kBarrierExit = __LINE__ + 3;
__global__ void exit_before_barrier_kernel(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}

// shared[t] = t, then each thread reads its neighbour's: right only with the barrier
template <bool kBarrier>
__global__ void neighbour_kernel(float* out) {
  POSENC_EXTERN_SHARED(float, shared);
  shared[threadIdx.x] = static_cast<float>(threadIdx.x);
  if (kBarrier) __syncthreads();
  out[threadIdx.x] = shared[(threadIdx.x + 1) % blockDim.x];
}

TEST(CudaEmu, DivergentBarrierIsAnErrorNamingBothLines) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  for (const char* schedule : kEngines) {
    ScheduleScope scope(schedule);
    auto launch = [&] { POSENC_LAUNCH(1, 64, 0, nullptr, divergent_barrier_kernel)(out); };
    const std::string f = fault_of(launch);
    EXPECT_NE(f.find("divergent __syncthreads"), std::string::npos) << schedule << ": " << f;
    EXPECT_NE(f.find(site(kBarrierA)), std::string::npos) << f;
    EXPECT_NE(f.find(site(kBarrierA + 2)), std::string::npos) << f;
    EXPECT_NE(f.find("divergent_barrier_kernel"), std::string::npos) << f;
  }
  for (const char* schedule : {"lockstep", "threads"}) {
    ScheduleScope scope(schedule);
    auto launch = [&] { POSENC_LAUNCH(1, 64, 0, nullptr, exit_before_barrier_kernel)(out); };
    const std::string f = fault_of(launch);
    EXPECT_NE(f.find("has exited"), std::string::npos) << schedule << ": " << f;
    EXPECT_NE(f.find(site(kBarrierExit)), std::string::npos) << f;
  }
  cudaFree(out);
}

// The fiber schedules only: under the thread engine the order of the unsynchronized write and read
// is the OS's (a race that TSan reports, scripts/check.sh thread), so the NaN is likely, not sure.
TEST(CudaEmu, MissingBarrierReadsTheNaNFillUnderEverySchedule) {
  const int n = 96;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, n * sizeof(float)), cudaSuccess);
  std::vector<float> host(n);
  for (const char* schedule : kSchedules) {
    ScheduleScope scope(schedule);
    POSENC_LAUNCH(1, n, n * sizeof(float), nullptr, neighbour_kernel<true>)(out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int t = 0; t < n; ++t) ASSERT_EQ(host[t], static_cast<float>((t + 1) % n)) << schedule;
    POSENC_LAUNCH(1, n, n * sizeof(float), nullptr, neighbour_kernel<false>)(out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    int nan = 0;
    for (float x : host) nan += std::isnan(x);
    EXPECT_GT(nan, 0) << schedule << ": every read came after the write without a barrier";
  }
  cudaFree(out);
}

// ---- shuffles ----------------------------------------------------------------------------------
constexpr int kShuffleA = __LINE__ + 4;
__global__ void divergent_shuffle_kernel(float* out) {
  float x = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 32 < 8)
    x = __shfl_xor_sync(kFull, x, 1);
  else
    x = __shfl_xor_sync(kFull, x, 1);
  out[threadIdx.x] = x;
}

__global__ void shuffle_kinds_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32), base = 4 * static_cast<int>(threadIdx.x);
  const int x = 100 * static_cast<int>(threadIdx.x);
  out[base + 0] = __shfl_xor_sync(kFull, x, 5);
  out[base + 1] = __shfl_down_sync(kFull, x, 3, 16);
  out[base + 2] = __shfl_up_sync(kFull, x, 2);
  out[base + 3] = __shfl_sync(kFull, x, 7 + lane / 8, 8);
}

__global__ void outside_mask_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_xor_sync(0xffffu, 1, 16);
}

TEST(CudaEmu, ShuffleKindsMatchTheirDefinitions) {
  const int n = 64;
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 4 * n * sizeof(int)), cudaSuccess);
  POSENC_LAUNCH(1, n, 0, nullptr, shuffle_kinds_kernel)(out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> host(4 * n);
  ASSERT_EQ(cudaMemcpy(host.data(), out, host.size() * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  for (int t = 0; t < n; ++t) {
    const int warp = t / 32 * 32, lane = t % 32;
    EXPECT_EQ(host[4 * t + 0], 100 * (warp + (lane ^ 5))) << t;
    EXPECT_EQ(host[4 * t + 1], 100 * (lane % 16 + 3 < 16 ? t + 3 : t)) << t;  // within 16
    EXPECT_EQ(host[4 * t + 2], 100 * (lane >= 2 ? t - 2 : t)) << t;
    EXPECT_EQ(host[4 * t + 3], 100 * (warp + lane / 8 * 8 + (7 + lane / 8) % 8)) << t;
  }
  cudaFree(out);
}

TEST(CudaEmu, DivergentOrOutOfMaskShuffleIsAnError) {
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(float)), cudaSuccess);
  for (const char* schedule : kEngines) {
    ScheduleScope scope(schedule);
    auto launch = [&] { POSENC_LAUNCH(1, 64, 0, nullptr, divergent_shuffle_kernel)(out); };
    const std::string f = fault_of(launch);
    EXPECT_NE(f.find("divergent warp shuffle"), std::string::npos) << schedule << ": " << f;
    EXPECT_NE(f.find(site(kShuffleA)), std::string::npos) << f;
    EXPECT_NE(f.find(site(kShuffleA + 2)), std::string::npos) << f;
  }
  for (const char* schedule : {"lockstep", "threads"}) {
    ScheduleScope scope(schedule);
    const std::string f = fault_of([&] {
      POSENC_LAUNCH(1, 32, 0, nullptr, outside_mask_kernel)(reinterpret_cast<int*>(out));
    });
    EXPECT_NE(f.find("not in the mask"), std::string::npos) << schedule << ": " << f;
  }
  cudaFree(out);
}

// ---- the thread engine -------------------------------------------------------------------------
// Each CUDA thread records its OS thread; blocks of 96 threads (3 warps, the last one full) in a
// grid of 3, with a barrier and a shuffle between the writes and reads of shared memory.
__global__ void os_thread_kernel(uint64_t* ids, float* out) {
  POSENC_EXTERN_SHARED(float, shared);
  const unsigned t = threadIdx.x, n = blockDim.x;
  ids[blockIdx.x * n + t] = std::hash<std::thread::id>{}(std::this_thread::get_id());
  shared[t] = static_cast<float>(blockIdx.x * n + t);
  __syncthreads();
  const float x = __shfl_xor_sync(kFull, shared[(t + 1) % n], 1);
  out[blockIdx.x * n + t] = x;
}

TEST(CudaEmu, ThreadEngineRunsEachCudaThreadOnItsOwnOsThread) {
  ScheduleScope scope("threads");
  const int n = 96, blocks = 3;
  uint64_t* ids = nullptr;
  float* out = nullptr;
  ASSERT_EQ(cudaMalloc(&ids, n * blocks * sizeof(uint64_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, n * blocks * sizeof(float)), cudaSuccess);
  POSENC_LAUNCH(blocks, n, n * sizeof(float), nullptr, os_thread_kernel)(ids, out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << last_fault();
  std::vector<uint64_t> host_ids(n * blocks);
  std::vector<float> host(n * blocks);
  ASSERT_EQ(
      cudaMemcpy(host_ids.data(), ids, host_ids.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), out, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  const std::set<uint64_t> distinct(host_ids.begin(), host_ids.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(n)) << "one OS thread per CUDA thread of a block";
  EXPECT_EQ(distinct.count(std::hash<std::thread::id>{}(std::this_thread::get_id())), 0u);
  for (int b = 0; b < blocks; ++b)
    for (int t = 0; t < n; ++t)  // lane t reads lane t ^ 1's neighbour
      ASSERT_EQ(host[b * n + t], static_cast<float>(b * n + ((t ^ 1) + 1) % n)) << b << " " << t;
  cudaFree(ids);
  cudaFree(out);
}

// ---- launch limits and memory ------------------------------------------------------------------
__global__ void fill_kernel(float* out, int n) {
  POSENC_EXTERN_SHARED(float, shared);
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x))
    out[i] = shared[i];
}

__global__ void write_shared_kernel(int byte) {
  POSENC_EXTERN_SHARED(char, shared);
  if (threadIdx.x == 0) shared[byte] = 1;
}

TEST(CudaEmu, LaunchLimitsAndTheSharedMemoryOptIn) {
  float* out = nullptr;
  const int n = 13 * 1024;  // 52 KiB of floats
  ASSERT_EQ(cudaMalloc(&out, n * sizeof(float)), cudaSuccess);
  clear_fault();
  POSENC_LAUNCH(1, 1025, 0, nullptr, fill_kernel)(out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  POSENC_LAUNCH(1, dim3(32, 33), 0, nullptr, fill_kernel)(out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  POSENC_LAUNCH(0, 32, 0, nullptr, fill_kernel)(out, 0);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once
  const size_t bytes = n * sizeof(float);
  POSENC_LAUNCH(1, 1024, bytes, nullptr, fill_kernel)(out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "52 KiB without the opt-in";
  EXPECT_EQ(cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(kSharedMemoryOptInCeiling) + 1),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaFuncSetAttribute(fill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)),
            cudaSuccess);
  POSENC_LAUNCH(1, 1024, bytes, nullptr, fill_kernel)(out, n);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<float> host(n);
  ASSERT_EQ(cudaMemcpy(host.data(), out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  for (float x : host) ASSERT_TRUE(std::isnan(x)) << "shared memory starts NaN-filled";
  POSENC_LAUNCH(1, 32, bytes + 4, nullptr, fill_kernel)(out, n);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue) << "above the opted-in size";
  cudaFree(out);
}

TEST(CudaEmu, SharedMemoryAndBuffersAreExactSize) {
  // inside the rounding to 16 bytes: the canary
  auto launch = [&] { POSENC_LAUNCH(1, 32, 20, nullptr, write_shared_kernel)(21); };
  const std::string f = fault_of(launch);
  EXPECT_NE(f.find("wrote byte 21 of dynamic shared memory of 20 bytes"), std::string::npos) << f;
  auto within = [&] { POSENC_LAUNCH(1, 32, 20, nullptr, write_shared_kernel)(19); };
  EXPECT_EQ(fault_of(within), "");
  // past it: the guard page
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(POSENC_LAUNCH(1, 32, 32, nullptr, write_shared_kernel)(32),
               "past the end of the block's dynamic shared memory.*write_shared_kernel");
  // copies must lie inside one buffer
  char* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 100), cudaSuccess);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer) % 256, 0u);
  std::vector<char> host(200, 0);
  EXPECT_EQ(cudaMemcpy(buffer, host.data(), 100, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(buffer + 1, host.data(), 100, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), buffer, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data() + 100, host.data(), 10, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFree(buffer), cudaSuccess);
}

// ---- storage types
// -------------------------------------------------------------------------------
TEST(CudaEmu, HalfAndBFloat16ConversionsAreBitExact) {
  // every 16-bit pattern to float, against c10's definitions
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const auto u = static_cast<uint16_t>(bits);
    __half h;
    __nv_bfloat16 b;
    std::memcpy(&h, &u, 2);
    std::memcpy(&b, &u, 2);
    const float hf = __half2float(h), bf = __bfloat162float(b);
    const float hc = static_cast<float>(c10::Half(u, c10::Half::from_bits()));
    const float bc = static_cast<float>(c10::BFloat16(u, c10::BFloat16::from_bits()));
    ASSERT_TRUE(std::memcmp(&hf, &hc, 4) == 0 || (std::isnan(hf) && std::isnan(hc))) << bits;
    ASSERT_TRUE(std::memcmp(&bf, &bc, 4) == 0 || (std::isnan(bf) && std::isnan(bc))) << bits;
  }
  // floats to 16 bits (round to nearest even): random bit patterns and the halfway cases
  auto patterns = torch::randint(0, 1LL << 32, {200000}, torch::kInt64);
  auto p = patterns.accessor<int64_t, 1>();
  for (int64_t i = 0; i < patterns.size(0); ++i) {
    auto word = static_cast<uint32_t>(p[i]);
    if (i % 4 == 0) word = (word & 0xffff0000u) | 0x8000u;  // halfway for bf16
    float x;
    std::memcpy(&x, &word, 4);
    if (std::isnan(x)) continue;
    const __half h = __float2half(x);
    const __nv_bfloat16 b = __float2bfloat16(x);
    uint16_t hb, bb;
    std::memcpy(&hb, &h, 2);
    std::memcpy(&bb, &b, 2);
    ASSERT_EQ(hb, c10::Half(x).x) << x;
    ASSERT_EQ(bb, c10::BFloat16(x).x) << x;
  }
}

// ---- every launchable posenc kernel ran --------------------------------------------------------
// After a full run (no --gtest_filter): the 96 instantiations of src/kernels/cuda (nvcc -ptx lists
// them: 24 RoPE = 3 storage types x 4 vector widths x the two roundings, kRoundEach false for
// rope_rotate and true for apply_rotary (test_rotary_emu.cpp); 72 attention = 3 kernels x 3
// storage types x 4 register tiles x with and without ids) less rope_table_kernel<float, 8, *>,
// which launch_tables can never choose: 8 fp32 pairs are 32 bytes, wider than the 16-byte vectors
// vector_width allows. They stay instantiated because the switch over V is shared by the three
// storage types (dropping them would change the PTX).
class EveryKernelRan : public ::testing::Environment {
 public:
  void TearDown() override {
    if (GTEST_FLAG_GET(filter) != "*") return;
    std::set<std::string> expected;
    for (const char* type : {"float", "__nv_bfloat16", "__half"}) {
      for (int n : {1, 2, 4, 8}) {
        const std::string args = std::string("<") + type + ", " + std::to_string(n);
        if (!(std::string(type) == "float" && n == 8))
          for (const char* round_each : {", false>", ", true>"})
            expected.insert("rope_table_kernel" + args + round_each);
        for (const char* k : {"attention_forward_kernel", "attention_backward_dkdv_kernel",
                              "attention_backward_dq_kernel"})
          for (const char* ids : {", false>", ", true>"}) expected.insert(k + args + ids);
      }
    }
    std::set<std::string> ran;
    for (const auto& [name, count] : launched_kernels())
      if (name.rfind("rope_", 0) == 0 || name.rfind("attention_", 0) == 0) ran.insert(name);
    for (const auto& name : expected)
      if (ran.count(name) == 0) ADD_FAILURE() << "kernel never launched: " << name;
    for (const auto& name : ran)
      if (expected.count(name) == 0) ADD_FAILURE() << "kernel not in the expected list: " << name;
    std::printf(
        "cuda_emu: %zu of %zu launchable kernels ran (96 instantiated; "
        "rope_table_kernel<float, 8, *> cannot be chosen)\n",
        ran.size(), expected.size());
  }
};
[[maybe_unused]] ::testing::Environment* const kEveryKernelRan =
    ::testing::AddGlobalTestEnvironment(new EveryKernelRan);

}  // namespace
}  // namespace posenc::cuda_emu
