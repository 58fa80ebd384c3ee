// CUDA RoPE kernels; interface and math in include/posenc/kernels/rope_cuda.h.
// Reference (specification, test oracle): rope_apply in src/functional/rope.cpp.
//   rope_rotate_tables:  cos/sin tables (the path behind rope_fused* on CUDA tensors), q and k in
//                        one launch, 16-byte vector loads and stores where alignment allows
// Two modes, chosen per launch (RopeTableLaunch::eager, a template argument of the kernel so the
// default path's code is untouched):
//   default  per-pair tables [.., F]: y_a = T(x_a c - x_b s) in float32, rounded once to the
//            storage type T (nvcc may contract a product and the sum into one FMA)
//   eager    tables [.., 2F] in x's layout, each output element reading its own entries:
//            y_a = T(r(x_a c_a) - r(x_b s_a)), y_b = T(r(x_b c_b) + r(x_a s_b)), r(v) =
//            float(T(v)), every product and the sum with __fmul_rn / __fsub_rn / __fadd_rn (never
//            contracted): eager PyTorch's `x * cos + rotate_half(x) * sin` (transformers'
//            apply_rotary_pos_emb, GLM's rotate_every_two for the interleaved layout), three
//            element-wise ops that each compute in float32 and round to T (ATen's opmath;
//            rotate_half's negation is exact, and r(-v) = -r(v)), so the result is eager's to the
//            bit for float32, bfloat16 and float16 whatever the tables hold (posenc::apply_rotary's
//            CUDA path: no check of the table values, hence no device wait)
#include "launch.cuh"
#include "posenc/kernels/rope_cuda.h"
#include "storage.cuh"

