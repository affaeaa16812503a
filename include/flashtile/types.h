// Element types and devices understood by FlashTile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace flashtile {

// int32 is for index tensors only (cu_seqlens_q / cu_seqlens_k / seqused_k); the float operands refuse it.
enum class DType : std::uint8_t { float32, float16, bfloat16, int32 };

enum class Device : std::uint8_t { cpu, cuda };

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::float32:
    case DType::int32: return 4;
  }
  return 4;
}

constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::float32: return "float32";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
  }
  return "?";
}

constexpr std::string_view device_name(Device d) noexcept {
  return d == Device::cpu ? "cpu" : "cuda";
}

}  // namespace flashtile
