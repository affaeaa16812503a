// 2^x in float32 for the softmax hot loops: Cody–Waite style split x = n + f with f in [-0.5, 0.5], a
// degree-6 polynomial for 2^f (the Cephes exp2f coefficients), and 2^n built in the exponent bits.
// Written with plain float/int operations so every ISA build auto-vectorises it.
//
// Accuracy (tested in tests/test_exp2.cpp against std::exp2 over [-126, 0] and edge cases): relative error
// <= 4 float ulps (~2.4e-7). Exact 0 for x <= -127 (masked scores are -inf), NaN in -> NaN out, +inf -> +inf.
#pragma once

#include "cpu/isa_namespace.h"

#include <bit>
#include <cstdint>

namespace flashtile::cpu {
FT_ISA_BEGIN

inline float exp2_fast(float x) {
  // Clamp into the range whose 2^n is a normal float (or exactly 0 at -127, inf at 128). A NaN compares
  // false and is clamped too, so the int conversion below is always defined; it is restored at the end.
  float xc = x > -127.0f ? x : -127.0f;
  xc = xc < 128.0f ? xc : 128.0f;
  // Round to the nearest integer n by adding 1.5·2^23 + 127 (no libm call, vectorises everywhere): the sum's low
  // mantissa bits are then n + 127, the exponent field of 2^n (below). The sum rounds ties to even, so a tie goes to
  // the odd n; f = ±0.5 either way, where the polynomial is as accurate as anywhere.
  constexpr float kShift = 12582912.0f + 127.0f;
  const float t = xc + kShift;
  const float n = t - kShift;
  const float f = xc - n;  // in [-0.5, 0.5]
  float p = 1.535336188319500e-4f;
  p = p * f + 1.339887440266574e-3f;
  p = p * f + 9.618437357674640e-3f;
  p = p * f + 5.550332471162809e-2f;
  p = p * f + 2.402264791363012e-1f;
  p = p * f + 6.931472028550421e-1f;
  p = p * f + 1.0f;
  // 2^n: t's low bits n + 127 shifted into the exponent field; n = -127 gives the bit pattern of +0, n = 128 that of
  // +inf. (A NaN is clamped above; its t is finite.)
  const float scale = std::bit_cast<float>(std::bit_cast<std::uint32_t>(t) << 23);
  const float r = p * scale;
  return x == x ? r : x;
}

// 2^f for f in [-0.5, 0.5] where the result is rounded to bf16 next (P of the bf16 forwards; simd.h
// exp2_scalef<true>): c[0] + c[1]·f + ... + c[4]·f^4, a relative-error minimax fit of degree 4, relative error 3.4e-6
// (bf16's rounding is up to 2^-9 = 2e-3), two FMAs fewer than exp2_fast's degree 6. tests/test_exp2.cpp bounds it.
inline constexpr float kExp2Bf16Poly[5] = {9.999990187494872e-1f, 6.931171424408931e-1f, 2.4024394707991586e-1f,
                                           5.5934592992700594e-2f, 9.591781891129891e-3f};

FT_ISA_END
}  // namespace flashtile::cpu
