// Which path posenc::positional_attention takes (the SDPA-layout attention; alibi_attention and
// t5_attention are it with one bias part), decided once by a pure function of what the call is —
// device type, dtype, head dims, the parts given — and read by the operator's forward, its
// backward and positional_attention_route alike. No tensor goes in, so the CUDA decision is tested
// on machines without a GPU (tests/test_positional_route.cpp).
//
// Paths, the first that takes the call runs it (PyTorch's sdp_utils picks SDPA's backends so):
//   cuda       the CUDA kernel (src/kernels/cuda/attention_cuda.cu) through
//   posenc::attention_fused:
//              CUDA tensors, a LibTorch with the CUDA glue, float32 / bfloat16 / float16, head
//              dims 1 .. cuda::kAttentionMaxDim, at most one bias part (ALiBi or T5), no causal
//              ids; RoPE rotated first in float32 by the reference's formula (the gradients back)
//   fused      the tiled CPU kernel (src/kernels/cpu/attention_cpu.cpp) through
//              posenc::attention_fused: CPU tensors, float32 / bfloat16 / float16, head dims >= 1
//              (or nothing to compute); RoPE inside its tiles where it reads the tables (one
//              per-pair [Nk, W/2] table: the batch rows equal, a pair's two members one value),
//              otherwise rotated first in float32 as on CUDA
//   reference  the plain-ATen specification (in float64 for float64): every call
// Tables that require a gradient (under grad mode) are rotated first by posenc::apply_rotary,
// differentiable in cos and sin; the path above then sees q, k rotated and no tables.
#pragma once

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace posenc::ops {

enum class PositionalPath { kCuda, kFused, kReference };
std::string to_string(PositionalPath path);

/// What positional_attention's path depends on (no tensor: every device is testable anywhere).
struct PositionalCall {
  c10::DeviceType device = c10::DeviceType::CPU;
  c10::ScalarType dtype = c10::ScalarType::Float;  ///< q's (k and v share it: checked before)
  int64_t head_dim = 0;                            ///< D of q and k
  int64_t value_dim = 0;                           ///< Dv of v
  bool empty = false;                              ///< q holds no element
  bool alibi = false;                              ///< slopes given
  bool t5 = false;                                 ///< a T5 table given
  bool causal_ids = false;                         ///< causal on ids (the CPU kernel reads them)
  bool rotary = false;                             ///< cos, sin of a width > 0
  bool learned_tables = false;                     ///< cos or sin requires grad, under grad mode
  /// Why the CPU kernel cannot read the tables inside its tiles ("" where it can): read from the
  /// tables' values by the caller (positional_rotary_outside in attention_operators.cpp).
  std::string tables_unreadable;
  bool cuda_glue = false;  ///< this library was built with the CUDA glue (POSENC_HAS_CUDA_GLUE)
};

struct PositionalRoute {
  PositionalPath path = PositionalPath::kReference;
  bool apply_rotary_first = false;  ///< learned tables: apply_rotary, then the path on no tables
  bool rope_inside = false;         ///< the kernel rotates q and k as it loads its tiles
  bool rotate_first = false;        ///< q, k rotated first in float32 (the gradients rotated back)
  std::string rope_outside;         ///< the CPU kernel: why the tables cannot go inside its tiles
  /// The paths passed over before `path`, in priority order, with the first rule each failed.
  std::vector<std::pair<PositionalPath, std::string>> not_taken;
};

/// The path `call` takes (see the table above).
PositionalRoute route_positional(const PositionalCall& call);

/// positional_attention_route's line (python/posenc/routes.py reads it as an AttentionRoute):
/// ["apply_rotary first (cos/sin require grad), then "] + one of "fused", "fused, RoPE inside",
/// "fused, RoPE outside: <why>", "CUDA kernel", "CUDA kernel, RoPE outside (float32)",
/// "reference: <why>" (on CUDA: "reference: a call the CUDA kernel does not take (<why>)").
std::string describe(const PositionalRoute& route);

}  // namespace posenc::ops
