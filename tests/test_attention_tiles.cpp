// The tiled CPU attention's micro-kernels (src/kernels/cpu/attention_tiles_rows.h, AVX2 6 x 16 and
// AVX-512 8 x 32) and scratch memory at their edges: no lane past the problem's rows and keys is
// read, and nothing in padding or stale scratch reaches an output.
//   AttentionFusedTileKernels  each level's three kernels (the levels this CPU has) at every row
//       count 1..R, key counts 1..33 and value widths 16 / 48, every operand placed so that its
//       last element the contract lets the kernel touch ends a page and the next page is
//       PROT_NONE (ggml test-backend-ops' out-of-bounds sentinels, here as guard pages): a read of
//       one lane past a short call's rows (the strip, the packed query block, alpha) or keys
//       faults. The unread gaps inside the operands (strides, padding keys) hold NaN. Values
//       against the contract of attention_tiles.h in float64: S = scale Q K^T,
//       O = alpha O + P V, O = alpha O + P^T V. Run in a child process (a death test), so that a
//       fault is one failed test, not the end of the run.
//   AttentionFusedScratch  attention_fused forward and gradients with the kernels' scratch (score
//       tiles and strips, accumulators, packed operands and their padding) filled with NaN
//       (set_attention_cpu_poison_for_tests) at key counts 1, 15, 17, 31, 33, 63, 65, 127, 129:
//       the same bits as without the poison, and equal to attention_reference within the
//       tolerances of test_attention_fused.cpp. CTest runs it at each CPU level
//       (unit_cpu_scalar|avx2|avx512, unit_attention_gemm_*).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/attention_tiles.h"
#include "posenc/kernels/attention_fused.h"
#include "posenc/kernels/cpu_capability.h"
#include "posenc/posenc.h"

namespace posenc {
namespace {

using detail::AttentionTileKernels;
using detail::kTilePanel;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// float32 sums of at most 48 fused multiply-adds against float64: relative to the sum of |terms|
constexpr double kTileTolerance = 1e-5;

// n floats whose last one ends a page; the page after it is PROT_NONE. Filled with NaN.
class GuardedFloats {
 public:
  explicit GuardedFloats(int64_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    size_ = (bytes + page - 1) / page * page + page;
    void* base = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      std::fprintf(stderr, "mmap of %zu bytes failed\n", size_);
      std::_Exit(2);
    }
    base_ = static_cast<char*>(base);
    char* guard = base_ + size_ - page;
    mprotect(guard, page, PROT_NONE);
    data_ = reinterpret_cast<float*>(guard) - n;
    for (int64_t i = 0; i < n; ++i) data_[i] = kNaN;
  }
  ~GuardedFloats() { munmap(base_, size_); }
  GuardedFloats(const GuardedFloats&) = delete;
  GuardedFloats& operator=(const GuardedFloats&) = delete;
  float* data() { return data_; }
  float& operator[](int64_t i) { return data_[i]; }

 private:
  char* base_ = nullptr;
  size_t size_ = 0;
  float* data_ = nullptr;
};

struct Mismatches {
  int count = 0;
  void check(double got, double want, double magnitude, const char* what, int64_t rows,
             int64_t cols, int64_t dim_v, int64_t r, int64_t e) {
    if (std::abs(got - want) <= kTileTolerance * std::max(1.0, magnitude)) return;
    if (++count <= 10)
      std::fprintf(stderr, "%s rows %lld cols %lld dim_v %lld: [%lld, %lld] = %.9g, want %.9g\n",
                   what, static_cast<long long>(rows), static_cast<long long>(cols),
                   static_cast<long long>(dim_v), static_cast<long long>(r),
                   static_cast<long long>(e), got, want);
  }
};

// S = scale Q K^T for `rows` query rows of the packed block (stride R) against `cols` keys.
void check_scores(const AttentionTileKernels& tiles, int64_t rows, int64_t cols, int64_t dim,
                  std::mt19937& gen, Mismatches& bad) {
  std::normal_distribution<float> normal;
  const int64_t big_r = tiles.rows, panels = (cols + kTilePanel - 1) / kTilePanel;
  const float scale = 0.3f;
  GuardedFloats qp((dim - 1) * big_r + rows);  // the last read: qp[(dim - 1) R + rows - 1]
  for (int64_t d = 0; d < dim; ++d)
    for (int64_t r = 0; r < rows; ++r) qp[d * big_r + r] = normal(gen);
  GuardedFloats kp(panels * kTilePanel * dim);  // padding keys stay NaN
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t d = 0; d < dim; ++d)
      kp[(c / kTilePanel) * kTilePanel * dim + d * kTilePanel + c % kTilePanel] = normal(gen);
  const int64_t lds = panels * kTilePanel + 3;
  GuardedFloats s((rows - 1) * lds + panels * kTilePanel);  // the last write ends the page
  tiles.scores(qp.data(), kp.data(), panels, dim, scale, s.data(), lds, rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      double want = 0, magnitude = 0;
      for (int64_t d = 0; d < dim; ++d) {
        const double term =
            double(qp[d * big_r + r]) *
            kp[(c / kTilePanel) * kTilePanel * dim + d * kTilePanel + c % kTilePanel];
        want += term;
        magnitude += std::abs(term);
      }
      bad.check(s[r * lds + c], scale * want, scale * magnitude, "scores", rows, cols, dim, r, c);
    }
}

