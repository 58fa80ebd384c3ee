// safetensors files (Hugging Face's format, https://github.com/huggingface/safetensors, the
// layout its README specifies), written and read without the Rust library:
//
//   [8 bytes: N, unsigned little-endian] [N bytes: JSON header] [data]
//   header = {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
//             "data_offsets": [begin, end]}, ...}
//
// Offsets count from the start of the data section; each tensor's bytes are row-major,
// little-endian, end - begin = numel * element size. The data is covered exactly, without holes or
// overlaps (the format's own rule); the header is padded with spaces to a multiple of 8 bytes
// (as the Python writer does, so every tensor starts 8-byte aligned).
// posenc's integrity check on top: the metadata key "posenc_fnv1a64" holds FNV-1a (64 bit, hex)
// of the data section; a file carrying it is verified on read. Every violation (truncated file,
// header past the end, unknown dtype, offsets outside the data or not matching the shape, a gap,
// a wrong checksum) is one line naming the file and what is wrong.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace posenc::train {

/// The largest header read (100 MB, the Python library's limit).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
/// The largest file read (64 GiB).
inline constexpr int64_t kMaxSafetensorsFileBytes = int64_t{64} << 30;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

/// The file's bytes for these tensors (any device; contiguous host copies are written) and
/// metadata; dtypes F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
std::string safetensors_bytes(const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {});
/// Written atomically and durably (posenc/io/durable_file.h), with posenc_fnv1a64.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
/// The tensors (in data order) of a file, every rule above checked; metadata into `metadata`.
NamedTensors read_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);
/// The same from bytes already read (`path` names them in errors).
NamedTensors parse_safetensors(const std::string& bytes, const std::string& path,
                               std::map<std::string, std::string>* metadata = nullptr);

}  // namespace posenc::train
