// A thin vector layer for the per-ISA kernel builds: V is the widest float vector the translation unit
// is compiled for (AVX-512: 16 lanes, AVX2: 8 lanes). The scalar build defines no V (FT_SIMD_WIDTH 0) and
// uses the plain loops in tile_ops.h. Only what the kernels use is here; a general SIMD library (Highway)
// was considered and not needed for a dozen operations.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "cpu/exp2.h"

namespace flashtile::cpu::simd {
FT_ISA_BEGIN

// x as computed, rounded to float: an empty asm that takes and gives the value in a register, so the compiler
// cannot contract the product that made x into an FMA with what follows (GCC contracts a * b - c in C++ mode).
inline float rounded(float x) {
  asm("" : "+x"(x));
  return x;
}

#if defined(__AVX512F__)
#define FT_SIMD_WIDTH 16
struct V {
  __m512 v;
};
inline V load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store(float* p, V a) { _mm512_storeu_ps(p, a.v); }
inline V set1(float x) { return {_mm512_set1_ps(x)}; }
inline V fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline V mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline V max(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
inline V min(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
inline V rounded(V a) {  // as rounded(float)
  asm("" : "+v"(a.v));
  return a;
}
// Written out instead of _mm512_reduce_*_ps, whose GCC 12 expansion trips -Wmaybe-uninitialized.
inline float reduce_add(V a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(V a) {
  const __m256 h = _mm256_max_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline V round_nearest(V a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
inline V shl23(V t) { return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_castps_si512(t.v), 23))}; }  // exp2
inline V keep_nan(V r, V x) {  // r where x is a number, x (NaN) elsewhere
  return {_mm512_mask_mov_ps(r.v, _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q), x.v)};
}
inline V div(V a, V b) { return {_mm512_div_ps(a.v, b.v)}; }
inline V abs(V a) { return {_mm512_abs_ps(a.v)}; }
inline V sign_of(V mag, V x) {  // |mag| with the sign bit of x
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x.v), _mm512_set1_epi32(static_cast<int>(0x80000000u)));
  return {_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag.v), sign))};
}
inline V select_lt(V a, V b, V x, V y) {  // x where a < b, else y (a NaN: y)
  return {_mm512_mask_mov_ps(y.v, _mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ), x.v)};
}
inline V zero_where_neg_inf(V a) {
  return {_mm512_mask_mov_ps(a.v, _mm512_cmp_ps_mask(a.v, _mm512_set1_ps(-__builtin_inff()), _CMP_EQ_OQ),
                             _mm512_setzero_ps())};
}
// Whether |x[j]| < bound for every j < n (n a multiple of 16); false when one is NaN.
inline bool all_abs_below(const float* x, int n, float bound) {
  const __m512 b = _mm512_set1_ps(bound);
  __mmask16 all = 0xFFFF;
  for (int j = 0; j < n; j += 16) all &= _mm512_cmp_ps_mask(abs(load(x + j)).v, b, _CMP_LT_OQ);
  return all == 0xFFFF;
}
// 16 bfloat16 / float16 values (raw 16-bit) widened to float: the decode kernel reads 16-bit caches directly.
inline V load_bf16(const std::uint16_t* p) {
  const __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16))};
}
inline V load_f16(const std::uint16_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
// The sixteen horizontal reductions of a[0..16) by op (add or max) as one vector, lane i = op over a[i]'s lanes:
// pairs of vectors halve per level (in-lane unpacks twice, then 128-bit blocks twice), 45 instructions where
// sixteen reduce_add take 128 (the decode kernel's dot products, the forward's row maxima and sums). The shuffles
// are the all-ones zero-masked forms, as in transpose16_epi32 below: GCC 12's plain ones trip -Werror=uninitialized once
// the function is emitted out of line (it was, in flash_decode.cpp, when qk_rows_chain's 8-row groups were added).
template <class Op>
inline V reduce_lanes(const V* a, Op op) {
  V s[8], t[4], u[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [a0, a1, a0, a1] partial results of a[2i], a[2i+1]
    s[i] = op(V{_mm512_maskz_unpacklo_ps(0xFFFF, a[2 * i].v, a[2 * i + 1].v)},
              V{_mm512_maskz_unpackhi_ps(0xFFFF, a[2 * i].v, a[2 * i + 1].v)});
  for (int i = 0; i < 4; ++i) {  // per block: [a0, a1, a2, a3] of a[4i ..]
    const __m512d x = _mm512_castps_pd(s[2 * i].v), y = _mm512_castps_pd(s[2 * i + 1].v);
    t[i] = op(V{_mm512_castpd_ps(_mm512_maskz_unpacklo_pd(0xFF, x, y))},
              V{_mm512_castpd_ps(_mm512_maskz_unpackhi_pd(0xFF, x, y))});
  }
  for (int i = 0; i < 2; ++i)  // blocks 0 + 1 and 2 + 3 of t[2i], then of t[2i + 1]
    u[i] = op(V{_mm512_maskz_shuffle_f32x4(0xFFFF, t[2 * i].v, t[2 * i + 1].v, _MM_SHUFFLE(2, 0, 2, 0))},
              V{_mm512_maskz_shuffle_f32x4(0xFFFF, t[2 * i].v, t[2 * i + 1].v, _MM_SHUFFLE(3, 1, 3, 1))});
  return op(V{_mm512_maskz_shuffle_f32x4(0xFFFF, u[0].v, u[1].v, _MM_SHUFFLE(2, 0, 2, 0))},
            V{_mm512_maskz_shuffle_f32x4(0xFFFF, u[0].v, u[1].v, _MM_SHUFFLE(3, 1, 3, 1))});
}
// out[2i] = a[i], out[2i + 1] = b[i] for i < 32 (16-bit elements): two rows as the pairs of a bf16 tile product's
// operand, one two-source permute per 32 outputs.
inline void interleave32_epi16(const void* a, const void* b, void* out) {
  alignas(64) static constexpr std::uint16_t kLo[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                       8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                       24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i x = _mm512_loadu_si512(a), y = _mm512_loadu_si512(b);
  _mm512_storeu_si512(out, _mm512_permutex2var_epi16(x, _mm512_load_si512(kLo), y));
  _mm512_storeu_si512(static_cast<char*>(out) + 64, _mm512_permutex2var_epi16(x, _mm512_load_si512(kHi), y));
}
// Transposes the 16 x 16 matrix of 32-bit elements whose rows are r[0..16), in place: unpacks of 32- and 64-bit
// elements within 128-bit blocks, then a 4 x 4 transpose of the blocks (64 shuffles). The all-ones zero-masked
// forms are the same instructions as the plain ones, whose GCC 12 expansion merges into _mm512_undefined_epi32()
// and fails -Werror=uninitialized in the sanitizer build (-O2).
inline void transpose16_epi32(__m512i* r) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {  // per block k: t[2i] = rows 2i, 2i+1 at columns 4k, 4k+1; t[2i+1] at 4k+2, 4k+3
    t[2 * i] = _mm512_maskz_unpacklo_epi32(0xFFFF, r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xFFFF, r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // per block k: u[4i + e] = rows 4i .. 4i+3 at column 4k + e
    u[4 * i] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xFF, t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xFF, t[4 * i + 1], t[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {  // column 4k + e takes block k of u[e], u[4 + e], u[8 + e], u[12 + e]
    const __m512i x0 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[e], u[4 + e], 0x44), x1 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[e], u[4 + e], 0xEE);
    const __m512i x2 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + e], u[12 + e], 0x44), x3 = _mm512_maskz_shuffle_i32x4(0xFFFF, u[8 + e], u[12 + e], 0xEE);
    r[e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, x2, 0x88);
    r[4 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x0, x2, 0xDD);
    r[8 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, x3, 0x88);
    r[12 + e] = _mm512_maskz_shuffle_i32x4(0xFFFF, x1, x3, 0xDD);
  }
}
// The W x W transpose of the floats whose rows are r[0..W), in place.
inline void transpose_lanes(V* r) {
  __m512i x[16];
  for (int i = 0; i < 16; ++i) x[i] = _mm512_castps_si512(r[i].v);
  transpose16_epi32(x);
  for (int i = 0; i < 16; ++i) r[i] = {_mm512_castsi512_ps(x[i])};
}
// 32 bfloat16 values as two float vectors, the even-indexed ones (0, 2, ..) and the odd ones (1, 3, ..): one load
// and one shift or mask each, where widening them in order takes a zero-extension per 16 (the decode kernel's
// pair order, flash_decode.cpp).
inline void load_bf16_pairs(const std::uint16_t* p, V& even, V& odd) {
  const __m512i x = _mm512_loadu_si512(p);
  even = {_mm512_castsi512_ps(_mm512_slli_epi32(x, 16))};
  odd = {_mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
}
#elif defined(__AVX2__)
#define FT_SIMD_WIDTH 8
struct V {
  __m256 v;
};
inline V load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline void store(float* p, V a) { _mm256_storeu_ps(p, a.v); }
inline V set1(float x) { return {_mm256_set1_ps(x)}; }
inline V fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V add(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V sub(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline V mul(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline V max(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
inline V min(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
inline V rounded(V a) {  // as rounded(float)
  asm("" : "+x"(a.v));
  return a;
}
inline float reduce_add(V a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float reduce_max(V a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline V round_nearest(V a) { return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)}; }
// The W x W transpose of the floats whose rows are r[0..W), in place: unpacks of 32-bit elements, shuffles of their
// pairs, then the 128-bit halves (24 shuffles).
inline void transpose_lanes(V* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i].v, r[2 * i + 1].v);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i].v, r[2 * i + 1].v);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int e = 0; e < 4; ++e) {
    r[e] = {_mm256_permute2f128_ps(u[e], u[4 + e], 0x20)};
    r[4 + e] = {_mm256_permute2f128_ps(u[e], u[4 + e], 0x31)};
  }
}
inline V shl23(V t) { return {_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t.v), 23))}; }  // exp2
inline V keep_nan(V r, V x) { return {_mm256_blendv_ps(r.v, x.v, _mm256_cmp_ps(x.v, x.v, _CMP_UNORD_Q))}; }
inline V div(V a, V b) { return {_mm256_div_ps(a.v, b.v)}; }
inline V abs(V a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
inline V sign_of(V mag, V x) { return {_mm256_or_ps(mag.v, _mm256_and_ps(_mm256_set1_ps(-0.0f), x.v))}; }
inline V select_lt(V a, V b, V x, V y) { return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ))}; }
inline V zero_where_neg_inf(V a) {
  const __m256 neg_inf = _mm256_cmp_ps(a.v, _mm256_set1_ps(-__builtin_inff()), _CMP_EQ_OQ);
  return {_mm256_blendv_ps(a.v, _mm256_setzero_ps(), neg_inf)};
}
inline bool all_abs_below(const float* x, int n, float bound) {  // n a multiple of 8
  const __m256 b = _mm256_set1_ps(bound);
  __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  for (int j = 0; j < n; j += 8) all = _mm256_and_ps(all, _mm256_cmp_ps(abs(load(x + j)).v, b, _CMP_LT_OQ));
  return _mm256_movemask_ps(all) == 0xFF;
}
inline V load_bf16(const std::uint16_t* p) {
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16))};
}
inline V load_f16(const std::uint16_t* p) { return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))}; }
// The eight horizontal reductions of a[0..8) by op as one vector, lane i = op over a[i]'s lanes: in-lane unpacks
// of 32- then 64-bit elements, then the two 128-bit halves (as the AVX-512 one above).
template <class Op>
inline V reduce_lanes(const V* a, Op op) {
  V s[4], t[2];
  for (int i = 0; i < 4; ++i)  // per 128-bit half: [a0, a1, a0, a1] partial results of a[2i], a[2i+1]
    s[i] = op(V{_mm256_unpacklo_ps(a[2 * i].v, a[2 * i + 1].v)}, V{_mm256_unpackhi_ps(a[2 * i].v, a[2 * i + 1].v)});
  for (int i = 0; i < 2; ++i) {  // per half: [a0, a1, a2, a3] of a[4i ..]
    const __m256d x = _mm256_castps_pd(s[2 * i].v), y = _mm256_castps_pd(s[2 * i + 1].v);
    t[i] = op(V{_mm256_castpd_ps(_mm256_unpacklo_pd(x, y))}, V{_mm256_castpd_ps(_mm256_unpackhi_pd(x, y))});
  }
  return op(V{_mm256_permute2f128_ps(t[0].v, t[1].v, 0x20)}, V{_mm256_permute2f128_ps(t[0].v, t[1].v, 0x31)});
}
inline void load_bf16_pairs(const std::uint16_t* p, V& even, V& odd) {  // 16 values; as the AVX-512 one
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = {_mm256_castsi256_ps(_mm256_slli_epi32(x, 16))};
  odd = {_mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))))};
}
#else
#define FT_SIMD_WIDTH 0
#endif

