// Sixteen keys into the bf16 pair layouts the tile products read (AVX-512 builds), shared by the AMX / vdpbf16ps
// forward's pair cache (pair_cache.h) and the AMX decode (flash_decode.cpp):
//  - Kᵀ pairs: kt[i · ldkt + j] = (k_j[2i], k_j[2i + 1]) as one 32-bit element, the 32-bit transpose of the K rows
//    (simd.h transpose16_epi32, 16 rows x 16 pairs at a time);
//  - V key pairs: pair row m of vp (vp + m · ldvp) holds (v_2m[c], v_2m+1[c]) at 2c, 2c + 1 (one two-source
//    permute per 32 columns, simd.h interleave32_epi16).
// Where the scalar form moves one element at a time (the bf16 AMX forward spent ~15 % of its time there).
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>

#include "cpu/convert.h"
#include "cpu/simd.h"

#if FT_SIMD_WIDTH == 16
namespace flashtile::cpu {
FT_ISA_BEGIN

// Keys k[0..16), v[0..16) with d and dv multiples of 32; returns whether a V value is Inf or NaN (exponent all ones).
inline bool pack_keys16(const BFloat16* const* k, const BFloat16* const* v, int d, int dv, std::uint32_t* kt,
                        std::int64_t ldkt, std::uint16_t* vp, std::int64_t ldvp) {
  for (int i0 = 0; i0 < d / 2; i0 += 16) {
    __m512i r[16];
    for (int j = 0; j < 16; ++j) r[j] = _mm512_loadu_si512(reinterpret_cast<const std::uint32_t*>(k[j]) + i0);
    simd::transpose16_epi32(r);
    for (int j = 0; j < 16; ++j) _mm512_storeu_si512(kt + (i0 + j) * ldkt, r[j]);
  }
  const __m512i exp_mask = _mm512_set1_epi16(0x7f80);
  __mmask32 nonfinite = 0;
  for (int m = 0; m < 8; ++m) {
    const BFloat16* a = v[2 * m];
    const BFloat16* b = v[2 * m + 1];
    for (int c = 0; c < dv; c += 32) {
      nonfinite |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(a + c), exp_mask), exp_mask) |
                   _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(b + c), exp_mask), exp_mask);
      simd::interleave32_epi16(a + c, b + c, vp + m * ldvp + 2 * c);
    }
  }
  return nonfinite != 0;
}

FT_ISA_END
}  // namespace flashtile::cpu
#endif
