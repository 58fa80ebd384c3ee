// posenc::apply_rotary — transformers' apply_rotary_pos_emb (modeling_llama.py) as one operator
// in PyTorch's dispatcher, for q and k together:
//
//   c = cos.unsqueeze(unsqueeze_dim), s = sin.unsqueeze(unsqueeze_dim)     W = cos.size(-1) <= D
//   y[..., :W] = x[..., :W] * c + rot(x[..., :W]) * s                      (x = q, then k)
//   y[..., W:] = x[..., W:]                                                (partial rotary)
//   rot, half:        [x0 .. x(W/2-1) | x(W/2) .. x(W-1)] -> [-x(W/2) .. -x(W-1) | x0 .. x(W/2-1)]
//                     (rotate_half: Llama, Qwen, Gemma, Mistral, ...)
//   rot, interleaved: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
//                     (rotate_every_two / rotate_half_llm: GPT-J, GLM, DeepSeek's interleave)
//
// q: [B, Hq, N, D] and k: [B, Hk, N, D] with cos, sin: [B or 1, N, W] (unsqueeze_dim 1, HF's
// default), or q/k: [B, N, H, D] (unsqueeze_dim 2); any shapes that broadcast as the formula says
// are taken by the reference, every unsqueeze_dim transformers takes with its shapes (-1: the
// table's last dim 1 broadcast over the head dim, which rotates whole); shapes the formula cannot
// broadcast are one line, as are dtypes other than float32/float64/bfloat16/float16 and tensors
// on different devices (src/kernels/dispatch/operator_checks.h). Results have the dtype eager
// PyTorch's formula gives (q's, unless cos is of a wider type). Head counts of q and k may differ
// (grouped-query attention).
//
// Paths (one dispatch point, apply_rotary_fused_refusal; apply_rotary_route says which and why):
// rope_rotate's kernel of the inputs' device with eager's roundings (each product and the sum
// rounded to the storage type, no fused multiply-add), so results equal eager's to the bit on
// either device; otherwise the reference below, which is the formula itself. Both kernels take q/k
// of 4 dims with a unit-stride head dim and tables [1 or B, N, W]:
//   CPU   rope_rotate_cpu's round_each_op mode, float32/float64/bfloat16/float16; it reads one
//         table entry per pair, so it takes tables whose two pair members hold the same value (HF's
//         cat((freqs, freqs)) or repeat_interleave), checked on the host (at::equal: CPU values)
//   CUDA  cuda::rope_rotate_tables' eager mode (where the library has the CUDA glue; not float64):
//         every output element reads its own table entries, so any table values give eager's
//         result and the refusal reads no value (shapes, dtypes and strides only): no device
//         wait, and CUDA graph capture (torch.compile mode="reduce-overhead") can record it
// The refusal names the first condition that fails.
// Backward (autograd/, differentiable, so gradgradcheck and torch.compile trace it):
//   dq = apply_rotary(dy, cos, -swap(sin))          swap: exchange the halves (pairs) of the table
//   dcos = sum over broadcast dims of dy * x,  dsin = sum of dy * rot(x)   (over q and k)
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>
#include <vector>

#include "posenc/functional/rope.h"

