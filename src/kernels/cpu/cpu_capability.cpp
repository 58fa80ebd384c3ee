// The fused CPU kernels' capability: CPUID once, then the environment's choice (the rule and its
// reasons in include/posenc/kernels/cpu_capability.h; ATen's counterpart is
// aten/src/ATen/native/DispatchStub.cpp's compute_cpu_capability).
#include "posenc/kernels/cpu_capability.h"

#include <c10/util/Exception.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace posenc {

namespace {

std::optional<CpuCapability> parse(const char* value) {
  if (std::strcmp(value, "scalar") == 0) return CpuCapability::kScalar;
  if (std::strcmp(value, "avx2") == 0) return CpuCapability::kAvx2;
  if (std::strcmp(value, "avx512") == 0) return CpuCapability::kAvx512;
  return std::nullopt;
}

}  // namespace

const char* to_string(CpuCapability capability) {
  switch (capability) {
    case CpuCapability::kScalar:
      return "scalar";
    case CpuCapability::kAvx2:
      return "avx2";
    case CpuCapability::kAvx512:
      return "avx512";
  }
  return "unknown";
}

CpuCapability cpu_capability_detected() {
  static const CpuCapability detected = [] {
#if defined(__x86_64__)
    __builtin_cpu_init();  // this may run during static initialization
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq");
    return avx512 ? CpuCapability::kAvx512 : avx2 ? CpuCapability::kAvx2 : CpuCapability::kScalar;
#else
    return CpuCapability::kScalar;
#endif
  }();
  return detected;
}

CpuCapability choose_cpu_capability(const char* posenc_value, const char* aten_value,
                                    CpuCapability detected) {
  if (posenc_value != nullptr) {
    const auto chosen = parse(posenc_value);
    TORCH_CHECK(chosen.has_value(), "POSENC_CPU_CAPABILITY='", posenc_value,
                "' is not one of scalar, avx2, avx512");
    TORCH_CHECK(*chosen <= detected, "POSENC_CPU_CAPABILITY=", posenc_value,
                " but this CPU's widest level is ", to_string(detected),
                " (avx512 needs AVX-512 F, BW, VL and DQ; avx2 needs AVX2, FMA and F16C)");
    return *chosen;
  }
  if (aten_value != nullptr) {  // ATen's names default, avx2, avx512 (its others: not ours)
    const auto chosen =
        std::strcmp(aten_value, "default") == 0 ? CpuCapability::kScalar : parse(aten_value);
    if (chosen.has_value()) return std::min(*chosen, detected);
  }
  return detected;
}

CpuCapability cpu_capability() {
  static const CpuCapability chosen =
      choose_cpu_capability(std::getenv("POSENC_CPU_CAPABILITY"),
                            std::getenv("ATEN_CPU_CAPABILITY"), cpu_capability_detected());
  return chosen;
}

std::optional<CpuCapability> cpu_capability_requested() {
  const char* value = std::getenv("POSENC_CPU_CAPABILITY");
  return value == nullptr ? std::nullopt : parse(value);
}

std::string cpu_capability_description() {
  const CpuCapability chosen = cpu_capability();
  const CpuCapability detected = cpu_capability_detected();
  std::string line = to_string(chosen);
  if (std::getenv("POSENC_CPU_CAPABILITY") != nullptr)
    line += " (POSENC_CPU_CAPABILITY; detected ";
  else if (chosen != detected)
    line += " (ATEN_CPU_CAPABILITY; detected ";
  else
    line += " (detected ";
  return line + to_string(detected) + ")";
}

bool cpu_has_native_bf16() {
  static const bool native = [] {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const unsigned max_subleaf = eax;
    const bool amx_bf16 = (edx & (1u << 22)) != 0;
    bool avx512_bf16 = false;
    if (max_subleaf >= 1 && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0)
      avx512_bf16 = (eax & (1u << 5)) != 0;
    return avx512_bf16 || amx_bf16;
#else
    return false;
#endif
  }();
  return native;
}

std::string bf16_unsupported_reason(CpuCapability level, bool native_bf16) {
  if (!native_bf16) return "this CPU has no native bfloat16 (AVX-512 BF16 or AMX-BF16)";
  if (level != CpuCapability::kAvx512)
    return std::string("posenc's CPU level is ") + to_string(level) + ", not avx512";
  return "";
}

std::string bf16_unsupported_reason() {
  const bool native = cpu_has_native_bf16();
  auto why = bf16_unsupported_reason(cpu_capability(), native);
  if (why.empty() || !native) return why;
  return "posenc's CPU level is " + cpu_capability_description() + ", not avx512";
}

}  // namespace posenc
