// One registration of posenc's operators per process, whichever way a second copy of
// libposenc_ops.so arrives (another build or install, loaded with torch.ops.load_library after
// `import posenc`, or before it).
//
// TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL register at dlopen, from static initializers; a
// second copy defining the same schemas (or the custom classes) again throws inside one, which
// aborts the process (signal 6) before Python can catch anything. POSENC_LIBRARY_FRAGMENT(m) and
// POSENC_LIBRARY_IMPL(k, m) are the same blocks made only when this copy registers_operators():
// the first copy loaded registers them all; a later copy registers none, says so on stderr in one
// line, and the first copy's operators stay in use (the same schemas, so callers see no change).
// Python's import refuses a second copy loaded before it in one line (python/posenc/_library.py).
//
// The core's own operators (rope_rotate*, attention_fused*) register once the same way in
// src/kernels/dispatch/rope_rotate_operator.cpp / attention_fused_operator.cpp (the static core may
// be linked into several objects).
#pragma once

#include <torch/library.h>

#include <cstdint>
#include <optional>

namespace posenc::ops {

/// Whether this copy of libposenc_ops registers its operators: decided once per copy, at its
/// first registration, from whether posenc::apply_rotary is already in the dispatcher (then
/// another copy registered it). Hidden: each loaded copy asks its own.
__attribute__((visibility("hidden"))) bool registers_operators();

/// A TORCH_LIBRARY_FRAGMENT / TORCH_LIBRARY_IMPL block for namespace posenc, made only when
/// registers_operators(); the torch::Library lives as long as this object (its destructor
/// deregisters), as torch::detail::TorchLibraryInit's does.
class LibraryOnce {
 public:
  using InitFunction = void(torch::Library&);
  LibraryOnce(torch::Library::Kind kind, InitFunction* init, std::optional<c10::DispatchKey> key,
              const char* file, uint32_t line) {
    if (!registers_operators()) return;
    library_.emplace(kind, "posenc", key, file, line);
    init(*library_);
  }

 private:
  std::optional<torch::Library> library_;
};

}  // namespace posenc::ops

#define POSENC_LIBRARY_FRAGMENT(m) POSENC_LIBRARY_FRAGMENT_UID(m, C10_UID)
#define POSENC_LIBRARY_FRAGMENT_UID(m, uid)                                               \
  static void C10_CONCATENATE(posenc_library_fragment_init_, uid)(torch::Library&);       \
  static const ::posenc::ops::LibraryOnce C10_CONCATENATE(posenc_library_fragment_, uid)( \
      torch::Library::FRAGMENT, &C10_CONCATENATE(posenc_library_fragment_init_, uid),     \
      std::nullopt, __FILE__, __LINE__);                                                  \
  void C10_CONCATENATE(posenc_library_fragment_init_, uid)(torch::Library & m)

#define POSENC_LIBRARY_IMPL(k, m) POSENC_LIBRARY_IMPL_UID(k, m, C10_UID)
#define POSENC_LIBRARY_IMPL_UID(k, m, uid)                                                  \
  static void C10_CONCATENATE(posenc_library_impl_init_##k##_, uid)(torch::Library&);       \
  static const ::posenc::ops::LibraryOnce C10_CONCATENATE(posenc_library_impl_##k##_, uid)( \
      torch::Library::IMPL, &C10_CONCATENATE(posenc_library_impl_init_##k##_, uid),         \
      std::make_optional(c10::DispatchKey::k), __FILE__, __LINE__);                         \
  void C10_CONCATENATE(posenc_library_impl_init_##k##_, uid)(torch::Library & m)
