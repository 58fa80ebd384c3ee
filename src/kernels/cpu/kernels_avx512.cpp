// The fused CPU kernels' loops at the AVX-512 level (cpu_kernels.h): the *_rows.h loops over
// vec_avx512.h's 16 float lanes, compiled for AVX-512 F + BW + VL + DQ (with AVX2, FMA, F16C)
// inside a `#pragma GCC target` region; everything included above the region keeps the baseline
// (cpu_kernels.h explains why). GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_*
// placeholders as "(may be) used uninitialized" (GCC bug 105593, fixed in 13): silenced for this
// file, before the header.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_tiles.h"
#include "cpu_kernels.h"
#include "linear_gemm.h"
#include "rotate_row.h"
#include "short_attention_cpu.h"

#if defined(__x86_64__)

// GCC: a target region; clang (clang-tidy, a clang build) has no `#pragma GCC target` and
// gives every function of the region the attribute instead.
#if defined(__clang__)
#pragma clang attribute push(                                                    \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq"))), \
    apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq")
#endif

// clang-format off
#include "vec_avx512.h"
#include "softmax_rows.h"
#include "gelu_rows.h"
#include "layer_norm_rows.h"
#include "rope_rows.h"
#include "short_attention_rows.h"
#include "adamw_rows.h"
#include "attention_tiles_rows.h"
#include "linear_gemm_rows.h"
// clang-format on

namespace posenc::detail {

using Vec = VecAvx512;

const CpuKernels kAvx512Kernels = {
    CpuCapability::kAvx512,
    &VecSoftmaxRows<Vec>::row_max,
    &VecSoftmaxRows<Vec>::exp_sub_sum,
    &GeluRows<Vec>::span,
    &GeluRows<Vec>::backward_span,
    &LayerNormRows<Vec>::forward_row,
    &LayerNormRows<Vec>::backward_row,
    &RopeRows<Vec>::f32_entry,
    &RopeRows<Vec>::stream_ok,
    &RopeRows<Vec>::bf16_entry,
    &RopeRows<Vec>::f16_entry,
    &ShortAttentionVec<Vec>::forward,
    &ShortAttentionVec<Vec>::backward,
    &adamw_update,
    &sum_squares_vec<Vec>,
};

// The tiled attention's own products: 8 query rows x 32 columns of accumulators
// (16 of the 32 zmm registers).
const AttentionTileKernels kAvx512AttentionTiles = AttentionTileRows<Vec, 8, 2>::table();

// The linear layers' own products (linear_gemm.h): 8 rows x 32 columns of accumulators (16 of the
// 32 zmm registers).
const LinearGemmKernels kAvx512LinearGemm = LinearGemmRows<Vec, 8, 2>::table();

}  // namespace posenc::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#endif  // x86-64 (elsewhere the level is never chosen: cpu_capability_detected() is scalar)
