// The fused kernels' backward passes are first order: they compute gradients with raw kernels,
// so a graph of those gradients (create_graph, grad mode on inside the backward) would silently
// lack the kernels' own derivatives. They refuse it in one line instead.
#pragma once

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

namespace posenc::detail {

inline void require_first_order(const char* kernel) {
  TORCH_CHECK(!at::GradMode::is_enabled(), kernel,
              ": no second-order gradients (create_graph) through the fused kernel's backward; "
              "take the reference path (fused=false, float64) for them");
}

}  // namespace posenc::detail