// O = alpha O + P V (transposed: P^T V) for `rows` rows of O over `cols` keys.
void check_accumulate(const AttentionTileKernels& tiles, bool transposed, int64_t rows,
                      int64_t cols, int64_t dim_v, std::mt19937& gen, Mismatches& bad) {
  std::normal_distribution<float> normal;
  // the strip: P[r][c] at s[r lds + c] (last read s[(rows - 1) lds + cols - 1]) or, transposed,
  // at s[c lds + r] (last read s[(cols - 1) lds + rows - 1]); the gaps between stay NaN
  const int64_t lds = transposed ? rows + 3 : cols + 5;
  GuardedFloats s(transposed ? (cols - 1) * lds + rows : (rows - 1) * lds + cols);
  auto p = [&](int64_t r, int64_t c) -> float& {
    return transposed ? s[c * lds + r] : s[r * lds + c];
  };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) p(r, c) = normal(gen);
  // value panels, vstride past 16 cols (NaN between panels); the last read
  // vp[(dim_v / 16 - 1) vstride + (cols - 1) 16 + 15]
  const int64_t vstride = kTilePanel * cols + 7;
  GuardedFloats vp((dim_v / kTilePanel - 1) * vstride + cols * kTilePanel);
  auto v = [&](int64_t c, int64_t e) -> float& {
    return vp[(e / kTilePanel) * vstride + c * kTilePanel + e % kTilePanel];
  };
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t e = 0; e < dim_v; ++e) v(c, e) = normal(gen);
  GuardedFloats alpha(rows);
  for (int64_t r = 0; r < rows; ++r) alpha[r] = 0.5f + 0.25f * float(r);
  const int64_t ldo = dim_v + 4;
  GuardedFloats o((rows - 1) * ldo + dim_v);
  std::vector<float> o_before(static_cast<size_t>(rows * ldo));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < dim_v; ++e) o[r * ldo + e] = o_before[r * ldo + e] = normal(gen);
  (transposed ? tiles.accumulate_transposed : tiles.accumulate)(
      s.data(), lds, rows, cols, vp.data(), vstride, dim_v, alpha.data(), o.data(), ldo);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t e = 0; e < dim_v; ++e) {
      double want = double(alpha[r]) * o_before[r * ldo + e];
      double magnitude = std::abs(want);
      for (int64_t c = 0; c < cols; ++c) {
        const double term = double(p(r, c)) * v(c, e);
        want += term;
        magnitude += std::abs(term);
      }
      bad.check(o[r * ldo + e], want, magnitude,
                transposed ? "accumulate_transposed" : "accumulate", rows, cols, dim_v, r, e);
    }
}

// Every row count, short and long key counts, one and several value panels; exits 0 when all
// values hold (a read past an operand faults before).
[[noreturn]] void check_all_calls(const AttentionTileKernels& tiles) {
  std::mt19937 gen(7);
  Mismatches bad;
  for (int64_t rows = 1; rows <= tiles.rows; ++rows)
    for (int64_t cols : {1, 2, 15, 16, 17, 31, 33}) {
      check_scores(tiles, rows, cols, 16, gen, bad);
      check_scores(tiles, rows, cols, 20, gen, bad);
      for (int64_t dim_v : {16, 48})
        for (bool transposed : {false, true})
          check_accumulate(tiles, transposed, rows, cols, dim_v, gen, bad);
    }
  std::fflush(stderr);
  std::_Exit(bad.count == 0 ? 0 : 1);
}

void expect_no_read_past_the_operands(CpuCapability level, const AttentionTileKernels& tiles) {
  if (cpu_capability_detected() < level)
    GTEST_SKIP() << "this CPU has no " << to_string(level) << " level";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(check_all_calls(tiles), ::testing::ExitedWithCode(0), "")
      << to_string(level) << ": a fault (a read or write past an operand) or wrong values";
}

