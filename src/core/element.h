// One element of a tensor, read as a double: how test and tool code (the tests' host tensors, the fuzzer) looks at
// memory of any FlashTile dtype. Unaligned addresses are fine (memcpy). Not for kernels: they convert whole tiles.
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
  }
  return 0.0;
}

}  // namespace flashtile::detail
