// The drivers of the linear layers' own products (linear_gemm.h): the forward y = x W^T + b with
// W^T packed once a call into [K, N] rows (B of the micro-kernel) and the bias as the
// accumulators' start; dx = dy W written (not accumulated: no zeroing pass); dW = dy^T x over the
// rows of dy and x in chunks of kDepthChunk (they stay in L2 while every tile of dW takes its
// share), with db = the column sums of dy over the same chunks. Rows of y and dx, and rows of dW
// (with their columns of db), are split across threads (posenc's parallel_for) in units of
// kRowUnit, a multiple of both levels' micro-kernel rows (AVX-512 8, AVX2 6): each element is
// computed by one thread in one fixed order, so the results do not depend on the thread count.
// For the MLP (linear -> GELU -> linear) the forward of the first layer can apply the GELU and the
// input gradient of the second multiply by GELU's derivative (cpu_kernels.h's passes, the same
// bits as their separate passes: element-wise) kRowUnit rows at a time while they are in L1.
// Which products: this CPU level's table (kernels_avx2.cpp, kernels_avx512.cpp); the scalar level
// and POSENC_LINEAR_GEMM=mkl keep MKL's (the callers' at::addmm_out / at::mm).
#include "linear_gemm_cpu.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "cpu_kernels.h"
#include "parallel.h"

namespace posenc::detail {

namespace {

constexpr int64_t kRowUnit = 24;          // rows a thread's share is a multiple of (lcm of 6 and 8)
constexpr int64_t kDepthChunk = 256;      // rows of dy and x a pass of dW's tiles reads
constexpr int64_t kGrainFlops = 1 << 18;  // below about this much work a call stays on one thread

const std::string& gemm_choice() {
  static const std::string choice = [] {
    const char* env = std::getenv("POSENC_LINEAR_GEMM");
    std::string value = env != nullptr ? env : "";
    TORCH_CHECK(value.empty() || value == "own" || value == "mkl",
                "POSENC_LINEAR_GEMM must be 'own' or 'mkl' (or unset), got '", value, "'");
    return value;
  }();
  return choice;
}

// units of kRowUnit rows per parallel_for task so that one task has about kGrainFlops of work
int64_t grain_units(int64_t flops_per_row) {
  return std::max<int64_t>(1, kGrainFlops / std::max<int64_t>(1, kRowUnit * flops_per_row));
}

void check_float_rows(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.scalar_type() == at::kFloat && t.is_cpu(),
              "linear_gemm: ", what, " must be a contiguous float32 CPU matrix, got ",
              t.scalar_type(), " ", t.sizes());
}

}  // namespace

const LinearGemmKernels* own_linear_gemm() {
  static const LinearGemmKernels* chosen = []() -> const LinearGemmKernels* {
    if (gemm_choice() == "mkl") return nullptr;
#if defined(__x86_64__)
    switch (cpu_kernels().capability) {
      case CpuCapability::kAvx512:
        return &kAvx512LinearGemm;
      case CpuCapability::kAvx2:
        return &kAvx2LinearGemm;
      default:
        return nullptr;
    }
#else
    return nullptr;
#endif
  }();
  return chosen;
}

bool linear_gemm_takes(int64_t cols) {
  const LinearGemmKernels* k = own_linear_gemm();
  return k != nullptr && cols > 0 && cols % k->lanes == 0;
}

void linear_forward_own(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                        at::Tensor& y, at::Tensor* gelu_out) {
  check_float_rows(x, "x");
  check_float_rows(weight, "weight");
  check_float_rows(y, "y");
  const auto gelu = cpu_kernels().gelu;
  TORCH_CHECK(gelu_out == nullptr || (gelu != nullptr && gelu_out->is_contiguous() &&
                                      gelu_out->scalar_type() == at::kFloat &&
                                      gelu_out->sizes() == y.sizes() && !gelu_out->is_same(y)),
              "linear_forward_own: the GELU output must be a float32 tensor apart from y of its "
              "shape ",
              y.sizes());
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  TORCH_CHECK(linear_gemm_takes(n) && weight.size(1) == k && y.size(0) == m && y.size(1) == n &&
                  bias.numel() == n && bias.is_contiguous(),
              "linear_forward_own: shapes x ", x.sizes(), ", weight ", weight.sizes(), ", bias ",
              bias.sizes(), ", y ", y.sizes(), " do not fit");
  if (m == 0) return;
  const LinearGemmKernels& kern = *own_linear_gemm();
  // W^T as [K, N] rows: B of the micro-kernel
  std::vector<float> wt(static_cast<size_t>(k * n));
  const float* w = weight.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) wt[j * n + i] = w[i * k + j];
  const float* xp = x.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  float* ap = gelu_out != nullptr ? gelu_out->data_ptr<float>() : nullptr;
  const int64_t units = (m + kRowUnit - 1) / kRowUnit;
  parallel_for(0, units, grain_units(2 * k * n), [&](int64_t begin, int64_t end) {
    const int64_t r0 = begin * kRowUnit, r1 = std::min(m, end * kRowUnit);
    if (ap == nullptr) {
      kern.rows_a(r1 - r0, n, k, xp + r0 * k, k, wt.data(), n, bp, 0, yp + r0 * n, n);
      return;
    }
    // kRowUnit rows at a time, their GELU while they are in L1
    for (int64_t s = r0; s < r1; s += kRowUnit) {
      const int64_t rows = std::min(kRowUnit, r1 - s);
      kern.rows_a(rows, n, k, xp + s * k, k, wt.data(), n, bp, 0, yp + s * n, n);
      gelu(yp + s * n, ap + s * n, rows * n, false);
    }
  });
}

