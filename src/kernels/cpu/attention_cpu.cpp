// Tiled CPU attention with the position bias computed on the fly (contract in
// posenc/kernels/attention_fused.h). Forward: for each (b, h, query block) an online softmax
// over key blocks (running max m, sum l, accumulator), as FlashAttention; backward: recompute
// each tile's probabilities from the saved log-sum-exp (FlashAttention-2), parallel over (b, h)
// so dK, dV and the per-head table gradient need no atomics. At the AVX2 and AVX-512 levels the
// tiles' products run on posenc's own register-blocked micro-kernels (attention_tiles_rows.h; where
// Dv is a multiple of 16 and, in the forward, Nq >= 32; the backward also needs D % 16 == 0): K and
// V packed once per head (forward) or key block (backward) into 16-key / 16-column panels, q (and
// dO) once per query block; in the forward, per 8 (AVX-512) or 6 (AVX2) query rows the scores strip
// is computed, biased, turned into probabilities in place while it sits in L1 and multiplied into
// the output rows from there (no pass over a materialized tile, no copy of P;
// attention_forward_own); the backward's five products read P and dS where they were written.
// Query blocks are whole micro-kernel calls (126 rows at AVX2's R = 6, 128 at AVX-512's 8), a
// short call (a block's last rows, a key block's last keys in the transposed products) runs the
// kernel compiled for its row count, and no kernel reads a lane past the problem's rows and keys:
// padding and stale scratch are never read (tests/test_attention_tiles.cpp fills them with NaN
// and puts a guard page after each operand). The
// other products (the scalar level, other widths, or POSENC_ATTENTION_GEMM=mkl) call LibTorch's
// BLAS (MKL on x86-64) directly on the operands' memory, as ATen's own CPU flash attention does
// (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: cpublas::gemm per tile):
// q, k, v, out and the gradients are [B, H, N, D] of any strides with unit stride in D (the
// operator passes the [B, N, H, D] tensors' transposed views, no copies). The softmax scale is
// the first product's alpha. In the MKL forward, a head's key and value blocks are packed once
// per thread for MKL's packed-matrix API (cblas_sgemm_pack: the scaled K^T block, the V block) and
// reused by every full query block of the head, and each full query block once for its
// products with the full key blocks, where per-tile sgemm calls re-pack every operand every time
// (K and V 16 times per head at N = 2048). Without MKL's symbols (another BLAS) the products go
// through at::mm on the same memory (POSENC_ATTENTION_GEMM=aten forces that path, =mkl the MKL
// path everywhere, for their tests). Bias and masks are plain loops over the tile, the softmax's
// max and exp-sum are the CPU level's rows (softmax_rows.h: Cephes' expf on 8 or 16 lanes;
// cpu_kernels.h).
// Shaw's query-dependent bias q_i . a[clip(j - i)] / sqrt(D) (Shaw et al. 2018) is read from
// qr = q a^T / sqrt(D), [Nq, 2K+1] per head; its backward sums dS_ij per (i, clip(j - i)) into
// dqr [Nq, 2K+1], then dq += dqr a / sqrt(D) and da += dqr^T q / sqrt(D).
// RoPE inside: each query block is rotated into a scratch tile as it is loaded, a head's keys
// once per thread into an [Nk, D] scratch (the backward: a head's queries once, each key block
// once); the backward computes dq', dk' for the rotated vectors and rotates them back (R^T =
// the rotation by -angle). No rotated copy of the whole q or k is made.
// Packed samples (Moirai's block-diagonal mask on sample_id, uni2ts' packed_attention_mask): each
// id one contiguous run per row, so the keys a query block can see are one interval [run_first of
// its first query, run_last of its last]; the forward visits only the key columns inside it, the
// backward only the query rows whose runs meet its key block, and the tiles in between mask the
// pairs of different ids with -inf. The binary variate bias (uni2ts' BinaryAttentionBias:
// weight[1, h] for equal variate ids, weight[0, h] otherwise) is added per pair; its gradient is
// two sums of dS per head, accumulated per (b, h) and summed over b (no atomics): per query row
// sum_{j same} dS_ij from the row's sums of P dP and P over its same-variate keys and all its
// keys, P normalized by its own row sum (sum_j dS_ij = 0 then holds to rounding: the float32 lse
// no longer scales the row), and weight[0, h]'s the opposite (a constant on a whole row changes
// no probability). Against uni2ts in float64 (tests/python/test_timeseries_models.py' Moirai-2
// model) this is under 5e-7 relative where uni2ts' own float32 autograd is 6e-7; summing dS
// directly gave 1.9e-6.
// Causal on ids (Moirai-2's packed_causal_attention_mask on time_id): key j is masked for query i
// when causal_ids[j] > causal_ids[i + Nk - Nq]; a tile is skipped (forward and backward) when the
// smallest id of its keys exceeds the largest of its queries (a variate-major packing: a query
// block of times [a, b] skips every key block of times > b in every variate).
#include "attention_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <unordered_set>

#include "attention_tiles.h"
#include "cpu_kernels.h"
#include "mkl_sgemm.h"
#include "parallel.h"
#include "rotate_row.h"

