// Elements of the FlashTile dtypes as test and tool code (the tests' host tensors and yardsticks, the fuzzer) sees
// them: one element read as a double (unaligned addresses are fine), a float rounded to a dtype as a framework
// stores it, and each dtype's machine epsilon. Also host code that converts element by element
// (merge_attention_states). Not for kernels: they convert whole tiles.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

#include "flashtile/types.h"

namespace flashtile::detail {

inline double load_element(const void* p, DType t) {
  switch (t) {
    case DType::float32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case DType::float16: {
      _Float16 x;
      std::memcpy(&x, p, 2);
      return static_cast<double>(x);
    }
    case DType::bfloat16: {
      std::uint16_t u;
      std::memcpy(&u, p, 2);
      return std::bit_cast<float>(static_cast<std::uint32_t>(u) << 16);
    }
    case DType::int32: {
      std::int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
  }
  return 0.0;
}

// x rounded to the dtype (nearest, ties to even) and widened back; NaN stays NaN.
inline float round_to(DType t, float x) {
  switch (t) {
    case DType::float16: return static_cast<float>(static_cast<_Float16>(x));
    case DType::bfloat16: {
      const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
      if ((u & 0x7fffffffu) > 0x7f800000u) return x;
      return std::bit_cast<float>((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
    }
    case DType::float32:
    case DType::int32: break;  // int32 values the tests write are small integers: exact in float
  }
  return x;
}

// Machine epsilon (the gap above 1) of the dtype.
inline double eps(DType t) {
  switch (t) {
    case DType::float16: return 0x1p-10;
    case DType::bfloat16: return 0x1p-7;
    case DType::float32:
    case DType::int32: break;
  }
  return 0x1p-23;
}

}  // namespace flashtile::detail
