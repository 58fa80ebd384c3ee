// Internal: MKL's Fortran sgemm and its packed-matrix API (cblas_sgemm_pack_get_size,
// cblas_sgemm_pack, cblas_sgemm_compute), exported by LibTorch's libtorch_cpu on x86-64 (LP64:
// 32-bit integers; Intel oneMKL reference, "sgemm" and "cblas_?gemm_pack"). Declared weak: each
// is null where the LibTorch has no MKL, and the caller takes at::mm instead. Used by the tiled
// attention (attention_cpu.cpp) and its benchmark of one tile's products.
#pragma once

#include <cstddef>

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc) __attribute__((weak));
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha,
                      const float* src, int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a,
                         int lda, const float* b, int ldb, float beta, float* c, int ldc)
    __attribute__((weak));
}
