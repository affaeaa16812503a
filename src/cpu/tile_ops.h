// Tile products and softmax row operations on float32 scratch tiles. Included by the per-ISA kernel
// files only: the SIMD builds use the register-blocked micro-kernels (microkernel.h) and vector exp2,
// the scalar build the plain loops below, which the compiler vectorises as it can.
//
// `lo` / `hi` (optional, together, one entry per query row of the tile) bound the keys a query row may touch
// to [lo, hi): masked keys then contribute nothing at all, not even 0 · NaN, so a NaN in a key or value that a
// row does not see can never reach that row (standard attention with an additive mask would leak it). Only
// partial tiles (MaskPolicy::tile) pass bounds, and they take the plain loops; the float32 forward and backward
// pass them only when an operand a masked entry multiplies is not finite (all_finite below), since with finite
// operands the exact zeros of the masked entries add nothing on the SIMD kernel either.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>
#include <cstring>

#include "cpu/convert.h"
#include "cpu/exp2.h"
#include "cpu/kernel_common.h"
#include "cpu/microkernel.h"

namespace flashtile::cpu {
FT_ISA_BEGIN

// Leading dimension of a scratch tile with n columns: a whole number of 16-float vectors.
constexpr int padded(std::int64_t n) { return static_cast<int>((n + 15) / 16 * 16); }

// A row stride for such a tile that spreads its rows over the L1 sets: padded(n), plus one 64-byte line where
// that is an even number of lines. Rows 2^k lines apart share 1/2^k of the sets (a 128-float row: 8 of 64), and a
// micro-kernel's column slice of 128 such rows then fills those sets' 8 ways, evicted by loads of the other
// operand. callgrind's cache model (32 KiB 8-way L1; S = 1024, D = 128, one thread): the backward's products
// missed L1 on 14.6 % (NN) and 17.6 % (TN) of their reads with padded() strides, 6.7 % and 5.4 % with these; timed
// on the 2-core EPYC (old and new builds interleaved, 7-15 rounds): backward 1.03-1.07x (per-round medians; rounds
// ranged 0.73-1.43x). The forward took them too and ran 0.94-0.98x, so it keeps padded().
constexpr int spread_ld(std::int64_t n) {
  const int p = padded(n);
  return (p / 16) % 2 == 0 ? p + 16 : p;
}

// C[m][n] (+)= A[m][k] · B[k][n]; row i of A uses only its columns [lo[i], hi[i]) when bounds are given.
inline void gemm_nn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict b, int ldb,
                    float* __restrict c, int ldc, bool accumulate, const int* lo = nullptr, const int* hi = nullptr) {
#if FT_SIMD_WIDTH
  if (hi == nullptr && n % simd::W == 0) return simd::gemm<false>(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
#endif
  for (int i = 0; i < m; ++i) {
    float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
    if (!accumulate)
      for (int j = 0; j < n; ++j) ci[j] = 0.0f;
    const float* ai = a + static_cast<std::int64_t>(i) * lda;
    const int kbegin = hi != nullptr ? lo[i] : 0, kend = hi != nullptr ? hi[i] : k;
    for (int p = kbegin; p < kend; ++p) {
      const float av = ai[p];
      const float* __restrict bp = b + static_cast<std::int64_t>(p) * ldb;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// C[m][n] += A[k][m]ᵀ · B[k][n]; row p of A (a query row) reaches only C rows [lo[p], hi[p]) when bounds are given.
inline void gemm_tn(int m, int n, int k, const float* __restrict a, int lda, const float* __restrict b, int ldb,
                    float* __restrict c, int ldc, const int* lo = nullptr, const int* hi = nullptr) {
#if FT_SIMD_WIDTH
  if (hi == nullptr && n % simd::W == 0) return simd::gemm<true>(m, n, k, a, lda, b, ldb, c, ldc, true);
#endif
  for (int p = 0; p < k; ++p) {
    const float* ap = a + static_cast<std::int64_t>(p) * lda;
    const float* __restrict bp = b + static_cast<std::int64_t>(p) * ldb;
    const int mbegin = hi != nullptr ? lo[p] : 0, mend = hi != nullptr ? hi[p] : m;
    for (int i = mbegin; i < mend; ++i) {
      const float av = ap[i];
      float* __restrict ci = c + static_cast<std::int64_t>(i) * ldc;
      for (int j = 0; j < n; ++j) ci[j] += av * bp[j];
    }
  }
}

// True when rows [0, rows) of a tile (ld floats apart, the first n of each) hold no NaN or infinity: then a
// product may run over masked entries whose weights are exact zeros (0 · x = 0) instead of passing bounds.
// An exponent of all ones is NaN or ±inf; the test is an integer OR, which the compiler vectorises (a float sum
// of 0 · x would be a chain of dependent adds).
inline bool all_finite(const float* x, int rows, int n, int ld) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<std::int64_t>(r) * ld;
    std::uint32_t bad = 0;
    for (int j = 0; j < n; ++j) {
      std::uint32_t u;
      std::memcpy(&u, xr + j, sizeof u);
      bad |= static_cast<std::uint32_t>((u & 0x7f800000u) == 0x7f800000u);
    }
    if (bad != 0) return false;
  }
  return true;
}

#if FT_SIMD_WIDTH
// Lane-wise max of x's W-float vectors [0, n / W) (n >= W).
inline simd::V row_max_lanes(const float* x, int n) {
  simd::V mv = simd::load(x);
  for (int j = simd::W; j + simd::W <= n; j += simd::W) mv = simd::max(mv, simd::load(x + j));
  return mv;
}

// exp_row (below) on x's vectors [0, n / W); returns the lane-wise sums.
inline simd::V exp_row_lanes(float* x, int n, float sub) {
  simd::V sv = simd::set1(0.0f);
  const simd::V lv = simd::set1(kLog2e), bv = simd::set1(sub);
  for (int j = 0; j + simd::W <= n; j += simd::W) {
    const simd::V e = simd::exp2(simd::mul(simd::sub(simd::load(x + j), bv), lv));
    simd::store(x + j, e);
    sv = simd::add(sv, e);
  }
  return sv;
}
#endif

// max_j x[j] (NaN-blind; a NaN reaches the output through exp2 and the sum instead).
inline float row_max(const float* x, int n) {
  float m = -__builtin_inff();
  int j = 0;
#if FT_SIMD_WIDTH
  if (n >= simd::W) {
    m = simd::reduce_max(row_max_lanes(x, n));
    j = n / simd::W * simd::W;
  }
#endif
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] = e^(x[j] − sub) for j < n; returns Σ x[j]. Scores stay in natural units: the difference x − sub
// is formed first (exact when x and sub are within a factor 2 of each other, one rounding otherwise), and only
// then multiplied by log2(e) for exp2. Folding log2(e) into the scores instead (one FMA, x·log2e − sub·log2e)
// rounds both terms at their own magnitude, an absolute error of eps·|x| that does not cancel: with one key
// dominating a row (x ≈ sub ≈ 11.5) the float32 backward's dV error was 3.9e-6 of max|dV| against 2.8e-7 for
// standard attention. NaN stays NaN; x = −inf gives 0 (sub finite).
inline float exp_row(float* x, int n, float sub) {
  float sum = 0.0f;
  int j = 0;
#if FT_SIMD_WIDTH
  sum = simd::reduce_add(exp_row_lanes(x, n, sub));
  j = n / simd::W * simd::W;
#endif
  for (; j < n; ++j) {
    x[j] = exp2_fast((x[j] - sub) * kLog2e);
    sum += x[j];
  }
  return sum;
}

// Prefetches slice `part` of `parts` of the cache lines of [p, p + bytes) toward L2. The forward spreads the
// next key tile's Kᵀ and V over the rows of the current tile's softmax this way: with the head's K/V cache
// in L3 (S = 4096, D = 128: 4 MiB), the key-tile loop ran at 39–43 GFLOP/s median on one AVX2 core without
// it and 50–52 with it (interleaved micro-benchmark of the loop, 400 runs each).
// Inlined always: GCC 12's IPA finds an out-of-line function made of prefetches pure and deletes its calls
// (it did so to the decode kernel's, flash_decode.cpp Ahead).
[[gnu::always_inline]] inline void prefetch_slice(const void* p, std::int64_t bytes, int part, int parts) {
  const std::int64_t lines = (bytes + 63) / 64;
  const char* c = static_cast<const char*>(p);
  for (std::int64_t i = lines * part / parts; i < lines * (part + 1) / parts; ++i) __builtin_prefetch(c + 64 * i, 0, 2);
}

#if FT_SIMD_WIDTH
// W values of a float, bfloat16 or float16 row, widened to float in registers.
inline simd::V load_row(const float* p) { return simd::load(p); }
inline simd::V load_row(const BFloat16* p) { return simd::load_bf16(reinterpret_cast<const std::uint16_t*>(p)); }
inline simd::V load_row(const Half* p) { return simd::load_f16(reinterpret_cast<const std::uint16_t*>(p)); }
#endif

// dst[c · ldd + j] = row(j)[c] in float for rows j < n and columns c < d: the transpose of a block of rows (the Kᵀ
// of a key block, whose columns the tile products take as rows), W x W at a time through registers (simd.h
// transpose_lanes). An element at a time it was a strided scalar store each: with this, the float32 tiled forward
// ran 1.6-2.6x at Sq = 1-64 and 1.05-1.4x at Sq = 128-2048 (A/B in one process, 2 threads, AVX-512 EPYC).
template <class T, class Row>
inline void transpose_to_float(Row row, int n, int d, float* __restrict dst, int ldd) {
  int j = 0;
#if FT_SIMD_WIDTH
  constexpr int W = simd::W;
  for (; j + W <= n; j += W) {
    const T* r[W];
    for (int u = 0; u < W; ++u) r[u] = row(j + u);
    int c = 0;
    for (; c + W <= d; c += W) {
      simd::V x[W];
      for (int u = 0; u < W; ++u) x[u] = load_row(r[u] + c);
      simd::transpose_lanes(x);
      for (int e = 0; e < W; ++e) simd::store(dst + static_cast<std::int64_t>(c + e) * ldd + j, x[e]);
    }
    for (; c < d; ++c)
      for (int u = 0; u < W; ++u) dst[static_cast<std::int64_t>(c) * ldd + j + u] = to_float(r[u][c]);
  }
#endif
  for (; j < n; ++j) {
    const T* r = row(j);
    for (int c = 0; c < d; ++c) dst[static_cast<std::int64_t>(c) * ldd + j] = to_float(r[c]);
  }
}

// c[i] += a[i] for the first rows · ld entries.
inline void add_rows(int rows, int ld, const float* __restrict a, float* __restrict c) {
  const std::int64_t n = static_cast<std::int64_t>(rows) * ld;
  for (std::int64_t i = 0; i < n; ++i) c[i] += a[i];
}

inline void scale_row(float* x, int n, float a) {
  for (int j = 0; j < n; ++j) x[j] *= a;
}

// One key tile's step of the output rows: acc[i][0, n) = acc[i]·alpha[i] + Σ_p P[i][p]·V[p][0, n), p < k — the
// online softmax's rescale and the tile's P·V. The tile's product is summed on its own before it is added (a
// running sum over all keys rounds worse; flash_forward.cpp). The SIMD kernel does the three steps in one pass
// over acc (microkernel.h, scale); with bounds, or without SIMD, they run one after the other through pv.
inline void rescale_add_pv(int m, int n, int k, const float* p, int ldp, const float* v, int ldv, float* acc, int ldacc,
                           const float* alpha, float* pv, const int* lo = nullptr, const int* hi = nullptr) {
#if FT_SIMD_WIDTH
  if (hi == nullptr && n % simd::W == 0) return simd::gemm<false>(m, n, k, p, ldp, v, ldv, acc, ldacc, false, alpha);
#endif
  for (int i = 0; i < m; ++i)
    if (alpha[i] != 1.0f) scale_row(acc + static_cast<std::int64_t>(i) * ldacc, n, alpha[i]);
  gemm_nn(m, n, k, p, ldp, v, ldv, pv, ldacc, false, lo, hi);
  add_rows(m, ldacc, pv, acc);
}

FT_ISA_END
}  // namespace flashtile::cpu
