// CUDA attention forward with the bias computed on the fly; interface, math and limits in
// include/posenc/kernels/attention_cuda.h. Specification and test oracle: attention_reference
// (src/kernels/autograd/attention_autograd.cpp); the CPU kernel (src/kernels/cpu/attention_cpu.cpp)
// follows the same online softmax:
//   per key tile:  m' = max(m, max_j s_ij),  p_ij = exp(s_ij - m'),  alpha = exp(m - m')
//                  l' = l alpha + sum_j p_ij,  acc' = acc alpha + sum_j p_ij v_j
//   at the end:    out_i = acc / l,  lse_i = m + log(l)   (l = 0: out 0, lse -inf)
//
// One block per (b, h, tile of kBlockQ query rows); shared memory (fp32):
//   qs [kBlockQ, D]   the query tile, loaded once
//   ks [kBlockK, D+1] the key tile (+1: lanes read different rows at the same d, no bank conflict)
//   vs [kBlockK, Dv]  the value tile
// Warp w owns query rows [8w, 8w+8); lane c holds the score of key j0 + c for each of them, so a
// row's max and sum are warp shuffles, and acc[row][d] (d = lane + 32 chunk) stays in registers.
#include <cfloat>
#include <cmath>

#include "posenc/kernels/attention_cuda.h"
#include "storage.cuh"

namespace posenc::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockQ = 32;
constexpr int kBlockK = 32;  // one key per lane
constexpr int kRowsPerWarp = kBlockQ / kWarps;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

// kChunks: Dv <= 32 kChunks (acc registers per row).
template <typename T, int kChunks>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(AttentionLaunch a) {
  extern __shared__ float shared[];
  const int dim = static_cast<int>(a.dim), dim_v = static_cast<int>(a.dim_v), ldk = dim + 1;
  float* qs = shared;              // [kBlockQ, D]
  float* ks = qs + kBlockQ * dim;  // [kBlockK, D + 1]
  float* vs = ks + kBlockK * ldk;  // [kBlockK, Dv]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_blocks = (a.nq + kBlockQ - 1) / kBlockQ;
  const int64_t qb = blockIdx.x % q_blocks, bh = blockIdx.x / q_blocks;
  const int64_t h = bh % a.heads, b = bh / a.heads;
  const int64_t i0 = qb * kBlockQ;

  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_batch + h * a.q_stride_head;
  const T* k = static_cast<const T*>(a.k) + b * a.k_stride_batch + h * a.k_stride_head;
  const T* v = static_cast<const T*>(a.v) + b * a.v_stride_batch + h * a.v_stride_head;
  for (int idx = threadIdx.x; idx < kBlockQ * dim; idx += kThreads) {
    const int r = idx / dim, d = idx % dim;
    const int64_t i = i0 + r;
    qs[idx] = i < a.nq ? load(q + i * a.q_stride_token + d) : 0.0f;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
  double pq[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    m[rr] = -INFINITY;
    l[rr] = 0.0f;
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    pq[rr] = a.q_positions != nullptr && i < a.nq ? a.q_positions[i] : 0.0;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] = 0.0f;
  }
  const float slope = a.bias == AttentionBias::kAlibi ? a.slopes[h] : 0.0f;
  const int64_t offset = a.nk - a.nq;  // causal: key j visible to query i when j <= i + offset
  int64_t j_end = a.nk;
  if (a.causal) {
    const int64_t i_last = (i0 + kBlockQ < a.nq ? i0 + kBlockQ : a.nq) - 1;
    j_end = i_last + offset + 1 < a.nk ? i_last + offset + 1 : a.nk;
  }

  for (int64_t j0 = 0; j0 < j_end; j0 += kBlockK) {
    __syncthreads();  // the previous tile is consumed (and qs is written, the first time)
    for (int idx = threadIdx.x; idx < kBlockK * dim; idx += kThreads) {
      const int c = idx / dim, d = idx % dim;
      const int64_t j = j0 + c;
      ks[c * ldk + d] = j < a.nk ? load(k + j * a.k_stride_token + d) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kBlockK * dim_v; idx += kThreads) {
      const int c = idx / dim_v, d = idx % dim_v;
      const int64_t j = j0 + c;
      vs[idx] = j < a.nk ? load(v + j * a.v_stride_token + d) : 0.0f;
    }
    __syncthreads();

    const int64_t j = j0 + lane;
    const bool key_real = j < a.nk && (a.key_keep == nullptr || a.key_keep[b * a.nk + j] != 0);
    const double pk = key_real && a.k_positions != nullptr ? a.k_positions[j] : 0.0;
    // scores: d outer, so each key element is read from shared memory once for the 8 rows
    float p[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = 0.0f;
    const float* qtile = qs + warp * kRowsPerWarp * dim;
    const float* krow = ks + lane * ldk;
    for (int d = 0; d < dim; ++d) {
      const float kd = krow[d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = fmaf(qtile[rr * dim + d], kd, p[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t i = i0 + warp * kRowsPerWarp + rr;
      float s = p[rr] * a.scale;
      if (a.bias == AttentionBias::kAlibi) {
        const double diff = pq[rr] - pk;
        s -= slope * static_cast<float>(a.symmetric ? fabs(diff) : diff);
      } else if (a.bias == AttentionBias::kBucketTable && key_real && i < a.nq) {
        const int64_t rel = __double2ll_rn(pk) - __double2ll_rn(pq[rr]) - a.offset_min;
        s += a.table[static_cast<int64_t>(a.bucket_of_offset[rel]) * a.heads + h];
      }
      const bool visible = key_real && i < a.nq && (!a.causal || j <= i + offset);
      p[rr] = visible ? s : -INFINITY;
    }
    // online softmax, one row per rr (all lanes of the warp hold the row's m and l)
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const float m_new = fmaxf(m[rr], warp_max(p[rr]));
      if (m_new == -INFINITY) {  // nothing visible yet: contributes nothing
        p[rr] = 0.0f;
        continue;
      }
      const float alpha = expf(m[rr] - m_new);  // m = -inf: 0 (acc and l are 0 then)
      p[rr] = expf(p[rr] - m_new);
      l[rr] = l[rr] * alpha + warp_sum(p[rr]);
      m[rr] = m_new;
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] *= alpha;
    }
    // acc += P V: key c's weight for row rr is lane c's p[rr]
    const int cols = static_cast<int>(a.nk - j0 < kBlockK ? a.nk - j0 : kBlockK);
    for (int c = 0; c < cols; ++c) {
      float vrow[kChunks];
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) {
        const int d = lane + 32 * ch;
        vrow[ch] = d < dim_v ? vs[c * dim_v + d] : 0.0f;
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pc = __shfl_sync(kFullMask, p[rr], c);
#pragma unroll
        for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] = fmaf(pc, vrow[ch], acc[rr][ch]);
      }
    }
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= a.nq) break;
    const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
    T* orow = out + ((b * a.nq + i) * a.heads + h) * a.dim_v;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      const int d = lane + 32 * ch;
      if (d < dim_v) store(orow + d, acc[rr][ch] * inv);
    }
    if (lane == 0)
      a.lse[(b * a.heads + h) * a.nq + i] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
  }
}

