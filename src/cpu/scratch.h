// The CPU kernels' per-thread scratch arrays: zero-filled and aligned to 64 bytes, one cache line and one AVX-512
// vector or AMX tile row. With operator new's 16-byte alignment (glibc: an mmap'ed block starts 16 bytes past a page)
// every 64-byte load of a tile row straddled two cache lines: the AVX-512 float32 products of the forward's shapes
// (bench micro-benchmark of simd::gemm, one thread) ran 8 % (S = Q Kᵀ, 64 x 64 x 128) and 24 % (P V, 64 x 128 x 64)
// slower with their operands 16 bytes off a line than on it.
#pragma once

#include "cpu/isa_namespace.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace flashtile::cpu {
FT_ISA_BEGIN

inline constexpr std::size_t kScratchAlign = 64;

struct ScratchDelete {
  void operator()(void* p) const noexcept { ::operator delete[](p, std::align_val_t(kScratchAlign)); }
};

template <class E>
using Scratch = std::unique_ptr<E[], ScratchDelete>;

// n zero elements (trivial types only: the bytes are the value).
template <class E>
Scratch<E> zeroed(std::int64_t n) {
  static_assert(std::is_trivial_v<E>);
  const std::size_t bytes = sizeof(E) * static_cast<std::size_t>(n > 0 ? n : 1);
  void* p = ::operator new[](bytes, std::align_val_t(kScratchAlign));
  std::memset(p, 0, bytes);
  return Scratch<E>(static_cast<E*>(p));
}

// n elements left as they are, for a buffer its user writes whole before reading.
template <class E>
Scratch<E> for_overwrite(std::int64_t n) {
  static_assert(std::is_trivial_v<E>);
  const std::size_t bytes = sizeof(E) * static_cast<std::size_t>(n > 0 ? n : 1);
  return Scratch<E>(static_cast<E*>(::operator new[](bytes, std::align_val_t(kScratchAlign))));
}

FT_ISA_END
}  // namespace flashtile::cpu