namespace posenc::detail {

namespace {

constexpr int64_t kBlockQ = 128;
constexpr int64_t kBlockK = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Non-finite scores, as attention_reference: a NaN anywhere in a row's scores (from q, k, the bias,
// or inf - inf after a +inf score) makes the row's output and log-sum-exp NaN; a row whose keys
// are all -inf (masked) gives 0. The online softmax gets there without a compare per element: a
// NaN score that the row max passes over (max_ps and std::max keep the other operand) reaches
// exp(s - m) and the sum l (NaN from then on: the output acc / l and lse = m + log l), and a NaN
// max is kept by the next std::max(m, .) (m first). Only a row whose max so far is -inf, taken as
// "no key yet", is scanned for a NaN (row_starts_nan), which then becomes its max; the end tells
// "no key" (l == 0) from NaN (l NaN) by l == 0, not l > 0.
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Whether a block's scores hold a NaN where their max is -inf (every other score masked).
bool row_starts_nan(const float* row, int64_t cols) {
  return std::any_of(row, row + cols, [](float x) { return std::isnan(x); });
}

// set_attention_cpu_poison_for_tests: scratch memory filled with a quiet NaN instead of zeros.
std::atomic<bool> poison_scratch{false};

// What the kernels' scratch buffers and the packed operands' padding start as: 0, or a quiet NaN
// while a test poisons them (no lane outside the problem's rows and keys may reach an output).
float scratch_fill() {
  return poison_scratch.load(std::memory_order_relaxed) ? std::numeric_limits<float>::quiet_NaN()
                                                        : 0.0f;
}

// A scratch tensor of n floats: uninitialized, or filled with the poison while a test sets it.
at::Tensor scratch(at::IntArrayRef sizes) {
  auto t = at::empty(sizes, at::kFloat);
  if (poison_scratch.load(std::memory_order_relaxed))
    t.fill_(std::numeric_limits<float>::quiet_NaN());
  return t;
}

// ---- The tiles' matrix products ----------------------------------------------------------------

// POSENC_ATTENTION_GEMM: unset or 'own' (the own micro-kernels at the AVX2 and AVX-512 levels,
// MKL at the scalar one), 'mkl' (MKL's sgemm for every product) or 'aten' (at::mm: the path of a
// LibTorch without MKL), the last two for their tests and measurements on machines with MKL.
const std::string& gemm_choice() {
  static const std::string choice = [] {
    const char* env = std::getenv("POSENC_ATTENTION_GEMM");
    std::string value = env != nullptr ? env : "";
    TORCH_CHECK(value.empty() || value == "own" || value == "mkl" || value == "aten",
                "POSENC_ATTENTION_GEMM must be 'own', 'mkl' or 'aten' (or unset), got '", value,
                "'");
    return value;
  }();
  return choice;
}

// Whether the products call MKL: where LibTorch exports it, unless POSENC_ATTENTION_GEMM=aten.
bool mkl_gemm() {
  static const bool use = sgemm_ != nullptr && gemm_choice() != "aten";
  return use;
}

// The own tile micro-kernels (attention_tiles.h) of this CPU level, or null (MKL's products).
// On the AVX-512 EPYC (Zen 4, one thread, BM_TileProducts) the AVX-512 kernel (8 x 32
// accumulators in 16 of 32 zmm registers) ran one tile's two products at 114 GFLOP/s and the AVX2
// kernel (6 x 16 in 12 of 16 ymm registers, no spill) at 110, against 98 for MKL's (its AVX2
// `zen` kernel, operands packed once; docs/performance.md). POSENC_ATTENTION_GEMM=mkl keeps MKL
// (CTest unit_attention_gemm_mkl, unit_attention_gemm_mkl_avx2).
const AttentionTileKernels* own_tile_kernels() {
  static const AttentionTileKernels* chosen = []() -> const AttentionTileKernels* {
    const std::string& choice = gemm_choice();
    if (choice == "mkl" || choice == "aten") return nullptr;
#if defined(__x86_64__)
    switch (cpu_kernels().capability) {
      case CpuCapability::kAvx512:
        return &kAvx512AttentionTiles;
      case CpuCapability::kAvx2:
        return &kAvx2AttentionTiles;
      default:
        return nullptr;
    }
#else
    return nullptr;
#endif
  }();
  return chosen;
}

// C [m, n] = alpha op(A) op(B) + beta C, all row-major with unit column stride: op(A) [m, k] is A
// [m, k] (row stride lda) or, trans_a, A [k, m] transposed; op(B) [k, n] is B [k, n] or, trans_b,
// B [n, k] transposed; C's row stride ldc; beta 0 (C is overwritten, whatever it held) or 1.
// Sizes and strides fit in int (checked by check_operand).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  // a leading dimension is read only between rows: one row may have any (Fortran wants >= width)
  lda = std::max<int64_t>(lda, trans_a ? m : k);
  ldb = std::max<int64_t>(ldb, trans_b ? k : n);
  if (mkl_gemm()) {  // column-major: C^T [n, m] = op(B)^T op(A)^T
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    const int la = static_cast<int>(lda), lb = static_cast<int>(ldb), lc = static_cast<int>(ldc);
    sgemm_(trans_b ? "T" : "N", trans_a ? "T" : "N", &ni, &mi, &ki, &alpha, b, &lb, a, &la, &beta,
           c, &lc);
    return;
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto view = [&](const float* x, int64_t rows, int64_t cols, int64_t ld, bool transposed) {
    auto t = at::from_blob(const_cast<float*>(x),
                           {transposed ? cols : rows, transposed ? rows : cols}, {ld, 1}, f32);
    return transposed ? t.t() : t;
  };
  auto c_view = at::from_blob(c, {m, n}, {ldc, 1}, f32);
  if (beta == 0.0f) {
    at::mm_out(c_view, view(a, m, k, lda, trans_a), view(b, k, n, ldb, trans_b));
    if (alpha != 1.0f) c_view.mul_(alpha);
  } else {
    c_view.addmm_(view(a, m, k, lda, trans_a), view(b, k, n, ldb, trans_b), 1.0, alpha);
  }
}

// MKL's packed-matrix API (row-major constants of mkl_cblas.h).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kAMatrix = 161,
              kBMatrix = 162;

bool packed_gemm_available() {
  return mkl_gemm() && cblas_sgemm_pack_get_size != nullptr && cblas_sgemm_pack != nullptr &&
         cblas_sgemm_compute != nullptr;
}

// Where each key block's packed K^T and V sit in a head's buffers (floats; the same for every
// head): MKL's packed layout depends on the product's sizes, so a block is packed for the full
// query block (kBlockQ rows) and its own column count, and only full query blocks use it.
struct PackLayout {
  std::vector<int64_t> k_offset, v_offset;  // [key blocks + 1]
};

int64_t packed_floats(int identifier, int64_t m, int64_t n, int64_t k) {
  const auto bytes = cblas_sgemm_pack_get_size(identifier, static_cast<int>(m), static_cast<int>(n),
                                               static_cast<int>(k));
  return (static_cast<int64_t>(bytes) + 63) / 64 * 16;  // whole cache lines
}

// One thread's packed blocks of one head (b * H + h), packed on first use.
struct PackedHead {
  at::Tensor k, v;  // float32 buffers of layout.k_offset.back() / v_offset.back() floats
  std::vector<uint8_t> k_ready, v_ready;
  int64_t head = -1;
};

// The sizes and strides an operand [B, H, N, D] hands to gemm: unit stride in D, int-sized.
struct Operand {
  float* base = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  float* rows(int64_t b, int64_t h) const { return base + b * batch_stride + h * head_stride; }
};

Operand operand(const char* name, const at::Tensor& t) {
  TORCH_CHECK(attention_cpu_reads_in_place(t), "attention (CPU kernel): ", name,
              " must be float32 [B, H, N, D] with unit stride in D and rows at least D apart, got ",
              t.scalar_type(), " sizes ", t.sizes(), " strides ", t.strides());
  const int64_t row_stride = t.size(2) > 1 ? t.stride(2) : t.size(3);
  return {t.data_ptr<float>(), t.stride(0), t.stride(1), row_stride};
}

// Whether any bias part or mask is applied inside the tiles.
bool has_tile_bias(const AttentionProblem& p) {
  return p.alibi || p.table_form != BiasForm::kNone || p.causal || !p.key_keep.empty() ||
         p.packed || p.variate || p.causal_by_ids;
}

// s: the tile scale q_i . k_j for rows [i0, i0+rows) and columns [j0, j0+cols), row stride ld.
// Adds the bias and masks in place.
void bias_and_mask(const AttentionProblem& p, float* s, int64_t ld, int64_t rows, int64_t cols,
                   int64_t i0, int64_t j0, int64_t b, int64_t h) {
  const int64_t offset = p.nk - p.nq;  // causal: keys j <= i + offset
  const uint8_t* keep = p.key_keep.empty() ? nullptr : p.key_keep.data() + b * p.nk;
  const float slope = p.alibi ? p.slopes[h] : 0.0f;
  const float* lut =
      p.table_form == BiasForm::kBucketTable ? p.lut.data() + h * p.rel_count : nullptr;
  const bool relative = p.table_form == BiasForm::kRelativeTable;
  const int64_t* sample = p.packed ? p.sample_ids.const_data_ptr<int64_t>() + b * p.nk : nullptr;
  const int64_t* variate = p.variate ? p.variate_ids.const_data_ptr<int64_t>() + b * p.nk : nullptr;
  const int64_t* causal_ids =
      p.causal_by_ids ? p.causal_ids.const_data_ptr<int64_t>() + b * p.nk : nullptr;
  const float differ = p.variate ? p.variate_bias[h] : 0.0f;
  const float same = p.variate ? p.variate_bias[p.heads + h] : 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    float* row = s + r * ld;
    if (p.alibi) {
      const double pi = p.pq[i];
      const double* pk = p.pk + j0;
      if (p.symmetric) {
        for (int64_t c = 0; c < cols; ++c)
          row[c] -= slope * static_cast<float>(std::abs(pi - pk[c]));
      } else {
        for (int64_t c = 0; c < cols; ++c) row[c] -= slope * static_cast<float>(pi - pk[c]);
      }
    }
    if (lut) {
      const int64_t base = -p.iq[i] - p.rel_min;
      const int64_t* ik = p.ik + j0;
      for (int64_t c = 0; c < cols; ++c) row[c] += lut[ik[c] + base];
    } else if (relative) {
      const float* qr = p.qr.data_ptr<float>() + ((b * p.heads + h) * p.nq + i) * p.qr.size(3);
      const int64_t pi = p.iq[i], kmax = p.max_relative;
      const int64_t* ik = p.ik + j0;
      for (int64_t c = 0; c < cols; ++c) row[c] += qr[std::clamp(ik[c] - pi, -kmax, kmax) + kmax];
    }
    if (variate) {  // Moirai's binary bias: weight[1, h] on equal ids, weight[0, h] otherwise
      const int64_t vi = variate[i + offset];
      const int64_t* vk = variate + j0;
      for (int64_t c = 0; c < cols; ++c) row[c] += vk[c] == vi ? same : differ;
    }
    if (p.causal) {
      const int64_t last = i + offset;  // last visible key
      for (int64_t c = std::max<int64_t>(0, last + 1 - j0); c < cols; ++c) row[c] = kNegInf;
    }
    if (causal_ids) {  // causal on ids: keys with a larger id than the query's are masked
      const int64_t ti = causal_ids[i + offset];
      const int64_t* tk = causal_ids + j0;
      for (int64_t c = 0; c < cols; ++c)
        if (tk[c] > ti) row[c] = kNegInf;
    }
    if (sample) {  // the block-diagonal mask of packed samples
      const int64_t si = sample[i + offset];
      const int64_t* sk = sample + j0;
      for (int64_t c = 0; c < cols; ++c)
        if (sk[c] != si) row[c] = kNegInf;
    }
    if (keep)
      for (int64_t c = 0; c < cols; ++c)
        if (!keep[j0 + c]) row[c] = kNegInf;
  }
}

// RoPE on rows: y[r] = x[r] rotated by the pair tables cos/sin [n, F] (rotate_row.h); x's rows
// x_stride apart, y's y_stride.
void rotate_rows(const float* x, int64_t x_stride, float* y, int64_t y_stride, int64_t n,
                 int64_t dim, const float* cos, const float* sin, int64_t pairs, bool interleaved,
                 float sign) {
  for (int64_t r = 0; r < n; ++r)
    rotate_row(x + r * x_stride, y + r * y_stride, dim, cos + r * pairs, sin + r * pairs, pairs,
               interleaved, sign);
}

// Rows [row0, row0 + n) of q or k (x: the first, row stride *ld), rotated into scratch (row
// stride D, *ld updated) when the problem has rotary tables; else x itself.
const float* maybe_rotated(const AttentionProblem& p, const float* x, int64_t n, int64_t* ld,
                           float* scratch, const at::Tensor& cos, const at::Tensor& sin,
                           int64_t row0) {
  if (!p.rotary) return x;
  rotate_rows(x, *ld, scratch, p.dim, n, p.dim, cos.data_ptr<float>() + row0 * p.rotary_pairs,
              sin.data_ptr<float>() + row0 * p.rotary_pairs, p.rotary_pairs, p.rotary_interleaved,
              1.0f);
  *ld = p.dim;
  return scratch;
}

// Number of key columns of block [j0, j0+cols) that can be visible to rows up to i_last.
int64_t visible_columns(const AttentionProblem& p, int64_t i_last, int64_t j0, int64_t cols) {
  if (!p.causal) return cols;
  return std::max<int64_t>(0, std::min(cols, i_last + (p.nk - p.nq) + 1 - j0));
}

// Packed samples: the key interval [first, last] that queries [i0, i0 + rows) can see (their runs
// are contiguous and so is their union); without packing all keys.
std::pair<int64_t, int64_t> packed_keys(const AttentionProblem& p, int64_t b, int64_t i0,
                                        int64_t rows) {
  if (!p.packed) return {0, p.nk - 1};
  const int64_t offset = p.nk - p.nq;
  return {p.run_first[b * p.nk + i0 + offset], p.run_last[b * p.nk + i0 + rows - 1 + offset]};
}

// The query interval [first, last] whose runs meet keys [j0, j0 + cols) (may be empty).
std::pair<int64_t, int64_t> packed_queries(const AttentionProblem& p, int64_t b, int64_t j0,
                                           int64_t cols) {
  if (!p.packed) return {0, p.nq - 1};
  const int64_t offset = p.nk - p.nq;
  return {std::max<int64_t>(0, p.run_first[b * p.nk + j0] - offset),
          std::min<int64_t>(p.nq - 1, p.run_last[b * p.nk + j0 + cols - 1] - offset)};
}

// Causal on ids: the largest id of queries [i0, i0 + rows) and the smallest of keys
// [j0, j0 + cols) of row b; a tile with smallest key id > largest query id is all masked.
int64_t largest_query_id(const AttentionProblem& p, int64_t b, int64_t i0, int64_t rows) {
  const int64_t* ids = p.causal_ids.const_data_ptr<int64_t>() + b * p.nk + (p.nk - p.nq) + i0;
  return *std::max_element(ids, ids + rows);
}

int64_t smallest_key_id(const AttentionProblem& p, int64_t b, int64_t j0, int64_t cols) {
  const int64_t* ids = p.causal_ids.const_data_ptr<int64_t>() + b * p.nk + j0;
  return *std::min_element(ids, ids + cols);
}

// ---- The forward on the CPU level's own micro-kernels (attention_tiles.h) ---------------------

// Whether the forward takes the own micro-kernels: the level has them, the values' width is whole
// 16-column panels, and enough queries share each packed head (below 32 the packing of K and V
// would be a visible part of the work: it is Nk (D + Dv) copies against 2 Nq Nk (D + Dv) flops).
const AttentionTileKernels* own_tiles_for(const AttentionProblem& p) {
  const AttentionTileKernels* tiles = own_tile_kernels();
  if (tiles == nullptr || p.dim_v % kTilePanel != 0 || p.nq < 32) return nullptr;
  return tiles;
}

// The cache lines of floats [x, x + n), prefetched (a hint: no fault, no effect on values).
inline void prefetch_row(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(x + i);
  __builtin_prefetch(x + n - 1);  // the last line when x is not 64-byte aligned
}

// Keys [0, n) of one head (rows ld apart) into 16-key panels kp[(c / 16) 16 D + d 16 + c % 16],
// the last panel's missing keys `pad` (their scores are computed and never read).
void pack_key_panels(const float* k, int64_t ld, int64_t n, int64_t dim, float* kp, float pad) {
  for (int64_t c0 = 0; c0 < n; c0 += kTilePanel) {
    float* panel = kp + (c0 / kTilePanel) * kTilePanel * dim;
    const int64_t width = std::min(kTilePanel, n - c0);
    // the next panel's rows, fetched while this one is packed: in a [B, N, H, D] tensor a head's
    // rows are H D floats apart, each a new run of lines from memory (without this the packing
    // waited on them: 3% of the AVX2 forward at [1, 2048, 16, 128], perf)
    for (int64_t c = c0 + kTilePanel; c < std::min(n, c0 + 2 * kTilePanel); ++c)
      prefetch_row(k + c * ld, dim);
    if (width < kTilePanel) std::fill(panel, panel + kTilePanel * dim, pad);
    for (int64_t c = 0; c < width; ++c) {
      const float* row = k + (c0 + c) * ld;
      for (int64_t d = 0; d < dim; ++d) panel[d * kTilePanel + c] = row[d];
    }
  }
}

// Values [0, n) of one head (rows ld apart, dim_v % 16 == 0) into 16-column panels
// vp[(e / 16) vstride + c 16 + e % 16], vstride = 16 n.
void pack_value_panels(const float* v, int64_t ld, int64_t n, int64_t dim_v, float* vp) {
  constexpr int64_t kAhead = 8;  // rows fetched ahead, as pack_key_panels
  for (int64_t c = 0; c < std::min(n, kAhead); ++c) prefetch_row(v + c * ld, dim_v);
  for (int64_t c = 0; c < n; ++c) {
    if (c + kAhead < n) prefetch_row(v + (c + kAhead) * ld, dim_v);
    const float* row = v + c * ld;
    for (int64_t e0 = 0; e0 < dim_v; e0 += kTilePanel) {
      float* dst = vp + e0 * n + c * kTilePanel;
      for (int64_t e = 0; e < kTilePanel; ++e) dst[e] = row[e0 + e];  // inline, no memmove call
    }
  }
}

// Rows [0, n) (ld apart) into blocks of R rows qp[(r / R) R dim + d R + r % R], the rows of the
// last block past n `pad` (the micro-kernels never read them).
void pack_query_rows(const float* x, int64_t ld, int64_t n, int64_t dim, int64_t rows_per_call,
                     float* qp, float pad) {
  for (int64_t r0 = 0; r0 < n; r0 += rows_per_call) {
    float* block = qp + r0 * dim;  // written in order
    const int64_t m = std::min(rows_per_call, n - r0);
    const float* rows = x + r0 * ld;
    for (int64_t d = 0; d < dim; ++d) {
      float* dst = block + d * rows_per_call;
      for (int64_t r = 0; r < m; ++r) dst[r] = rows[r * ld + d];
      for (int64_t r = m; r < rows_per_call; ++r) dst[r] = pad;
    }
  }
}

// The forward of attention_forward_cpu with the products on the level's micro-kernels. Per
// (b, h, query block of block_q rows: kBlockQ rounded down to whole calls) the online softmax over
// key blocks of kBlockK columns, as the MKL path; inside a key block, per R query rows (the
// micro-kernel's rows): the scores strip S = scale q k^T [R, cols] into an L1-sized buffer, the
// bias and masks, the row max and exp(s - m) in place (the probabilities where the scores were),
// then acc = alpha acc + P V for those rows. K and V are packed once per head per thread (a
// thread's consecutive query blocks share the head), each query block once; P is never copied.
void attention_forward_own(const AttentionProblem& p, const AttentionTileKernels& tiles,
                           at::Tensor& out, at::Tensor& lse) {
  const int64_t rows_per_call = tiles.rows;
  // query blocks of a whole number of micro-kernel calls: 128 rows at the AVX-512 level (R = 8),
  // 126 at AVX2 (R = 6), whose 128-row blocks computed 132 rows (3% of the products on padding)
  const int64_t block_q = kBlockQ / rows_per_call * rows_per_call;
  const int64_t q_blocks = (p.nq + block_q - 1) / block_q;
  const int64_t units = p.batch * p.heads * q_blocks;
  const int64_t q_packed_rows = block_q;
  const int64_t nk_padded = (p.nk + kTilePanel - 1) / kTilePanel * kTilePanel;
  // the strip's row stride: a key block starting inside a panel (packed samples' first key) is
  // computed from its panel's first key, so the strip holds kBlockK + 15 columns
  const int64_t lds = kBlockK + kTilePanel;
  const CpuKernels& kernels = cpu_kernels();  // the softmax rows of this CPU level
  const Operand q_op = operand("q", p.q), k_op = operand("k", p.k), v_op = operand("v", p.v);
  const Operand out_op = operand("out", out);
  const bool tile_bias = has_tile_bias(p);
  const float fill = scratch_fill();
  parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> key_panels(nk_padded * p.dim, fill), value_panels(p.nk * p.dim_v, fill);
    std::vector<float> q_packed(q_packed_rows * p.dim, fill), strip(rows_per_call * lds, fill);
    std::vector<float> acc(block_q * p.dim_v, fill), m(block_q, fill), l(block_q, fill),
        alpha(block_q, fill);
    auto q_rot = p.rotary ? at::empty({block_q, p.dim}, at::kFloat) : at::Tensor();
    auto k_rot = p.rotary ? at::empty({p.nk, p.dim}, at::kFloat) : at::Tensor();
    int64_t packed_head = -1;
    float* s = strip.data();
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t bh = unit / q_blocks, qb = unit % q_blocks;
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const int64_t i0 = qb * block_q, rows = std::min(block_q, p.nq - i0);
      if (packed_head != bh) {  // this head's keys (rotated where RoPE is inside) and values
        int64_t ldk = k_op.row_stride;
        const float* k_bh =
            maybe_rotated(p, k_op.rows(b, h), p.nk, &ldk,
                          p.rotary ? k_rot.data_ptr<float>() : nullptr, p.k_cos, p.k_sin, 0);
        pack_key_panels(k_bh, ldk, p.nk, p.dim, key_panels.data(), fill);
        pack_value_panels(v_op.rows(b, h), v_op.row_stride, p.nk, p.dim_v, value_panels.data());
        packed_head = bh;
      }
      int64_t ldq = q_op.row_stride;
      const float* q_blk =
          maybe_rotated(p, q_op.rows(b, h) + i0 * ldq, rows, &ldq,
                        p.rotary ? q_rot.data_ptr<float>() : nullptr, p.q_cos, p.q_sin, i0);
      pack_query_rows(q_blk, ldq, rows, p.dim, rows_per_call, q_packed.data(), fill);
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      const auto [j_first, j_last] = packed_keys(p, b, i0, rows);
      const int64_t query_id_max = p.causal_by_ids ? largest_query_id(p, b, i0, rows) : 0;
      for (int64_t j0 = j_first; j0 <= j_last; j0 += kBlockK) {
        const int64_t cols =
            visible_columns(p, i0 + rows - 1, j0, std::min(kBlockK, j_last + 1 - j0));
        if (cols == 0) break;
        if (p.causal_by_ids && smallest_key_id(p, b, j0, cols) > query_id_max) continue;
        const int64_t shift = j0 % kTilePanel;  // the block's first key inside its panel
        const int64_t panels = (shift + cols + kTilePanel - 1) / kTilePanel;
        const float* kp = key_panels.data() + (j0 / kTilePanel) * kTilePanel * p.dim;
        const float* vp = value_panels.data() + j0 * kTilePanel;
        float* tile = s + shift;  // S and then P of keys [j0, j0 + cols): tile[r * lds + c]
        for (int64_t r0 = 0; r0 < rows; r0 += rows_per_call) {
          const int64_t strip_rows = std::min(rows_per_call, rows - r0);
          tiles.scores(q_packed.data() + r0 * p.dim, kp, panels, p.dim, p.scale, s, lds,
                       strip_rows);
          if (tile_bias) bias_and_mask(p, tile, lds, strip_rows, cols, i0 + r0, j0, b, h);
          for (int64_t r = 0; r < strip_rows; ++r) {
            float* row = tile + r * lds;
            const int64_t i = r0 + r;
            float m_new = std::max(m[i], kernels.row_max(row, cols));
            if (m_new == kNegInf) {
              if (!row_starts_nan(row, cols)) {  // nothing visible yet: contributes nothing
                std::fill(row, row + cols, 0.0f);
                alpha[i] = 1.0f;
                continue;
              }
              m_new = kNan;  // the row is NaN from here on
            }
            alpha[i] = std::exp(m[i] - m_new);
            l[i] = l[i] * alpha[i] + kernels.exp_sub_sum(row, cols, m_new);
            m[i] = m_new;
          }
          tiles.accumulate(tile, lds, strip_rows, cols, vp, kTilePanel * p.nk, p.dim_v,
                           alpha.data() + r0, acc.data() + r0 * p.dim_v, p.dim_v);
        }
      }
      float* o = out_op.rows(b, h) + i0 * out_op.row_stride;
      float* lse_row = lse[b][h].data_ptr<float>() + i0;
      for (int64_t r = 0; r < rows; ++r) {
        // l == 0: the row saw no key (0, lse -inf); l NaN: a NaN score (NaN, lse NaN)
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        float* o_row = o + r * out_op.row_stride;
        for (int64_t d = 0; d < p.dim_v; ++d) o_row[d] = acc[r * p.dim_v + d] * inv;
        lse_row[r] = l[r] == 0.0f ? kNegInf : m[r] + std::log(l[r]);
      }
    }
  });
}

}  // namespace

