// The way 16-bit tiles leave the sm90 kernels' accumulators for global memory: through shared memory, so that the
// stores are 16-byte vectors covering whole rows.
#pragma once

#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/array.h>

namespace flashtile::cuda::sm90 {

// A (kRows x kCols) tile of 16-bit values staged in shared memory on its way out: written as pairs of adjacent
// columns from an accumulator, read back in 16-byte vectors and stored by consecutive threads along each row.
// From the accumulator directly, each quad wrote 16 bytes of a row, half a 32-byte sector per store (ncu:
// dq_convert took 111 us against cuDNN's 53; staged, under 50, and the backward at 2k-4k tokens 7-21 % faster).
// The pitch is 16 bytes more than a row, so that the pairs of the accumulator's eight rows per warp fall in 32
// distinct banks.
template <int kRows, int kCols>
struct StagedTile {
  static constexpr int kPitch = kCols + 8;
  static constexpr int kElems = kRows * kPitch;
  static_assert(kCols % 8 == 0);
  template <class Element>
  CUTE_DEVICE static void put(Element* s, int row, int col, float x0, float x1) {
    cutlass::Array<Element, 2> x;
    x[0] = Element(x0);
    x[1] = Element(x1);
    *reinterpret_cast<cutlass::Array<Element, 2>*>(s + row * kPitch + col) = x;
  }
  // Two adjacent rows of one column (an accumulator of the transposed tile: its pairs run along our rows).
  template <class Element>
  CUTE_DEVICE static void put_column(Element* s, int row, int col, float x0, float x1) {
    s[row * kPitch + col] = Element(x0);
    s[(row + 1) * kPitch + col] = Element(x1);
  }
  // Rows below `rows` and columns below `cols` (a multiple of 8: checks.cpp) to dst (16-byte aligned rows).
  template <class Element>
  CUTE_DEVICE static void store(const Element* s, Element* dst, std::int64_t row_stride, int rows, int cols,
                                int tid, int threads) {
    constexpr int kChunks = kCols / 8;
    for (int c = tid; c < kRows * kChunks; c += threads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      if (r < rows && col < cols)
        *reinterpret_cast<uint4*>(dst + r * row_stride + col) = *reinterpret_cast<const uint4*>(s + r * kPitch + col);
    }
  }
};

}  // namespace flashtile::cuda::sm90
