// CUDA attention forward and backward with the bias computed on the fly; interface, math and
// limits in include/posenc/kernels/attention_cuda.h. Specification and test oracle:
// attention_reference (src/kernels/attention_fused.cpp); the CPU kernel
// (src/kernels/cpu/attention_cpu.cpp) follows the same online softmax (Dao et al. 2022, 2023):
//   per key tile:  m' = max(m, max_j s_ij),  p_ij = exp(s_ij - m'),  alpha = exp(m - m')
//                  l' = l alpha + sum_j p_ij,  acc' = acc alpha + sum_j p_ij v_j
//   at the end:    out_i = acc / l,  lse_i = m + log(l)   (l = 0: out 0, lse -inf)
// A NaN score (q, k, the bias; inf - inf) makes its row NaN: fmaxf passes over a NaN, which then
// reaches expf(s - m) and l, and a row whose max is -inf is checked for a NaN (warp_max of x != x).
// and the backward recomputes p_ij = exp(s_ij - lse_i) tile by tile (see the header).
//
// Forward: one block per (b, h, tile of kBlockQ query rows); shared memory (fp32):
//   qs [kBlockQ, D]   the query tile, loaded once
//   ks [kBlockK, D+1] the key tile (+1: lanes read different rows at the same d, no bank conflict)
//   vs [kBlockK, Dv]  the value tile
// Warp w owns query rows [8w, 8w+8); lane c holds the score of key j0 + c for each of them, so a
// row's max and sum are warp shuffles, and acc[row][d] (d = lane + 32 chunk) stays in registers.
// Backward dQ has the forward's shape (dO tile beside the q tile, v tile padded like k); backward
// dK/dV is its transpose: warp w owns key rows, lane c holds query i0 + c.
// Packed samples and the variate bias (kIds = true, a second instantiation of each kernel, so the
// kernels without ids keep their registers): the ids of a block's own tile (its query tile; dK/dV:
// its key tile) sit in shared memory ahead of the fp32 tiles (int64 first, for its alignment), the
// other side's ids are one per lane; the loops run only over the tiles whose samples meet the
// block's (sample_first/sample_last of the tile's first and last token), so a packed batch costs
// the sum of its samples' squares, not N^2. The variate bias's gradient: per-thread sums of dS,
// reduced over the block in a fixed order into dvariate_partial (no atomics: deterministic).
#include <cfloat>
#include <cmath>

#include "launch.cuh"
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
static_assert(kBlockK == kAttentionKeyTile, "dvariate_partial's key tiles are the dK/dV blocks'");
// a tile's ids in shared memory: variate [32] int64, then sample_first [32] int32 (384 bytes, a
// multiple of 16: the fp32 tiles after them keep their alignment)
constexpr int kTileIds = 32;
static_assert(kBlockQ == kTileIds && kBlockK == kTileIds, "one id per tile row");
constexpr size_t kTileIdBytes = kTileIds * (sizeof(int64_t) + sizeof(int32_t));

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

// The biased logit of query i and key j, or -inf where j is not visible to i (padding, another
// sample, causal, or a row/column past the end). key_real: a real key of the query's sample;
// variate: the variate bias's term (read only with variate_ids), added after the position bias as
// on the CPU. bucket: the T5 bucket used (kBucketTable), else untouched.
template <bool kIds>
__device__ __forceinline__ float logit(const AttentionLaunch& a, float dot, int64_t h, float slope,
                                       int64_t i, double pq, int64_t j, double pk, bool key_real,
                                       float variate, int* bucket) {
  const bool visible = key_real && i < a.nq && (!a.causal || j <= i + (a.nk - a.nq));
  if (!visible) return -INFINITY;
  float s = dot * a.scale;
  if (a.bias == AttentionBias::kAlibi) {
    const double diff = pq - pk;
    s -= slope * static_cast<float>(a.symmetric ? fabs(diff) : diff);
  } else if (a.bias == AttentionBias::kBucketTable) {
    const int64_t rel = __double2ll_rn(pk) - __double2ll_rn(pq) - a.offset_min;
    const int bk = a.bucket_of_offset[rel];
    *bucket = bk;
    s += a.table[static_cast<int64_t>(bk) * a.heads + h];
  }
  if (kIds && a.variate_ids != nullptr) s += variate;
  return s;
}

