// CUDA RoPE kernel; interface and math in include/posenc/kernels/rope_cuda.h.
// Reference (specification, test oracle): rope_apply in src/functional/rope.cpp.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "posenc/kernels/rope_cuda.h"

namespace posenc::cuda {

namespace {

template <typename T>
__device__ __forceinline__ float load(const T* p);
template <>
__device__ __forceinline__ float load<float>(const float* p) {
  return *p;
}
template <>
__device__ __forceinline__ float load<__nv_bfloat16>(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
template <>
__device__ __forceinline__ float load<__half>(const __half* p) {
  return __half2float(*p);
}

template <typename T>
__device__ __forceinline__ void store(T* p, float v);
template <>
__device__ __forceinline__ void store<float>(float* p, float v) {
  *p = v;
}
template <>
__device__ __forceinline__ void store<__nv_bfloat16>(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}
template <>
__device__ __forceinline__ void store<__half>(__half* p, float v) {
  *p = __float2half(v);
}

// grid: one block per token (b, n); shared: cos[F], sin[F]
template <typename T>
__global__ void rope_kernel(RopeLaunch a) {
  extern __shared__ float shared[];
  float* cos_table = shared;
  float* sin_table = shared + a.pairs;
  const int64_t token = blockIdx.x;  // b * tokens + n
  const int64_t b = token / a.tokens, n = token % a.tokens;
  const double p = a.positions[a.positions_batched ? token : n];
  for (int64_t i = threadIdx.x; i < a.pairs; i += blockDim.x) {
    // exact product in float64, reduced to [-pi, pi] before the float32 trig
    const double angle = remainder(p * static_cast<double>(a.inv_freq[i]), 2.0 * M_PI);
    float s, c;
    sincosf(static_cast<float>(angle), &s, &c);
    cos_table[i] = c * a.scaling;
    sin_table[i] = s * a.scaling * a.sign;
  }
  __syncthreads();
  T* base = static_cast<T*>(a.x) + b * a.stride_batch + n * a.stride_token;
  const int64_t work = a.heads * a.pairs;
  for (int64_t w = threadIdx.x; w < work; w += blockDim.x) {
    const int64_t h = w / a.pairs, i = w % a.pairs;
    T* row = base + h * a.stride_head;
    const int64_t ia = a.interleaved ? 2 * i : i;
    const int64_t ib = a.interleaved ? 2 * i + 1 : i + a.pairs;
    const float xa = load(row + ia), xb = load(row + ib);
    const float c = cos_table[i], s = sin_table[i];
    store(row + ia, xa * c - xb * s);
    store(row + ib, xb * c + xa * s);
  }
}

template <typename T>
cudaError_t launch(const RopeLaunch& a, cudaStream_t stream) {
  const int64_t blocks = a.batch * a.tokens;
  if (blocks == 0 || a.heads == 0 || a.pairs == 0) return cudaSuccess;
  const int threads = 128;
  const size_t shared = 2 * a.pairs * sizeof(float);
  rope_kernel<T><<<static_cast<unsigned>(blocks), threads, shared, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope_rotate_inplace(const RopeLaunch& a, cudaStream_t stream) {
  if (a.x == nullptr || a.positions == nullptr || a.inv_freq == nullptr)
    return cudaErrorInvalidValue;
  if (2 * a.pairs > a.head_dim) return cudaErrorInvalidValue;
  switch (a.storage) {
    case Storage::kFloat32:
      return launch<float>(a, stream);
    case Storage::kBFloat16:
      return launch<__nv_bfloat16>(a, stream);
    case Storage::kFloat16:
      return launch<__half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace posenc::cuda
