// Fractional RoPE: positions as fractions of a maximum, frequencies log-spaced from 1 to theta, the
// whole attention width as one table dealt to the heads. LTX-2's rotary embedding (diffusers 0.42.1
// LTX2AudioVideoRotaryPosEmbed.forward, models/transformers/transformer_ltx2.py; Lightricks' LTX-2
// ltx_core "fractional positions"), op for op in its arithmetic:
//
//   A axes, dim = H * Dh (the attention's inner width), F = dim // (2A) frequencies
//   f_j   = float32(theta^(linspace(0, 1, F)_j) * pi / 2)   pow in float64 (LTX-2's
//           rope_double_precision, default) or float32; * pi then / 2 in that dtype, then rounded
//   g_a   = p_a / max_a                                     float32 (p: the patch's midpoint)
//   angle = (g_a * 2 - 1) * f_j                             float32, in [-f_j, f_j]
//   pairs: P = (dim mod 2A) / 2 identity pairs first (cos 1, sin 0), then pair P + j A + a turns
//          by angle(a, j): the axes interleaved per frequency (t0 h0 w0 t1 h1 w1 ...)
//   heads: pair k belongs to head k // (Dh / 2), its pair k mod (Dh / 2) there.
// Layouts (the pair's two elements within a head):
//   interleaved (LTX-2 rope_type "interleaved"): (2i, 2i + 1) over the inner width, which is the
//                same pairs per head since Dh is even
//   half        (LTX-2 rope_type "split"): (i, i + Dh/2) within each head
// cos/sin in float32 are torch's vectorized kernels: equal to diffusers' on the same ATen CPU
// capability (tests/fixtures/diffusers_video.json records it).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace posenc {

/// f_j, j < count: [count] float32 (pow in float64 when double_precision, else float32).
at::Tensor rope_fractional_frequencies(double theta, int64_t count, bool double_precision);

/// Per-head (cos, sin) [..., N, H, Dh/2] float32 for coords [..., N, A] (each value taken to
/// float32, as diffusers' float32 coordinates) with max_positions [A] and frequencies [F],
/// F = (H Dh) // (2A). Checks the shapes with their values.
std::pair<at::Tensor, at::Tensor> rope_fractional_cos_sin(const at::Tensor& coords,
                                                          const std::vector<double>& max_positions,
                                                          const at::Tensor& frequencies,
                                                          int64_t num_heads, int64_t head_dim);

}  // namespace posenc
