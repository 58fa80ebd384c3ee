// CUDA on the CPU for tests: the shim header force-included (g++ -include) before the project's .cu
// files, which g++ then compiles as C++ (each .cu is #included by a small .cpp beside this file).
//
// What it maps (the real CUDA headers supply the types: cudaError_t, dim3, uint3, float4, __half,
// __nv_bfloat16 and their host conversions, which round to nearest even like the device's):
//   __global__ __device__ __host__ __forceinline__ __launch_bounds__  -> plain C++ (inline)
//   threadIdx blockIdx blockDim gridDim                               -> the running fiber's
//   __syncthreads __syncwarp __shfl_sync __shfl_xor_sync __shfl_up_sync __shfl_down_sync
//                                      -> checked rendezvous, the call site captured (__FILE__,
//                                         __LINE__): a divergent one is an error naming both lines
//   atomicAdd, __ldg, __double2ll_rn, __expf, __logf, __fdividef, rsqrtf, __saturatef ...
//   __fmul_rn __fadd_rn __fsub_rn      -> one IEEE float32 op each (round to nearest even); the
//                                         .cu files that use them are compiled with
//                                         -ffp-contract=off, so g++ fuses none into an FMA either
//   POSENC_LAUNCH / POSENC_EXTERN_SHARED (src/kernels/cuda/launch.cuh)   -> emulated launch and
//                                         the block's exact-size, NaN-filled dynamic shared memory
//   cudaMalloc cudaFree cudaMemcpy cudaMemset cudaDeviceSynchronize cudaGetDeviceCount
//   cudaGetLastError cudaPeekAtLastError cudaGetErrorString cudaFuncSetAttribute cudaStream*
//                                      -> posenc::cuda_emu functions, by macro. Not extern "C"
//                                         definitions: LibTorch links libcudart, and interposing
//                                         its symbols would hijack it.
// Runtime and the meaning of each check: tests/cuda_emu/cuda_emu.cpp.
//
// Each CUDA thread of a block runs as a fiber (glibc ucontext); blocks run one after another. The
// schedule (POSENC_CUDA_EMU_SCHEDULE) orders the fibers between synchronization points:
//   lockstep          every thread runs to its next barrier or shuffle, thread 0 first (default)
//   warp-serial       warp 0 runs until it waits at a barrier, then warp 1, ...
//   reverse           warp-serial with warps, lanes and blocks in reverse order
//   lockstep-reverse  lockstep, last thread first
// A missing __syncthreads shows as wrong results under one schedule or the other.
//   threads           the thread engine: each CUDA thread of a block is an OS thread (a launch of
//                     128 threads starts 128), __syncthreads a real barrier, a warp shuffle an
//                     exchange through the block's lock; the order is the OS's. For
//                     ThreadSanitizer (scripts/check.sh thread): it sees the happens-before edges
//                     a GPU gives (each barrier, each warp rendezvous among its lanes, blocks one
//                     after another) and no others, so a missing __syncthreads is a reported race.
// The call-site checks (divergent barrier or shuffle) hold under every schedule.
#pragma once

#define POSENC_CUDA_EMU 1

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

// ---- keywords ----------------------------------------------------------------------------------
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#undef __launch_bounds__
#undef __noinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// A static __shared__ array is one object shared by the block's fibers (blocks run one at a time).
#define __shared__ static

