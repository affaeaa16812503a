// bf16 tile products on dot-product pairs, for bf16 inputs in the forward pass:
//   C[m][n] (+)= Σ_p A2(i, p) · B2(p, n),   A2(i, p) = (a[i·lda + 2p], a[i·lda + 2p + 1])   (a row-major bf16 tile)
//                                           B2(p, n) = (b[p·ldb + 2n], b[p·ldb + 2n + 1])   (pairs interleaved)
// with float32 accumulation. FT_BF16_PAIRS selects how a pair product is computed:
//   1: AVX512_BF16 vdpbf16ps, 16 lanes x 2 products per instruction (twice an FMA's work per instruction:
//      measured at twice the float32 FMA FLOP rate on a Zen 4-class EPYC, where the dispatch picks this set,
//      and at half on two Intel Xeons (with AMX and without), where it does not: isa.cpp bf16_dots_pay);
//   2: an emulation on AVX2 FMAs (two per pair), which runs the same layouts, tails and masking on CPUs
//      without bf16 instructions. It is slower than the float32 path and never chosen automatically: it
//      exists so that the test suite exercises the pair kernels on every x86-64 machine with AVX2
//      (FLASHTILE_CPU_ISA=avx2-bf16emu).
// The register blocking follows microkernel.h: kMR rows x kNV vectors of C stay in registers for the
// whole p loop; one pair of B vectors is loaded per step and each A pair is broadcast as one 32-bit word.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>
#include <cstring>

#include "cpu/convert.h"
#include "cpu/simd.h"

#if FT_BF16_PAIRS
namespace flashtile::cpu::bf16 {
FT_ISA_BEGIN

using simd::V;
using simd::W;

#if FT_BF16_PAIRS == 1
// W keys x 2 bf16 values of B; A broadcast as W copies of one pair.
struct P {
  __m512i v;
};
inline P load_pairs(const std::uint16_t* p) { return {_mm512_loadu_si512(p)}; }
inline P broadcast_pair(std::uint32_t pair) { return {_mm512_set1_epi32(static_cast<int>(pair))}; }
inline V dot(V acc, P a, P b) { return {_mm512_dpbf16_ps(acc.v, (__m512bh)a.v, (__m512bh)b.v)}; }
// Two rows' 2W values x, y (y null: zeros) as key pairs: even[c] = (x[2c], y[2c]), odd[c] = (x[2c + 1], y[2c + 1]).
inline void interleave_rows(const std::uint16_t* x, const std::uint16_t* y, P& even, P& odd) {
  const __m512i a = _mm512_loadu_si512(x), b = y != nullptr ? _mm512_loadu_si512(y) : _mm512_setzero_si512();
  constexpr __mmask32 kHigh = 0xAAAAAAAAu;  // the high 16 bits of each 32-bit lane
  even = {_mm512_mask_blend_epi16(kHigh, a, _mm512_slli_epi32(b, 16))};
  odd = {_mm512_mask_blend_epi16(kHigh, _mm512_srli_epi32(a, 16), b)};
}
#else
struct P {
  __m256i v;
};
inline P load_pairs(const std::uint16_t* p) { return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))}; }
inline P broadcast_pair(std::uint32_t pair) { return {_mm256_set1_epi32(static_cast<int>(pair))}; }
// acc + a.lo * b.lo + a.hi * b.hi per 32-bit lane; bf16 -> float is a 16-bit shift (lo) or a mask (hi).
inline V dot(V acc, P a, P b) {
  const __m256i hi_mask = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  const __m256 a_lo = _mm256_castsi256_ps(_mm256_slli_epi32(a.v, 16));
  const __m256 a_hi = _mm256_castsi256_ps(_mm256_and_si256(a.v, hi_mask));
  const __m256 b_lo = _mm256_castsi256_ps(_mm256_slli_epi32(b.v, 16));
  const __m256 b_hi = _mm256_castsi256_ps(_mm256_and_si256(b.v, hi_mask));
  return {_mm256_fmadd_ps(a_hi, b_hi, _mm256_fmadd_ps(a_lo, b_lo, acc.v))};
}
inline void interleave_rows(const std::uint16_t* x, const std::uint16_t* y, P& even, P& odd) {  // as above
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i b = y != nullptr ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)) : _mm256_setzero_si256();
  even = {_mm256_blend_epi16(a, _mm256_slli_epi32(b, 16), 0xAA)};
  odd = {_mm256_blend_epi16(_mm256_srli_epi32(a, 16), b, 0xAA)};
}
#endif

#if FT_SIMD_WIDTH == 16
constexpr int kMR = 8, kNV = 2;
#else
constexpr int kMR = 6, kNV = 2;
#endif

inline std::uint32_t pair_at(const std::uint16_t* a) {
  std::uint32_t x;
  std::memcpy(&x, a, sizeof x);
  return x;
}

// kp pairs; ldb counts bf16 elements between consecutive pair rows of B (2 x the padded column count).
template <int MR, int NV>
inline void block(int kp, const std::uint16_t* __restrict a, int lda, const std::uint16_t* __restrict b, int ldb,
                  float* __restrict c, int ldc, bool accumulate) {
  V acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = accumulate ? simd::load(c + r * ldc + v * W) : simd::set1(0.0f);
  for (int p = 0; p < kp; ++p) {
    P bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load_pairs(b + static_cast<std::int64_t>(p) * ldb + v * 2 * W);
    for (int r = 0; r < MR; ++r) {
      const P av = broadcast_pair(pair_at(a + static_cast<std::int64_t>(r) * lda + 2 * p));
      for (int v = 0; v < NV; ++v) acc[r][v] = dot(acc[r][v], av, bv[v]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) simd::store(c + r * ldc + v * W, acc[r][v]);
}

template <int NV, int MR = kMR - 1>
inline void block_rows(int rows, int kp, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c,
                       int ldc, bool accumulate) {
  if constexpr (MR >= 1) {
    if (rows == MR) return block<MR, NV>(kp, a, lda, b, ldb, c, ldc, accumulate);
    return block_rows<NV, MR - 1>(rows, kp, a, lda, b, ldb, c, ldc, accumulate);
  }
}

// C[m][n] (+)= A2 · B2 over kp pairs; n a multiple of W.
inline void gemm(int m, int n, int kp, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb, float* c,
                 int ldc, bool accumulate) {
  for (int i0 = 0; i0 < m; i0 += kMR) {
    const int rows = m - i0 < kMR ? m - i0 : kMR;
    const std::uint16_t* ai = a + static_cast<std::int64_t>(i0) * lda;
    float* ci = c + static_cast<std::int64_t>(i0) * ldc;
    int j0 = 0;
    for (; j0 + kNV * W <= n; j0 += kNV * W) {
      if (rows == kMR) {
        block<kMR, kNV>(kp, ai, lda, b + 2 * j0, ldb, ci + j0, ldc, accumulate);
      } else {
        block_rows<kNV>(rows, kp, ai, lda, b + 2 * j0, ldb, ci + j0, ldc, accumulate);
      }
    }
    for (; j0 < n; j0 += W) {
      if (rows == kMR) {
        block<kMR, 1>(kp, ai, lda, b + 2 * j0, ldb, ci + j0, ldc, accumulate);
      } else {
        block_rows<1>(rows, kp, ai, lda, b + 2 * j0, ldb, ci + j0, ldc, accumulate);
      }
    }
  }
}

FT_ISA_END
}  // namespace flashtile::cpu::bf16
#endif
