// The raw CUDA kernels (rope_rotate_tables, attention_forward, attention_backward) against their
// specifications evaluated in float64: rope_apply and attention_reference (with autograd through
// it for the gradients). Buffers through cudaMalloc/cudaMemcpy only, no LibTorch CUDA, so one
// source runs in two binaries:
//   posenc_cuda_tests      (ctest cuda)      nvcc's kernels on a GPU; every test skips without one
//   posenc_cuda_emu_tests  (ctest cuda_emu)  the same .cu files compiled as C++ against the CPU
//                                            emulator of tests/cuda_emu, under two schedules;
//                                            it also checks that every launchable kernel ran
// Matrix: RoPE 3 storage types x 2 layouts x {odd F (scalar path), F = 6 (2-wide vectors), q and k
// with different head counts (widest vectors) and the inverse in place, strided rows in place with
// a partial rotary width, a misaligned base}; attention 3 storage types x {no bias, causal ALiBi
// with cached keys, T5 bidirectional with key padding (the table-gradient atomics), symmetric
// ALiBi with padding for one query and Dv 200}, forward and backward for every type, plus an fp32
// case whose 98 KiB of shared memory takes the >48 KiB opt-in. The head dims pick every
// register-tile width (kChunks 1, 2, 4, 8) of each attention kernel. Packed samples and Moirai's
// binary variate bias (the kernels' kIds instantiations), 3 storage types x {samples + variates,
// samples with causal ALiBi and cached keys (a sample no query sees), samples + variates with T5
// and padding that leaves a sample no key, variates alone for one query and Dv 200}, forward, lse
// and backward incl. d variate_bias (the kernel's per-key-tile partial sums), the same four
// register-tile widths; and a poisoned cache: NaN keys and values outside every query's sample
// leave the output and dq finite (the tiles outside the samples are never read); a NaN in one
// query (fp32 and bf16, beside masked keys) gives the reference's NaNs in the output, lse and the
// gradients (relative_diff: NaN exactly where the oracle is NaN).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "posenc/functional/relative.h"
#include "posenc/kernels/attention_cuda.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/rope_cuda.h"
#include "posenc/posenc.h"
#include "support/bias_forms.h"

