// The CPU capability posenc's fused CPU kernels run at, chosen once per process, as ATen's
// DispatchStub chooses its own (aten/src/ATen/native/DispatchStub.cpp: each cpu/ kernel built per
// capability, the widest the CPU has picked by CPUID, ATEN_CPU_CAPABILITY lowering it):
//   kAvx512  AVX-512 F + BW + VL + DQ (with AVX2, FMA, F16C): 16 float lanes, masked tails
//   kAvx2    AVX2 + FMA + F16C: 8 float lanes
//   kScalar  any x86-64 (or another architecture): the plain C++ loops; GELU and add + LayerNorm
//            have no plain pass and take their ATen reference (as before on CPUs without AVX2)
// Detected by __builtin_cpu_supports (CPUID). POSENC_CPU_CAPABILITY=scalar|avx2|avx512 chooses
// one (for tests and measurements); unset, ATEN_CPU_CAPABILITY's default|avx2|avx512 does (so
// the CTest entries that lower ATen lower posenc with it). A POSENC_CPU_CAPABILITY that is not
// one of the three, or names a level this CPU lacks, is an error at the first kernel call (one
// line; a typo or a missing unit must not run, and be measured as, another variant);
// ATEN_CPU_CAPABILITY is ATen's variable, with values of its own (zvector, sve256, ...): one
// posenc does not know, or above the CPU, leaves posenc at what the CPU has (ATen's own
// handling of values it does not know).
// Native bfloat16 (train.precision: bf16, src/train/schedule.h): AVX-512 BF16 (vdpbf16ps: bf16
// pairs multiplied and summed into float32, CPUID leaf 7 subleaf 1 EAX bit 5) or AMX-BF16 (tile
// matmuls of bf16, leaf 7 subleaf 0 EDX bit 22), the units oneDNN's bf16 matmuls run on; the rule
// also asks for posenc's level to be avx512, so POSENC_CPU_CAPABILITY=avx2 runs this machine as an
// AVX2 one (where oneDNN would emulate bf16 in float32 arithmetic at a loss), refusal included.
#pragma once

#include <optional>
#include <string>

namespace posenc {

enum class CpuCapability { kScalar, kAvx2, kAvx512 };

/// "scalar", "avx2", "avx512" (the values POSENC_CPU_CAPABILITY takes).
const char* to_string(CpuCapability capability);
/// The widest level this CPU supports (CPUID, asked once).
CpuCapability cpu_capability_detected();
/// The level the fused kernels run at in this process (detected, or the environment's choice;
/// decided at the first call). Throws (one line) for a bad POSENC_CPU_CAPABILITY.
CpuCapability cpu_capability();
/// What cpu_capability() would choose given the two variables' values (nullptr: unset) on a
/// CPU whose widest level is `detected`; throws c10::Error (TORCH_CHECK, one line) for a bad
/// POSENC_CPU_CAPABILITY value. The rule, apart from the process's environment for tests.
CpuCapability choose_cpu_capability(const char* posenc_value, const char* aten_value,
                                    CpuCapability detected);
/// The level named by POSENC_CPU_CAPABILITY when it is set to a known name, else nullopt (tests
/// skip a forced level the CPU lacks instead of failing).
std::optional<CpuCapability> cpu_capability_requested();
/// One line for --version and profiles: "avx512 (detected avx512)" or, forced,
/// "avx2 (POSENC_CPU_CAPABILITY; detected avx512)".
std::string cpu_capability_description();

/// Whether this CPU computes bfloat16 natively: AVX-512 BF16 or AMX-BF16 (CPUID, asked once).
bool cpu_has_native_bf16();
/// Why bf16 training cannot run at posenc level `level` on a CPU with (or without) native bf16;
/// "" when it can (level avx512 and native bf16). The rule, apart from this CPU, for tests.
std::string bf16_unsupported_reason(CpuCapability level, bool native_bf16);
/// The same for this process (cpu_capability() and cpu_has_native_bf16()), naming the level as
/// cpu_capability_description() does.
std::string bf16_unsupported_reason();

}  // namespace posenc
