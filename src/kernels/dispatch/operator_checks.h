// Argument checks every posenc operator shares (src/kernels/dispatch, src/bindings), one line each
// naming the argument:
//
// check_same_device(op, {{"q", q}, {"cos", cos}, ...}, host_ok)
//   Every tensor argument on the first one's device (meta included: a meta table among CPU
//   tensors would otherwise send the call to the fake kernel, Meta outranking CPU, and return
//   uninitialized CPU memory). host_ok: arguments that may also live on the CPU when the first
//   is on CUDA (rope_rotate's and attention_fused's tables: the documented exceptions).
//   python/posenc/_meta.py's fakes check the same with the same words.
// check_has_values(op, {...})
//   No meta tensor where the operator reads values on the host (the streams' bookkeeping).
// check_no_aliasing(op, written, read, instead)
//   In place: each written operand holds every element once (at::has_internal_overlap No, or a
//   proof below), and no written operand shares memory with another operand (written or read).
//   Same storage with intersecting byte ranges is refused unless the elements are proven apart:
//   by a period P (every stride >= P a multiple of P, each tensor's inner block within one period,
//   the two blocks' residues mod P disjoint: q and k sliced from one packed qkv row), or by
//   comparing the element offsets themselves (up to kExactOffsets elements); otherwise refused,
//   never let through (at::get_overlap_status's TooHard is not "no overlap").
#pragma once

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

namespace posenc::ops {

/// A tensor argument and its schema name (undefined: an absent optional, skipped).
struct NamedTensor {
  NamedTensor(const char* name_, const at::Tensor& tensor_) : name(name_), tensor(tensor_) {}
  NamedTensor(const char* name_, const std::optional<at::Tensor>& tensor_)
      : name(name_), tensor(tensor_.has_value() ? *tensor_ : at::Tensor()) {}
  const char* name;
  at::Tensor tensor;
};

inline void check_same_device(const char* op, const std::vector<NamedTensor>& tensors,
                              std::initializer_list<NamedTensor> host_ok = {}) {
  const NamedTensor* anchor = nullptr;
  for (const auto& t : tensors) {
    if (!t.tensor.defined()) continue;
    if (anchor == nullptr) {
      anchor = &t;
      continue;
    }
    TORCH_CHECK(t.tensor.device() == anchor->tensor.device(), op, ": ", t.name, " is on ",
                t.tensor.device(), " but ", anchor->name, " is on ", anchor->tensor.device(),
                "; every tensor argument must be on ", anchor->name, "'s device");
  }
  if (anchor == nullptr) return;
  const auto& device = anchor->tensor.device();
  for (const auto& t : host_ok) {
    if (!t.tensor.defined()) continue;
    TORCH_CHECK(t.tensor.device() == device || (device.is_cuda() && t.tensor.device().is_cpu()), op,
                ": ", t.name, " is on ", t.tensor.device(), " but ", anchor->name, " is on ",
                device, "; ", t.name, " must be on ", anchor->name,
                "'s device (or the CPU, for a CUDA ", anchor->name, ")");
  }
}

inline void check_has_values(const char* op, std::initializer_list<NamedTensor> tensors) {
  for (const auto& t : tensors)
    TORCH_CHECK(!t.tensor.defined() || !t.tensor.is_meta(), op, ": ", t.name,
                " is on meta, which holds no values; this operator reads its arguments' values");
}

namespace aliasing {

/// Elements whose offsets are compared one by one when no stride argument decides (int64 each).
constexpr int64_t kExactOffsets = int64_t{1} << 22;

struct StridedBytes {
  std::vector<std::pair<int64_t, int64_t>> dims;  ///< (stride in bytes, size) of dims of size > 1
  int64_t offset = 0;                             ///< first element's byte offset in its storage
  int64_t item = 1;                               ///< bytes per element
  int64_t span = 0;  ///< bytes from the first element's first byte to the last one's last
};

inline StridedBytes strided_bytes(const at::Tensor& t) {
  StridedBytes b;
  b.item = static_cast<int64_t>(t.element_size());
  b.offset = t.storage_offset() * b.item;
  b.span = b.item;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) <= 1) continue;
    b.dims.emplace_back(t.stride(d) * b.item, t.size(d));
    b.span += t.stride(d) * b.item * (t.size(d) - 1);
  }
  std::sort(b.dims.begin(), b.dims.end());
  return b;
}

/// Proof that no two elements share a byte: sorted by stride, each dim steps past the whole block
/// of the dims inside it (every view of a dense tensor by slicing, stepping or permuting).
inline bool nested_without_overlap(const StridedBytes& b) {
  int64_t block = b.item;
  for (const auto& [stride, size] : b.dims) {
    if (stride < block) return false;
    block += stride * (size - 1);
  }
  return true;
}