#if defined(__x86_64__)  // the tables exist where the build targets x86-64 (attention_tiles.h)
TEST(AttentionFusedTileKernels, Avx2ReadsAndWritesOnlyItsRowsAndKeys) {
  expect_no_read_past_the_operands(CpuCapability::kAvx2, detail::kAvx2AttentionTiles);
}

TEST(AttentionFusedTileKernels, Avx512ReadsAndWritesOnlyItsRowsAndKeys) {
  expect_no_read_past_the_operands(CpuCapability::kAvx512, detail::kAvx512AttentionTiles);
}
#endif

// ---- attention_fused with its scratch poisoned --------------------------------------------------

// As test_attention_fused.cpp: float32 tiles vs a float32 einsum/softmax, values O(1)
constexpr double kForwardTolerance = 2e-5;
// relative to the gradient's largest entry
constexpr double kGradientTolerance = 1e-4;

struct ScratchCase {
  int64_t nq, nk;
  bool causal;
};

class AttentionFusedScratch : public ::testing::TestWithParam<ScratchCase> {};

// Restores the poison's previous setting.
struct PoisonScope {
  explicit PoisonScope(bool on) : previous(detail::set_attention_cpu_poison_for_tests(on)) {}
  ~PoisonScope() { detail::set_attention_cpu_poison_for_tests(previous); }
  bool previous;
};

TEST_P(AttentionFusedScratch, PoisonedScratchChangesNoBit) {
  const auto& c = GetParam();
  torch::manual_seed(5);
  // D 32 and Dv 48: whole 16-float panels (the own micro-kernels at AVX2 and AVX-512, forward
  // and backward), Dv past AVX-512's 32-column blocks; Nq 37 and 133: a 6- or 8-row strip tail,
  // two query blocks at 133
  const int64_t b = 2, h = 2, d = 32, dv = 48;
  auto q = torch::randn({b, c.nq, h, d});
  auto k = torch::randn({b, c.nk, h, d});
  auto v = torch::randn({b, c.nk, h, dv});
  auto probe = torch::randn({b, c.nq, h, dv});
  auto pk = torch::arange(c.nk, torch::kFloat64);
  auto pq = torch::arange(c.nk - c.nq, c.nk, torch::kFloat64);
  const BiasSpec spec;  // no bias: the tiles' products and softmax alone
  AttentionMasks masks;
  masks.causal = c.causal;
  masks.key_padding = torch::ones({b, c.nk}, torch::kBool);
  if (c.nk > 1) masks.key_padding[1][0] = false;  // one padded key in sample 1
  const double scale = 1.0 / std::sqrt(double(d));
  auto run = [&](auto&& attention) {
    std::vector<at::Tensor> inputs{q.clone().requires_grad_(), k.clone().requires_grad_(),
                                   v.clone().requires_grad_()};
    auto out = attention(inputs[0], inputs[1], inputs[2]);
    auto grads = torch::autograd::grad({(out * probe).sum()}, inputs);
    grads.insert(grads.begin(), out.detach());
    return grads;  // out, dq, dk, dv
  };
  auto fused = [&](const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& vi) {
    return attention_fused(qi, ki, vi, spec, pq, pk, masks, scale);
  };
  const auto clean = run(fused);
  std::vector<at::Tensor> poisoned;
  {
    PoisonScope poison(true);
    poisoned = run(fused);
  }
  const auto reference = run([&](const at::Tensor& qi, const at::Tensor& ki, const at::Tensor& vi) {
    return attention_reference(qi, ki, vi, at::Tensor(), masks, scale);
  });
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (size_t i = 0; i < clean.size(); ++i) {
    EXPECT_TRUE(torch::equal(poisoned[i], clean[i]))
        << names[i] << ": the poisoned scratch changed bits (NaN in the poisoned result: "
        << poisoned[i].isnan().any().item<bool>() << ")";
    const double tolerance =
        i == 0 ? kForwardTolerance
               : kGradientTolerance * std::max(1.0, reference[i].abs().max().item<double>());
    EXPECT_LT((poisoned[i] - reference[i]).abs().max().item<double>(), tolerance) << names[i];
  }
}

std::vector<ScratchCase> scratch_cases() {
  std::vector<ScratchCase> out;
  for (int64_t nk : {1, 15, 17, 31, 33, 63, 65, 127, 129})
    for (int64_t nq : {37, 133}) {
      out.push_back({nq, nk, false});
      if (nk >= nq) out.push_back({nq, nk, true});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(KeyCounts, AttentionFusedScratch, ::testing::ValuesIn(scratch_cases()),
                         [](const ::testing::TestParamInfo<ScratchCase>& info) {
                           return "q" + std::to_string(info.param.nq) + "_k" +
                                  std::to_string(info.param.nk) +
                                  (info.param.causal ? "_causal" : "");
                         });

}  // namespace
}  // namespace posenc