bool set_attention_cpu_poison_for_tests(bool on) { return poison_scratch.exchange(on); }

void check_causal_ids(const char* op, const at::Tensor& causal_ids, bool causal, int64_t batch,
                      int64_t nq, int64_t nk) {
  if (!causal_ids.defined()) return;
  TORCH_CHECK_VALUE(!causal, op,
                    ": causal and causal_ids together are two causal rules (token order and ids); "
                    "pass one of them");
  TORCH_CHECK_VALUE(at::isIntegralType(causal_ids.scalar_type(), /*includeBool=*/false), op,
                    ": causal_ids must be an integer tensor (int64), got ",
                    causal_ids.scalar_type());
  TORCH_CHECK_VALUE(
      causal_ids.dim() == 2 && causal_ids.size(0) == batch && causal_ids.size(1) == nk, op,
      ": causal_ids must be [B, Nk] = [", batch, ", ", nk, "], got ", causal_ids.sizes());
  TORCH_CHECK_VALUE(nq <= nk, op, ": causal_ids with more queries (", nq, ") than keys (", nk,
                    "): the queries take the last Nq ids");
}

void set_causal_ids(AttentionProblem& p, const char* op, const at::Tensor& causal_ids) {
  check_causal_ids(op, causal_ids, p.causal, p.batch, p.nq, p.nk);
  if (!causal_ids.defined()) return;
  p.causal_by_ids = true;
  p.causal_ids = causal_ids.to(at::kCPU, at::kLong).contiguous();
}

