// Small dense products on float32 tiles held in row-major scratch buffers. Included by the per-ISA
// kernel files, so each copy is compiled (and auto-vectorised) for that ISA. Every inner loop runs over
// a contiguous output row, so the compiler emits broadcast-FMA sequences.
//
// `limit` (optional, one entry per query row of the tile) bounds the key index a query row may touch:
// masked keys then contribute nothing at all, not even 0 · NaN, so a NaN in a key or value that a row
// does not see can never reach that row (standard attention with an additive mask would leak it).
// Key tiles start at or after every row's first visible key today (causal / no mask); a window mask
// would add a lower bound here.
#pragma once

#include <cstdint>

namespace flashtile::cpu {

// C[m][n] (+)= A[m][k] · B[k][n]; row i of A uses only its first limit[i] columns when limit is given.
inline void gemm_nn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict b, int ldb,
                    float* __restrict c, int ldc, bool accumulate, const int* limit = nullptr) {
  for (int i = 0; i < m; ++i) {
    float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
    if (!accumulate)
      for (int j = 0; j < n; ++j) ci[j] = 0.0f;
    const float* ai = a + static_cast<std::int64_t>(i) * lda;
    const int kend = limit != nullptr ? limit[i] : k;
    for (int p = 0; p < kend; ++p) {
      const float av = ai[p];
      const float* __restrict bp = b + static_cast<std::int64_t>(p) * ldb;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// C[m][n] += A[k][m]ᵀ · B[k][n]; row p of A (a query row) reaches only C rows i < limit[p].
inline void gemm_tn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict b, int ldb,
                    float* __restrict c, int ldc, const int* limit = nullptr) {
  for (int p = 0; p < k; ++p) {
    const float* ap = a + static_cast<std::int64_t>(p) * lda;
    const float* __restrict bp = b + static_cast<std::int64_t>(p) * ldb;
    const int mend = limit != nullptr ? limit[p] : m;
    for (int i = 0; i < mend; ++i) {
      const float av = ap[i];
      float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

}  // namespace flashtile::cpu