template <typename T, int kChunks>
cudaError_t launch(const AttentionLaunch& a, cudaStream_t stream) {
  const size_t shared =
      sizeof(float) * (kBlockQ * a.dim + kBlockK * (a.dim + 1) + kBlockK * a.dim_v);
  auto kernel = attention_forward_kernel<T, kChunks>;
  if (shared > 48 * 1024) {  // above the default limit: opt in (sm_80: 163 KiB, sm_90: 227 KiB)
    const cudaError_t err = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (err != cudaSuccess) return err;
  }
  const int64_t blocks = a.batch * a.heads * ((a.nq + kBlockQ - 1) / kBlockQ);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(blocks), kThreads, shared, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_for_dim_v(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.dim_v <= 32) return launch<T, 1>(a, stream);
  if (a.dim_v <= 64) return launch<T, 2>(a, stream);
  if (a.dim_v <= 128) return launch<T, 4>(a, stream);
  return launch<T, 8>(a, stream);
}

}  // namespace

cudaError_t attention_forward(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.batch < 0 || a.heads < 0 || a.nq < 0 || a.nk < 0) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.heads == 0 || a.nq == 0) return cudaSuccess;
  if (a.q == nullptr || (a.nk > 0 && (a.k == nullptr || a.v == nullptr)) || a.out == nullptr ||
      a.lse == nullptr || a.dim < 1 || a.dim > kAttentionMaxDim || a.dim_v < 1 ||
      a.dim_v > kAttentionMaxDim)
    return cudaErrorInvalidValue;
  if (a.bias == AttentionBias::kAlibi &&
      (a.slopes == nullptr || a.q_positions == nullptr || a.k_positions == nullptr))
    return cudaErrorInvalidValue;
  if (a.bias == AttentionBias::kBucketTable &&
      (a.table == nullptr || a.bucket_of_offset == nullptr || a.q_positions == nullptr ||
       a.k_positions == nullptr || a.offset_count < 1))
    return cudaErrorInvalidValue;
  switch (a.storage) {
    case Storage::kFloat32:
      return launch_for_dim_v<float>(a, stream);
    case Storage::kBFloat16:
      return launch_for_dim_v<__nv_bfloat16>(a, stream);
    case Storage::kFloat16:
      return launch_for_dim_v<__half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace posenc::cuda