void check_packed_ids(const char* op, const at::Tensor& sample_ids, const at::Tensor& variate_ids,
                      const at::Tensor& variate_bias, int64_t batch, int64_t nk, int64_t heads) {
  auto check_ids = [&](const char* name, const at::Tensor& t) {
    if (!t.defined()) return;
    TORCH_CHECK(at::isIntegralType(t.scalar_type(), /*includeBool=*/false), op, ": ", name,
                " must be an integer tensor (int64), got ", t.scalar_type());
    TORCH_CHECK(t.dim() == 2 && t.size(0) == batch && t.size(1) == nk, op, ": ", name,
                " must be [B, Nk] = [", batch, ", ", nk, "], got ", t.sizes());
  };
  check_ids("sample_ids", sample_ids);
  check_ids("variate_ids", variate_ids);
  TORCH_CHECK(variate_ids.defined() == variate_bias.defined(), op,
              ": variate_ids and variate_bias go together; got ",
              variate_ids.defined() ? "variate_ids without variate_bias"
                                    : "variate_bias without variate_ids");
  if (variate_bias.defined()) {
    TORCH_CHECK(at::isFloatingType(variate_bias.scalar_type()), op,
                ": variate_bias must be floating point, got ", variate_bias.scalar_type());
    TORCH_CHECK(
        variate_bias.dim() == 2 && variate_bias.size(0) == 2 && variate_bias.size(1) == heads, op,
        ": variate_bias must be [2, H] = [2, ", heads,
        "] (row 0: different variate ids, row 1: the same; Moirai's Embedding(2, H) "
        "weight), got ",
        variate_bias.sizes());
  }
  if (variate_ids.defined() && variate_ids.numel() > 0) {
    const auto v = variate_ids.to(at::kCPU, at::kLong).contiguous();
    const int64_t* d = v.const_data_ptr<int64_t>();
    for (int64_t n = 0; n < v.numel(); ++n)
      TORCH_CHECK(d[n] >= 0, op, ": variate_ids[", n / nk, ", ", n % nk, "] = ", d[n],
                  " is negative (variate ids must be >= 0)");
  }
  if (sample_ids.defined() && sample_ids.numel() > 0) {
    const auto s = sample_ids.to(at::kCPU, at::kLong).contiguous();
    const int64_t* d = s.const_data_ptr<int64_t>();
    std::unordered_set<int64_t> seen;
    for (int64_t b = 0; b < batch; ++b) {
      seen.clear();
      const int64_t* row = d + b * nk;
      for (int64_t j = 0; j < nk; ++j) {
        if (j > 0 && row[j] == row[j - 1]) continue;
        TORCH_CHECK(seen.insert(row[j]).second, op, ": sample_ids[", b, ", ", j, "] = ", row[j],
                    " starts a second run of that sample (each sample id must be one contiguous "
                    "run per row)");
      }
    }
  }
}

