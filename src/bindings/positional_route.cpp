// route_positional and describe: positional_attention's path as named rules in priority order
// (cuda, fused, reference), each saying why it does not take a call. The table of paths and what
// each needs is in positional_route.h.
#include "positional_route.h"

#include "posenc/kernels/attention_cuda.h"

namespace posenc::ops {

namespace {

bool kernel_dtype(c10::ScalarType dtype) {
  return dtype == c10::ScalarType::Float || dtype == c10::ScalarType::BFloat16 ||
         dtype == c10::ScalarType::Half;
}

// Why the CUDA kernel does not take the call ("" when it does).
std::string cuda_refusal(const PositionalCall& c) {
  if (c.device != c10::DeviceType::CUDA) return "not on a CUDA device";
  if (!c.cuda_glue) return "this LibTorch has no CUDA glue";
  // float64 is the one other dtype positional_attention takes
  if (!kernel_dtype(c.dtype)) return "float64 (the kernel computes in float32)";
  if (c.head_dim == 0 || c.value_dim == 0) return "a head dim of 0";
  if (c.head_dim > cuda::kAttentionMaxDim || c.value_dim > cuda::kAttentionMaxDim)
    return "a head dim above " + std::to_string(cuda::kAttentionMaxDim);
  if (c.alibi && c.t5) return "ALiBi and T5 together";
  if (c.causal_ids) return "causal ids";
  return "";
}

// Why the tiled CPU kernel does not take the call ("" when it does).
std::string cpu_refusal(const PositionalCall& c) {
  if (c.dtype == c10::ScalarType::Double) return "float64 (the kernel computes in float32)";
  if (c.device != c10::DeviceType::CPU) return "not on the CPU";
  if (!c.empty && (c.head_dim == 0 || c.value_dim == 0)) return "a head dim of 0";
  return "";
}

}  // namespace

std::string to_string(PositionalPath path) {
  switch (path) {
    case PositionalPath::kCuda:
      return "cuda";
    case PositionalPath::kFused:
      return "fused";
    case PositionalPath::kReference:
      return "reference";
  }
  return "?";
}

PositionalRoute route_positional(const PositionalCall& call) {
  PositionalRoute route;
  route.apply_rotary_first = call.rotary && call.learned_tables;
  const bool tables = call.rotary && !route.apply_rotary_first;  // what the path itself reads
  // CUDA first where the tensors are there; on other devices the CPU kernel's rule says why not.
  if (call.device == c10::DeviceType::CUDA) {
    if (const auto why = cuda_refusal(call); !why.empty()) {
      route.not_taken.emplace_back(PositionalPath::kCuda, why);
      return route;
    }
    route.path = PositionalPath::kCuda;
    route.rotate_first = tables;
    return route;
  }
  if (const auto why = cpu_refusal(call); !why.empty()) {
    route.not_taken.emplace_back(PositionalPath::kFused, why);
    return route;
  }
  route.path = PositionalPath::kFused;
  route.rope_inside = tables && call.tables_unreadable.empty();
  route.rotate_first = tables && !call.tables_unreadable.empty();
  if (route.rotate_first) route.rope_outside = call.tables_unreadable;
  return route;
}

std::string describe(const PositionalRoute& route) {
  const std::string first =
      route.apply_rotary_first ? "apply_rotary first (cos/sin require grad), then " : "";
  switch (route.path) {
    case PositionalPath::kCuda:
      return first + (route.rotate_first ? "CUDA kernel, RoPE outside (float32)" : "CUDA kernel");
    case PositionalPath::kFused:
      if (route.rope_inside) return first + "fused, RoPE inside";
      if (route.rotate_first) return first + "fused, RoPE outside: " + route.rope_outside;
      return first + "fused";
    case PositionalPath::kReference:
      break;
  }
  if (!route.not_taken.empty() && route.not_taken.front().first == PositionalPath::kCuda)
    return first + "reference: a call the CUDA kernel does not take (" +
           route.not_taken.front().second + ")";
  return first + "reference: " + (route.not_taken.empty() ? "" : route.not_taken.front().second);
}

}  // namespace posenc::ops