namespace posenc::cuda {

namespace {

// ---- table-driven rotation (rope_fused* on CUDA tensors) ---------------------------------------

// N elements of T loaded or stored as one aligned vector (16 bytes at most).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// v rounded to the storage type T and back (float32: v itself).
template <typename T>
__device__ __forceinline__ float rounded(float v) {
  T t;
  store(&t, v);
  return load(&t);
}

// One pair with one shared table entry: (ya, yb) = (xa c - xb s, xb c + xa s), stored as T,
// rounded once (the default mode).
template <typename T>
__device__ __forceinline__ void rotate_pair(float xa, float xb, float c, float s, T* ya, T* yb) {
  store(ya, xa * c - xb * s);
  store(yb, xb * c + xa * s);
}

// One pair with each member's own entries (the eager mode): ya = xa ca - xb sa,
// yb = xb cb + xa sb, each product and the sum rounded to T.
template <typename T>
__device__ __forceinline__ void rotate_pair_eager(float xa, float xb, float ca, float sa, float cb,
                                                  float sb, T* ya, T* yb) {
  store(ya, __fsub_rn(rounded<T>(__fmul_rn(xa, ca)), rounded<T>(__fmul_rn(xb, sa))));
  store(yb, __fadd_rn(rounded<T>(__fmul_rn(xb, cb)), rounded<T>(__fmul_rn(xa, sb))));
}

// grid: one block per token (b, n). Thread w of tensor t: head w / (F / V), pairs
// [i0, i0 + V) with i0 = V * (w % (F / V)).
//   half:        a = row[i0 .. i0+V), b = row[F+i0 .. F+i0+V)   (two vector loads)
//   interleaved: row[2 i0 .. 2 i0 + 2V) = a0 b0 a1 b1 ..       (one vector load)
// Table rows: default [F], entry i for pair i; eager [2F], the entries of x's own positions
// (half: i and F + i; interleaved: 2i and 2i + 1).
template <typename T, int V, bool kEager>
__global__ void rope_table_kernel(RopeTableLaunch a) {
  const int64_t token = blockIdx.x;  // b * tokens + n
  const int64_t b = token / a.tokens, n = token % a.tokens;
  const int64_t row = (a.table_batched ? token : n) * (kEager ? 2 * a.pairs : a.pairs);
  const float* cos_row = a.cos + row;
  const float* sin_row = a.sin + row;
  const int groups = static_cast<int>(a.pairs / V);
  for (int t = 0; t < a.count; ++t) {
    const RopeTableTensor& u = a.tensors[t];
    const T* xb = static_cast<const T*>(u.x) + b * u.x_stride_batch + n * u.x_stride_token;
    T* yb = static_cast<T*>(u.y) + b * u.y_stride_batch + n * u.y_stride_token;
    const int work = static_cast<int>(u.heads) * groups;
    for (int w = threadIdx.x; w < work; w += blockDim.x) {
      const int h = w / groups, i0 = (w % groups) * V;
      const T* xr = xb + h * u.x_stride_head;
      T* yr = yb + h * u.y_stride_head;
      if constexpr (!kEager) {
        float c[V], s[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          c[v] = __ldg(cos_row + i0 + v);
          s[v] = __ldg(sin_row + i0 + v) * a.sign;
        }
        if (!a.interleaved) {
          const Pack<T, V> pa = *reinterpret_cast<const Pack<T, V>*>(xr + i0);
          const Pack<T, V> pb = *reinterpret_cast<const Pack<T, V>*>(xr + i0 + a.pairs);
          Pack<T, V> oa, ob;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            rotate_pair<T>(load(&pa.v[v]), load(&pb.v[v]), c[v], s[v], &oa.v[v], &ob.v[v]);
          }
          *reinterpret_cast<Pack<T, V>*>(yr + i0) = oa;
          *reinterpret_cast<Pack<T, V>*>(yr + i0 + a.pairs) = ob;
        } else {
          const Pack<T, 2 * V> p = *reinterpret_cast<const Pack<T, 2 * V>*>(xr + 2 * i0);
          Pack<T, 2 * V> o;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            rotate_pair<T>(load(&p.v[2 * v]), load(&p.v[2 * v + 1]), c[v], s[v], &o.v[2 * v],
                           &o.v[2 * v + 1]);
          }
          *reinterpret_cast<Pack<T, 2 * V>*>(yr + 2 * i0) = o;
        }
      } else {
        if (!a.interleaved) {
          const Pack<T, V> pa = *reinterpret_cast<const Pack<T, V>*>(xr + i0);
          const Pack<T, V> pb = *reinterpret_cast<const Pack<T, V>*>(xr + i0 + a.pairs);
          Pack<T, V> oa, ob;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const int64_t ia = i0 + v, ib = a.pairs + i0 + v;
            rotate_pair_eager<T>(load(&pa.v[v]), load(&pb.v[v]), __ldg(cos_row + ia),
                                 __ldg(sin_row + ia), __ldg(cos_row + ib), __ldg(sin_row + ib),
                                 &oa.v[v], &ob.v[v]);
          }
          *reinterpret_cast<Pack<T, V>*>(yr + i0) = oa;
          *reinterpret_cast<Pack<T, V>*>(yr + i0 + a.pairs) = ob;
        } else {
          const Pack<T, 2 * V> p = *reinterpret_cast<const Pack<T, 2 * V>*>(xr + 2 * i0);
          Pack<T, 2 * V> o;
#pragma unroll
          for (int v = 0; v < V; ++v) {
            const int64_t ia = 2 * (i0 + v), ib = ia + 1;
            rotate_pair_eager<T>(load(&p.v[2 * v]), load(&p.v[2 * v + 1]), __ldg(cos_row + ia),
                                 __ldg(sin_row + ia), __ldg(cos_row + ib), __ldg(sin_row + ib),
                                 &o.v[2 * v], &o.v[2 * v + 1]);
          }
          *reinterpret_cast<Pack<T, 2 * V>*>(yr + 2 * i0) = o;
        }
      }
    }
    if (u.y != u.x) {  // out of place: dims 2F..Dh-1 pass through
      const int rest = static_cast<int>(u.head_dim - 2 * a.pairs);
      const int copies = static_cast<int>(u.heads) * rest;
      for (int w = threadIdx.x; w < copies; w += blockDim.x) {
        const int h = w / rest, d = static_cast<int>(2 * a.pairs) + w % rest;
        yb[h * u.y_stride_head + d] = xb[h * u.x_stride_head + d];
      }
    }
  }
}