#if FT_SIMD_WIDTH
constexpr int W = FT_SIMD_WIDTH;

// The W horizontal sums / maxima of a[0..W) as one vector (reduce_lanes).
inline V reduce_add_lanes(const V* a) { return reduce_lanes(a, add); }
inline V reduce_max_lanes(const V* a) { return reduce_lanes(a, max); }

// 2^f for f in [-0.5, 0.5]: exp2_fast()'s polynomial (exp2.h), for exp2 and exp2_scalef below.
inline V exp2_poly(V f) {
  V p = set1(1.535336188319500e-4f);
  p = fma(p, f, set1(1.339887440266574e-3f));
  p = fma(p, f, set1(9.618437357674640e-3f));
  p = fma(p, f, set1(5.550332471162809e-2f));
  p = fma(p, f, set1(2.402264791363012e-1f));
  p = fma(p, f, set1(6.931472028550421e-1f));
  p = fma(p, f, set1(1.0f));
  return p;
}

// 2^x, the same steps as exp2_fast() in exp2.h, bit for bit under the same flags (tests/simd_exp2_cases.h): exact 0
// for x <= -127, +inf for x >= 128, NaN stays NaN. 13 instructions, in the softmax's inner loop: x + (1.5·2^23 + 127)
// rounds x to the nearest integer n and leaves n + 127 in the sum's low mantissa bits, which a left shift by 23
// moves into the exponent field: 2^n, +0 for n = −127, +inf for n = 128. max/min return their second operand for
// NaN: with x second, a NaN passes the clamp, its sum shifts to the bits of +0, and NaN · 0 is NaN. Rounding with
// vroundps, converting n back to int and restoring the NaN with a compare and blend took 16: a 64 x 64 score tile's
// softmax ran 1.11x faster without them (one core of the AVX-512 EPYC, AVX2 set), the float32 forward 1.00-1.02x
// (bench/cpu_ab.py, 2 threads, S = 2048 / 4096).
inline V exp2(V x) {
  constexpr float kShift = 12582912.0f + 127.0f;
  const V xc = min(set1(128.0f), max(set1(-127.0f), x));
  const V t = add(xc, set1(kShift));
  const V f = sub(xc, sub(t, set1(kShift)));  // in [-0.5, 0.5]
  return mul(exp2_poly(f), shl23(t));
}