// Token t's sample (its first token) and variate id; -1 where there is none (no packed samples,
// no variate bias, or not a token: a row or column past the end, which logit masks anyway), so
// that without samples every query and key compare equal.
__device__ __forceinline__ int sample_of(const AttentionLaunch& a, int64_t b, int64_t t,
                                         bool token) {
  return a.sample_first != nullptr && token ? a.sample_first[b * a.nk + t] : -1;
}
__device__ __forceinline__ int64_t variate_of(const AttentionLaunch& a, int64_t b, int64_t t,
                                              bool token) {
  return a.variate_ids != nullptr && token ? a.variate_ids[b * a.nk + t] : -1;
}

// Packed samples: the key range [*begin, *end) the query tile at i0 visits, narrowed to the
// samples of its first and last query (the first key tile starts at the first sample's first key:
// no key outside those samples is read); unchanged without them.
__device__ __forceinline__ void packed_key_range(const AttentionLaunch& a, int64_t b, int64_t i0,
                                                 int64_t* begin, int64_t* end) {
  if (a.sample_first == nullptr) return;
  const int64_t i_last = (i0 + kBlockQ < a.nq ? i0 + kBlockQ : a.nq) - 1;
  const int64_t offset = a.nk - a.nq, row = b * a.nk;
  *begin = a.sample_first[row + i0 + offset];
  const int64_t last = static_cast<int64_t>(a.sample_last[row + i_last + offset]) + 1;
  if (last < *end) *end = last;
}

__device__ __forceinline__ bool key_is_real(const AttentionLaunch& a, int64_t b, int64_t j) {
  return j < a.nk && (a.key_keep == nullptr || a.key_keep[b * a.nk + j] != 0);
}

// acc[rr][ch] += sum_c w_c(rr) tile[c][d] (d = lane + 32 ch < width): row rr's weight for tile
// row c sits in lane c of w[rr]. Tile rows have stride ld; rows c < count take part. This is
// P V (forward), dS K (dQ), P^T dO (dV) and dS^T Q (dK).
template <int kChunks>
__device__ __forceinline__ void add_weighted_rows(float (&acc)[kRowsPerWarp][kChunks],
                                                  const float (&w)[kRowsPerWarp], const float* tile,
                                                  int ld, int width, int count, int lane) {
  for (int c = 0; c < count; ++c) {
    float row[kChunks];
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      const int d = lane + 32 * ch;
      row[ch] = d < width ? tile[c * ld + d] : 0.0f;
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const float wc = __shfl_sync(kFullMask, w[rr], c);
#pragma unroll
      for (int ch = 0; ch < kChunks; ++ch) acc[rr][ch] = fmaf(wc, row[ch], acc[rr][ch]);
    }
  }
}

// kChunks: Dv <= 32 kChunks (acc registers per row).
template <typename T, int kChunks, bool kIds>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(AttentionLaunch a) {
  POSENC_EXTERN_SHARED(float, shared);
  const int dim = static_cast<int>(a.dim), dim_v = static_cast<int>(a.dim_v), ldk = dim + 1;
  int64_t* qvariate_s = reinterpret_cast<int64_t*>(shared);                   // [kBlockQ]
  int* qsample_s = reinterpret_cast<int*>(qvariate_s + kBlockQ);              // [kBlockQ]
  float* qs = kIds ? reinterpret_cast<float*>(qsample_s + kBlockQ) : shared;  // [kBlockQ, D]
  float* ks = qs + kBlockQ * dim;                                             // [kBlockK, D + 1]
  float* vs = ks + kBlockK * ldk;                                             // [kBlockK, Dv]
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
  const int64_t offset = a.nk - a.nq;   // causal: key j visible to query i when j <= i + offset
  if (kIds && threadIdx.x < kBlockQ) {  // query i is token i + offset
    const int64_t i = i0 + threadIdx.x;
    qsample_s[threadIdx.x] = sample_of(a, b, i + offset, i < a.nq);
    qvariate_s[threadIdx.x] = variate_of(a, b, i + offset, i < a.nq);
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
  const bool variate = kIds && a.variate_ids != nullptr;
  const float differ = variate ? a.variate_bias[h] : 0.0f;
  const float same = variate ? a.variate_bias[a.heads + h] : 0.0f;
  int64_t j_begin = 0, j_end = a.nk;
  if (a.causal) {
    const int64_t i_last = (i0 + kBlockQ < a.nq ? i0 + kBlockQ : a.nq) - 1;
    j_end = i_last + offset + 1 < a.nk ? i_last + offset + 1 : a.nk;
  }
  if (kIds) packed_key_range(a, b, i0, &j_begin, &j_end);

  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBlockK) {
    __syncthreads();  // the previous tile is consumed (and qs, the ids written, the first time)
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
    const bool key_real = key_is_real(a, b, j);
    const double pk = key_real && a.k_positions != nullptr ? a.k_positions[j] : 0.0;
    const int ksample = kIds ? sample_of(a, b, j, j < a.nk) : -1;
    const int64_t kvariate = kIds ? variate_of(a, b, j, j < a.nk) : -1;
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
      const int row = warp * kRowsPerWarp + rr;
      const int64_t i = i0 + row;
      const bool real = key_real && (!kIds || qsample_s[row] == ksample);  // same sample
      const float term = kIds && qvariate_s[row] == kvariate ? same : differ;
      int bucket = 0;
      p[rr] = logit<kIds>(a, p[rr], h, slope, i, pq[rr], j, pk, real, term, &bucket);
    }
    // online softmax, one row per rr (all lanes of the warp hold the row's m and l)
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      float m_new = fmaxf(m[rr], warp_max(p[rr]));
      if (m_new == -INFINITY) {  // warp-uniform: every lane holds the row's max
        // fmaxf passes over NaN: a row of NaN and -inf scores is NaN from here on (as
        // attention_reference), only a row whose scores are all -inf sees nothing yet
        if (warp_max(p[rr] != p[rr] ? 1.0f : 0.0f) == 0.0f) {  // nothing visible: contributes 0
          p[rr] = 0.0f;
          continue;
        }
        m_new = NAN;
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
    add_weighted_rows(acc, p, vs, dim_v, dim_v, cols, lane);
  }

  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= a.nq) break;
    // l == 0: the row saw no key (0, lse -inf); l NaN: a NaN score (NaN, lse NaN)
    const float inv = l[rr] == 0.0f ? 0.0f : 1.0f / l[rr];
    T* orow = out + ((b * a.nq + i) * a.heads + h) * a.dim_v;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      const int d = lane + 32 * ch;
      if (d < dim_v) store(orow + d, acc[rr][ch] * inv);
    }
    if (lane == 0)
      a.lse[(b * a.heads + h) * a.nq + i] = l[rr] == 0.0f ? -INFINITY : m[rr] + logf(l[rr]);
  }
}