void set_packed(AttentionProblem& p, const char* op, const at::Tensor& sample_ids,
                const at::Tensor& variate_ids, const at::Tensor& variate_bias) {
  check_packed_ids(op, sample_ids, variate_ids, variate_bias, p.batch, p.nk, p.heads);
  if (sample_ids.defined()) {
    TORCH_CHECK(p.nq <= p.nk, op, ": sample_ids with more queries (", p.nq, ") than keys (", p.nk,
                "): the queries take the last Nq ids");
    p.packed = true;
    p.sample_ids = sample_ids.to(at::kCPU, at::kLong).contiguous();
    const int64_t* d = p.sample_ids.const_data_ptr<int64_t>();
    p.run_first.resize(p.batch * p.nk);
    p.run_last.resize(p.batch * p.nk);
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t base = b * p.nk;
      for (int64_t j = 0; j < p.nk; ++j)
        p.run_first[base + j] =
            j > 0 && d[base + j] == d[base + j - 1] ? p.run_first[base + j - 1] : j;
      for (int64_t j = p.nk - 1; j >= 0; --j)
        p.run_last[base + j] =
            j + 1 < p.nk && d[base + j] == d[base + j + 1] ? p.run_last[base + j + 1] : j;
    }
  }
  if (variate_ids.defined()) {
    p.variate = true;
    p.variate_ids = variate_ids.to(at::kCPU, at::kLong).contiguous();
    const auto w = variate_bias.detach().to(at::kCPU, at::kFloat).contiguous();
    p.variate_bias.assign(w.const_data_ptr<float>(), w.const_data_ptr<float>() + w.numel());
  }
}