namespace posenc {
namespace {

using test::Form;
using test::spec_for;

// A tolerance per element: |got - want| <= relative |want| + absolute.
struct Tolerance {
  double relative, absolute;
};
// fp32 rotation vs float64: a few fp32 ulps of |x| (|x| <~ 5).
constexpr Tolerance kRopeFloat32{1e-6, 5e-6};
// bf16/fp16 outputs are rounded once from fp32: half an ulp (2^-9, 2^-12 relative), doubled, plus
// the fp32 rotation's own error.
constexpr Tolerance kRopeBFloat16{1.0 / 256, 5e-6};
constexpr Tolerance kRopeFloat16{1.0 / 2048, 5e-6};
// Attention outputs O(1): fp32 tiles, another summation order and the device's expf (2 ulps) vs
// float64; the reduced types add one rounding of the output as above.
constexpr Tolerance kAttentionFloat32{1e-5, 5e-5};
constexpr Tolerance kAttentionBFloat16{1.0 / 256, 5e-5};
constexpr Tolerance kAttentionFloat16{1.0 / 2048, 5e-5};
// Gradients relative to their largest entry, every storage type: fp32 outputs from inputs that are
// exact in fp32 (the oracle sees the same rounded q, k, v, dO; delta is exact), so only fp32
// summation over up to 70 keys and 45 queries differs from float64.
constexpr double kGradientTolerance = 1e-4;
// d variate_bias: per head a float32 sum of dS over every pair (up to 2 x 100 x 100), whose terms
// cancel (each row's dS sums to 0), relative to the largest entry.
constexpr double kVariateGradientTolerance = 1e-3;

bool has_cuda_device() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_DEVICE() \
  if (!has_cuda_device()) GTEST_SKIP() << "no CUDA device"

at::ScalarType scalar_type_of(cuda::Storage storage) {
  switch (storage) {
    case cuda::Storage::kFloat32:
      return at::kFloat;
    case cuda::Storage::kBFloat16:
      return at::kBFloat16;
    case cuda::Storage::kFloat16:
      return at::kHalf;
  }
  return at::kFloat;
}

std::string storage_name(cuda::Storage storage) {
  return storage == cuda::Storage::kFloat32    ? "f32"
         : storage == cuda::Storage::kBFloat16 ? "bf16"
                                               : "f16";
}

// The worst element against `tolerance`, as a message; "" when every element is within it.
std::string compare(const torch::Tensor& got, const torch::Tensor& want, Tolerance tolerance) {
  auto g = got.to(torch::kCPU, torch::kFloat64).reshape(-1);
  auto w = want.to(torch::kCPU, torch::kFloat64).reshape(-1);
  if (g.numel() != w.numel()) return "sizes differ";
  if (g.numel() == 0) return "";
  auto excess = (g - w).abs() - (w.abs() * tolerance.relative + tolerance.absolute);
  excess = torch::where(torch::isnan(g) != torch::isnan(w), torch::full_like(excess, INFINITY),
                        excess.nan_to_num(0.0));
  const int64_t i = excess.argmax().item<int64_t>();
  if (excess[i].item<double>() <= 0.0) return "";
  return "element " + std::to_string(i) + " of " + std::to_string(g.numel()) + ": got " +
         std::to_string(g[i].item<double>()) + ", want " + std::to_string(w[i].item<double>());
}

// max |got - want| / max |want|
double relative_diff(const torch::Tensor& got, const torch::Tensor& want) {
  auto g = got.to(torch::kCPU, torch::kFloat64), w = want.to(torch::kCPU, torch::kFloat64);
  // NaN exactly where the oracle is NaN (a NaN input), compared elsewhere
  if (!torch::equal(g.isnan(), w.isnan())) return INFINITY;
  const auto known = w.isnan().logical_not();
  g = g.masked_select(known);
  w = w.masked_select(known);
  if (w.numel() == 0) return 0.0;
  return (g - w).abs().max().item<double>() / std::max(1e-12, w.abs().max().item<double>());
}

// A device copy of a CPU tensor (made contiguous), freed at scope exit.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const torch::Tensor& host) : bytes_(host.nbytes()) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_ == 0 ? 1 : bytes_), cudaSuccess);
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(data_, host.contiguous().data_ptr(), bytes_, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }
  template <typename T>
  T* get() const {
    return static_cast<T*>(data_);
  }
  /// Copies back into `host` (contiguous, same bytes).
  void read(torch::Tensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.data_ptr(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// ---- the tests that were test_cuda.cpp's ------------------------------------------------------

TEST(CudaRawKernel, RopeRotateTablesQkOutOfPlaceAndInverse) {
  SKIP_WITHOUT_DEVICE();
  torch::manual_seed(4);
  const int64_t b = 2, n = 13, hq = 4, hk = 2, dh = 64, f = 32;
  auto q = torch::randn({b, n, hq, dh}), k = torch::randn({b, n, hk, dh});
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * f, 2, torch::kFloat64) / (2.0 * f));
  auto [cos, sin] = rope_cos_sin(torch::rand({b, n}, torch::kFloat64) * 3000, inv);  // batched
  DeviceBuffer dq(q), dk(k), dqo(q), dko(k), dc(cos), ds(sin);
  cuda::RopeTableLaunch a;
  a.count = 2;
  a.batch = b;
  a.tokens = n;
  a.cos = dc.get<float>();
  a.sin = ds.get<float>();
  a.table_batched = true;
  a.pairs = f;
  const DeviceBuffer* in[2] = {&dq, &dk};
  const DeviceBuffer* out[2] = {&dqo, &dko};
  const int64_t heads[2] = {hq, hk};
  for (int t = 0; t < 2; ++t) {
    auto& u = a.tensors[t];
    u.x = in[t]->get<float>();
    u.y = out[t]->get<float>();
    u.heads = heads[t];
    u.head_dim = dh;
    u.x_stride_batch = u.y_stride_batch = n * heads[t] * dh;
    u.x_stride_token = u.y_stride_token = heads[t] * dh;
    u.x_stride_head = u.y_stride_head = dh;
  }
  ASSERT_EQ(cuda::rope_rotate_tables(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto gq = torch::empty_like(q), gk = torch::empty_like(k);
  dqo.read(gq);
  dko.read(gk);
  EXPECT_EQ(compare(gq, rope_apply(q, cos, sin, RopeLayout::kHalf), kRopeFloat32), "");
  EXPECT_EQ(compare(gk, rope_apply(k, cos, sin, RopeLayout::kHalf), kRopeFloat32), "");
  // the inverse rotation, in place on the outputs, gives the inputs back
  a.sign = -1.0f;
  for (int t = 0; t < 2; ++t) a.tensors[t].x = a.tensors[t].y;
  ASSERT_EQ(cuda::rope_rotate_tables(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dqo.read(gq);
  EXPECT_EQ(compare(gq, q, {0.0, 1e-5}), "");
}

TEST(CudaRawKernel, RejectsHeadDimAboveLimit) {
  SKIP_WITHOUT_DEVICE();
  cuda::AttentionLaunch a;
  a.batch = a.heads = a.nq = a.nk = 1;
  a.dim = cuda::kAttentionMaxDim + 1;
  a.dim_v = 8;
  float dummy = 0.0f;
  a.q = a.k = a.v = a.out = &dummy;
  a.lse = &dummy;
  EXPECT_EQ(cuda::attention_forward(a, nullptr), cudaErrorInvalidValue);
}

// ---- RoPE: storage types x layouts x shapes ----------------------------------------------------

enum class RopeShape {
  kOddWidth,           // F = 5 of Dh = 13, out of place, batched table: scalar path, pass-through
  kSixPairs,           // F = 6: 2-wide vectors at most
  kQkHeadsAndInverse,  // q 4 heads, k 2 heads in one launch (widest vectors), then inverse in place
  kStridedInPlace,     // rows with stride 2 Dh, partial F = 12 of Dh = 48, rotated in place
  kMisaligned,         // base one element past an aligned address: vectors must not be used
};

struct RopeCase {
  cuda::Storage storage;
  RopeLayout layout;
  RopeShape shape;
};

std::string rope_case_name(const testing::TestParamInfo<RopeCase>& info) {
  const char* shapes[] = {"OddWidth", "SixPairs", "QkHeadsAndInverse", "StridedInPlace",
                          "Misaligned"};
  return storage_name(info.param.storage) +
         (info.param.layout == RopeLayout::kHalf ? "_half_" : "_interleaved_") +
         shapes[static_cast<int>(info.param.shape)];
}

class CudaRawRope : public ::testing::TestWithParam<RopeCase> {};

TEST_P(CudaRawRope, MatchesRopeApply) {
  SKIP_WITHOUT_DEVICE();
  const auto& c = GetParam();
  const auto dtype = scalar_type_of(c.storage);
  const Tolerance tolerance = c.storage == cuda::Storage::kFloat32    ? kRopeFloat32
                              : c.storage == cuda::Storage::kBFloat16 ? kRopeBFloat16
                                                                      : kRopeFloat16;
  torch::manual_seed(11 + static_cast<int>(c.shape));
  int64_t b = 2, n = 7, f = 5, dh = 13, row = 13, offset = 0;  // row: elements between heads
  std::vector<int64_t> heads = {3};
  bool in_place = false, batched = false;
  switch (c.shape) {
    case RopeShape::kOddWidth:
      batched = true;
      break;
    case RopeShape::kSixPairs:
      f = 6, dh = row = 12, n = 9;
      break;
    case RopeShape::kQkHeadsAndInverse:
      f = 32, dh = row = 64, n = 5, heads = {4, 2};
      break;
    case RopeShape::kStridedInPlace:
      f = 12, dh = 48, row = 96, in_place = true, heads = {2};
      break;
    case RopeShape::kMisaligned:
      f = 16, dh = 32, row = 34, offset = 1, heads = {2};
      break;
  }
  auto positions = batched ? torch::rand({b, n}, torch::kFloat64) * 4000
                           : torch::arange(n, torch::kFloat64) + 1234;  // an offset
  auto inv = torch::pow(10000.0, -torch::arange(0, 2 * f, 2, torch::kFloat64) / (2.0 * f));
  auto [cos, sin] = rope_cos_sin(positions, inv);
  DeviceBuffer dcos(cos), dsin(sin);
  cuda::RopeTableLaunch a;
  a.count = static_cast<int>(heads.size());
  a.storage = c.storage;
  a.batch = b;
  a.tokens = n;
  a.cos = dcos.get<float>();
  a.sin = dsin.get<float>();
  a.table_batched = batched;
  a.pairs = f;
  a.interleaved = c.layout == RopeLayout::kInterleaved;
  // base[t]: [B, N, H, row] holding x = base[..., offset : offset + dh] (a strided view)
  std::vector<torch::Tensor> base, x, out_base;
  std::vector<std::unique_ptr<DeviceBuffer>> dx, dy;
  for (size_t t = 0; t < heads.size(); ++t) {
    base.push_back(torch::randn({b, n, heads[t], row}).mul(2).to(dtype));
    x.push_back(base[t].narrow(-1, offset, dh));
    dx.push_back(std::make_unique<DeviceBuffer>(base[t]));
    dy.push_back(std::make_unique<DeviceBuffer>(torch::zeros_like(base[t])));
    auto& u = a.tensors[t];
    const size_t element = base[t].element_size();
    u.x = dx[t]->get<char>() + offset * element;
    u.y = in_place ? const_cast<void*>(u.x) : dy[t]->get<char>() + offset * element;
    u.heads = heads[t];
    u.head_dim = dh;
    u.x_stride_batch = u.y_stride_batch = n * heads[t] * row;
    u.x_stride_token = u.y_stride_token = heads[t] * row;
    u.x_stride_head = u.y_stride_head = row;
  }
  ASSERT_EQ(cuda::rope_rotate_tables(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t t = 0; t < heads.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t));
    auto got = torch::empty_like(base[t]);
    (in_place ? dx[t] : dy[t])->read(got);
    auto want = rope_apply(x[t].to(torch::kFloat64), cos, sin, c.layout);
    EXPECT_EQ(compare(got.narrow(-1, offset, dh), want, tolerance), "");
    // what lies outside the view is untouched: the input (in place) or the zeros written
    auto outside = torch::ones({row}, torch::kBool);
    outside.narrow(0, offset, dh).fill_(false);
    auto untouched = in_place ? base[t] : torch::zeros_like(base[t]);
    EXPECT_TRUE(torch::equal(got.index({"...", outside}), untouched.index({"...", outside})));
  }
  if (c.shape != RopeShape::kQkHeadsAndInverse) return;
  // the inverse rotation in place on the outputs gives the inputs back: the outputs' rounding
  // (relative to a pair's norm, <= sqrt(2) max |x|) carries into both elements of the pair
  a.sign = -1.0f;
  for (size_t t = 0; t < heads.size(); ++t) a.tensors[t].x = a.tensors[t].y;
  ASSERT_EQ(cuda::rope_rotate_tables(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t t = 0; t < heads.size(); ++t) {
    auto got = torch::empty_like(base[t]);
    dy[t]->read(got);
    const double largest = base[t].abs().max().to(torch::kFloat64).item<double>();
    const Tolerance inverse{0.0, 2 * tolerance.relative * largest + 1e-5};
    EXPECT_EQ(compare(got, base[t].to(torch::kFloat64), inverse), "") << "tensor " << t;
  }
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> out;
  for (auto storage : {cuda::Storage::kFloat32, cuda::Storage::kBFloat16, cuda::Storage::kFloat16})
    for (auto layout : {RopeLayout::kHalf, RopeLayout::kInterleaved})
      for (auto shape : {RopeShape::kOddWidth, RopeShape::kSixPairs, RopeShape::kQkHeadsAndInverse,
                         RopeShape::kStridedInPlace, RopeShape::kMisaligned})
        out.push_back({storage, layout, shape});
  return out;
}

INSTANTIATE_TEST_SUITE_P(StoragesLayoutsShapes, CudaRawRope, ::testing::ValuesIn(rope_cases()),
                         rope_case_name);

// ---- attention: storage types x bias forms, forward and backward -------------------------------

struct AttentionCase {
  cuda::Storage storage;
  Form form;
  bool causal, padding;
  int64_t batch, heads, nq, nk, d, dv;
  const char* name;
};

std::string attention_case_name(const testing::TestParamInfo<AttentionCase>& info) {
  return storage_name(info.param.storage) + "_" + info.param.name;
}

// Packed samples (run lengths per batch row, the remainder one more sample; empty: none) and the
// binary variate bias (random variate ids in [0, 3) per token), and which keys to pad.
struct Packed {
  std::vector<std::vector<int64_t>> lengths;
  bool variates = false;
  int64_t padded_sample = -1;  ///< pad every key of this sample of row 0 (-1: none)
  bool nan_query = false;      ///< q[B - 1][0][0][1] = NaN: query 0's scores NaN
};

// sample_ids [B, N] from run lengths (the remainder of a row one more sample)
torch::Tensor sample_ids_from(const std::vector<std::vector<int64_t>>& lengths, int64_t n) {
  auto ids = torch::empty({static_cast<int64_t>(lengths.size()), n}, torch::kInt64);
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t j = 0, id = 0;
    for (int64_t length : lengths[b]) {
      ids[b].narrow(0, j, length).fill_(id++);
      j += length;
    }
    if (j < n) ids[b].narrow(0, j, n - j).fill_(id);
  }
  return ids;
}

// each token's sample bounds (first and last token of its run), as the kernel takes them
std::pair<torch::Tensor, torch::Tensor> sample_bounds_of(const torch::Tensor& ids) {
  auto first = torch::empty(ids.sizes(), torch::kInt32), last = torch::empty_like(first);
  const int64_t nk = ids.size(1);
  auto id = ids.accessor<int64_t, 2>();
  auto f = first.accessor<int32_t, 2>(), l = last.accessor<int32_t, 2>();
  for (int64_t b = 0; b < ids.size(0); ++b) {
    for (int64_t j = 0; j < nk; ++j) f[b][j] = j > 0 && id[b][j] == id[b][j - 1] ? f[b][j - 1] : j;
    for (int64_t j = nk - 1; j >= 0; --j)
      l[b][j] = j + 1 < nk && id[b][j] == id[b][j + 1] ? l[b][j + 1] : j;
  }
  return {first, last};
}

void check_attention(const AttentionCase& c, const Packed& packed) {
  const auto dtype = scalar_type_of(c.storage);
  const Tolerance tolerance = c.storage == cuda::Storage::kFloat32    ? kAttentionFloat32
                              : c.storage == cuda::Storage::kBFloat16 ? kAttentionBFloat16
                                                                      : kAttentionFloat16;
  torch::manual_seed(21);
  const int64_t b = c.batch, h = c.heads;
  // inputs rounded to the storage type; the oracle computes in float64 from the same values
  auto q = torch::randn({b, c.nq, h, c.d}).to(dtype);
  auto k = torch::randn({b, c.nk, h, c.d}).to(dtype);
  auto v = torch::randn({b, c.nk, h, c.dv}).to(dtype);
  if (packed.nan_query) q[b - 1][0][0][1] = NAN;
  auto table = torch::randn({32, h});
  auto spec = spec_for(c.form, h, table);
  // positions with an offset; queries are the last nq of the keys (a KV cache)
  auto kp = torch::arange(c.nk, torch::kFloat64) + 100;
  auto qp = kp.narrow(0, c.nk - c.nq, c.nq).clone();
  AttentionMasks masks;
  masks.causal = c.causal;
  if (c.padding) {
    masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
    masks.key_padding[b - 1].narrow(0, c.nk - 3, 3).fill_(false);
    masks.key_padding[0][0] = false;
  }
  torch::Tensor sample_first, sample_last, variate_bias;
  if (!packed.lengths.empty()) {
    masks.sample_ids = sample_ids_from(packed.lengths, c.nk);
    std::tie(sample_first, sample_last) = sample_bounds_of(masks.sample_ids);
    if (packed.padded_sample >= 0)
      masks.key_padding.index_put_({0, masks.sample_ids[0] == packed.padded_sample}, false);
  }
  if (packed.variates) {
    masks.variate_ids = torch::randint(0, 3, {b, c.nk}, torch::kInt64);
    variate_bias = torch::randn({2, h});
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));

  DeviceBuffer dq(q), dk(k), dv_(v), dqp(qp), dkp(kp);
  auto out = torch::empty({b, c.nq, h, c.dv}, dtype);
  auto lse = torch::empty({b, h, c.nq});
  DeviceBuffer dout(out), dlse(lse);
  cuda::AttentionLaunch a;
  a.q = dq.get<void>();
  a.k = dk.get<void>();
  a.v = dv_.get<void>();
  a.out = dout.get<void>();
  a.lse = dlse.get<float>();
  a.storage = c.storage;
  a.batch = b;
  a.heads = h;
  a.nq = c.nq;
  a.nk = c.nk;
  a.dim = c.d;
  a.dim_v = c.dv;
  a.q_stride_batch = c.nq * h * c.d;
  a.q_stride_token = h * c.d;
  a.q_stride_head = c.d;
  a.k_stride_batch = c.nk * h * c.d;
  a.k_stride_token = h * c.d;
  a.k_stride_head = c.d;
  a.v_stride_batch = c.nk * h * c.dv;
  a.v_stride_token = h * c.dv;
  a.v_stride_head = c.dv;
  a.scale = static_cast<float>(scale);
  a.causal = c.causal;
  a.q_positions = dqp.get<double>();
  a.k_positions = dkp.get<double>();
  std::unique_ptr<DeviceBuffer> dslopes, dtable, dbuckets, dkeep, dfirst, dlast, dvariates, dweight;
  if (spec.form == BiasForm::kAlibi) {
    dslopes = std::make_unique<DeviceBuffer>(spec.slopes);
    a.bias = cuda::AttentionBias::kAlibi;
    a.slopes = dslopes->get<float>();
    a.symmetric = spec.symmetric;
  } else if (spec.form == BiasForm::kBucketTable) {
    auto offsets =
        t5_offset_buckets(qp, kp, spec.bidirectional, spec.num_buckets, spec.max_distance);
    auto buckets = offsets.buckets.to(torch::kInt32);
    dtable = std::make_unique<DeviceBuffer>(table);
    dbuckets = std::make_unique<DeviceBuffer>(buckets);
    a.bias = cuda::AttentionBias::kBucketTable;
    a.table = dtable->get<float>();
    a.num_buckets = table.size(0);
    a.bucket_of_offset = dbuckets->get<int32_t>();
    a.offset_min = offsets.offset_min;
    a.offset_count = buckets.numel();
  }
  if (c.padding) {
    dkeep = std::make_unique<DeviceBuffer>(masks.key_padding.to(torch::kUInt8));
    a.key_keep = dkeep->get<uint8_t>();
  }
  if (sample_first.defined()) {
    dfirst = std::make_unique<DeviceBuffer>(sample_first);
    dlast = std::make_unique<DeviceBuffer>(sample_last);
    a.sample_first = dfirst->get<int32_t>();
    a.sample_last = dlast->get<int32_t>();
  }
  if (packed.variates) {
    dvariates = std::make_unique<DeviceBuffer>(masks.variate_ids);
    dweight = std::make_unique<DeviceBuffer>(variate_bias);
    a.variate_ids = dvariates->get<int64_t>();
    a.variate_bias = dweight->get<float>();
  }
  ASSERT_EQ(cuda::attention_forward(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.read(out);
  dlse.read(lse);

  // the oracle in float64, with autograd for the gradients
  auto q64 = q.to(torch::kFloat64).requires_grad_(true);
  auto k64 = k.to(torch::kFloat64).requires_grad_(true);
  auto v64 = v.to(torch::kFloat64).requires_grad_(true);
  auto table64 = table.to(torch::kFloat64).requires_grad_(true);
  auto bias = bias_from_spec(spec_for(c.form, h, table64), qp, kp, h);
  if (bias.defined()) bias = bias.to(torch::kFloat64);
  torch::Tensor variate64;
  if (packed.variates) {
    variate64 = variate_bias.to(torch::kFloat64).requires_grad_(true);
    masks.variate_bias = variate64;
  }
  auto want = attention_reference(q64, k64, v64, bias, masks, scale);
  EXPECT_EQ(compare(out, want, tolerance), "") << "output";
  // log-sum-exp of the masked, biased logits (float32 for every storage type)
  auto logits = torch::einsum("bqhd,bkhd->bhqk", {q64, k64}).detach() * scale;
  if (bias.defined()) logits = logits + bias.detach();
  if (packed.variates)
    logits = logits + variate_bias_from_ids(masks.variate_ids, variate64.detach(), c.nq);
  auto i = torch::arange(c.nq).unsqueeze(1), j = torch::arange(c.nk).unsqueeze(0);
  if (c.causal) logits = logits.masked_fill(j > i + (c.nk - c.nq), -INFINITY);
  if (c.padding)
    logits = logits.masked_fill(masks.key_padding.logical_not().view({b, 1, 1, c.nk}), -INFINITY);
  if (masks.sample_ids.defined())
    logits = logits.masked_fill(
        sample_mask_from_ids(masks.sample_ids, c.nq).logical_not().unsqueeze(1), -INFINITY);
  EXPECT_EQ(compare(lse, torch::logsumexp(logits, -1), {1e-5, 5e-5}), "") << "lse";

  // backward for a probe dO (rounded to the storage type) with delta_i = dO_i . O_i exact
  auto probe = torch::randn({b, c.nq, h, c.dv}).to(dtype);
  auto probe64 = probe.to(torch::kFloat64);
  auto delta = (probe64 * want.detach()).sum(-1).transpose(1, 2).to(torch::kFloat).contiguous();
  auto gq = torch::empty({b, c.nq, h, c.d}), gk = torch::empty({b, c.nk, h, c.d}),
       gv = torch::empty({b, c.nk, h, c.dv});
  auto gtable = torch::zeros_like(table);
  const int64_t key_tiles = (c.nk + cuda::kAttentionKeyTile - 1) / cuda::kAttentionKeyTile;
  auto gvariate = torch::full({b, h, key_tiles, 2}, NAN);  // every entry written
  DeviceBuffer dprobe(probe), ddelta(delta), dgq(gq), dgk(gk), dgv(gv), dgtable(gtable),
      dgvariate(gvariate);
  cuda::AttentionBackwardLaunch g;
  g.forward = a;
  g.dout = dprobe.get<void>();
  g.delta = ddelta.get<float>();
  g.dq = dgq.get<float>();
  g.dk = dgk.get<float>();
  g.dv = dgv.get<float>();
  if (spec.form == BiasForm::kBucketTable) g.dtable = dgtable.get<float>();
  if (packed.variates) g.dvariate_partial = dgvariate.get<float>();
  ASSERT_EQ(cuda::attention_backward(g, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dgq.read(gq);
  dgk.read(gk);
  dgv.read(gv);
  dgtable.read(gtable);
  dgvariate.read(gvariate);
  (want * probe64).sum().backward();
  EXPECT_LT(relative_diff(gq, q64.grad()), kGradientTolerance) << "dq";
  EXPECT_LT(relative_diff(gk, k64.grad()), kGradientTolerance) << "dk";
  EXPECT_LT(relative_diff(gv, v64.grad()), kGradientTolerance) << "dv";
  if (spec.form == BiasForm::kBucketTable)
    EXPECT_LT(relative_diff(gtable, table64.grad()), kGradientTolerance) << "dtable";
  if (packed.variates) {  // the partial sums over the batch and the key tiles: [2, H]
    EXPECT_LT(relative_diff(gvariate.sum({0, 2}).t(), variate64.grad()), kVariateGradientTolerance)
        << "dvariate_bias";
  } else {  // a variate gradient without variate ids is refused
    g.dvariate_partial = dgvariate.get<float>();
    EXPECT_EQ(cuda::attention_backward(g, nullptr), cudaErrorInvalidValue);
    g.dvariate_partial = nullptr;
  }
  // a table gradient without a table bias is refused
  if (spec.form != BiasForm::kBucketTable) {
    g.dtable = dgtable.get<float>();
    EXPECT_EQ(cuda::attention_backward(g, nullptr), cudaErrorInvalidValue);
  }
}

class CudaRawAttention : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaRawAttention, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_DEVICE();
  check_attention(GetParam(), {});
}

std::vector<AttentionCase> attention_cases() {
  std::vector<AttentionCase> out;
  // D, Dv choose the register tiles: forward by Dv, backward by max(D, Dv) (32 per chunk)
  for (auto s : {cuda::Storage::kFloat32, cuda::Storage::kBFloat16, cuda::Storage::kFloat16}) {
    out.push_back({s, Form::kNone, false, false, 2, 2, 33, 33, 16, 8, "NoBias"});  // chunks 1
    out.push_back({s, Form::kAlibiCausal, true, false, 2, 3, 17, 70, 24, 40,       // chunks 2
                   "AlibiCausalCachedKeys"});
    out.push_back({s, Form::kT5Bidirectional, false, true, 2, 2, 45, 45, 100, 96,  // chunks 4
                   "T5BidirectionalPadding"});
    out.push_back({s, Form::kAlibiSymmetric, false, true, 2, 2, 1, 65, 32, 200,  // chunks 8
                   "AlibiSymmetricPaddingOneQueryDv200"});
  }
  // 4 (32 x 256 + 32 x 257 + 32 x 256) = 98 KiB of shared memory: the >48 KiB opt-in
  out.push_back({cuda::Storage::kFloat32, Form::kAlibiCausal, true, true, 1, 2, 40, 40, 256, 256,
                 "AlibiCausalPaddingSharedAbove48KiB"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(StoragesForms, CudaRawAttention, ::testing::ValuesIn(attention_cases()),
                         attention_case_name);

// A NaN in query 0 (a row of NaN scores, next to -inf ones where causal or padded): that row NaN
// in the output and lse, and the reference's NaN gradients; fmaxf passed over the NaN, so the row
// looked as if it saw no key and gave 0 (found by the hostile review).
class CudaRawAttentionNanQuery : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(CudaRawAttentionNanQuery, RowIsNanAsTheReference) {
  SKIP_WITHOUT_DEVICE();
  Packed nan_query;
  nan_query.nan_query = true;
  check_attention(GetParam(), nan_query);
}

INSTANTIATE_TEST_SUITE_P(
    StoragesForms, CudaRawAttentionNanQuery,
    ::testing::Values(AttentionCase{cuda::Storage::kFloat32, Form::kNone, false, false, 2, 2, 33,
                                    33, 16, 8, "NoBias"},
                      AttentionCase{cuda::Storage::kFloat32, Form::kAlibiCausal, true, false, 2, 3,
                                    17, 70, 24, 40, "AlibiCausalCachedKeys"},
                      AttentionCase{cuda::Storage::kBFloat16, Form::kT5Bidirectional, false, true,
                                    2, 2, 45, 45, 100, 96, "T5BidirectionalPadding"}),
    attention_case_name);

// ---- packed samples and the binary variate bias (the kernels' kIds instantiations) -------------

struct PackedCase {
  AttentionCase base;
  Packed packed;
};

class CudaRawPackedAttention : public ::testing::TestWithParam<PackedCase> {};

TEST_P(CudaRawPackedAttention, ForwardAndBackwardMatchReference) {
  SKIP_WITHOUT_DEVICE();
  check_attention(GetParam().base, GetParam().packed);
}

std::vector<PackedCase> packed_cases() {
  std::vector<PackedCase> out;
  // the same register tiles as attention_cases: chunks 1, 2, 4, 8
  for (auto s : {cuda::Storage::kFloat32, cuda::Storage::kBFloat16, cuda::Storage::kFloat16}) {
    // several samples of different lengths across key tiles, variate ids per token
    out.push_back({{s, Form::kNone, false, false, 2, 2, 100, 100, 16, 8, "SamplesVariates"},
                   {{{30, 45, 25}, {7, 60}}, true, -1}});
    // queries the last 37 of 90 tokens: sample 0 (tokens 0-19) has no query
    out.push_back(
        {{s, Form::kAlibiCausal, true, false, 2, 3, 37, 90, 24, 40, "SamplesAlibiCausalCachedKeys"},
         {{{20, 50}, {90}}, false, -1}});
    // every key of sample 0 of row 0 padded: its queries see no key (0, lse -inf)
    out.push_back({{s, Form::kT5Bidirectional, false, true, 2, 2, 70, 70, 100, 96,
                    "SamplesVariatesT5PaddedSample"},
                   {{{10, 25, 35}, {33}}, true, 0}});
    out.push_back(
        {{s, Form::kAlibiSymmetric, false, true, 2, 2, 1, 65, 32, 200, "VariatesOneQueryDv200"},
         {{}, true, -1}});
  }
  return out;
}

std::string packed_case_name(const testing::TestParamInfo<PackedCase>& info) {
  return storage_name(info.param.base.storage) + "_" + info.param.base.name;
}

INSTANTIATE_TEST_SUITE_P(StoragesForms, CudaRawPackedAttention, ::testing::ValuesIn(packed_cases()),
                         packed_case_name);

// Tile skipping, observed: keys no query can see (two samples before the queries' in a cache of
// 96 tokens, the queries the last 40) hold NaN on the device. A block that read them would turn
// the NaN into its sums (0 * NaN); the output, lse and dq stay finite and right, and the dK/dV
// block of keys 0-31, whose samples meet no query, writes exact zeros without a query tile.
TEST(CudaRawPackedAttentionSkip, KeysOutsideEveryQuerysSampleAreNeverRead) {
  SKIP_WITHOUT_DEVICE();
  torch::manual_seed(29);
  const int64_t b = 1, h = 2, nq = 40, nk = 96, d = 16;
  auto q = torch::randn({b, nq, h, d}), k = torch::randn({b, nk, h, d}),
       v = torch::randn({b, nk, h, d});
  auto ids = sample_ids_from({{40, 16, 40}}, nk);  // queries: tokens 56-95, all of sample 2
  auto [first, last] = sample_bounds_of(ids);
  auto k_poisoned = k.clone(), v_poisoned = v.clone();
  k_poisoned.narrow(1, 0, 56).fill_(NAN);
  v_poisoned.narrow(1, 0, 56).fill_(NAN);
  DeviceBuffer dq(q), dk(k_poisoned), dv_(v_poisoned), dfirst(first), dlast(last);
  auto out = torch::empty({b, nq, h, d}), lse = torch::empty({b, h, nq});
  DeviceBuffer dout(out), dlse(lse);
  cuda::AttentionLaunch a;
  a.q = dq.get<void>();
  a.k = dk.get<void>();
  a.v = dv_.get<void>();
  a.out = dout.get<void>();
  a.lse = dlse.get<float>();
  a.batch = b;
  a.heads = h;
  a.nq = nq;
  a.nk = nk;
  a.dim = a.dim_v = d;
  a.q_stride_batch = nq * h * d;
  a.k_stride_batch = a.v_stride_batch = nk * h * d;
  a.q_stride_token = a.k_stride_token = a.v_stride_token = h * d;
  a.q_stride_head = a.k_stride_head = a.v_stride_head = d;
  a.scale = 0.25f;
  a.sample_first = dfirst.get<int32_t>();
  a.sample_last = dlast.get<int32_t>();
  ASSERT_EQ(cuda::attention_forward(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dout.read(out);
  dlse.read(lse);
  AttentionMasks masks;
  masks.sample_ids = ids;
  auto q64 = q.to(torch::kFloat64).requires_grad_(true);
  auto k64 = k.to(torch::kFloat64).requires_grad_(true);
  auto v64 = v.to(torch::kFloat64).requires_grad_(true);
  auto want = attention_reference(q64, k64, v64, {}, masks, 0.25);  // the clean keys: masked
  EXPECT_EQ(compare(out, want, kAttentionFloat32), "") << "output";
  EXPECT_TRUE(torch::isfinite(lse).all().item<bool>()) << "lse";

  auto probe = torch::randn({b, nq, h, d});
  auto delta =
      (probe.to(torch::kFloat64) * want.detach()).sum(-1).transpose(1, 2).to(torch::kFloat);
  auto gq = torch::empty({b, nq, h, d}), gk = torch::empty({b, nk, h, d}),
       gv = torch::empty({b, nk, h, d});
  DeviceBuffer dprobe(probe), ddelta(delta.contiguous()), dgq(gq), dgk(gk), dgv(gv);
  cuda::AttentionBackwardLaunch g;
  g.forward = a;
  g.dout = dprobe.get<void>();
  g.delta = ddelta.get<float>();
  g.dq = dgq.get<float>();
  g.dk = dgk.get<float>();
  g.dv = dgv.get<float>();
  ASSERT_EQ(cuda::attention_backward(g, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dgq.read(gq);
  dgk.read(gk);
  dgv.read(gv);
  (want * probe.to(torch::kFloat64)).sum().backward();
  EXPECT_LT(relative_diff(gq, q64.grad()), kGradientTolerance) << "dq";
  // keys 0-31: their block visits no query tile (exact zeros); keys 56-95: as the reference
  // (keys 32-55 share a tile with sample 2's keys: their own gradients are not looked at)
  EXPECT_TRUE(torch::equal(gk.narrow(1, 0, 32), torch::zeros({b, 32, h, d}))) << "dk, keys 0-31";
  EXPECT_TRUE(torch::equal(gv.narrow(1, 0, 32), torch::zeros({b, 32, h, d}))) << "dv, keys 0-31";
  EXPECT_LT(relative_diff(gk.narrow(1, 56, 40), k64.grad().narrow(1, 56, 40)), kGradientTolerance)
      << "dk";
  EXPECT_LT(relative_diff(gv.narrow(1, 56, 40), v64.grad().narrow(1, 56, 40)), kGradientTolerance)
      << "dv";
}

}  // namespace
}  // namespace posenc
