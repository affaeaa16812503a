// Register-blocked tile products for the SIMD builds (see simd.h):
//   C[m][n] (+)= Σ_p A(i, p) · B[p][n],   A(i, p) = a[i·lda + p]  (NN)   or   a[p·lda + i]  (TN).
// A block of MR rows × NV vectors of C lives in registers for the whole p loop: per step one load of NV
// B vectors, MR broadcasts of A, MR·NV FMAs, and no load/store of C — the FMA units, not the load/store
// ports, set the pace. n must be a multiple of the vector width W: every scratch tile has its leading
// dimension padded to 16 floats with zeros in the padding (tile_config.h), so the pad columns compute
// harmless zeros and no tail code is needed.
// With `scale` (one factor per row of C) a block computes C[i][n] = C[i][n]·scale[i] + Σ_p A(i, p)·B[p][n]: the sum
// starts from zero in registers and meets C only at the store, as a separate multiply and add, so the result is
// bitwise that of scaling C, forming the product in a tile of its own and adding it.
#pragma once

#include "cpu/isa_namespace.h"

#include "cpu/simd.h"

#if FT_SIMD_WIDTH
namespace flashtile::cpu::simd {
FT_ISA_BEGIN

#if FT_SIMD_WIDTH == 16
// 24 accumulators + 4 B vectors + 1 broadcast of the 32 zmm registers: 10 loads per 24 FMAs where 8 x 2 had 10 per
// 16. Measured on the 2-core AMX Xeon VM against 8 x 2 (bench/cpu_ab.py, 2 threads, interleaved rounds): float32
// forward 1.01-1.05x, backward 0.99-1.05x at S = 2048 / 4096, D = 64 / 128; 12 x 2 and 14 x 2 0.98-1.03x.
constexpr int kMR = 6, kNV = 4;
#else
constexpr int kMR = 6, kNV = 2;  // 12 accumulators + 2 B vectors + 1 broadcast of the 16 ymm registers
#endif

// What a block does with C: kSet writes the product, kAccumulate adds it (the sum starts from C's values), kScale
// writes C·scale + product. A template parameter, so that each block's prologue and epilogue are straight-line code.
enum class Epilogue { kSet, kAccumulate, kScale };

template <bool kTransA, int MR, int NV, Epilogue kE>
inline void block(int k, const float* __restrict a, int lda, const float* __restrict b, int ldb, float* __restrict c,
                  int ldc, const float* __restrict scale) {
  // gemm_with takes k <= 0 itself. Told so, GCC keeps the accumulators in registers from the start: otherwise the
  // loop that may not run left them in a stack array, stored, loaded and stored again around it (~70 vector moves
  // per block, objdump of block<false, 6, 4, ...>).
  if (k <= 0) __builtin_unreachable();
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = kE == Epilogue::kAccumulate ? load(c + r * ldc + v * W) : set1(0.0f);
  for (int p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load(b + static_cast<std::int64_t>(p) * ldb + v * W);
    for (int r = 0; r < MR; ++r) {
      const V av = set1(kTransA ? a[static_cast<std::int64_t>(p) * lda + r] : a[static_cast<std::int64_t>(r) * lda + p]);
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(av, bv[v], acc[r][v]);
    }
  }
  if constexpr (kE == Epilogue::kScale) {
    for (int r = 0; r < MR; ++r) {
      const V sr = set1(scale[r]);
      for (int v = 0; v < NV; ++v) acc[r][v] = add(mul(load(c + r * ldc + v * W), sr), acc[r][v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * W, acc[r][v]);
}

// Rows [0, MR') of a block with MR' < kMR, chosen at run time.
template <bool kTransA, int NV, Epilogue kE, int MR = kMR - 1>
inline void block_rows(int rows, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                       const float* scale) {
  if constexpr (MR >= 1) {
    if (rows == MR) return block<kTransA, MR, NV, kE>(k, a, lda, b, ldb, c, ldc, scale);
    return block_rows<kTransA, NV, kE, MR - 1>(rows, k, a, lda, b, ldb, c, ldc, scale);
  }
}

// Column blocks outer, row blocks inner: a block's B slice (k x NV vectors: 8 KiB of Kᵀ at D = 128) stays in L1
// while every row block passes over it, and only A's rows stream from L2; rows outer re-read all of B from L2
// for each row block (Kᵀ 32 KiB, V 32 KiB: the size of L1 on its own).
template <bool kTransA, Epilogue kE>
inline void gemm_with(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                      const float* scale) {
  if (k <= 0) {  // an empty sum: the blocks below assume k >= 1
    for (int i = 0; i < m && kE != Epilogue::kAccumulate; ++i) {
      float* ci = c + static_cast<std::int64_t>(i) * ldc;
      for (int j = 0; j < n; ++j) ci[j] = kE == Epilogue::kScale ? ci[j] * scale[i] : 0.0f;  // 0, not 0 · C (NaN)
    }
    return;
  }
  auto rows_over = [&]<int NV>(int j0) {
    for (int i0 = 0; i0 < m; i0 += kMR) {
      const int rows = m - i0 < kMR ? m - i0 : kMR;
      const float* ai = kTransA ? a + i0 : a + static_cast<std::int64_t>(i0) * lda;
      float* ci = c + static_cast<std::int64_t>(i0) * ldc + j0;
      const float* si = scale != nullptr ? scale + i0 : nullptr;
      if (rows == kMR) {
        block<kTransA, kMR, NV, kE>(k, ai, lda, b + j0, ldb, ci, ldc, si);
      } else {
        block_rows<kTransA, NV, kE>(rows, k, ai, lda, b + j0, ldb, ci, ldc, si);
      }
    }
  };
  int j0 = 0;
  for (; j0 + kNV * W <= n; j0 += kNV * W) rows_over.template operator()<kNV>(j0);
  for (; j0 < n; j0 += W) rows_over.template operator()<1>(j0);
}

template <bool kTransA>
inline void gemm(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                 bool accumulate, const float* scale = nullptr) {
  if (scale != nullptr) return gemm_with<kTransA, Epilogue::kScale>(m, n, k, a, lda, b, ldb, c, ldc, scale);
  if (accumulate) return gemm_with<kTransA, Epilogue::kAccumulate>(m, n, k, a, lda, b, ldb, c, ldc, nullptr);
  gemm_with<kTransA, Epilogue::kSet>(m, n, k, a, lda, b, ldb, c, ldc, nullptr);
}

FT_ISA_END
}  // namespace flashtile::cpu::simd
#endif