void attention_forward_cpu(const AttentionProblem& p, at::Tensor& out, at::Tensor& lse) {
  if (const AttentionTileKernels* tiles = own_tiles_for(p)) {
    attention_forward_own(p, *tiles, out, lse);
    return;
  }
  const int64_t q_blocks = (p.nq + kBlockQ - 1) / kBlockQ;
  const int64_t k_blocks = (p.nk + kBlockK - 1) / kBlockK;
  const int64_t units = p.batch * p.heads * q_blocks;
  const CpuKernels& kernels = cpu_kernels();  // the softmax rows of this CPU level
  const Operand q_op = operand("q", p.q), k_op = operand("k", p.k), v_op = operand("v", p.v);
  const Operand out_op = operand("out", out);
  const bool tile_bias = has_tile_bias(p);
  // packed keys and values pay off when a head has several full query blocks to reuse them
  PackLayout layout;
  const bool pack = packed_gemm_available() && p.nq >= 2 * kBlockQ;
  if (pack) {
    layout.k_offset.assign(1, 0);
    layout.v_offset.assign(1, 0);
    for (int64_t t = 0; t < k_blocks; ++t) {
      const int64_t cols = std::min(kBlockK, p.nk - t * kBlockK);
      layout.k_offset.push_back(layout.k_offset.back() +
                                packed_floats(kBMatrix, kBlockQ, cols, p.dim));
      layout.v_offset.push_back(layout.v_offset.back() +
                                packed_floats(kBMatrix, kBlockQ, p.dim_v, cols));
    }
  }
  parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    auto tile = scratch({kBlockQ, kBlockK});
    auto acc_buffer = scratch({kBlockQ, p.dim_v});
    auto q_rot = p.rotary ? at::empty({kBlockQ, p.dim}, at::kFloat) : at::Tensor();
    // the rotated keys of one head, reused by this thread's consecutive query blocks of it
    auto k_rot = p.rotary ? at::empty({p.nk, p.dim}, at::kFloat) : at::Tensor();
    int64_t k_rot_head = -1;
    PackedHead packed;
    // a full query block packed once for the q k^T products of its full key blocks
    at::Tensor q_packed;
    if (pack) {
      packed.k = at::empty({layout.k_offset.back()}, at::kFloat);
      packed.v = at::empty({layout.v_offset.back()}, at::kFloat);
      q_packed = at::empty({packed_floats(kAMatrix, kBlockQ, kBlockK, p.dim)}, at::kFloat);
    }
    float* s = tile.data_ptr<float>();
    float* acc = acc_buffer.data_ptr<float>();
    std::vector<float> m(kBlockQ), l(kBlockQ);
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t bh = unit / q_blocks, qb = unit % q_blocks;
      const int64_t b = bh / p.heads, h = bh % p.heads;
      const int64_t i0 = qb * kBlockQ, rows = std::min(kBlockQ, p.nq - i0);
      int64_t ldq = q_op.row_stride, ldk = k_op.row_stride;
      const float* q_blk =
          maybe_rotated(p, q_op.rows(b, h) + i0 * ldq, rows, &ldq,
                        p.rotary ? q_rot.data_ptr<float>() : nullptr, p.q_cos, p.q_sin, i0);
      const float* k_bh = k_op.rows(b, h);  // [Nk, D]
      if (p.rotary) {
        int64_t ld = ldk;
        if (k_rot_head != bh)
          maybe_rotated(p, k_bh, p.nk, &ld, k_rot.data_ptr<float>(), p.k_cos, p.k_sin, 0);
        k_rot_head = bh;
        k_bh = k_rot.data_ptr<float>();
        ldk = p.dim;
      }
      const float* v_bh = v_op.rows(b, h);
      const int64_t ldv = v_op.row_stride;
      if (pack && packed.head != bh) {
        packed.k_ready.assign(k_blocks, 0);
        packed.v_ready.assign(k_blocks, 0);
        packed.head = bh;
      }
      bool q_ready = false;
      std::fill(acc, acc + rows * p.dim_v, 0.0f);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), 0.0f);
      const auto [j_first, j_last] = packed_keys(p, b, i0, rows);
      const int64_t query_id_max = p.causal_by_ids ? largest_query_id(p, b, i0, rows) : 0;
      for (int64_t j0 = j_first; j0 <= j_last; j0 += kBlockK) {
        const int64_t cols =
            visible_columns(p, i0 + rows - 1, j0, std::min(kBlockK, j_last + 1 - j0));
        if (cols == 0) break;
        if (p.causal_by_ids && smallest_key_id(p, b, j0, cols) > query_id_max) continue;
        // a whole key block with a whole query block: the head's packed K^T and V blocks
        const int64_t t = j0 / kBlockK;
        const bool use_packed =
            pack && rows == kBlockQ && j0 % kBlockK == 0 && cols == std::min(kBlockK, p.nk - j0);
        if (use_packed) {
          float* kp = packed.k.data_ptr<float>() + layout.k_offset[t];
          if (!packed.k_ready[t]) {  // scale K^T: the block's scores come out scaled
            cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kBlockQ, cols, p.dim, p.scale,
                             k_bh + j0 * ldk, ldk, kp);
            packed.k_ready[t] = 1;
          }
          if (cols == kBlockK) {  // the query block packed for this product's sizes
            float* qp = q_packed.data_ptr<float>();
            if (!q_ready) {
              cblas_sgemm_pack(kRowMajor, kAMatrix, kNoTrans, kBlockQ, kBlockK, p.dim, 1.0f, q_blk,
                               ldq, qp);
              q_ready = true;
            }
            cblas_sgemm_compute(kRowMajor, kPacked, kPacked, kBlockQ, cols, p.dim, qp, p.dim, kp,
                                cols, 0.0f, s, kBlockK);
          } else {
            cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, kBlockQ, cols, p.dim, q_blk, ldq, kp,
                                cols, 0.0f, s, kBlockK);
          }
        } else {  // S = scale q k^T
          gemm(false, true, rows, cols, p.dim, p.scale, q_blk, ldq, k_bh + j0 * ldk, ldk, 0.0f, s,
               kBlockK);
        }
        if (tile_bias) bias_and_mask(p, s, kBlockK, rows, cols, i0, j0, b, h);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = s + r * kBlockK;
          float m_new = std::max(m[r], kernels.row_max(row, cols));
          if (m_new == kNegInf) {
            if (!row_starts_nan(row, cols)) {  // nothing visible yet: contributes nothing
              for (int64_t c = 0; c < cols; ++c) row[c] = 0.0f;
              continue;
            }
            m_new = kNan;  // the row is NaN from here on
          }
          const float alpha = std::exp(m[r] - m_new);
          const float sum = kernels.exp_sub_sum(row, cols, m_new);
          l[r] = l[r] * alpha + sum;
          m[r] = m_new;
          if (alpha != 1.0f) {
            float* a = acc + r * p.dim_v;
            for (int64_t d = 0; d < p.dim_v; ++d) a[d] *= alpha;
          }
        }
        if (use_packed) {  // acc += P V
          float* vp = packed.v.data_ptr<float>() + layout.v_offset[t];
          if (!packed.v_ready[t]) {
            cblas_sgemm_pack(kRowMajor, kBMatrix, kNoTrans, kBlockQ, p.dim_v, cols, 1.0f,
                             v_bh + j0 * ldv, ldv, vp);
            packed.v_ready[t] = 1;
          }
          cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, kBlockQ, p.dim_v, cols, s, kBlockK, vp,
                              p.dim_v, 1.0f, acc, p.dim_v);
        } else {
          gemm(false, false, rows, p.dim_v, cols, 1.0f, s, kBlockK, v_bh + j0 * ldv, ldv, 1.0f, acc,
               p.dim_v);
        }
      }
      float* o = out_op.rows(b, h) + i0 * out_op.row_stride;
      float* lse_row = lse[b][h].data_ptr<float>() + i0;
      for (int64_t r = 0; r < rows; ++r) {
        // l == 0: the row saw no key (0, lse -inf); l NaN: a NaN score (NaN, lse NaN)
        const float inv = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
        float* o_row = o + r * out_op.row_stride;
        for (int64_t d = 0; d < p.dim_v; ++d) o_row[d] = acc[r * p.dim_v + d] * inv;
        lse_row[r] = l[r] == 0.0f ? kNegInf : m[r] + std::log(l[r]);
      }
    }
  });
}

