// Internal: the tiled CPU attention's own tile products (attention_cpu.cpp), one table per CPU
// level with vector units (attention_tiles_rows.h, compiled by kernels_avx2.cpp and
// kernels_avx512.cpp; the scalar level has none and keeps MKL's sgemm). The operands are packed
// by attention_cpu.cpp in the layouts the micro-kernels stream:
//   query block  qp[(r / R) * R * D + d * R + r % R]      R = rows (the micro-kernel's row count),
//                                                          the last block's missing rows never read
//   key panels   kp[(c / 16) * 16 * D + d * 16 + c % 16]   16 keys a panel, the last one padded
//                                                          (its scores computed, never read)
//   value panels vp[(e / 16) * vstride + c * 16 + e % 16]  16 columns a panel, vstride >= 16 Nk
// and the score strip of R query rows is s[r * lds + c] (row-major, in L1: R x 256 floats).
#pragma once

#include <cstdint>

namespace posenc::detail {

constexpr int64_t kTilePanel = 16;  // keys per key panel, columns per value panel

struct AttentionTileKernels {
  int64_t rows;  // R: query rows per micro-kernel call (at most)
  // Every entry takes `rows` in [1, R] (0 does nothing) and reads and writes those rows only: no
  // lane of the strip, the packed query block or alpha past them (a short call at the end of a
  // block runs a kernel compiled for its row count).
  // s[r * lds + c] = scale * sum_d qp[d * R + r] kp(c, d) for r < rows and c < 16 * panels
  // (qp: one R-row block of the packed query block; kp: the tile's first key panel).
  void (*scores)(const float* qp, const float* kp, int64_t panels, int64_t dim, float scale,
                 float* s, int64_t lds, int64_t rows);
  // o[r * ldo + e] = alpha[r] o[r * ldo + e] + sum_{c < cols} s[r * lds + c] vp(c, e) for
  // r < rows and e < dim_v (a multiple of 16; vp: the tile's first key in value panel 0).
  void (*accumulate)(const float* s, int64_t lds, int64_t rows, int64_t cols, const float* vp,
                     int64_t vstride, int64_t dim_v, const float* alpha, float* o, int64_t ldo);
  // The same with the strip transposed: o[r * ldo + e] = alpha[r] o[r * ldo + e] +
  // sum_{c < cols} s[c * lds + r] vp(c, e) (s[c * lds + r] read for r < rows only).
  void (*accumulate_transposed)(const float* s, int64_t lds, int64_t rows, int64_t cols,
                                const float* vp, int64_t vstride, int64_t dim_v, const float* alpha,
                                float* o, int64_t ldo);
};

// Defined by kernels_avx2.cpp and kernels_avx512.cpp (x86-64 only).
extern const AttentionTileKernels kAvx2AttentionTiles;
extern const AttentionTileKernels kAvx512AttentionTiles;

}  // namespace posenc::detail
