// Small dense products on float32 tiles held in row-major scratch buffers. Included by the per-ISA
// kernel files, so each copy is compiled (and auto-vectorised) for that ISA. Every inner loop runs over
// a contiguous output row, so the compiler emits broadcast-FMA sequences.
#pragma once

#include <cstdint>

namespace flashtile::cpu {

// C[m][n] = A[m][k] · Bt[k][n]  (Bt is B transposed; row strides lda, ldb, ldc).
inline void gemm_nn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict bt, int ldb,
                    float* __restrict c, int ldc, bool accumulate) {
  for (int i = 0; i < m; ++i) {
    float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
    if (!accumulate)
      for (int j = 0; j < n; ++j) ci[j] = 0.0f;
    const float* ai = a + static_cast<std::int64_t>(i) * lda;
    for (int p = 0; p < k; ++p) {
      const float av = ai[p];
      const float* __restrict bp = bt + static_cast<std::int64_t>(p) * ldb;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// C[m][n] += A[k][m]ᵀ · B[k][n]
inline void gemm_tn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict b, int ldb,
                    float* __restrict c, int ldc) {
  for (int p = 0; p < k; ++p) {
    const float* ap = a + static_cast<std::int64_t>(p) * lda;
    const float* __restrict bp = b + static_cast<std::int64_t>(p) * ldb;
    for (int i = 0; i < m; ++i) {
      const float av = ap[i];
      float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// Dst[cols][rows] = Src[rows][cols]ᵀ
inline void transpose(int rows, int cols, const float* __restrict src, int lds, float* __restrict dst, int ldd) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) dst[static_cast<std::int64_t>(c) * ldd + r] = src[static_cast<std::int64_t>(r) * lds + c];
}

}  // namespace flashtile::cpu