namespace posenc::cuda_emu {

// ---- the running thread ------------------------------------------------------------------------
struct ThreadCoordinates {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
namespace detail {
extern thread_local const ThreadCoordinates* current;  // the CUDA thread that runs now, or null
const ThreadCoordinates& outside_kernel();             // aborts: threadIdx read outside a kernel
inline const ThreadCoordinates& coordinates() {
  return current != nullptr ? *current : outside_kernel();
}
}  // namespace detail

// ---- synchronization: call sites captured by the macros below -----------------------------------
void syncthreads(const char* file, int line);
void syncwarp(const char* file, int line, unsigned mask = 0xffffffffu);

enum class ShuffleKind { kIndex, kXor, kUp, kDown };
uint64_t shuffle(const char* file, int line, ShuffleKind kind, unsigned mask, uint64_t value,
                 int operand, int width);

template <typename T>
T shuffle_value(const char* file, int line, ShuffleKind kind, unsigned mask, T value, int operand,
                int width = 32) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffle of <= 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = shuffle(file, line, kind, mask, bits, operand, width);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// ---- launches ----------------------------------------------------------------------------------
struct LaunchSite {
  const void* kernel;  // identity (cudaFuncSetAttribute is keyed by it)
  const char* name;    // "rope_table_kernel<float, 4>"
  const char* file;
  int line;
};
// Runs `body` once per thread of every block (body: calls the kernel with the launch's arguments).
void launch(const LaunchSite& site, dim3 grid, dim3 block, size_t shared_bytes, void (*body)(void*),
            void* context);
void* dynamic_shared_memory(size_t alignment);

// The kernel's name from the compiler's spelling of this template's argument.
std::string kernel_name_from(const char* pretty_function);

template <auto Kernel>
struct Launch {
  dim3 grid, block;
  size_t shared_bytes;
  const char* file;
  int line;
  Launch(dim3 g, dim3 b, size_t s, cudaStream_t /*stream: launches are synchronous*/, const char* f,
         int l)
      : grid(g), block(b), shared_bytes(s), file(f), line(l) {}
  static const char* name() {
    static const std::string n = kernel_name_from(__PRETTY_FUNCTION__);
    return n.c_str();
  }
  template <typename... Args>
  void operator()(const Args&... args) const {
    auto call = [&] { Kernel(args...); };  // every thread gets its own copy of by-value params
    auto trampoline = [](void* c) { (*static_cast<decltype(call)*>(c))(); };
    const LaunchSite site{reinterpret_cast<const void*>(Kernel), name(), file, line};
    launch(site, grid, block, shared_bytes, trampoline, &call);
  }
};

template <typename T>
T* extern_shared() {
  return static_cast<T*>(dynamic_shared_memory(alignof(T) > 16 ? alignof(T) : 16));
}

// ---- runtime API (the macros below map cudaX to these)
// -------------------------------------------
cudaError_t Malloc(void** pointer, size_t bytes);
template <typename T>
cudaError_t Malloc(T** pointer, size_t bytes) {
  return Malloc(reinterpret_cast<void**>(pointer), bytes);
}
cudaError_t Free(void* pointer);
cudaError_t Memcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream = nullptr);
cudaError_t Memset(void* dst, int value, size_t bytes);
cudaError_t DeviceSynchronize();
cudaError_t GetDeviceCount(int* count);
cudaError_t GetLastError();
cudaError_t PeekAtLastError();
const char* GetErrorString(cudaError_t error);
cudaError_t FuncSetAttributeRaw(const void* kernel, cudaFuncAttribute attribute, int value);
template <typename F>
cudaError_t FuncSetAttribute(F* kernel, cudaFuncAttribute attribute, int value) {
  return FuncSetAttributeRaw(reinterpret_cast<const void*>(kernel), attribute, value);
}
cudaError_t StreamCreate(cudaStream_t* stream);
cudaError_t StreamDestroy(cudaStream_t stream);
cudaError_t StreamSynchronize(cudaStream_t stream);

// ---- what tests ask the emulator --------------------------------------------------------------
/// Kernels launched so far (name -> launches), distinct entry points.
std::vector<std::pair<std::string, int64_t>> launched_kernels();
/// The last kernel fault's message ("" if none); faults are sticky like a device's until cleared.
std::string last_fault();
void clear_fault();
/// The opt-in ceiling of dynamic shared memory per block: the smallest of the architectures the
/// kernels are built for (CMAKE_CUDA_ARCHITECTURES 80 90: sm_80, 163 KiB).
constexpr size_t kSharedMemoryOptInCeiling = 163 * 1024;
constexpr size_t kSharedMemoryDefaultLimit = 48 * 1024;

// ---- device math the host library lacks --------------------------------------------------------
inline long long double2ll_rn(double x) { return std::llrint(x); }  // default mode: to even
inline float saturate(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float fmul_rn(float x, float y) { return x * y; }
inline float fadd_rn(float x, float y) { return x + y; }
inline float fsub_rn(float x, float y) { return x - y; }
// Relaxed like the device's (no ordering of other memory): the thread engine runs it concurrently.
template <typename T>
T atomic_add(T* address, T value) {
  std::atomic_ref<T> target(*address);
  T old = target.load(std::memory_order_relaxed);
  while (
      !target.compare_exchange_weak(old, static_cast<T>(old + value), std::memory_order_relaxed)) {
  }
  return old;
}

}  // namespace posenc::cuda_emu

#define threadIdx (::posenc::cuda_emu::detail::coordinates().thread_idx)
#define blockIdx (::posenc::cuda_emu::detail::coordinates().block_idx)
#define blockDim (::posenc::cuda_emu::detail::coordinates().block_dim)
#define gridDim (::posenc::cuda_emu::detail::coordinates().grid_dim)
#define warpSize 32

#define __syncthreads() ::posenc::cuda_emu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::posenc::cuda_emu::syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __shfl_sync(mask, ...)                                                                   \
  ::posenc::cuda_emu::shuffle_value(__FILE__, __LINE__, ::posenc::cuda_emu::ShuffleKind::kIndex, \
                                    mask, __VA_ARGS__)
#define __shfl_xor_sync(mask, ...)                                                             \
  ::posenc::cuda_emu::shuffle_value(__FILE__, __LINE__, ::posenc::cuda_emu::ShuffleKind::kXor, \
                                    mask, __VA_ARGS__)
#define __shfl_up_sync(mask, ...)                                                             \
  ::posenc::cuda_emu::shuffle_value(__FILE__, __LINE__, ::posenc::cuda_emu::ShuffleKind::kUp, \
                                    mask, __VA_ARGS__)
#define __shfl_down_sync(mask, ...)                                                             \
  ::posenc::cuda_emu::shuffle_value(__FILE__, __LINE__, ::posenc::cuda_emu::ShuffleKind::kDown, \
                                    mask, __VA_ARGS__)

#define __ldg(pointer) (*(pointer))
#define atomicAdd ::posenc::cuda_emu::atomic_add
#define __double2ll_rn ::posenc::cuda_emu::double2ll_rn
#define __expf expf
#define __logf logf
#define __sinf sinf
#define __cosf cosf
#define __powf powf
#define __fdividef(x, y) ((x) / (y))
#define __frcp_rn(x) (1.0f / (x))
#define __saturatef ::posenc::cuda_emu::saturate
#define __fmul_rn ::posenc::cuda_emu::fmul_rn
#define __fadd_rn ::posenc::cuda_emu::fadd_rn
#define __fsub_rn ::posenc::cuda_emu::fsub_rn
#define rsqrtf(x) (1.0f / sqrtf(x))

#define POSENC_LAUNCH(grid, block, shared, stream, ...) \
  ::posenc::cuda_emu::Launch<&__VA_ARGS__>(grid, block, shared, stream, __FILE__, __LINE__)
#define POSENC_EXTERN_SHARED(type, name) \
  type* const name = ::posenc::cuda_emu::extern_shared<type>()

#define cudaMalloc ::posenc::cuda_emu::Malloc
#define cudaFree ::posenc::cuda_emu::Free
#define cudaMemcpy ::posenc::cuda_emu::Memcpy
#define cudaMemcpyAsync ::posenc::cuda_emu::MemcpyAsync
#define cudaMemset ::posenc::cuda_emu::Memset
#define cudaDeviceSynchronize ::posenc::cuda_emu::DeviceSynchronize
#define cudaGetDeviceCount ::posenc::cuda_emu::GetDeviceCount
#define cudaGetLastError ::posenc::cuda_emu::GetLastError
#define cudaPeekAtLastError ::posenc::cuda_emu::PeekAtLastError
#define cudaGetErrorString ::posenc::cuda_emu::GetErrorString
#define cudaFuncSetAttribute ::posenc::cuda_emu::FuncSetAttribute
#define cudaStreamCreate ::posenc::cuda_emu::StreamCreate
#define cudaStreamDestroy ::posenc::cuda_emu::StreamDestroy
#define cudaStreamSynchronize ::posenc::cuda_emu::StreamSynchronize
