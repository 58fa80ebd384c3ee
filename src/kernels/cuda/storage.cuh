// Loads and stores of the storage types the CUDA kernels take (fp32, bf16, fp16), converting
// to and from the fp32 they compute in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace posenc::cuda {

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

}  // namespace posenc::cuda