/// The element offsets of t (in elements, from its storage's start), int64 on the CPU.
inline at::Tensor element_offsets(const at::Tensor& t) {
  auto offsets = at::full({}, t.storage_offset(), at::kLong);
  for (int64_t d = 0; d < t.dim(); ++d) {
    std::vector<int64_t> shape(static_cast<size_t>(t.dim()), 1);
    shape[static_cast<size_t>(d)] = t.size(d);
    offsets = offsets + (at::arange(t.size(d), at::kLong) * t.stride(d)).view(shape);
  }
  return offsets.reshape({-1});
}

/// Proof that a and b (one storage, intersecting byte ranges) hold no byte in common: a period P
/// that every stride >= P divides, each tensor's inner block (strides < P) within one period, and
/// the two blocks' residues mod P apart (q, k, v sliced from one packed row).
inline bool apart_by_period(const StridedBytes& a, const StridedBytes& b) {
  std::vector<int64_t> periods;
  for (const auto* t : {&a, &b})
    for (const auto& d : t->dims) periods.push_back(d.first);
  for (const int64_t period : periods) {
    if (period <= 0) continue;
    int64_t lo[2], hi[2];
    bool fits = true;
    int i = 0;
    for (const auto* t : {&a, &b}) {
      int64_t inner = t->item;
      for (const auto& [stride, size] : t->dims) {
        if (stride >= period)
          fits = fits && stride % period == 0;
        else
          inner += stride * (size - 1);
      }
      lo[i] = t->offset % period;
      hi[i] = lo[i] + inner;
      fits = fits && hi[i] <= period;
      ++i;
    }
    if (fits && (hi[0] <= lo[1] || hi[1] <= lo[0])) return true;
  }
  return false;
}

}  // namespace aliasing

/// In place: written operands hold each element once and share no memory with any other operand.
/// `instead` ends each message (what to call instead, e.g. "use apply_rotary").
inline void check_no_aliasing(const char* op, std::initializer_list<NamedTensor> written,
                              std::initializer_list<NamedTensor> read, const char* instead) {
  for (const auto& w : written) {
    const auto& t = w.tensor;
    if (!t.defined() || t.numel() <= 1) continue;
    const auto status = at::has_internal_overlap(t);
    bool apart = status == at::MemOverlap::No;
    if (status == at::MemOverlap::TooHard) {
      apart = aliasing::nested_without_overlap(aliasing::strided_bytes(t));
      if (!apart && t.numel() <= aliasing::kExactOffsets) {
        const auto sorted = std::get<0>(at::sort(aliasing::element_offsets(t)));
        const int64_t n = sorted.numel();
        apart = !sorted.narrow(0, 1, n - 1).eq(sorted.narrow(0, 0, n - 1)).any().item<bool>();
      }
    }
    TORCH_CHECK(apart, op, ": ", w.name,
                " has elements that share memory (more than one element at a single memory "
                "location, or not provably apart: sizes ",
                t.sizes(), ", strides ", t.strides(),
                "); in place writes each element once: ", instead);
  }
  std::string written_names;
  for (const auto& w : written) {
    if (!written_names.empty()) written_names += " or ";
    written_names += w.name;
  }
  // every written operand against every operand after it (written), then against the read ones
  std::vector<const NamedTensor*> all;
  for (const auto& w : written) all.push_back(&w);
  const size_t written_count = all.size();
  for (const auto& r : read) all.push_back(&r);
  for (size_t i = 0; i < written_count; ++i) {
    for (size_t j = i + 1; j < all.size(); ++j) {
      const auto &a = all[i]->tensor, &b = all[j]->tensor;
      if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) continue;
      if (!a.storage().is_alias_of(b.storage())) continue;
      const auto sa = aliasing::strided_bytes(a), sb = aliasing::strided_bytes(b);
      bool apart = sa.offset + sa.span <= sb.offset || sb.offset + sb.span <= sa.offset ||
                   aliasing::apart_by_period(sa, sb);
      if (!apart && sa.item == sb.item && a.numel() <= aliasing::kExactOffsets &&
          b.numel() <= aliasing::kExactOffsets)
        apart = !at::isin(aliasing::element_offsets(a), aliasing::element_offsets(b))
                     .any()
                     .item<bool>();
      const std::string where =
          "one storage, bytes [" + std::to_string(sa.offset) + ", " +
          std::to_string(sa.offset + sa.span) + ") and [" + std::to_string(sb.offset) + ", " +
          std::to_string(sb.offset + sb.span) + "), elements not provably apart";
      if (j < written_count) {
        TORCH_CHECK(apart, op, ": ", all[i]->name, " and ", all[j]->name, " share memory (", where,
                    "); in place needs them apart: ", instead);
      } else {
        TORCH_CHECK(apart, op, ": ", all[j]->name, " shares memory with ", written_names, " (",
                    all[j]->name, " and ", all[i]->name, ": ", where,
                    "), which in place overwrites: ", instead);
      }
    }
  }
}

}  // namespace posenc::ops
