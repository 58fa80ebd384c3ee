// IDX files (LeCun's MNIST format, also Fashion-MNIST; Debian's dataset-fashion-mnist ships them
// gzipped): big-endian header  [0, 0, type, ndim] [dim_0] .. [dim_{ndim-1}]  then the data.
// Only unsigned bytes (type 0x08) are used by these data sets. Truncated or corrupt files are
// errors that name the file and what was expected.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <string>

namespace posenc::vision {

/// Reads an IDX file, gzipped (.gz) or not: a uint8 tensor with the file's dims.
at::Tensor read_idx(const std::string& path);

struct FashionMnist {
  at::Tensor images;  ///< [N, 28, 28] uint8
  at::Tensor labels;  ///< [N] int64, 0..9
  static const std::array<const char*, 10>& class_names();
};

/// The Fashion-MNIST training (60000) or test (10000) split from `directory`
/// (default: where Debian's dataset-fashion-mnist puts it).
FashionMnist load_fashion_mnist(bool train,
                                const std::string& directory = "/usr/share/datasets/fashion-mnist");

}  // namespace posenc::vision