// Dynamic shared memory above the default 48 KiB needs an opt-in per kernel
// (sm_80: up to 163 KiB, sm_90: 227 KiB).
template <typename Kernel>
cudaError_t allow_shared(Kernel kernel, size_t shared) {
  if (shared <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(shared));
}

template <typename T, int kChunks, bool kIds>
cudaError_t launch_forward(const AttentionLaunch& a, cudaStream_t stream) {
  const size_t shared =
      (kIds ? kTileIdBytes : 0) +
      sizeof(float) * (kBlockQ * a.dim + kBlockK * (a.dim + 1) + kBlockK * a.dim_v);
  auto kernel = attention_forward_kernel<T, kChunks, kIds>;
  const cudaError_t err = allow_shared(kernel, shared);
  if (err != cudaSuccess) return err;
  const int64_t blocks = a.batch * a.heads * ((a.nq + kBlockQ - 1) / kBlockQ);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const auto grid = static_cast<unsigned>(blocks);
  POSENC_LAUNCH(grid, kThreads, shared, stream, attention_forward_kernel<T, kChunks, kIds>)(a);
  return cudaGetLastError();
}

// The kernels with ids where the launch has packed samples or a variate bias.
template <typename T, int kChunks>
cudaError_t launch(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.sample_first != nullptr || a.variate_ids != nullptr)
    return launch_forward<T, kChunks, true>(a, stream);
  return launch_forward<T, kChunks, false>(a, stream);
}

template <typename T>
cudaError_t launch_for_dim_v(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.dim_v <= 32) return launch<T, 1>(a, stream);
  if (a.dim_v <= 64) return launch<T, 2>(a, stream);
  if (a.dim_v <= 128) return launch<T, 4>(a, stream);
  return launch<T, 8>(a, stream);
}

// ---- backward
// ------------------------------------------------------------------------------------