#if FT_SIMD_WIDTH == 16
// exp2's polynomial with 2^n applied by vscalefps, which also carries NaN and +inf through: 12 instructions
// where exp2 takes 13. Below x = −125 the result is 0 (exp2 gives 0 below −127 and values under 2^-125
// between): zeroed by the mask, not computed, since a denormal result costs a microcode assist (masked keys at
// −inf made the causal forward 5 % slower when their 2^-150 underflowed). The clamp's order keeps a NaN
// (max/min return their second operand for NaN), and the mask keeps it too (not-less-than is true for NaN).
// kToBf16: a value that is rounded to bf16 next takes exp2.h's kExp2Bf16Poly (degree 4, relative error 3.4e-6)
// instead of exp2_poly's degree 6: the bf16 forward on AMX ran 1.02-1.06x (bench/cpu_ab.py, 2-core Xeon VM, one
// process, S = 2048 / 8192, D = 64 / 128).
template <bool kToBf16 = false>
inline V exp2_scalef(V x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const V xc = {_mm512_min_ps(_mm512_set1_ps(128.0f), _mm512_max_ps(_mm512_set1_ps(-125.0f), x.v))};
  const V n = round_nearest(xc);
  const V f = sub(xc, n);
  V p;
  if constexpr (kToBf16) {
    p = set1(kExp2Bf16Poly[4]);
    for (int i = 3; i >= 0; --i) p = fma(p, f, set1(kExp2Bf16Poly[i]));
  } else {
    p = exp2_poly(f);
  }
  return {_mm512_maskz_scalef_ps(normal, p.v, n.v)};
}
#endif

// tanh for |x| < 0.625 only: the odd polynomial of tanh_fast() in score_row.h (its FMAs fused).
inline V tanh_small(V x) {
  const V z = mul(x, x);
  V p = set1(-5.70498872745e-3f);
  p = fma(p, z, set1(2.06390887954e-2f));
  p = fma(p, z, set1(-5.37397155531e-2f));
  p = fma(p, z, set1(1.33314422036e-1f));
  p = fma(p, z, set1(-3.33332819422e-1f));
  return fma(mul(x, z), p, x);
}

// tanh, the same formulas as tanh_fast() in score_row.h: the odd polynomial below |x| = 0.625, else
// 1 − 2/(e^(2|x|) + 1) with x's sign; NaN stays NaN (exp2 keeps it, the compare sends it there).
inline V tanh(V x) {
  const V a = abs(x);
  const V small = tanh_small(x);
  const V e = exp2(mul(a, set1(2.0f * 1.4426950408889634f)));
  const V big = sub(set1(1.0f), div(set1(2.0f), add(e, set1(1.0f))));
  return select_lt(a, set1(0.625f), small, keep_nan(sign_of(big, x), x));
}
#endif

FT_ISA_END
}  // namespace flashtile::cpu::simd