void linear_input_grad_own(const at::Tensor& dy, const at::Tensor& weight, at::Tensor& dx,
                           const at::Tensor* gelu_input) {
  check_float_rows(dy, "dy");
  check_float_rows(weight, "weight");
  check_float_rows(dx, "dx");
  const auto gelu_backward = cpu_kernels().gelu_backward;
  TORCH_CHECK(gelu_input == nullptr ||
                  (gelu_backward != nullptr && gelu_input->is_contiguous() &&
                   gelu_input->scalar_type() == at::kFloat && gelu_input->sizes() == dx.sizes()),
              "linear_input_grad_own: the GELU input must be a float32 tensor of dx's shape ",
              dx.sizes());
  const int64_t m = dy.size(0), n = dy.size(1), k = weight.size(1);
  TORCH_CHECK(linear_gemm_takes(k) && weight.size(0) == n && dx.size(0) == m && dx.size(1) == k,
              "linear_input_grad_own: shapes dy ", dy.sizes(), ", weight ", weight.sizes(), ", dx ",
              dx.sizes(), " do not fit");
  if (m == 0) return;
  const LinearGemmKernels& kern = *own_linear_gemm();
  const float* dyp = dy.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  const float* hp = gelu_input != nullptr ? gelu_input->data_ptr<float>() : nullptr;
  const int64_t units = (m + kRowUnit - 1) / kRowUnit;
  parallel_for(0, units, grain_units(2 * k * n), [&](int64_t begin, int64_t end) {
    const int64_t r0 = begin * kRowUnit, r1 = std::min(m, end * kRowUnit);
    if (hp == nullptr) {
      kern.rows_a(r1 - r0, k, n, dyp + r0 * n, n, wp, k, nullptr, 0, dxp + r0 * k, k);
      return;
    }
    // kRowUnit rows at a time, times GELU's derivative at h while they are in L1 (in place)
    for (int64_t s = r0; s < r1; s += kRowUnit) {
      const int64_t rows = std::min(kRowUnit, r1 - s);
      kern.rows_a(rows, k, n, dyp + s * n, n, wp, k, nullptr, 0, dxp + s * k, k);
      gelu_backward(dxp + s * k, hp + s * k, dxp + s * k, rows * k, false);
    }
  });
}

void linear_weight_grad_own(const at::Tensor& dy, const at::Tensor& x, at::Tensor& dw,
                            at::Tensor* db) {
  check_float_rows(dy, "dy");
  check_float_rows(x, "x");
  check_float_rows(dw, "dw");
  const int64_t m = dy.size(0), n = dy.size(1), k = x.size(1);
  TORCH_CHECK(linear_gemm_takes(k) && x.size(0) == m && dw.size(0) == n && dw.size(1) == k &&
                  (db == nullptr ||
                   (db->numel() == n && db->is_contiguous() && db->scalar_type() == at::kFloat)),
              "linear_weight_grad_own: shapes dy ", dy.sizes(), ", x ", x.sizes(), ", dw ",
              dw.sizes(), " do not fit");
  if (m == 0) {
    dw.zero_();
    if (db != nullptr) db->zero_();
    return;
  }
  const LinearGemmKernels& kern = *own_linear_gemm();
  const float* dyp = dy.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  float* dwp = dw.data_ptr<float>();
  float* dbp = db != nullptr ? db->data_ptr<float>() : nullptr;
  const int64_t units = (n + kRowUnit - 1) / kRowUnit;
  parallel_for(0, units, grain_units(2 * k * m), [&](int64_t begin, int64_t end) {
    const int64_t n0 = begin * kRowUnit, n1 = std::min(n, end * kRowUnit);
    for (int64_t m0 = 0; m0 < m; m0 += kDepthChunk) {
      const int64_t depth = std::min(kDepthChunk, m - m0);
      const bool first = m0 == 0;
      float* c = dwp + n0 * k;
      kern.cols_a(n1 - n0, k, depth, dyp + m0 * n + n0, n, xp + m0 * k, k, first ? nullptr : c, k,
                  c, k);
      if (dbp != nullptr) kern.column_sums(depth, n1 - n0, dyp + m0 * n + n0, n, dbp + n0, !first);
    }
  });
}

}  // namespace posenc::detail