namespace posenc::ops {

/// The formula in plain ATen (the specification and the test oracle); any device.
std::tuple<at::Tensor, at::Tensor> apply_rotary_reference(const at::Tensor& q, const at::Tensor& k,
                                                          const at::Tensor& cos,
                                                          const at::Tensor& sin,
                                                          int64_t unsqueeze_dim,
                                                          const std::string& layout);
/// rot(x) over the last dim (half or interleaved), as the formula's table.
at::Tensor rotate_half_any(const at::Tensor& x, RopeLayout layout);
/// The table with its two pair members exchanged (half: the halves; interleaved: even/odd).
at::Tensor swap_pair_members(const at::Tensor& table, RopeLayout layout);
/// Why the fused kernel of the inputs' device (CPU, or CUDA where the library has the CUDA glue)
/// does not take these inputs ("" when it does).
std::string apply_rotary_fused_refusal(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& cos, const at::Tensor& sin,
                                       int64_t unsqueeze_dim, RopeLayout layout);
/// What a fused kernel takes beyond the conditions both share.
struct RotaryKernelTakes {
  bool float64 = false;  ///< float64 q/k/tables (the CPU kernel)
  /// Tables whose two pair members differ: the kernel reads each output element's own entries
  /// (the CUDA kernel's eager mode). Then the refusal reads no table value; without it, the pair
  /// members are compared (at::equal, a device wait on CUDA) and float64 tables must be float32's.
  bool unequal_pair_members = false;
};
/// The CPU kernel's (rope_rotate_cpu, round_each_op) and the CUDA kernel's (eager mode).
inline constexpr RotaryKernelTakes kCpuRotaryKernelTakes{/*float64=*/true,
                                                         /*unequal_pair_members=*/false};
inline constexpr RotaryKernelTakes kCudaRotaryKernelTakes{/*float64=*/false,
                                                          /*unequal_pair_members=*/true};
/// The device-independent part of apply_rotary_fused_refusal for a kernel that takes `takes`:
/// shapes, dtypes, strides, and (only without takes.unequal_pair_members) table values.
std::string apply_rotary_kernel_refusal(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& cos, const at::Tensor& sin,
                                        int64_t unsqueeze_dim, RopeLayout layout,
                                        RotaryKernelTakes takes);
/// A rotation kernel with eager's roundings: inputs[i] [B, N, H, D] rotated into outputs[i] by the
/// tables cos, sin, per-pair ([N, F] or [B, N, F]: rope_rotate_cpu's contract, round_each_op)
/// or, where reads_whole_tables, as apply_rotary has them ([N, W] or [B, N, W]: each output
/// element its own entries, detail::rope_rotate_launch_eager's contract).
struct RotaryKernel {
  void (*rotate)(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                 const at::Tensor& cos, const at::Tensor& sin, RopeLayout layout) = nullptr;
  bool reads_whole_tables = false;
};
/// The fused path for inputs that apply_rotary_kernel_refusal takes: q, k (as given to
/// apply_rotary, unsqueeze_dim 1 or 2, normalized) into outputs of their shapes (or themselves:
/// in place) through `kernel`, which reads them as [B, N, H, D] views and the tables (per pair,
/// or whole). The CPU emulator's tests (tests/cuda_emu) run it with the emulated CUDA kernel.
void apply_rotary_through(const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs, const at::Tensor& cos,
                          const at::Tensor& sin, int64_t unsqueeze_dim, RopeLayout layout,
                          RotaryKernel kernel);
/// apply_rotary on the CPU or CUDA: the fused kernel of the device where it applies, else the
/// reference.
std::tuple<at::Tensor, at::Tensor> apply_rotary_fused_or_reference(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin,
    int64_t unsqueeze_dim, const std::string& layout);
/// unsqueeze_dim in [0, cos.dim()] (negative: counted from the end, as torch's unsqueeze); one
/// line outside [-(cos.dim() + 1), cos.dim()].
int64_t normalized_unsqueeze_dim(int64_t unsqueeze_dim, const at::Tensor& cos);
/// The dtype of x's result: x, cos and sin promoted (transformers' formula in eager).
at::ScalarType apply_rotary_result_dtype(const at::Tensor& x, const at::Tensor& cos,
                                         const at::Tensor& sin);
/// The rotary width of x under the unsqueezed table c: c.size(-1), or x's whole head dim where c's
/// last dim is 1 (broadcast over it: transformers' formula with unsqueeze_dim -1).
int64_t rotary_width(const at::Tensor& x, const at::Tensor& c);
/// The shape of x's result under the unsqueezed table c: the leading dims broadcast, x's head dim.
std::vector<int64_t> apply_rotary_result_shape(const at::Tensor& x, const at::Tensor& c);
/// Checks shared by every path: the one-line errors (devices, shapes, dtypes, layout name).
RopeLayout apply_rotary_check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos,
                              const at::Tensor& sin, int64_t unsqueeze_dim,
                              const std::string& layout);

}  // namespace posenc::ops