// dK, dV (and dtable, the variate bias's partial sums) for one (b, h, key tile). Shared memory
// (fp32 after the key tile's ids):
//   ks [kBlockK, D], vs [kBlockK, Dv]      the key tile (rows read as warp broadcasts)
//   qs [kBlockQ, D+1], dos [kBlockQ, Dv+1] the query tile (lane c reads row c: padded)
//   lse_s, delta_s [kBlockQ]; dtable_s [num_buckets] when dtable is wanted
// kChunks: max(D, Dv) <= 32 kChunks.
template <typename T, int kChunks, bool kIds>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dkdv_kernel(AttentionBackwardLaunch g) {
  const AttentionLaunch& a = g.forward;
  POSENC_EXTERN_SHARED(float, shared);
  const int dim = static_cast<int>(a.dim), dim_v = static_cast<int>(a.dim_v);
  const int ldq = dim + 1, ldo = dim_v + 1;
  int64_t* kvariate_s = reinterpret_cast<int64_t*>(shared);                   // [kBlockK]
  int* ksample_s = reinterpret_cast<int*>(kvariate_s + kBlockK);              // [kBlockK]
  float* ks = kIds ? reinterpret_cast<float*>(ksample_s + kBlockK) : shared;  // [kBlockK, D]
  float* vs = ks + kBlockK * dim;                                             // [kBlockK, Dv]
  float* qs = vs + kBlockK * dim_v;                                           // [kBlockQ, D + 1]
  float* dos = qs + kBlockQ * ldq;                                            // [kBlockQ, Dv + 1]
  float* lse_s = dos + kBlockQ * ldo;                                         // [kBlockQ]
  float* delta_s = lse_s + kBlockQ;                                           // [kBlockQ]
  float* dtable_s = delta_s + kBlockQ;                                        // [num_buckets]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t k_blocks = (a.nk + kBlockK - 1) / kBlockK;
  const int64_t kb = blockIdx.x % k_blocks, bh = blockIdx.x / k_blocks;
  const int64_t h = bh % a.heads, b = bh / a.heads;
  const int64_t j0 = kb * kBlockK;

  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_batch + h * a.q_stride_head;
  const T* k = static_cast<const T*>(a.k) + b * a.k_stride_batch + h * a.k_stride_head;
  const T* v = static_cast<const T*>(a.v) + b * a.v_stride_batch + h * a.v_stride_head;
  const T* dout = static_cast<const T*>(g.dout);
  const float* lse = a.lse + (b * a.heads + h) * a.nq;
  const float* delta = g.delta + (b * a.heads + h) * a.nq;
  for (int idx = threadIdx.x; idx < kBlockK * dim; idx += kThreads) {
    const int c = idx / dim, d = idx % dim;
    ks[idx] = j0 + c < a.nk ? load(k + (j0 + c) * a.k_stride_token + d) : 0.0f;
  }
  for (int idx = threadIdx.x; idx < kBlockK * dim_v; idx += kThreads) {
    const int c = idx / dim_v, d = idx % dim_v;
    vs[idx] = j0 + c < a.nk ? load(v + (j0 + c) * a.v_stride_token + d) : 0.0f;
  }
  if (g.dtable != nullptr)
    for (int64_t idx = threadIdx.x; idx < a.num_buckets; idx += kThreads) dtable_s[idx] = 0.0f;
  if (kIds && threadIdx.x < kBlockK) {
    const int64_t j = j0 + threadIdx.x;
    ksample_s[threadIdx.x] = sample_of(a, b, j, j < a.nk);
    kvariate_s[threadIdx.x] = variate_of(a, b, j, j < a.nk);
  }

  float dk[kRowsPerWarp][kChunks], dv[kRowsPerWarp][kChunks];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) dk[rr][ch] = dv[rr][ch] = 0.0f;
  }
  const float slope = a.bias == AttentionBias::kAlibi ? a.slopes[h] : 0.0f;
  const bool variate = kIds && a.variate_ids != nullptr;
  const float differ = variate ? a.variate_bias[h] : 0.0f;
  const float same = variate ? a.variate_bias[a.heads + h] : 0.0f;
  float dvariate_differ = 0.0f, dvariate_same = 0.0f;  // this thread's sums of dS
  const int64_t offset = a.nk - a.nq;                  // query i is token i + offset
  // causal: query i sees key j0 from i = j0 - (Nk - Nq) on; earlier query tiles contribute nothing
  int64_t i_begin = 0, i_end = a.nq;
  if (a.causal) {
    const int64_t first = j0 - offset;
    i_begin = first > 0 ? first / kBlockQ * kBlockQ : 0;
  }
  if (kIds && a.sample_first != nullptr) {  // the queries whose samples meet keys [j0, j_last]
    const int64_t j_last = (j0 + kBlockK < a.nk ? j0 + kBlockK : a.nk) - 1;
    const int64_t first = a.sample_first[b * a.nk + j0] - offset;
    const int64_t last = a.sample_last[b * a.nk + j_last] - offset + 1;
    if (first > i_begin) i_begin = first;  // no query outside those samples is read
    if (last < i_end) i_end = last;
  }

  for (int64_t i0 = i_begin; i0 < i_end; i0 += kBlockQ) {
    __syncthreads();  // the previous query tile is consumed (ks, vs, dtable_s, the ids written the
                      // first time)
    for (int idx = threadIdx.x; idx < kBlockQ * dim; idx += kThreads) {
      const int r = idx / dim, d = idx % dim;
      qs[r * ldq + d] = i0 + r < a.nq ? load(q + (i0 + r) * a.q_stride_token + d) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kBlockQ * dim_v; idx += kThreads) {
      const int r = idx / dim_v, d = idx % dim_v;
      const int64_t i = i0 + r;
      dos[r * ldo + d] =
          i < a.nq ? load(dout + ((b * a.nq + i) * a.heads + h) * a.dim_v + d) : 0.0f;
    }
    if (threadIdx.x < kBlockQ) {
      const int64_t i = i0 + threadIdx.x;
      lse_s[threadIdx.x] = i < a.nq ? lse[i] : 0.0f;
      delta_s[threadIdx.x] = i < a.nq ? delta[i] : 0.0f;
    }
    __syncthreads();

    const int64_t i = i0 + lane;
    const double pq = i < a.nq && a.q_positions != nullptr ? a.q_positions[i] : 0.0;
    const float lse_i = lse_s[lane], delta_i = delta_s[lane];
    const int qsample = kIds ? sample_of(a, b, i + offset, i < a.nq) : -1;
    const int64_t qvariate = kIds ? variate_of(a, b, i + offset, i < a.nq) : -1;
    float p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = ds[rr] = 0.0f;
    const float* ktile = ks + warp * kRowsPerWarp * dim;
    const float* vtile = vs + warp * kRowsPerWarp * dim_v;
    for (int d = 0; d < dim; ++d) {
      const float qd = qs[lane * ldq + d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = fmaf(qd, ktile[rr * dim + d], p[rr]);
    }
    for (int d = 0; d < dim_v; ++d) {  // dP = dO_i . v_j
      const float od = dos[lane * ldo + d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) ds[rr] = fmaf(od, vtile[rr * dim_v + d], ds[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int64_t j = j0 + warp * kRowsPerWarp + rr;
      // key j's padding and position, read again for each query tile rather than held across
      // the loop in 8 doubles and 8 flags (with them the half-precision kernels spilled)
      const bool real = key_is_real(a, b, j);
      const double pk = real && a.k_positions != nullptr ? a.k_positions[j] : 0.0;
      const int row = warp * kRowsPerWarp + rr;
      const bool same_variate = kIds && kvariate_s[row] == qvariate;
      int bucket = -1;
      const float x = logit<kIds>(a, p[rr], h, slope, i, pq, j, pk,
                                  real && (!kIds || ksample_s[row] == qsample),
                                  same_variate ? same : differ, &bucket);
      // masked: 0, NaN in a NaN row (lse NaN) as the reference's weights; visible: lse_i finite
      p[rr] = x == -INFINITY ? (lse_i == lse_i ? 0.0f : lse_i) : expf(x - lse_i);
      // masked: dS 0, also in a NaN row (delta NaN), as the reference's masked_fill
      ds[rr] = x == -INFINITY ? 0.0f : p[rr] * (ds[rr] - delta_i);
      if (g.dtable != nullptr && bucket >= 0 && ds[rr] != 0.0f)
        atomicAdd(dtable_s + bucket, ds[rr]);
      if (kIds) {
        if (same_variate)
          dvariate_same += ds[rr];
        else
          dvariate_differ += ds[rr];
      }
    }
    // dV_j += sum_c P_cj dO_c,  dK_j += sum_c dS_cj q_c  (query c's values sit in lane c)
    const int rows = static_cast<int>(a.nq - i0 < kBlockQ ? a.nq - i0 : kBlockQ);
    add_weighted_rows(dv, p, dos, ldo, dim_v, rows, lane);
    add_weighted_rows(dk, ds, qs, ldq, dim, rows, lane);
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t j = j0 + warp * kRowsPerWarp + rr;
    if (j >= a.nk) break;
    float* dkrow = g.dk + ((b * a.nk + j) * a.heads + h) * a.dim;
    float* dvrow = g.dv + ((b * a.nk + j) * a.heads + h) * a.dim_v;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      const int d = lane + 32 * ch;
      if (d < dim) dkrow[d] = dk[rr][ch] * a.scale;
      if (d < dim_v) dvrow[d] = dv[rr][ch];
    }
  }
  if (g.dtable != nullptr) {
    __syncthreads();
    for (int64_t idx = threadIdx.x; idx < a.num_buckets; idx += kThreads)
      if (dtable_s[idx] != 0.0f) atomicAdd(g.dtable + idx * a.heads + h, dtable_s[idx]);
  }
  if (kIds &&
      g.dvariate_partial != nullptr) {  // the block's two sums, in a fixed order: no atomics
    const float warp_differ = warp_sum(dvariate_differ), warp_same = warp_sum(dvariate_same);
    __syncthreads();  // lse_s is consumed: it takes the warps' sums
    if (lane == 0) {
      lse_s[2 * warp] = warp_differ;
      lse_s[2 * warp + 1] = warp_same;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += lse_s[2 * w + threadIdx.x];
      g.dvariate_partial[(bh * k_blocks + kb) * 2 + threadIdx.x] = sum;
    }
  }
}

// dQ for one (b, h, query tile): the forward's layout. Shared memory (fp32):
//   qs [kBlockQ, D], dos [kBlockQ, Dv]       the query tile (rows read as warp broadcasts)
//   ks [kBlockK, D+1], vs [kBlockK, Dv+1]    the key tile (lane c reads row c: padded)
template <typename T, int kChunks, bool kIds>
__global__ void __launch_bounds__(kThreads)
    attention_backward_dq_kernel(AttentionBackwardLaunch g) {
  const AttentionLaunch& a = g.forward;
  POSENC_EXTERN_SHARED(float, shared);
  const int dim = static_cast<int>(a.dim), dim_v = static_cast<int>(a.dim_v);
  const int ldk = dim + 1, ldv = dim_v + 1;
  int64_t* qvariate_s = reinterpret_cast<int64_t*>(shared);                   // [kBlockQ]
  int* qsample_s = reinterpret_cast<int*>(qvariate_s + kBlockQ);              // [kBlockQ]
  float* qs = kIds ? reinterpret_cast<float*>(qsample_s + kBlockQ) : shared;  // [kBlockQ, D]
  float* dos = qs + kBlockQ * dim;                                            // [kBlockQ, Dv]
  float* ks = dos + kBlockQ * dim_v;                                          // [kBlockK, D + 1]
  float* vs = ks + kBlockK * ldk;                                             // [kBlockK, Dv + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t q_blocks = (a.nq + kBlockQ - 1) / kBlockQ;
  const int64_t qb = blockIdx.x % q_blocks, bh = blockIdx.x / q_blocks;
  const int64_t h = bh % a.heads, b = bh / a.heads;
  const int64_t i0 = qb * kBlockQ;

  const T* q = static_cast<const T*>(a.q) + b * a.q_stride_batch + h * a.q_stride_head;
  const T* k = static_cast<const T*>(a.k) + b * a.k_stride_batch + h * a.k_stride_head;
  const T* v = static_cast<const T*>(a.v) + b * a.v_stride_batch + h * a.v_stride_head;
  const T* dout = static_cast<const T*>(g.dout);
  for (int idx = threadIdx.x; idx < kBlockQ * dim; idx += kThreads) {
    const int r = idx / dim, d = idx % dim;
    qs[idx] = i0 + r < a.nq ? load(q + (i0 + r) * a.q_stride_token + d) : 0.0f;
  }
  for (int idx = threadIdx.x; idx < kBlockQ * dim_v; idx += kThreads) {
    const int r = idx / dim_v, d = idx % dim_v;
    const int64_t i = i0 + r;
    dos[idx] = i < a.nq ? load(dout + ((b * a.nq + i) * a.heads + h) * a.dim_v + d) : 0.0f;
  }
  if (kIds && threadIdx.x < kBlockQ) {  // query i is token i + Nk - Nq
    const int64_t i = i0 + threadIdx.x;
    qsample_s[threadIdx.x] = sample_of(a, b, i + (a.nk - a.nq), i < a.nq);
    qvariate_s[threadIdx.x] = variate_of(a, b, i + (a.nk - a.nq), i < a.nq);
  }

  float lse_r[kRowsPerWarp], delta_r[kRowsPerWarp], dq[kRowsPerWarp][kChunks];
  double pq[kRowsPerWarp];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    const int64_t row = (b * a.heads + h) * a.nq + i;
    lse_r[rr] = i < a.nq ? a.lse[row] : 0.0f;
    delta_r[rr] = i < a.nq ? g.delta[row] : 0.0f;
    pq[rr] = a.q_positions != nullptr && i < a.nq ? a.q_positions[i] : 0.0;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) dq[rr][ch] = 0.0f;
  }
  const float slope = a.bias == AttentionBias::kAlibi ? a.slopes[h] : 0.0f;
  const bool variate = kIds && a.variate_ids != nullptr;
  const float differ = variate ? a.variate_bias[h] : 0.0f;
  const float same = variate ? a.variate_bias[a.heads + h] : 0.0f;
  int64_t j_begin = 0, j_end = a.nk;
  if (a.causal) {
    const int64_t i_last = (i0 + kBlockQ < a.nq ? i0 + kBlockQ : a.nq) - 1;
    const int64_t last = i_last + (a.nk - a.nq) + 1;
    j_end = last < a.nk ? last : a.nk;
  }
  if (kIds) packed_key_range(a, b, i0, &j_begin, &j_end);

  for (int64_t j0 = j_begin; j0 < j_end; j0 += kBlockK) {
    __syncthreads();  // the previous key tile is consumed (and qs, dos, the ids written, the first
                      // time)
    for (int idx = threadIdx.x; idx < kBlockK * dim; idx += kThreads) {
      const int c = idx / dim, d = idx % dim;
      ks[c * ldk + d] = j0 + c < a.nk ? load(k + (j0 + c) * a.k_stride_token + d) : 0.0f;
    }
    for (int idx = threadIdx.x; idx < kBlockK * dim_v; idx += kThreads) {
      const int c = idx / dim_v, d = idx % dim_v;
      vs[c * ldv + d] = j0 + c < a.nk ? load(v + (j0 + c) * a.v_stride_token + d) : 0.0f;
    }
    __syncthreads();

    const int64_t j = j0 + lane;
    const bool real = key_is_real(a, b, j);
    const double pk = real && a.k_positions != nullptr ? a.k_positions[j] : 0.0;
    const int ksample = kIds ? sample_of(a, b, j, j < a.nk) : -1;
    const int64_t kvariate = kIds ? variate_of(a, b, j, j < a.nk) : -1;
    float p[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = ds[rr] = 0.0f;
    const float* qtile = qs + warp * kRowsPerWarp * dim;
    const float* otile = dos + warp * kRowsPerWarp * dim_v;
    for (int d = 0; d < dim; ++d) {
      const float kd = ks[lane * ldk + d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) p[rr] = fmaf(qtile[rr * dim + d], kd, p[rr]);
    }
    for (int d = 0; d < dim_v; ++d) {
      const float vd = vs[lane * ldv + d];
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) ds[rr] = fmaf(otile[rr * dim_v + d], vd, ds[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int row = warp * kRowsPerWarp + rr;
      const int64_t i = i0 + row;
      int bucket = -1;
      const float x = logit<kIds>(a, p[rr], h, slope, i, pq[rr], j, pk,
                                  real && (!kIds || qsample_s[row] == ksample),
                                  kIds && qvariate_s[row] == kvariate ? same : differ, &bucket);
      const float pij = x == -INFINITY ? 0.0f : expf(x - lse_r[rr]);
      ds[rr] = x == -INFINITY ? 0.0f : pij * (ds[rr] - delta_r[rr]);  // masked: 0 (NaN rows too)
    }
    // dQ_i += sum_c dS_ic k_c  (key c's dS sits in lane c)
    const int cols = static_cast<int>(a.nk - j0 < kBlockK ? a.nk - j0 : kBlockK);
    add_weighted_rows(dq, ds, ks, ldk, dim, cols, lane);
  }

#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int64_t i = i0 + warp * kRowsPerWarp + rr;
    if (i >= a.nq) break;
    float* dqrow = g.dq + ((b * a.nq + i) * a.heads + h) * a.dim;
#pragma unroll
    for (int ch = 0; ch < kChunks; ++ch) {
      const int d = lane + 32 * ch;
      if (d < dim) dqrow[d] = dq[rr][ch] * a.scale;
    }
  }
}