void attention_backward_cpu(const AttentionProblem& p, const at::Tensor& out, const at::Tensor& lse,
                            const at::Tensor& grad_out, at::Tensor& dq, at::Tensor& dk,
                            at::Tensor& dv, at::Tensor& dtable, at::Tensor* dvariate) {
  const bool table_grad = p.table_form == BiasForm::kBucketTable;
  const bool relative = p.table_form == BiasForm::kRelativeTable;
  const int64_t rel_width = relative ? 2 * p.max_relative + 1 : 0;
  // per (b, h) partial table gradients, summed over b (and h) afterwards:
  // [B, H, num_buckets] (T5) or [B, H, 2K+1, D] (Shaw)
  at::Tensor partial;
  if (table_grad) partial = at::zeros({p.batch, p.heads, p.num_buckets}, at::kFloat);
  if (relative) partial = at::zeros({p.batch, p.heads, rel_width, p.dim}, at::kFloat);
  // per (b, h) sums of dS over the pairs of different / same variate ids: [B, H, 2] (float64:
  // N^2 terms)
  auto variate_partial = p.variate ? at::zeros({p.batch, p.heads, 2}, at::kDouble) : at::Tensor();
  // D_i = sum_d dO_i,d O_i,d : [B, H, Nq]
  auto row_dot = (grad_out * out).sum(-1).contiguous();
  const CpuKernels& kernels = cpu_kernels();  // the softmax rows of this CPU level
  const Operand q_op = operand("q", p.q), k_op = operand("k", p.k), v_op = operand("v", p.v);
  const Operand do_op = operand("grad_out", grad_out), dq_op = operand("dq", dq);
  const Operand dk_op = operand("dk", dk), dv_op = operand("dv", dv);
  const bool tile_bias = has_tile_bias(p);
  // the level's micro-kernels (attention_tiles.h) where both widths are whole 16-float panels
  const AttentionTileKernels* tiles = own_tile_kernels();
  if (p.dim % kTilePanel != 0 || p.dim_v % kTilePanel != 0) tiles = nullptr;
  const int64_t rows_per_call = tiles != nullptr ? tiles->rows : 1;
  // query blocks of a whole number of micro-kernel calls, as the forward's: 126 rows at the AVX2
  // level (R = 6), whose 128-row blocks ended each in a 2-row call; 128 at AVX-512 and with MKL
  const int64_t block_q = kBlockQ / rows_per_call * rows_per_call;
  const float fill = scratch_fill();
  parallel_for(0, p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    // [block_q, kBlockK] tiles (the micro-kernels read and write a call's own rows only)
    const int64_t tile_floats = block_q * kBlockK;
    auto tile = scratch({tile_floats});
    auto dp = scratch({tile_floats});
    // the micro-kernels' operands: a key block's K and V in key panels, K in value panels; each
    // query block's q and dO in row blocks and in value panels (attention_tiles.h), packed once
    // per head into slot i0 / block_q (packed samples: query blocks start anywhere, so each tile
    // repacks slot 0)
    std::vector<float> key_panels, value_key_panels, key_value_panels, q_rows, do_rows, q_panels,
        do_panels, ones;
    std::vector<uint8_t> query_block_ready;
    const int64_t slots = p.packed ? 1 : (p.nq + block_q - 1) / block_q;
    const int64_t q_rows_slot = block_q * p.dim;  // block_q: a whole number of R-row blocks
    const int64_t do_rows_slot = block_q * p.dim_v;
    if (tiles != nullptr) {
      key_panels.resize(kBlockK * p.dim, fill);
      value_key_panels.resize(kBlockK * p.dim_v, fill);
      key_value_panels.resize(kBlockK * p.dim, fill);
      q_rows.resize(slots * q_rows_slot, fill);
      do_rows.resize(slots * do_rows_slot, fill);
      q_panels.resize(slots * block_q * p.dim, fill);
      do_panels.resize(slots * block_q * p.dim_v, fill);
      ones.assign(std::max(kBlockQ, kBlockK), 1.0f);
    }
    auto dqr = relative ? at::empty({p.nq, rel_width}, at::kFloat) : at::Tensor();
    auto q_rot = p.rotary ? at::empty({p.nq, p.dim}, at::kFloat) : at::Tensor();  // one head
    auto k_rot = p.rotary ? at::empty({kBlockK, p.dim}, at::kFloat) : at::Tensor();
    float* s = tile.data_ptr<float>();
    float* dps = dp.data_ptr<float>();
    // the variate bias's gradient per query row: sums over its same-variate keys and over all of
    // its keys of P dP and of P (float64), combined after the row's last key block
    std::vector<double> same_pdp, all_pdp, same_p, all_p;
    if (p.variate) {
      for (auto* row_sums : {&same_pdp, &all_pdp, &same_p, &all_p}) row_sums->resize(p.nq);
    }
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / p.heads, h = bh % p.heads;
      query_block_ready.assign(slots, 0);
      if (relative) dqr.zero_();
      if (p.variate) {
        for (auto* row_sums : {&same_pdp, &all_pdp, &same_p, &all_p})
          std::fill(row_sums->begin(), row_sums->end(), 0.0);
      }
      float* table_acc = table_grad ? partial[b][h].data_ptr<float>() : nullptr;
      double* variate_acc = p.variate ? variate_partial[b][h].data_ptr<double>() : nullptr;
      const int64_t* variate =
          p.variate ? p.variate_ids.const_data_ptr<int64_t>() + b * p.nk : nullptr;
      const float* lse_bh = lse[b][h].data_ptr<float>();
      const float* dot_bh = row_dot[b][h].data_ptr<float>();
      int64_t ldq = q_op.row_stride;
      const float* q_bh =
          maybe_rotated(p, q_op.rows(b, h), p.nq, &ldq,
                        p.rotary ? q_rot.data_ptr<float>() : nullptr, p.q_cos, p.q_sin, 0);
      const float* do_bh = do_op.rows(b, h);
      const int64_t ld_do = do_op.row_stride;
      float* dq_bh = dq_op.rows(b, h);
      const int64_t ld_dq = dq_op.row_stride, ld_dk = dk_op.row_stride, ld_dv = dv_op.row_stride;
      const int64_t ldv = v_op.row_stride;
      for (int64_t j0 = 0; j0 < p.nk; j0 += kBlockK) {
        const int64_t cols_all = std::min(kBlockK, p.nk - j0);
        int64_t ldk = k_op.row_stride;
        const float* k_blk =
            maybe_rotated(p, k_op.rows(b, h) + j0 * ldk, cols_all, &ldk,
                          p.rotary ? k_rot.data_ptr<float>() : nullptr, p.k_cos, p.k_sin, j0);
        const float* v_blk = v_op.rows(b, h) + j0 * ldv;
        if (tiles != nullptr) {
          pack_key_panels(k_blk, ldk, cols_all, p.dim, key_panels.data(), fill);
          pack_key_panels(v_blk, ldv, cols_all, p.dim_v, value_key_panels.data(), fill);
          pack_value_panels(k_blk, ldk, cols_all, p.dim, key_value_panels.data());
        }
        float* dk_blk = dk_op.rows(b, h) + j0 * ld_dk;
        float* dv_blk = dv_op.rows(b, h) + j0 * ld_dv;
        const auto [i_first, i_last] = packed_queries(p, b, j0, cols_all);
        const int64_t key_id_min = p.causal_by_ids ? smallest_key_id(p, b, j0, cols_all) : 0;
        for (int64_t i0 = i_first; i0 <= i_last; i0 += block_q) {
          const int64_t rows = std::min(block_q, i_last + 1 - i0);
          const int64_t cols = visible_columns(p, i0 + rows - 1, j0, cols_all);
          if (cols == 0) continue;
          if (p.causal_by_ids && key_id_min > largest_query_id(p, b, i0, rows)) continue;
          const float* q_blk = q_bh + i0 * ldq;
          const float* do_blk = do_bh + i0 * ld_do;
          const int64_t panels = (cols + kTilePanel - 1) / kTilePanel;
          const int64_t slot = p.packed ? 0 : i0 / block_q;
          float* q_rows_blk = tiles != nullptr ? q_rows.data() + slot * q_rows_slot : nullptr;
          float* do_rows_blk = tiles != nullptr ? do_rows.data() + slot * do_rows_slot : nullptr;
          float* q_panels_blk =
              tiles != nullptr ? q_panels.data() + slot * block_q * p.dim : nullptr;
          float* do_panels_blk =
              tiles != nullptr ? do_panels.data() + slot * block_q * p.dim_v : nullptr;
          if (tiles != nullptr && (p.packed || !query_block_ready[slot])) {
            pack_query_rows(q_blk, ldq, rows, p.dim, rows_per_call, q_rows_blk, fill);
            pack_query_rows(do_blk, ld_do, rows, p.dim_v, rows_per_call, do_rows_blk, fill);
            pack_value_panels(q_blk, ldq, rows, p.dim, q_panels_blk);
            pack_value_panels(do_blk, ld_do, rows, p.dim_v, do_panels_blk);
            query_block_ready[slot] = 1;
          }
          // S = scale q k^T
          if (tiles != nullptr) {
            for (int64_t r0 = 0; r0 < rows; r0 += rows_per_call)
              tiles->scores(q_rows_blk + r0 * p.dim, key_panels.data(), panels, p.dim, p.scale,
                            s + r0 * kBlockK, kBlockK, std::min(rows_per_call, rows - r0));
          } else {
            gemm(false, true, rows, cols, p.dim, p.scale, q_blk, ldq, k_blk, ldk, 0.0f, s, kBlockK);
          }
          if (tile_bias) bias_and_mask(p, s, kBlockK, rows, cols, i0, j0, b, h);
          for (int64_t r = 0; r < rows; ++r) {  // P = exp(S - lse)
            float* row = s + r * kBlockK;
            const float lse_r = lse_bh[i0 + r];
            if (lse_r == kNegInf)  // no key: P 0
              std::fill(row, row + cols, 0.0f);
            else if (std::isnan(lse_r))  // a NaN score: P NaN, its sign bit marking masked keys
              for (int64_t c = 0; c < cols; ++c) row[c] = row[c] == kNegInf ? -kNan : kNan;
            else
              kernels.exp_sub_sum(row, cols, lse_r);
          }
          if (tiles != nullptr) {
            // dV += P^T dO, R keys a call
            for (int64_t c0 = 0; c0 < cols; c0 += rows_per_call)
              tiles->accumulate_transposed(s + c0, kBlockK, std::min(rows_per_call, cols - c0),
                                           rows, do_panels_blk, kTilePanel * rows, p.dim_v,
                                           ones.data(), dv_blk + c0 * ld_dv, ld_dv);
            // dP = dO V^T
            for (int64_t r0 = 0; r0 < rows; r0 += rows_per_call)
              tiles->scores(do_rows_blk + r0 * p.dim_v, value_key_panels.data(), panels, p.dim_v,
                            1.0f, dps + r0 * kBlockK, kBlockK, std::min(rows_per_call, rows - r0));
          } else {
            // dV += P^T dO
            gemm(true, false, cols, p.dim_v, rows, 1.0f, s, kBlockK, do_blk, ld_do, 1.0f, dv_blk,
                 ld_dv);
            // dP = dO V^T
            gemm(false, true, rows, cols, p.dim_v, 1.0f, do_blk, ld_do, v_blk, ldv, 0.0f, dps,
                 kBlockK);
          }
          if (variate_acc) {  // per row: P dP and P over its same-variate keys and all its keys
            for (int64_t r = 0; r < rows; ++r) {
              const float* prow = s + r * kBlockK;
              const float* dprow = dps + r * kBlockK;
              const int64_t vi = variate[i0 + r + (p.nk - p.nq)];
              float spd = 0.0f, apd = 0.0f, sp = 0.0f, ap = 0.0f;
              for (int64_t c = 0; c < cols; ++c) {
                const float pdp = prow[c] * dprow[c];
                apd += pdp;
                ap += prow[c];
                if (variate[j0 + c] == vi) {
                  spd += pdp;
                  sp += prow[c];
                }
              }
              same_pdp[i0 + r] += spd;
              all_pdp[i0 + r] += apd;
              same_p[i0 + r] += sp;
              all_p[i0 + r] += ap;
            }
          }
          for (int64_t r = 0; r < rows; ++r) {  // dS = P (dP - D), in place of P
            float* row = s + r * kBlockK;
            const float* dprow = dps + r * kBlockK;
            const float d = dot_bh[i0 + r];
            if (std::isnan(lse_bh[i0 + r])) {  // as the reference's autograd: NaN, 0 where masked
              for (int64_t c = 0; c < cols; ++c) row[c] = std::signbit(row[c]) ? 0.0f : kNan;
            } else {
              for (int64_t c = 0; c < cols; ++c) row[c] *= dprow[c] - d;
            }
            if (table_acc) {
              const int64_t base = -p.iq[i0 + r] - p.rel_min;
              for (int64_t c = 0; c < cols; ++c) table_acc[p.bucket[p.ik[j0 + c] + base]] += row[c];
            }
            if (relative) {
              float* g = dqr.data_ptr<float>() + (i0 + r) * rel_width;
              const int64_t pi = p.iq[i0 + r], kmax = p.max_relative;
              const int64_t* ik = p.ik + j0;
              for (int64_t c = 0; c < cols; ++c)
                g[std::clamp(ik[c] - pi, -kmax, kmax) + kmax] += row[c];
            }
            if (tiles != nullptr)  // the micro-kernels have no alpha: scale dS here
              for (int64_t c = 0; c < cols; ++c) row[c] *= p.scale;
          }
          if (tiles != nullptr) {
            // dQ += (scale dS) k, R query rows a call
            for (int64_t r0 = 0; r0 < rows; r0 += rows_per_call)
              tiles->accumulate(s + r0 * kBlockK, kBlockK, std::min(rows_per_call, rows - r0), cols,
                                key_value_panels.data(), kTilePanel * cols_all, p.dim, ones.data(),
                                dq_bh + (i0 + r0) * ld_dq, ld_dq);
            // dK += (scale dS)^T q, R keys a call
            for (int64_t c0 = 0; c0 < cols; c0 += rows_per_call)
              tiles->accumulate_transposed(s + c0, kBlockK, std::min(rows_per_call, cols - c0),
                                           rows, q_panels_blk, kTilePanel * rows, p.dim,
                                           ones.data(), dk_blk + c0 * ld_dk, ld_dk);
          } else {
            // dQ += scale dS k, dK += scale dS^T q
            gemm(false, false, rows, p.dim, cols, p.scale, s, kBlockK, k_blk, ldk, 1.0f,
                 dq_bh + i0 * ld_dq, ld_dq);
            gemm(true, false, cols, p.dim, rows, p.scale, s, kBlockK, q_blk, ldq, 1.0f, dk_blk,
                 ld_dk);
          }
        }
      }
      if (variate_acc) {
        // d weight[1, h] = sum_i sum_{j same} dS_ij with dS_ij = P_ij (dP_ij - D_i), the row's
        // P normalized by its own sum s_i (P_ij / s_i; D_i = sum_j P_ij dP_ij / s_i): the float32
        // rounding of lse scales a row's P by 1 + O(1e-7), which the two sums of dS (each ~0
        // after cancellation: sum_j dS_ij = 0) would otherwise pick up. weight[0, h] gets the
        // opposite (a constant added to every logit of a row changes no probability).
        double same_sum = 0.0;
        for (int64_t i = 0; i < p.nq; ++i)
          if (all_p[i] != 0)  // 0: the row saw no key; NaN: a NaN score (NaN, as the reference)
            same_sum += (same_pdp[i] - same_p[i] * (all_pdp[i] / all_p[i])) / all_p[i];
        variate_acc[0] = -same_sum;
        variate_acc[1] = same_sum;
      }
      if (p.rotary) {  // gradients for the rotated q', k' -> for q, k: the inverse rotation
        rotate_rows(dq_bh, ld_dq, dq_bh, ld_dq, p.nq, p.dim, p.q_cos.data_ptr<float>(),
                    p.q_sin.data_ptr<float>(), p.rotary_pairs, p.rotary_interleaved, -1.0f);
        float* g = dk_op.rows(b, h);
        rotate_rows(g, ld_dk, g, ld_dk, p.nk, p.dim, p.k_cos.data_ptr<float>(),
                    p.k_sin.data_ptr<float>(), p.rotary_pairs, p.rotary_interleaved, -1.0f);
      }
      if (relative) {  // the bias's own q term, and the table's gradient from this (b, h)
        dq[b][h].addmm_(dqr, p.rel_table, 1.0, p.rel_scale);
        auto slot = partial[b][h];
        at::mm_out(slot, dqr.t(), p.q[b][h]).mul_(p.rel_scale);
      }
    }
  });
  if (table_grad) dtable = partial.sum(0).t().contiguous();  // [num_buckets, H]
  if (relative) dtable = partial.sum({0, 1});                // [2K+1, D]
  if (p.variate && dvariate != nullptr)
    *dvariate = variate_partial.sum(0).t().to(at::kFloat).contiguous();  // [2, H]
}

}  // namespace posenc::detail
