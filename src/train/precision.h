// train.precision: the arithmetic of the training forward. Internal to the trainer.
//   float32  everything in float32 (the default)
//   bf16     mixed precision as torch.autocast("cpu", dtype=torch.bfloat16) does it (Micikevicius
//            et al. 2018, "Mixed Precision Training"; PyTorch's autocast,
//            aten/src/ATen/autocast_mode.cpp): the forward of the model and the loss runs with CPU
//            autocast on, so the ops on autocast's lower-precision list (linear, matmul, mm, addmm,
//            bmm, scaled_dot_product_attention, ...) cast their float inputs to bfloat16 and
//            compute in it (oneDNN's bf16 matmuls: AVX-512 BF16 / AMX), those on its float32 list
//            (cross_entropy_loss, ...) in float32, the rest in the dtype they are given. The
//            parameters stay float32 (the master weights: autocast casts a copy per forward,
//            cached for the forward's life), the backward follows the forward's dtypes, the
//            gradients reach the parameters as float32, and AdamW, the clip and the weight
//            average work in float32. Evaluation (the task's evaluate and generalization rows)
//            runs in float32 (the same evaluation as a float32 run's).
//            posenc's fused kernels under it (where autocast leaves the dtype to the op):
//            add + LayerNorm is a float32 op (autocast's choice for layer_norm on CUDA): bf16
//            inputs are widened, so the residual stream and its norms stay float32 and fused
//            (Python's autocast keeps the stream in bf16 after a bf16 embedding); a short
//            sequence's bf16 q, k, v are widened for the short attention kernel (RoPE inside;
//            SDPA's bf16 flash backward at N = 16 is ~20x slower); GELU, whose fused pass is
//            float32 only, runs ATen's bf16 gelu on fc1's bf16 output; a long sequence's RoPE
//            pass reads bf16 q and k (angles in float32).
// Training in bf16 needs native bfloat16 on the CPU (posenc/kernels/cpu_capability.h: AVX-512
// BF16 or AMX-BF16 at posenc's avx512 level); elsewhere bf16 has no arithmetic of its own to run
// on, and the training run is refused in one line. CPU only (train.device: cpu). Reading a bf16
// run (eval, eval --image, evaluate_only) is not training: its evaluation is float32 on any CPU.
#pragma once

#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>

#include <string>

#include "posenc/kernels/cpu_capability.h"

namespace posenc::train {

/// Checks train.precision's value when the config is read: "float32" or "bf16"; an error
/// (c10::Error: exit 2) names the value. Every command that reads a run checks this.
inline void check_precision_value(const std::string& precision) {
  TORCH_CHECK(precision == "float32" || precision == "bf16",
              "train: precision must be 'float32' or 'bf16', got '", precision, "'");
}

/// Checks that this process can train at train.precision: bf16 needs a CPU run on a CPU with
/// native bfloat16 (at posenc's avx512 level); an error (exit 2) names the value and why. Only
/// training asks: evaluating a bf16 run (posenc eval, eval --image, evaluate_only, export) reads
/// float32 weights and evaluates in float32, as the run's own evaluation did, so it runs on any
/// CPU and prints the run's numbers.
inline void check_precision_can_train(const std::string& precision, const std::string& device) {
  check_precision_value(precision);
  if (precision != "bf16") return;
  TORCH_CHECK(device == "cpu",
              "train: precision 'bf16' is CPU autocast; train.device must be 'cpu', got '", device,
              "'");
  const auto why = bf16_unsupported_reason();
  TORCH_CHECK(why.empty(),
              "train: precision 'bf16' needs a CPU with native bfloat16 (AVX-512 BF16 ",
              "or AMX-BF16) at posenc's avx512 level, but ", why, "; use precision: float32");
}

/// CPU autocast to bfloat16 for the scope's life when `on` (as `with torch.autocast("cpu",
/// dtype=torch.bfloat16)`: the previous state restored, the cast cache cleared on leaving the
/// outermost scope).
class CpuAutocastScope {
 public:
  explicit CpuAutocastScope(bool on) : on_(on) {
    if (!on_) return;
    was_enabled_ = at::autocast::is_autocast_enabled(at::kCPU);
    was_dtype_ = at::autocast::get_autocast_dtype(at::kCPU);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CpuAutocastScope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCPU, was_dtype_);
  }
  CpuAutocastScope(const CpuAutocastScope&) = delete;
  CpuAutocastScope& operator=(const CpuAutocastScope&) = delete;

 private:
  bool on_;
  bool was_enabled_ = false;
  at::ScalarType was_dtype_ = at::kBFloat16;
};

}  // namespace posenc::train
