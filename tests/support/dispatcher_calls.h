// Test support: the posenc operators the dispatcher runs on this thread, by schema name, seen
// through a RecordFunction callback (a plain function: it records into one list). Each operator
// shows at every kernel it passes (its Autograd kernel, then the device kernel it calls).
#pragma once

#include <ATen/record_function.h>

#include <memory>
#include <string>
#include <vector>

namespace posenc::test {

inline std::vector<std::string>& posenc_calls() {
  static std::vector<std::string> calls;
  return calls;
}

/// Starts recording into posenc_calls(); at::removeCallback(handle) stops.
inline at::CallbackHandle watch_posenc_calls() {
  return at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                     -> std::unique_ptr<at::ObserverContext> {
        const std::string name = fn.name();
        if (name.rfind("posenc::", 0) == 0) posenc_calls().push_back(name);
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
}

}  // namespace posenc::test
