// RoPE on one row for the CPU attention kernels (Su et al. 2021; layouts as rope_apply):
//   half:        (y_i, y_{i+F})   = (x_i c_i - x_{i+F} s_i,   x_{i+F} c_i + x_i s_i)
//   interleaved: (y_2i, y_2i+1)   = (x_2i c_i - x_2i+1 s_i,   x_2i+1 c_i + x_2i s_i)
// with s_i = sign * sin_i (sign -1: the inverse rotation R^T); dims from 2F on pass through.
// y may be x (in place). Inline so each kernel compiles it for its own target (AVX2 or not).
#pragma once

#include <cstdint>

namespace posenc::detail {

inline __attribute__((always_inline)) void rotate_row(const float* x, float* y, int64_t dim,
                                                      const float* c, const float* s, int64_t pairs,
                                                      bool interleaved, float sign) {
  if (interleaved) {
    for (int64_t i = 0; i < pairs; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1], si = sign * s[i];
      y[2 * i] = a * c[i] - b * si;
      y[2 * i + 1] = b * c[i] + a * si;
    }
  } else {
    for (int64_t i = 0; i < pairs; ++i) {
      const float a = x[i], b = x[i + pairs], si = sign * s[i];
      y[i] = a * c[i] - b * si;
      y[i + pairs] = b * c[i] + a * si;
    }
  }
  if (y != x)
    for (int64_t d = 2 * pairs; d < dim; ++d) y[d] = x[d];
}

}  // namespace posenc::detail