// The widest V (pairs per thread) that every pointer, stride and F allows: 16-byte vectors.
template <typename T>
int vector_width(const RopeTableLaunch& a) {
  const int elements =
      a.interleaved ? static_cast<int>(16 / sizeof(T)) / 2 : static_cast<int>(16 / sizeof(T));
  for (int v = elements; v > 1; v /= 2) {
    const int64_t span = a.interleaved ? 2 * v : v;  // elements per vector
    bool ok = a.pairs % v == 0;
    for (int t = 0; t < a.count && ok; ++t) {
      const RopeTableTensor& u = a.tensors[t];
      const uintptr_t bytes = span * sizeof(T);
      ok = reinterpret_cast<uintptr_t>(u.x) % bytes == 0 &&
           reinterpret_cast<uintptr_t>(u.y) % bytes == 0;
      for (int64_t stride : {u.x_stride_batch, u.x_stride_token, u.x_stride_head, u.y_stride_batch,
                             u.y_stride_token, u.y_stride_head})
        ok = ok && stride % span == 0;
      ok = ok && (a.interleaved || a.pairs % span == 0);  // b = a + F stays aligned
    }
    if (ok) return v;
  }
  return 1;
}

template <typename T, bool kEager>
void launch_width(int width, unsigned grid, int threads, cudaStream_t stream,
                  const RopeTableLaunch& a) {
  switch (width) {
    case 8:
      POSENC_LAUNCH(grid, threads, 0, stream, rope_table_kernel<T, 8, kEager>)(a);
      break;
    case 4:
      POSENC_LAUNCH(grid, threads, 0, stream, rope_table_kernel<T, 4, kEager>)(a);
      break;
    case 2:
      POSENC_LAUNCH(grid, threads, 0, stream, rope_table_kernel<T, 2, kEager>)(a);
      break;
    default:
      POSENC_LAUNCH(grid, threads, 0, stream, rope_table_kernel<T, 1, kEager>)(a);
  }
}

template <typename T>
cudaError_t launch_tables(const RopeTableLaunch& a, cudaStream_t stream) {
  const int64_t blocks = a.batch * a.tokens;
  if (blocks == 0 || a.pairs == 0) {
    bool copies = false;
    for (int t = 0; t < a.count; ++t) copies = copies || a.tensors[t].x != a.tensors[t].y;
    if (blocks == 0 || !copies) return cudaSuccess;  // F = 0 out of place: still copy
  }
  int64_t widest = 0;
  for (int t = 0; t < a.count; ++t)
    widest = widest > a.tensors[t].heads * a.tensors[t].head_dim / 2
                 ? widest
                 : a.tensors[t].heads * a.tensors[t].head_dim / 2;
  const int threads = widest >= 256 ? 256 : (widest >= 128 ? 128 : 64);
  const auto grid = static_cast<unsigned>(blocks);
  const int width = a.pairs == 0 ? 1 : vector_width<T>(a);
  if (a.eager) {
    launch_width<T, true>(width, grid, threads, stream, a);
  } else {
    launch_width<T, false>(width, grid, threads, stream, a);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t rope_rotate_tables(const RopeTableLaunch& a, cudaStream_t stream) {
  if (a.count < 1 || a.count > 2 || a.cos == nullptr || a.sin == nullptr || a.pairs < 0 ||
      (a.eager && a.sign != 1.0f))  // eager: no inverse (the rotation of unequal members' tables)
    return cudaErrorInvalidValue;
  for (int t = 0; t < a.count; ++t) {
    const RopeTableTensor& u = a.tensors[t];
    if (u.x == nullptr || u.y == nullptr || 2 * a.pairs > u.head_dim) return cudaErrorInvalidValue;
  }
  if (a.batch * a.tokens > 0x7fffffff) return cudaErrorInvalidConfiguration;  // grid.x
  switch (a.storage) {
    case Storage::kFloat32:
      return launch_tables<float>(a, stream);
    case Storage::kBFloat16:
      return launch_tables<__nv_bfloat16>(a, stream);
    case Storage::kFloat16:
      return launch_tables<__half>(a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace posenc::cuda
