// IDX reader over zlib's gz* API (reads plain files too); format in idx.h.
#include "idx.h"

#include <torch/torch.h>
#include <zlib.h>

#include <memory>

#include "posenc/io/input_digest.h"

namespace posenc::vision {

namespace {

struct GzCloser {
  void operator()(gzFile_s* f) const {
    if (f) gzclose(f);
  }
};

// Reads exactly n bytes or fails naming the file and the counts.
void read_exactly(gzFile file, const std::string& path, void* out, size_t n, const char* what) {
  size_t done = 0;
  auto* bytes = static_cast<unsigned char*>(out);
  while (done < n) {
    const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - done, 1u << 30));
    const int got = gzread(file, bytes + done, chunk);
    if (got <= 0) {
      int code = 0;
      const char* message = gzerror(file, &code);
      TORCH_CHECK(false, "idx: '", path, "' is truncated or corrupt: expected ", n, " bytes of ",
                  what, ", got ", done,
                  code < 0 && message ? std::string(" (") + message + ")" : "");
    }
    done += static_cast<size_t>(got);
  }
}

}  // namespace

at::Tensor read_idx(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  TORCH_CHECK(file, "idx: cannot open '", path, "'");
  unsigned char magic[4];
  read_exactly(file.get(), path, magic, 4, "header");
  TORCH_CHECK(magic[0] == 0 && magic[1] == 0, "idx: '", path, "' is not an IDX file (magic bytes ",
              int(magic[0]), ", ", int(magic[1]), ", expected 0, 0)");
  TORCH_CHECK(magic[2] == 0x08, "idx: '", path, "' holds type 0x", std::hex, int(magic[2]),
              "; only unsigned bytes (0x08) are supported");
  const int ndim = magic[3];
  TORCH_CHECK(ndim >= 1 && ndim <= 4, "idx: '", path, "' has ", ndim, " dims, expected 1..4");
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    unsigned char b[4];
    read_exactly(file.get(), path, b, 4, "dimension sizes");
    const int64_t size =
        (int64_t(b[0]) << 24) | (int64_t(b[1]) << 16) | (int64_t(b[2]) << 8) | b[3];
    TORCH_CHECK(size > 0 && size < (int64_t(1) << 31), "idx: '", path, "' dim ", d, " is ", size);
    dims.push_back(size);
    count *= size;
  }
  auto data = torch::empty(dims, torch::kUInt8);
  read_exactly(file.get(), path, data.data_ptr<uint8_t>(), static_cast<size_t>(count), "data");
  unsigned char extra;
  TORCH_CHECK(gzread(file.get(), &extra, 1) == 0, "idx: '", path, "' has bytes after the ", count,
              " the header announces");
  note_input(data.data_ptr<uint8_t>(), static_cast<size_t>(count));  // compared across ranks
  return data;
}

const std::array<const char*, 10>& FashionMnist::class_names() {
  static const std::array<const char*, 10> names{"t-shirt", "trouser",   "pullover", "dress",
                                                 "coat",    "sandal",    "shirt",    "sneaker",
                                                 "bag",     "ankle boot"};
  return names;
}

FashionMnist load_fashion_mnist(bool train, const std::string& directory) {
  const std::string prefix = directory + "/" + (train ? "train" : "t10k");
  FashionMnist out;
  out.images = read_idx(prefix + "-images-idx3-ubyte.gz");
  auto labels = read_idx(prefix + "-labels-idx1-ubyte.gz");
  TORCH_CHECK(out.images.dim() == 3 && out.images.size(1) == 28 && out.images.size(2) == 28,
              "fashion-mnist: images must be [N, 28, 28], got ", out.images.sizes());
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == out.images.size(0),
              "fashion-mnist: ", labels.numel(), " labels for ", out.images.size(0), " images");
  TORCH_CHECK(labels.max().item<int64_t>() <= 9, "fashion-mnist: label ",
              labels.max().item<int64_t>(), " out of range 0..9");
  out.labels = labels.to(torch::kLong);
  return out;
}

}  // namespace posenc::vision
