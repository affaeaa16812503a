// Element types on the CPU and their conversions to and from float.
#pragma once

#include "cpu/isa_namespace.h"

#include <bit>
#include <cstdint>
#include <cstring>

#include "flashtile/types.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace flashtile::cpu {
FT_ISA_BEGIN

// IEEE binary16 through the compiler's _Float16 (uses F16C instructions where the target has them).
struct Half {
  _Float16 value;
};
// bfloat16 as raw bits: the top half of a float32.
struct BFloat16 {
  std::uint16_t bits;
};

inline float to_float(float x) { return x; }
inline float to_float(Half x) { return static_cast<float>(x.value); }
inline float to_float(BFloat16 x) { return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16); }

template <class T>
T from_float(float x);
template <>
inline float from_float<float>(float x) {
  return x;
}
template <>
inline Half from_float<Half>(float x) {
  return Half{static_cast<_Float16>(x)};
}
template <>
inline BFloat16 from_float<BFloat16>(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  const std::uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return BFloat16{static_cast<std::uint16_t>(rounded >> 16)};
}

// dst[j] = bf16(src[j]) for j < n (round to nearest even), dst[j] = 0 for n <= j < n_pad (a pair or tile tail).
inline void to_bf16_row(const float* src, std::uint16_t* dst, int n, int n_pad) {
  int j = 0;
#if defined(__AVX512BF16__)
  for (; j + 16 <= n; j += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + j));
    std::memcpy(dst + j, &h, sizeof h);
  }
#endif
  for (; j < n; ++j) dst[j] = from_float<BFloat16>(src[j]).bits;
  for (; j < n_pad; ++j) dst[j] = 0;
}

// Calls f.template operator()<T>() with T the C++ type of dtype (a float dtype: validation refuses int32 for the
// operands, so int32 never reaches a kernel; it maps to float only to keep the switch total).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float16: return f.template operator()<Half>();
    case DType::bfloat16: return f.template operator()<BFloat16>();
    case DType::float32:
    case DType::int32: break;
  }
  return f.template operator()<float>();
}

// Element (b, s, h, 0) of a [B, S, H, D] tensor given element strides.
template <class T, class Ptr, class Strides>
inline auto row_ptr(Ptr base, const Strides& st, std::int64_t b, std::int64_t s, std::int64_t h) {
  using Elem = std::conditional_t<std::is_const_v<std::remove_pointer_t<Ptr>>, const T, T>;
  return static_cast<Elem*>(base) + b * st.batch + s * st.row + h * st.head;
}

FT_ISA_END
}  // namespace flashtile::cpu
