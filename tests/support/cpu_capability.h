// Test support: the ATen CPU capability this process's vectorized kernels run at.
//
// ATen builds each elementwise kernel (exp, pow, erf, sin, cos, ...) for DEFAULT, AVX2 and
// AVX512 and picks the widest the CPU has, lowered by ATEN_CPU_CAPABILITY=avx2|default. Their
// float32 results differ by an ulp between capabilities (Sleef's AVX-512 pow is not its AVX2
// pow), so a fixture frozen from torch's math holds to the bit only at the capability it was
// generated at; elsewhere a test states its ulp tolerance (tests/CMakeLists.txt also runs such
// tests under ATEN_CPU_CAPABILITY=avx2, bit for bit, on every CPU of our kind).
#pragma once

#include <ATen/Version.h>

#include <string>

namespace posenc::test {

/// "DEFAULT", "AVX2" or "AVX512": torch.backends.cpu.get_cpu_capability()'s names.
inline std::string aten_cpu_capability() { return at::get_cpu_capability(); }

}  // namespace posenc::test
