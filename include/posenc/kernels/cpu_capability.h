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

}  // namespace posenc