template <typename T, int kChunks, bool kIds>
cudaError_t launch_backward_kernels(const AttentionBackwardLaunch& g, cudaStream_t stream) {
  const AttentionLaunch& a = g.forward;
  const int64_t q_blocks = a.batch * a.heads * ((a.nq + kBlockQ - 1) / kBlockQ);
  const int64_t k_blocks = a.batch * a.heads * ((a.nk + kBlockK - 1) / kBlockK);
  if (q_blocks > 0x7fffffff || k_blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  if (k_blocks > 0) {
    const size_t shared =
        (kIds ? kTileIdBytes : 0) +
        sizeof(float) * (kBlockK * (a.dim + a.dim_v) + kBlockQ * (a.dim + 1 + a.dim_v + 1) +
                         2 * kBlockQ + (g.dtable != nullptr ? a.num_buckets : 0));
    auto kernel = attention_backward_dkdv_kernel<T, kChunks, kIds>;
    cudaError_t err = allow_shared(kernel, shared);
    if (err != cudaSuccess) return err;
    const auto grid = static_cast<unsigned>(k_blocks);
    POSENC_LAUNCH(grid, kThreads, shared, stream, attention_backward_dkdv_kernel<T, kChunks, kIds>)
    (g);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const size_t shared =
      (kIds ? kTileIdBytes : 0) +
      sizeof(float) * (kBlockQ * (a.dim + a.dim_v) + kBlockK * (a.dim + 1 + a.dim_v + 1));
  auto kernel = attention_backward_dq_kernel<T, kChunks, kIds>;
  const cudaError_t err = allow_shared(kernel, shared);
  if (err != cudaSuccess) return err;
  const auto grid = static_cast<unsigned>(q_blocks);
  POSENC_LAUNCH(grid, kThreads, shared, stream, attention_backward_dq_kernel<T, kChunks, kIds>)(g);
  return cudaGetLastError();
}

template <typename T, int kChunks>
cudaError_t launch_backward(const AttentionBackwardLaunch& g, cudaStream_t stream) {
  if (g.forward.sample_first != nullptr || g.forward.variate_ids != nullptr)
    return launch_backward_kernels<T, kChunks, true>(g, stream);
  return launch_backward_kernels<T, kChunks, false>(g, stream);
}

template <typename T>
cudaError_t launch_backward_for_dims(const AttentionBackwardLaunch& g, cudaStream_t stream) {
  const int64_t widest = g.forward.dim > g.forward.dim_v ? g.forward.dim : g.forward.dim_v;
  if (widest <= 32) return launch_backward<T, 1>(g, stream);
  if (widest <= 64) return launch_backward<T, 2>(g, stream);
  if (widest <= 128) return launch_backward<T, 4>(g, stream);
  return launch_backward<T, 8>(g, stream);
}

// The forward's argument checks (both passes take the same launch).
cudaError_t check_arguments(const AttentionLaunch& a) {
  if (a.q == nullptr || (a.nk > 0 && (a.k == nullptr || a.v == nullptr)) || a.lse == nullptr ||
      a.dim < 1 || a.dim > kAttentionMaxDim || a.dim_v < 1 || a.dim_v > kAttentionMaxDim)
    return cudaErrorInvalidValue;
  if (a.bias == AttentionBias::kAlibi &&
      (a.slopes == nullptr || a.q_positions == nullptr || a.k_positions == nullptr))
    return cudaErrorInvalidValue;
  if (a.bias == AttentionBias::kBucketTable &&
      (a.table == nullptr || a.bucket_of_offset == nullptr || a.q_positions == nullptr ||
       a.k_positions == nullptr || a.offset_count < 1))
    return cudaErrorInvalidValue;
  // packed samples and the variate bias: each pair of pointers given together; the queries take
  // the last Nq ids
  if ((a.sample_first == nullptr) != (a.sample_last == nullptr) ||
      (a.variate_ids == nullptr) != (a.variate_bias == nullptr))
    return cudaErrorInvalidValue;
  if ((a.sample_first != nullptr || a.variate_ids != nullptr) && a.nq > a.nk)
    return cudaErrorInvalidValue;
  return cudaSuccess;
}

}  // namespace

cudaError_t attention_forward(const AttentionLaunch& a, cudaStream_t stream) {
  if (a.batch < 0 || a.heads < 0 || a.nq < 0 || a.nk < 0) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.heads == 0 || a.nq == 0) return cudaSuccess;
  if (a.out == nullptr) return cudaErrorInvalidValue;
  const cudaError_t err = check_arguments(a);
  if (err != cudaSuccess) return err;
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

cudaError_t attention_backward(const AttentionBackwardLaunch& g, cudaStream_t stream) {
  const AttentionLaunch& a = g.forward;
  if (a.batch < 0 || a.heads < 0 || a.nq < 0 || a.nk < 0) return cudaErrorInvalidValue;
  if (a.batch == 0 || a.heads == 0 || a.nq == 0) return cudaSuccess;
  if (g.dout == nullptr || g.delta == nullptr || g.dq == nullptr ||
      (a.nk > 0 && (g.dk == nullptr || g.dv == nullptr)) ||
      (g.dtable != nullptr && a.bias != AttentionBias::kBucketTable) ||
      (g.dvariate_partial != nullptr && a.variate_ids == nullptr))
    return cudaErrorInvalidValue;
  const cudaError_t err = check_arguments(a);
  if (err != cudaSuccess) return err;
  switch (a.storage) {
    case Storage::kFloat32:
      return launch_backward_for_dims<float>(g, stream);
    case Storage::kBFloat16:
      return launch_backward_for_dims<__nv_bfloat16>(g, stream);
    case Storage::kFloat16:
      return launch_backward_for_dims<__half>(g, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace posenc::cuda
