// registers_operators(): the first copy of libposenc_ops.so in a process registers its operators,
// a later copy none (see registration.h for why a second registration would abort).
#include "registration.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <dlfcn.h>

#include <string>

namespace posenc::ops {

bool registers_operators() {
  // A function-local static of this copy: its blocks all ask before any of them registers, so
  // the schema found here can only come from another copy.
  static const bool first = [] {
    if (!c10::Dispatcher::singleton().findSchema({"posenc::apply_rotary", ""}).has_value())
      return true;
    Dl_info info{};
    const bool named = dladdr(reinterpret_cast<void*>(&registers_operators), &info) != 0 &&
                       info.dli_fname != nullptr;
    TORCH_WARN(
        "posenc: its operators are already registered in this process (another copy of "
        "libposenc_ops.so, or a program linking it); ",
        named ? std::string(info.dli_fname) : std::string("this copy"),
        " registers none of its own, and the first copy's stay in use");
    return false;
  }();
  return first;
}

}  // namespace posenc::ops
